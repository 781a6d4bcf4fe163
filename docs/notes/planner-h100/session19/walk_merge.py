"""A finished evaluation's run cache plus the walk prompts' texts (``walk_texts.py``), and its
document with ``profile_walk_prompts`` set: what ``planner_rescore`` re-scores with the walks
over more prompts (run it where the texts were decoded: ``planner_rescore`` says why).

    python docs/notes/planner-h100/session19/walk_merge.py RUNS.jsonl.gz PLANNER.json \\
        WALK.jsonl.gz PROMPTS OUT_RUNS.jsonl OUT_PLANNER.json
"""

import gzip
import json
import sys


def main(runs, planner, walk, prompts, out_runs, out_planner) -> None:
    lines = gzip.open(runs, "rt").read().splitlines()
    lines += gzip.open(walk, "rt").read().splitlines()[1:]  # its settings line left out
    with open(out_runs, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    doc = json.load(open(planner))
    doc["profile_walk_prompts"] = int(prompts)
    with open(out_planner, "w") as fh:
        json.dump(doc, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
