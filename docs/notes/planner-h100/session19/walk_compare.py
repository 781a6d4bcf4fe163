"""Each n-gram tree's walked tokens per round as the current code's profile computes them from
an evaluation's runs (the profile rebuilt as planner_rescore does), beside the recorded figure.
The form that wrote walkcmp32*.log on the H100 (docs/notes/planner.md, session 19).

    PYTHONPATH=. python docs/notes/planner-h100/session19/walk_compare.py RUNS PLANNER.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import planner_rescore as pr

import planner.evaluate as ev

rec = {}
orig = ev.walk_ngram


def wrap(bench, regime, a, runs, prompts, own, record, extra=()):
    orig(bench, regime, a, runs, prompts, own, record, extra)
    rec[regime] = {
        k: (v.get("walked"), v.get("walked_prompts"), v.get("walked_texts"))
        for k, v in record.get(regime, {}).items()
        if "walked" in v
    }


ev.walk_ngram = wrap
for runs, doc in ((sys.argv[1], sys.argv[2]),):
    d = json.loads(Path(doc).read_text())
    pr.profile_from_runs(Path(runs), d)
    old = d["profile_chain_tokens"]
    for reg, v in rec.items():
        for k, (w, p, t) in v.items():
            rec_w = old[reg][k]["walked"]
            print(
                reg,
                k[:50].ljust(50),
                f"walked now {w:.3f} over {p} prompts {t} texts; recorded {rec_w:.3f}",
            )
