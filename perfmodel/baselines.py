"""Side-by-side predictions of the DESIGN.md baselines on one workload, as table rows.

Each row is one (context, strategy) point with its per-op seconds, tokens/s and speedups over
``ar_dense`` and ``ar_sparse`` at the same context; every figure carries the predictor's
provenance and, for a calibrated prediction, its interval (``perfmodel.intervals``: every op's,
the draft, verify and round times', tokens/s' and both speedups'). ``ssvkit predict`` prints
these rows; notebooks and sweeps reuse them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.intervals import bounds, interval, uncovered_share
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.selection_ops import SELECTION_OPS
from ssvkit.perfmodel.step import ATTENTION_OPS, StepPrediction, build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload

GEMM_OPS = (
    "qkv_proj",
    "o_proj",
    "ffn_gate_up",
    "ffn_down",
    "lm_head",
    "moe_router",
    "moe_experts",
    "moe_shared",
    "fc",
)


def op_group(name: str) -> str:
    """Coarse group of an op name for tables: draft, loop (the loop's host time), gemm,
    attention, selection, other."""
    stage, _, op = name.partition(".")
    if stage in ("draft", "loop"):
        return stage
    if op in GEMM_OPS:
        return "gemm"
    if op in ATTENTION_OPS:  # dense, and every sparse class: reuse and refresh, fused or not
        return "attention"
    if op in SELECTION_OPS.values():
        return "selection"
    return "other"


def compare(
    model: ModelSpec,
    gpu: GpuSpec,
    strategies: list[Strategy],
    contexts: list[int],
    workload: Workload,
) -> list[dict]:
    """Predict every strategy at every context; rows carry seconds per op and tokens/s.

    ``workload`` supplies everything but the context. Speedups are against the ``ar_dense`` and
    ``ar_sparse`` rows of the same context, computed on the fly when those baselines are not
    among ``strategies``.
    """
    anchors = [Strategy.from_name("ar_dense"), Strategy.from_name("ar_sparse")]
    todo = strategies + [a for a in anchors if a.name not in {s.name for s in strategies}]
    points = [
        (s, dataclasses.replace(workload, context_len=int(T))) for T in contexts for s in todo
    ]
    cols = build_columns(model, points)
    drafter = next((s.drafter for s in strategies if s.tree not in ("chain:0", "none")), None)
    pred = predict_columns(model, cols, make_predictor(gpu, workload.dtype, cols.tp), drafter)
    rows = []
    for i, (s, w) in enumerate(points):
        rows.append(
            {
                "context_len": w.context_len,
                "strategy": s.name,
                "tokens_per_s": float(pred.tokens_per_s[i]),
                "tokens_per_round": float(pred.tokens_per_round[i]),
                "num_draft_tokens": int(cols.num_draft[i]),
                "round_s": float(pred.round_s[i]),
                "draft_s": float(pred.draft_s[i]),
                "verify_s": float(pred.verify_s[i]),
                "op_s": {k: float(v[i]) for k, v in pred.op_seconds.items() if v[i] > 0},
                "op_flops": {
                    k: float(np.broadcast_to(op.flops, cols.tp.shape)[i])
                    for k, op in pred.ops.items()
                },
                "op_bytes": {
                    k: float(np.broadcast_to(op.bytes, cols.tp.shape)[i])
                    for k, op in pred.ops.items()
                },
                "provenance": pred.label(i),
                "extrapolated": bool(pred.extrapolated[i]),
                "stand_ins": pred.stood_in_for(i),
            }
        )
    by_key = {(r["context_len"], r["strategy"]): r for r in rows}
    anchor_idx = {}
    for a in ("ar_dense", "ar_sparse"):
        anchor_idx[a] = np.array([rows.index(by_key[(r["context_len"], a)]) for r in rows])
        for r in rows:
            base = by_key[(r["context_len"], a)]["tokens_per_s"]
            r[f"speedup_vs_{a}"] = r["tokens_per_s"] / base
    add_intervals(rows, pred, anchor_idx)
    keep = {s.name for s in strategies}
    return [r for r in rows if r["strategy"] in keep]


FIGURES = ("tokens_per_s", "round_s", "draft_s", "verify_s")


def add_intervals(rows: list[dict], pred: StepPrediction, anchor_idx: dict) -> None:
    """Give each row (point i of ``pred``) ``intervals``: [low, high] of its times, tokens/s,
    speedups over the anchor points ``anchor_idx[a][i]`` and every op with seconds; the residual
    set of each op (``op_residuals``) and the share of the round without residuals
    (``uncovered_share``); or None and ``interval_note`` saying why."""
    draft, verify = pred.spread(prefix="draft."), pred.spread(prefix="verify.")
    if draft is None:
        for r in rows:
            r.update(intervals=None, interval_note=pred.interval_note, op_residuals={})
        return
    rnd = pred.spread()  # draft, verify and the loop's host time
    spreads = {"round_s": rnd, "draft_s": draft, "verify_s": verify}
    ivs = {k: interval(getattr(pred, k), over=bounds(sp)) for k, sp in spreads.items()}
    rb = bounds(rnd)
    ivs["tokens_per_s"] = interval(pred.tokens_per_s, under=rb)
    own = np.arange(len(rows))
    for a, idx in anchor_idx.items():
        ratio = pred.tokens_per_s / pred.tokens_per_s[idx]
        ivs[f"speedup_vs_{a}"] = interval(ratio, over=rb.take(idx), under=rb, same=idx == own)
    uncovered = uncovered_share(rnd)
    src = pred.interval_source
    op_ivs = {
        k: interval(pred.op_seconds[k], over=bounds(pred.spread(keys=[k]))) for k in pred.op_seconds
    }
    for i, r in enumerate(rows):
        r["intervals"] = {k: [float(x) for x in v[i]] for k, v in ivs.items()}
        r["intervals"]["op_s"] = {k: [float(x) for x in op_ivs[k][i]] for k in r["op_s"]}
        r["op_residuals"] = {}
        for k in r["op_s"]:
            fam, mask = pred.op_family.get(k), pred.op_outside.get(k)
            outside = mask is not None and bool(mask[i])
            if k == "loop.host" and pred.loop_residuals is not None:
                r["op_residuals"][k] = pred.loop_residuals.source
            else:
                r["op_residuals"][k] = None if fam is None else src.residuals(fam, outside).source
        r["uncovered_share"] = float(uncovered[i])
        r["interval_note"] = ""


def base_provenance(row: dict) -> str:
    """A row's provenance without its point's flags (``StepPrediction.label``)."""
    return row["provenance"].removesuffix(":stand-in").removesuffix(":extrapolated")


def grouped_seconds(row: dict) -> dict[str, float]:
    """A row's op seconds summed by ``op_group``."""
    out = {
        "draft": 0.0,
        "gemm": 0.0,
        "attention": 0.0,
        "selection": 0.0,
        "other": 0.0,
        "loop": 0.0,
    }
    for k, v in row["op_s"].items():
        out[op_group(k)] += v
    return out
