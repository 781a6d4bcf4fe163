"""Per-round wall time distribution: fixed vs controller (dm chain:2, prose, 15360)."""
# ruff: noqa: E501  (one-off device script: its printed-table f-strings)

import dataclasses
import gc
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from controller_cost import load_setting

from planner.controller import ControllerConfig, OnlineController, strategy_from_json
from planner.evaluate import make_bench, prompt_tokens, run_once

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


def ctl(**kw):
    c = OnlineController(ranking, model, gpu, profile, ControllerConfig(**kw))
    c.warm()
    return c


for rep in range(3):
    for name, make, gcoff in (
        ("fixed", lambda: None, False),
        ("controller", ctl, False),
        ("controller_gcoff", ctl, True),
        ("stride1", lambda: ctl(stride=1), False),
    ):
        c = make()
        if gcoff:
            gc.collect()
            gc.disable()
        res = run_once(bench, s, prompt, controller=c, seed=4)
        gc.enable()
        rs = [r for r in res.rounds if not r.warmup]
        w = np.array([r.wall_s for r in rs]) * 1e6
        co = np.array([r.step_s.get("control_overlap", 0.0) for r in rs]) * 1e6
        gpu_us = (
            np.array(
                [
                    sum(
                        v
                        for k, v in r.step_s.items()
                        if k in ("draft", "launch", "verify", "accept")
                    )
                    for r in rs
                ]
            )
            * 1e6
        )
        pct = lambda a: (
            " ".join(f"{np.percentile(a, q):6.0f}" for q in (10, 50, 90, 99))
            + f" mean {a.mean():6.0f} max {a.max():6.0f}"
        )
        print(
            f"{rep} {name:18s} sw {len(getattr(c, 'switches', []))} wall p10/50/90/99 {pct(w)} | gpu {pct(gpu_us)} | ctl {pct(co)}",
            flush=True,
        )
        if rep == 2 and name == "controller":
            big = np.argsort(-w)[:8]
            print(
                "   largest rounds:",
                [(int(i), round(w[i]), round(co[i]), round(gpu_us[i])) for i in big],
            )
            print(
                "   ctl by round mod 4:",
                [round(co[i::4].mean()) for i in range(4)],
                "wall by mod 4:",
                [round(w[i::4].mean()) for i in range(4)],
            )
