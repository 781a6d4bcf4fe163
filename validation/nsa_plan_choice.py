"""The NSA tile plan a calibrated model would pick per call, against the measured best: the
GPU's shipped profile prices the packed fused calls of a committed ``nsa_tile_plans`` document
under both plans ("fixed", "fit": ``NsaVerifyConfig.tile_plan``), from the work each plan's
launches do (``perfmodel.nsa_work``, ``tile_plan``). The profile's NSA classes are fitted on
"fixed" rows only, so the "fit" rows are calls of a plan no fit row ran. The document's
kernels are those of its commit: a path changed since (the refresh call's selection) shows as
an error common to both plans, which leaves their order to the launch plans' work.

    python -m ssvkit.validation.nsa_plan_choice --gpu h200 \\
        [--data validation/data/nsa-tile-plans-h200.json] [--json]

Per mode (reuse, refresh) it prints each call's measured and predicted times under both
plans, the predicted-faster plan, and over the calls the mean and worst loss of three rules
against the measured faster plan: the model's pick, "fixed" always, "fit" always.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from ssvkit.calibration.fit import error_stats
from ssvkit.calibration.validate import annotate
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.nsa_plan import TILE_PLANS
from ssvkit.perfmodel.profiles import shipped_profile

DATA = Path(__file__).parent / "data" / "nsa-tile-plans-h200.json"
MODEL = "llama-3.1-8b"  # the geometry validation.nsa_tile_plans times (kernel_inputs' default)
MODES = ("reuse", "refresh")


def doc_plans(doc: dict) -> tuple[str, ...]:
    """The tile plans the document timed (its ``configs``), in ``TILE_PLANS`` order."""
    plans = tuple(k for k in TILE_PLANS if k in doc["configs"])
    if len(plans) < 2:
        raise ValueError(f"it times {len(plans)} of the tile plans {TILE_PLANS}, not two")
    return plans


def plan_rows(doc: dict, mode: str) -> list[dict]:
    """Calibration-shaped rows of the document's packed fused ``mode`` calls, one per plan
    timed, each with its plan in ``params["tile_plan"]``."""
    m = get_model(MODEL)
    prov = doc["provenance"]
    out = []
    for r in doc["rows"]:
        for plan in doc_plans(doc):
            t = r["times_s"].get(f"r0_{plan}_{mode}")
            if t is None:
                continue
            params = dict(
                context_len=r["context_len"],
                num_query_tokens=r["num_query_tokens"],
                num_q_heads=m.num_q_heads,
                num_kv_heads=m.num_kv_heads,
                head_dim=m.head_dim,
                batch=r["batch"],
                mode=mode,
                group_size=None,
                overlap=r["overlap"],
                dtype="bfloat16",
                impl="fused",
                tree="binary",
                context_tiles="paired",
                tile_plan=plan,
                **doc["kwargs"],
            )
            out.append(
                dict(
                    op="nsa_verify",
                    params=params,
                    median_s=t,
                    unique_bytes=r["unique_bytes"],
                    flops=r["flops"],
                    timing="graph",
                    git_commit=prov["git_commit"][:7],
                    timestamp=prov["timestamp"],
                )
            )
    return out


def choice_report(doc: dict, gpu: str) -> dict:
    """Per mode: each call's measured and predicted seconds under both plans and the pick;
    the prediction error per plan; the mean and worst loss of each rule against the measured
    faster plan (calls with both plans timed)."""
    profile = shipped_profile(gpu)
    prov = doc["provenance"]
    plans = doc_plans(doc)
    out = {
        "gpu": gpu,
        "plans": plans,
        "profile_id": profile.profile_id,
        "data": {k: prov[k] for k in ("device_name", "git_commit", "timestamp")},
        "modes": {},
    }
    for mode in MODES:
        calls: dict[tuple, dict] = {}
        for a in annotate(plan_rows(doc, mode), profile):
            p = a["params"]
            key = (p["batch"], p["num_query_tokens"], p["context_len"])
            calls.setdefault(key, {})[p["tile_plan"]] = (a["median_s"], a["predicted_s"])
        rows = []
        for (b, t, ctx), by_plan in sorted(calls.items()):
            if set(by_plan) != set(plans):
                continue
            pick = min(plans, key=lambda k: by_plan[k][1])
            best = min(m for m, _ in by_plan.values())
            rows.append(
                dict(
                    batch=b,
                    t=t,
                    context_len=ctx,
                    **{f"{k}_measured_s": by_plan[k][0] for k in plans},
                    **{f"{k}_predicted_s": by_plan[k][1] for k in plans},
                    pick=pick,
                    loss={
                        "pick": by_plan[pick][0] / best - 1,
                        **{k: by_plan[k][0] / best - 1 for k in plans},
                    },
                )
            )
        errors = {
            k: error_stats(
                np.array([r[f"{k}_predicted_s"] for r in rows]),
                np.array([r[f"{k}_measured_s"] for r in rows]),
            )
            for k in plans
        }
        rules = ("pick", *plans)
        loss = {
            k: {
                "mean": float(np.mean([r["loss"][k] for r in rows])),
                "max": float(max(r["loss"][k] for r in rows)),
                "best_calls": sum(r["loss"][k] == 0 for r in rows),
            }
            for k in rules
        }
        out["modes"][mode] = {"calls": rows, "errors": errors, "loss": loss}
    return out


def print_report(rep: dict) -> None:
    d = rep["data"]
    print(f"profile {rep['profile_id']}: NSA tile plans, measured vs predicted (us)")
    print(f"rows: {d['device_name']}, kernels at {d['git_commit'][:7]}, {d['timestamp']}")
    for mode, m in rep["modes"].items():
        print(f"\n{mode}, fused, packed rows")
        print("   b    t  context" + "".join(f" {k:>9}   pred" for k in rep["plans"]) + "  pick")
        for r in m["calls"]:
            times = "".join(
                f" {r[f'{k}_measured_s'] * 1e6:9.1f} {r[f'{k}_predicted_s'] * 1e6:6.1f}"
                for k in rep["plans"]
            )
            print(f"{r['batch']:4d} {r['t']:4d} {r['context_len'] // 1024:6d}K{times}  {r['pick']}")
        for k, e in m["errors"].items():
            print(
                f"  {k}: prediction APE median {e['median_ape']:.1%}, "
                f"p90 {e['p90_ape']:.1%}, max {e['max_ape']:.1%}"
            )
        n = len(m["calls"])
        for k, v in m["loss"].items():
            name = "model's pick" if k == "pick" else f"always {k}"
            print(
                f"  {name:>13}: the faster plan in {v['best_calls']} of {n} calls; "
                f"mean loss {v['mean']:.1%}, worst {v['max']:.1%}"
            )


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m ssvkit.validation.nsa_plan_choice", description=__doc__)
    p.add_argument("--gpu", default="h200", help="registry GPU whose shipped profile prices")
    p.add_argument("--data", default=str(DATA), help="an nsa_tile_plans document (tile_plan)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    try:
        doc = json.loads(Path(a.data).read_text())
        rep = choice_report(doc, a.gpu)
    except (OSError, ValueError, KeyError) as e:
        p.error(f"--data {a.data!r}: {e}")
    if a.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
    else:
        print_report(rep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
