"""Decode the walk prompts' autoregressive texts of an evaluation on the GPU (``walk_texts``,
the keys the evaluation gives them), as run-cache lines, so that a finished evaluation's runs
plus these re-score on the CPU with the walks over more prompts (``planner_rescore`` with
``profile_walk_prompts`` set). Settings as ``planner_eval``'s defaults (the tiny pair, room
for 30720 tokens, 384 new tokens, temperature 1).

    PYTHONPATH=. python docs/notes/planner-h100/session19/walk_texts.py OUT.jsonl [PROMPTS]
"""

import json
import sys
import time

from planner.evaluate import make_bench, regime_of, walk_texts
from planner.space import SpaceSpec

CONTEXTS = (3584, 7680, 15360, 30720)


class Recorder:
    """A run cache that keeps every run it is asked for, in the cache's line format."""

    reused = 0

    def __init__(self):
        self.lines = []

    def get(self, key, fn):
        value = fn()
        self.lines.append(json.dumps({"key": key, "value": value}))
        return value


def main(out: str, prompts: str = "20") -> None:
    t0 = time.perf_counter()
    bench = make_bench("tiny", "tiny-draft", max(CONTEXTS), 384, 5, "auto", "h100-sxm", 1.0)
    bench.cache = Recorder()
    space = SpaceSpec(drafters=("draft_model", "ngram"), draft_model=bench.draft_label)
    for ctx in CONTEXTS:
        pairs = walk_texts(bench, space, ctx, int(prompts), regime_of(ctx))
        print(f"{ctx}: {len(pairs)} texts ({time.perf_counter() - t0:.0f} s)", flush=True)
    with open(out, "w") as fh:
        fh.write(json.dumps({"settings": "walk texts"}) + "\n")
        fh.write("\n".join(bench.cache.lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
