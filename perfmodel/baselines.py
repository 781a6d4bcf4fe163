"""Side-by-side predictions of the DESIGN.md baselines on one workload, as table rows.

Each row is one (context, strategy) point with its per-op seconds, tokens/s and speedups over
``ar_dense`` and ``ar_sparse`` at the same context; every figure carries the predictor's
provenance. ``ssvkit predict`` prints these rows; notebooks and sweeps reuse them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.step import ATTENTION_OPS, build_columns, predict_columns
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
    """Coarse group of an op name for tables: draft, gemm, attention, selection, other."""
    stage, _, op = name.partition(".")
    if stage == "draft":
        return "draft"
    if op in GEMM_OPS:
        return "gemm"
    if op in ATTENTION_OPS:  # dense, and every sparse class: reuse and refresh, fused or not
        return "attention"
    if op == "selection":
        return op
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
                "stand_ins": pred.stood_in_for(i),
            }
        )
    by_key = {(r["context_len"], r["strategy"]): r for r in rows}
    for r in rows:
        for a in ("ar_dense", "ar_sparse"):
            base = by_key[(r["context_len"], a)]["tokens_per_s"]
            r[f"speedup_vs_{a}"] = r["tokens_per_s"] / base
    keep = {s.name for s in strategies}
    return [r for r in rows if r["strategy"] in keep]


def grouped_seconds(row: dict) -> dict[str, float]:
    """A row's op seconds summed by ``op_group``."""
    out = {"draft": 0.0, "gemm": 0.0, "attention": 0.0, "selection": 0.0, "other": 0.0}
    for k, v in row["op_s"].items():
        out[op_group(k)] += v
    return out
