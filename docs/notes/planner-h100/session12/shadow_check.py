"""Adaptive runs on code (16K, offline best) at seeds 0-4 with the walked shadow: switches, the
shadow's tokens per round (walk vs per position), tokens/s; fixed runs beside them."""
# ruff: noqa: E501  (one-off device script: its printed-table f-strings)

import json
import os
import sys

sys.path.insert(0, "benchmarks")
from controller_cost import load_setting

from planner.controller import ControllerConfig, OnlineController, strategy_from_json
from planner.evaluate import make_bench, prompt_tokens, run_once, shadow_summary, steady_figures

ctx = 15360
ranking, model, gpu, profile = load_setting()
bench = make_bench("tiny", "tiny-draft", ctx, 384, 1, temperature=1.0)
best = strategy_from_json(ranking["regimes"]["16K"]["ranking"][0]["strategy"])
print("offline best", best.drafter.kind, best.tree)
out = []
for pset in ("code", "repetitive"):
    prompt = prompt_tokens(pset, ctx, offset=2 * ctx)
    run_once(bench, best, prompt, seed=0)  # warm-up (graphs)
    c = OnlineController(ranking, model, gpu, profile, ControllerConfig())
    c.warm()
    run_once(bench, best, prompt, controller=c, seed=0)
    for seed in range(5):
        fixed = steady_figures(run_once(bench, best, prompt, seed=seed))
        c = OnlineController(ranking, model, gpu, profile, ControllerConfig())
        c.warm()
        res = run_once(bench, best, prompt, controller=c, seed=seed)
        f = steady_figures(res)
        sh = shadow_summary(res).get("ngram", {})
        row = {
            "set": pset,
            "seed": seed,
            "fixed_tps": fixed["tokens_per_s"],
            "adaptive_tps": f["tokens_per_s"],
            "switches": [
                (s["round"], s["reason"], s["to"], round(s["predicted_gain"], 3))
                for s in c.switches
            ],
            "walk": sh.get("tokens_per_round"),
            "per_position": sh.get("tokens_per_round_per_position"),
            "fixed_mean_accepted": fixed["mean_accepted"],
        }
        out.append(row)
        w = {
            k: round(v, 2)
            for k, v in (row["walk"] or {}).items()
            if k in ("chain:2", "chain:4", "chain:7")
        }
        pp = {
            k: round(v, 2)
            for k, v in (row["per_position"] or {}).items()
            if k in ("chain:2", "chain:4", "chain:7")
        }
        print(
            f"{pset} seed {seed}: fixed {fixed['tokens_per_s']:.0f} (1+{fixed['mean_accepted']:.2f}/round) adaptive {f['tokens_per_s']:.0f} switches {row['switches']} walk {w} per-position {pp}",
            flush=True,
        )
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(
    {"commit": os.environ.get("SSVKIT_GIT_COMMIT"), "rows": out},
    open(os.path.join(os.environ.get("OUT", "/tmp"), "shadow-check.json"), "w"),
    indent=1,
)
