import json, sys, dataclasses
from pathlib import Path
sys.path.insert(0, "benchmarks")
from planner_rescore import CachedRuns
from planner.evaluate import make_bench, measure_profile
from planner.space import SpaceSpec
from planner.rank import score, strategy_from_json
from planner.profile import overhead_features, OVERHEAD_TERMS
import numpy as np
runs, ev = Path(sys.argv[1]), Path(sys.argv[2])
doc = json.loads(ev.read_text())
contexts = {r: v["context_len"] for r, v in doc["regimes"].items()}
bench = make_bench("tiny", "tiny-draft", max(contexts.values()), doc["max_new_tokens"], doc["repeats"], "cpu", doc["gpu_model"], doc["temperature"])
bench.log = lambda m: None
bench.cache = CachedRuns(runs)
space = SpaceSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()})
profile, fits, _, _ = measure_profile(bench, contexts, space, doc["profile_reference_tree"], doc["profile_attention_tree"], doc["profile_prompts"])
for regime, v in doc["regimes"].items():
    ov = profile.overhead.get(regime, {})
    print(regime, {k: round(x*1e6,1) for k,x in ov.items()})
    strats = [strategy_from_json(r["strategy"]) if "strategy" in r else None for r in v["strategies"]]
    for r in v["strategies"]:
        m = r["measured"]
        meas = (1 + m["mean_accepted"]) / m["tokens_per_s"]
        pred = r["predicted_tokens_per_round"] / r["predicted_tokens_per_s"]
        print("  %-50s meas %5.0f pred %5.0f  (%+4.0f%%) verify meas %4.0f draft meas %4.0f" % (r["describe"][:50], meas*1e6, pred*1e6, 100*(pred/meas-1), m["steps_s"]["verify"]*1e6, m["steps_s"]["draft"]*1e6))
