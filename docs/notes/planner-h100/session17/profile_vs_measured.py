"""Run 30: each dense strategy's round time and draft step in the profile runs (one timing pass,
ten profile prompts, median) against the measured runs (least disturbed of three passes, ten
held-out prompts, median), per regime. The profile decodes ``Strategy(name="profile", tree,
drafter)`` (``planner.evaluate.measure_profile``), matched here by drafter and tree:

    PYTHONPATH=. python docs/notes/planner-h100/session17/profile_vs_measured.py \\
        docs/notes/planner-h100/runs-run30-fda8343.jsonl.gz docs/validation/planner.json \\
        docs/notes/planner-h100/session17/ranking-run30.json.gz
"""

import gzip
import json
import sys
from collections import defaultdict

import numpy as np

from perfmodel.strategy import Strategy
from planner.space import strategy_id

runs = {}
with gzip.open(sys.argv[1], "rt") as fh:
    for line in fh:
        x = json.loads(line)
        if "key" in x:
            runs[x["key"]] = x["value"]
doc = json.load(open(sys.argv[2]))
# The measured strategies, from the run's full ranking (``--ranking-out``) by id.
strategy_by_id = {}
if len(sys.argv) > 3:
    from planner.rank import strategy_from_json

    with gzip.open(sys.argv[3], "rt") as fh:
        ranked = json.load(fh)
    for reg in ranked["regimes"].values():
        for r in reg["ranking"]:
            strategy_by_id[r["id"]] = strategy_from_json(r["strategy"])
for regime, v in doc["regimes"].items():
    ctx = str(v["context_len"])
    prof = defaultdict(list)
    for k, r in runs.items():
        p = k.split("|")
        if p[0] == "profile" and p[1] == ctx:
            prof[p[-1]].append(r)
    print(regime)
    for row in v["strategies"]:
        s = strategy_by_id.get(row["id"])
        if s is None or s.is_sparse:
            continue
        pr = prof.get(strategy_id(Strategy(name="profile", tree=s.tree, drafter=s.drafter)))
        if not pr:
            continue
        m = row["measured"]
        p_round = np.median([r["wall_s"] / r["rounds"] for r in pr]) * 1e6
        p_draft = np.median([r["steps_s"]["draft"] for r in pr]) * 1e6
        m_round = (1 + m["mean_accepted"]) / m["tokens_per_s"] * 1e6
        print(
            f"  {row['describe'][:40]:40s} round profile {p_round:5.0f} measured "
            f"{m_round:5.0f} ({p_round / m_round - 1:+4.0%})  draft profile {p_draft:4.0f} "
            f"measured {m['steps_s']['draft'] * 1e6:4.0f}"
        )
