"""Fit the physical model (``perfmodel.physical``) of the attention families on measured rows.

One fit serves every family in ``PHYSICAL_FAMILIES`` at once: its constants are the GPU's, so
dense and sparse rows of every geometry, group size, context and batch constrain the same eight
numbers. A row's work comes from the launch plan its kernel made (``perfmodel.attention_work``);
sparse rows carry their measured selections' distinct bytes (``global_unique_bytes``) and union
share (``f_load``). The sparse kernel that timed the committed H100 rows split a group's list
until the grid filled one wave (``attention_work.fill_sparse_splits``); later rows follow
``sparse_plan.choose_sparse_splits``, so rows of ``row_work.SPARSE_FILL_SPLIT_COMMITS`` keep
that kernel's rule, and rows of the earlier union plan kernel its counts
(``row_work.union_plan_kernel``).

Fit: soft-L1 loss of log(predicted / measured) over the constants, from fixed starts (no random
restarts), the lowest loss kept: deterministic.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from ssvkit.calibration.row_work import (
    SPARSE_FILL_SPLIT_COMMITS,
    sparse_config,
    union_plan_kernel,
)
from ssvkit.perfmodel.attention_work import (
    AttentionWork,
    dense_verify_work,
    sparse_verify_work,
)
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.physical import PARAMS, PhysicalFit, stack

PHYSICAL_FAMILIES = ("dense_verify", "sparse_verify")
PHYSICAL_CLASS = "attention"  # the one class the physical model fits for its families
KV_ELEM_BYTES = 2

# Bounds of each constant (PARAMS order): launches and waves of a few microseconds, streaming
# and MMA efficiencies up to the measured ceilings (a little above: the ceilings are medians of
# other kernels), L2 at 1-6x HBM (fitted as that ratio, kept over PEAK: ``_constants``), a tile's
# load latency up to 20 us, a row's up to 1 us, a union plan's compare step up to 100 ns (a step
# of the sort kernel is a pass over a thread's keys with a barrier, not one compare).
LOWER = (0.0, 0.0, 0.3, 0.0, 1.0, 0.02, 0.0, 0.0, 0.0)
UPPER = (2e-5, 2e-5, 1.2, 1.0, 6.0, 1.2, 2e-5, 1e-6, 1e-7)
STARTS = (
    (2e-6, 1e-6, 0.85, 0.3, 2.0, 0.3, 2e-6, 2e-8, 1e-11),
    (4e-6, 3e-6, 0.7, 0.6, 3.0, 0.6, 5e-6, 1e-8, 1e-10),
    (1e-6, 5e-7, 0.95, 0.1, 1.5, 0.15, 1e-6, 5e-8, 1e-12),
)


def row_work(row: dict, spec: GpuSpec) -> AttentionWork:
    """The work of the call a measured row timed, on ``spec``'s SMs and shared memory."""
    p = row["params"]
    common = (p["num_q_heads"], p["num_kv_heads"], p["head_dim"])
    sms, smem = spec.num_sms, spec.smem_per_sm_bytes
    if row["op"] == "dense_verify":
        return dense_verify_work(
            p["batch"], p["num_query_tokens"], p["context_len"], *common, sms, smem
        )
    if row["op"] != "sparse_verify":
        raise ValueError(f"no physical work description for op {row['op']!r}")
    b, t, hkv, d = p["batch"], p["num_query_tokens"], p["num_kv_heads"], p["head_dim"]
    top_n, bs, mode = p["top_n"], p["block_size"], p["mode"]
    c = 1 if mode == "per_query" else min(p["group_size"], t)
    groups = -(-t // c)
    per_query = b * hkv * t * top_n
    row_blocks = {"per_query": per_query, "union": p["f_load"] * per_query}.get(
        mode, b * hkv * groups * top_n
    )
    block_bytes = 2 * bs * d * KV_ELEM_BYTES
    fixed = row["unique_bytes"] - row_blocks * block_bytes  # tail, queries, outputs, indices
    return sparse_verify_work(
        b,
        t,
        *common,
        mode,
        p["group_size"],
        top_n,
        bs,
        sms,
        smem,
        list_blocks=p["f_load"] * t * top_n / groups if mode == "union" else None,
        unique_kv_bytes=p["global_unique_bytes"] - fixed + b * hkv * t * block_bytes / bs,
        split_rule="fill" if row["git_commit"][:7] in SPARSE_FILL_SPLIT_COMMITS else "wave_balance",
        union_plan=union_plan_kernel(row),
        config=sparse_config(row),
    )


def rows_work(rows: list[dict], spec: GpuSpec) -> dict[str, np.ndarray]:
    return stack([row_work(r, spec) for r in rows])


def fit_physical(rows: list[dict], bw: float, peak: float, spec: GpuSpec) -> PhysicalFit:
    """Least-squares fit of the constants on ``rows`` (of ``PHYSICAL_FAMILIES``)."""
    work = rows_work(rows, spec)
    seconds = np.array([r["median_s"] for r in rows])

    def resid(x):
        t = _constants(x, bw, peak).call_time_s(work, bw, peak)
        return np.log(t) - np.log(seconds)

    scale = np.array(UPPER) - np.array(LOWER)
    sols = [
        least_squares(
            resid,
            np.array(x0),
            bounds=(LOWER, UPPER),
            loss="soft_l1",
            f_scale=0.05,
            x_scale=scale,
            max_nfev=4000,
        )
        for x0 in STARTS
    ]
    best = min(sols, key=lambda s: s.cost)
    return _constants(best.x, bw, peak)


_L2 = PARAMS.index("l2_bytes_per_flop")


def _constants(x, bw: float, peak: float) -> PhysicalFit:
    """The fit from the solver's vector, whose L2 entry is the L2-to-SM throughput over ``bw``
    (the bounds' unit), kept over ``peak``."""
    v = [float(e) for e in x]
    v[_L2] *= bw / peak
    return PhysicalFit(**dict(zip(PARAMS, v, strict=True)))


def predict_rows(fit: PhysicalFit, rows: list[dict], bw: float, peak: float, spec: GpuSpec):
    """Predicted seconds of ``rows`` under ``fit``."""
    if not rows:
        return np.array([])
    return fit.call_time_s(rows_work(rows, spec), bw, peak)
