"""Run 30's round times per measured strategy, measured against predicted, with the profile's
overhead fit rebuilt from the runs (as ``benchmarks/planner_rescore.py`` does):

    PYTHONPATH=. python docs/notes/planner-h100/session17/round_residuals.py \\
        docs/notes/planner-h100/runs-run30-fda8343.jsonl.gz docs/validation/planner.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from planner_rescore import profile_from_runs  # noqa: E402

doc = json.loads(Path(sys.argv[2]).read_text())
profile = profile_from_runs(Path(sys.argv[1]), doc)[3]
for regime, v in doc["regimes"].items():
    print(regime, {k: round(x * 1e6, 1) for k, x in profile.overhead.get(regime, {}).items()})
    for r in v["strategies"]:
        m = r["measured"]
        meas = (1 + m["mean_accepted"]) / m["tokens_per_s"]
        pred = r["predicted_tokens_per_round"] / r["predicted_tokens_per_s"]
        print(
            f"  {r['describe'][:50]:50s} meas {meas * 1e6:5.0f} pred {pred * 1e6:5.0f}  "
            f"({100 * (pred / meas - 1):+4.0f}%) verify meas "
            f"{m['steps_s']['verify'] * 1e6:4.0f} draft meas {m['steps_s']['draft'] * 1e6:4.0f}"
        )
