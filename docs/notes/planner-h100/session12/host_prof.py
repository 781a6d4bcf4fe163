"""cProfile of the decode loop's host side: draft_model chain:2 (bfs, dense) on prose at 15360."""
# ruff: noqa: E501  (one-off device script: its printed-table f-strings)

import cProfile
import dataclasses
import pstats
import sys

sys.path.insert(0, "benchmarks")
from controller_cost import load_setting

from planner.controller import ControllerConfig, OnlineController, strategy_from_json
from planner.evaluate import make_bench, prompt_tokens, run_once, steady_figures

ctx = 15360
ranking, model, gpu, profile = load_setting()
bench = make_bench("tiny", "tiny-draft", ctx, 384, 1, temperature=1.0)
s = None
for r in ranking["regimes"]["16K"]["ranking"]:
    x = strategy_from_json(r["strategy"])
    if x.drafter.kind == "draft_model" and x.tree == "chain:2" and not x.is_sparse:
        s = x
        break
s = dataclasses.replace(s, drafter=dataclasses.replace(s.drafter, model=bench.draft_label))
prompt = prompt_tokens("prose", ctx, offset=2 * ctx)
for variant in ("fixed", "controller", "fixed", "controller"):
    c = None
    if variant == "controller":
        c = OnlineController(ranking, model, gpu, profile, ControllerConfig())
        c.warm()
    prof = cProfile.Profile()
    prof.enable()
    res = run_once(bench, s, prompt, controller=c, seed=4)
    prof.disable()
    f = steady_figures(res)
    print(
        f"== {variant}: rounds {f['rounds']} round us {1e6 * f['wall_s'] / f['rounds']:.0f} switches {len(getattr(c, 'switches', []))} steps { ({k: round(1e6 * v) for k, v in f['steps_s'].items()}) } ctl {1e6 * f['control_overlap_s'] / f['rounds']:.0f}"
    )
ps = pstats.Stats(prof)
n = f["rounds"]
for sort, lim in ((2, 45), (3, 60)):
    rows = sorted(((v[sort], v[2], v[3], v[0], k) for k, v in ps.stats.items()), reverse=True)[:lim]
    print("-- by", "tottime" if sort == 2 else "cumtime", "(us per round)")
    for _, tt, ct, cnt, k in rows:
        print(
            f"{ct * 1e6 / n:8.1f} cum {tt * 1e6 / n:7.1f} tot {cnt / n:6.2f}/rnd {k[0].split('/')[-1]}:{k[1]} {k[2]}"
        )
