"""The least-squares fit of one op class of the calibrated model (``perfmodel.class_fit``) on
its fit rows (``calibration.features``), as ``calibration.fit`` runs it per class.


Fit: per class, minimise the soft-L1 loss of log(predicted / measured) over t0, the efficiency
knots (K = 2..6 evenly spaced in log10 bytes and log10 FLOPs over the class's fit rows, K from
the row count), for sparse verification the L2-miss share h and the L2 throughput ratio r
(``perfmodel.class_fit``: requested bytes / (r BW) bound the call beside the HBM bytes;
bounded to [1, 4]), for repair the share h alone, for GEMMs, repair, the KV write and sampling
the latency t_k of a serial chain (a GEMM's K; the KV tiles one SM slot of a repair call walks,
``perfmodel.repair_plan``; the elements a KV-write thread stores in series,
``perfmodel.torch_plan``; the vocabulary a sampling row walks), for NSA verification the
latency t_s of a merge step (the serial walk over split partials), for NSA and dense
verification t_r of a row-tile row (``perfmodel.nsa_plan``, ``perfmodel.attention_work``), and
for block selection the rates t_x of its top-n stage's counts (``perfmodel.torch_plan``). Dense
verification's FLOPs are its kernel's padded row tiles' (``features``).
Deterministic (no random starts; sparse verification starts from a few byte efficiencies and
L2 ratios and keeps the lowest loss).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from ssvkit.calibration.features import DEDUP_OPS, class_data, is_select_plan
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.hardware import GpuSpec

L2_RATIO_STARTS = (1.2, 1.6, 2.0, 2.5, 3.0)  # starts of the L2 throughput ratio r (``fit_class``)
BYTES_EFF_STARTS = (0.7, 0.4, 1.0)  # starts of sparse verification's byte efficiencies


def _knots(values: np.ndarray, k: int) -> tuple[float, ...]:
    lo, hi = float(np.log10(values.min())), float(np.log10(values.max()))
    if hi - lo < 1e-6:
        hi = lo + 1e-6
    return tuple(np.linspace(lo, hi, k))


def _latency_bound(seconds: np.ndarray, count: np.ndarray) -> float:
    """Upper bound of a per-unit latency: the whole of a call's time spread over its count,
    for the call where that is least."""
    on = count > 0
    if not on.any():
        return 1e-30  # no row has the count: its rate is not identified, and prices nothing
    return float((seconds[on] / count[on]).min())


def fit_class(name: str, rows: list[dict], bw: float, peak: float, gpu: GpuSpec) -> ClassFit:
    """Least-squares fit of one class on its fit rows."""
    d = class_data(name, rows, gpu)
    # Sparse verification: two knots; its launch plan's counts (chain, waves, merge, row tile)
    # carry what changes with size and geometry, and a finer curve in total bytes, fitted on
    # one geometry's sizes, misprices another's.
    k = 2 if name.startswith("sparse_verify") else int(np.clip(len(rows) // 8, 2, 6))
    bk, fk = _knots(d.nbytes, k), _knots(d.flops, k)
    has_h = d.dedup is not None
    # The L2 throughput bound r only where a call's programs re-read each other's blocks
    # (sparse verification's overlapping selections); repair's uniform draws barely repeat.
    has_l2 = has_h and name.split("/")[0] in DEDUP_OPS
    has_depth = bool(d.depth.any())
    has_steps = bool(d.steps.any())
    has_rows = bool(d.rows.any())
    # A chain whose tiles cost by the row tile's rows: the slot-planned NSA calls' and sparse
    # verification's (``perfmodel.sparse_work``).
    has_depth_row = has_depth and has_rows and name.startswith(("nsa_verify", "sparse_verify"))
    # Block selection fitted on the current kernels' plan counts (``perfmodel.select_work``).
    select_plan = all(is_select_plan(r) for r in rows) and name.startswith("select_blocks")
    n_stage = len(d.stages)
    n_eff = 1 + 2 * k
    n_lat = n_eff + has_h + has_depth + has_steps + has_rows + has_depth_row

    def unpack(x):
        h = float(x[n_eff]) if has_h else None
        t_depth = float(x[n_eff + has_h]) if has_depth else 0.0
        t_step = float(x[n_eff + has_h + has_depth]) if has_steps else 0.0
        t_row = float(x[n_eff + has_h + has_depth + has_steps]) if has_rows else 0.0
        t_depth_row = float(x[n_lat - 1]) if has_depth_row else 0.0
        l2 = float(x[n_lat + n_stage]) if has_l2 else 0.0
        eb, ef = tuple(x[1 : 1 + k]), tuple(x[1 + k : 1 + 2 * k])
        return ClassFit(
            name,
            float(x[0]),
            bk,
            eb,
            fk,
            ef,
            h,
            t_depth_s=t_depth,
            t_step_s=t_step,
            t_row_s=t_row,
            t_stage_s=tuple(float(v) for v in x[n_lat : n_lat + n_stage]),
            l2_ratio=l2,
            t_depth_row_s=t_depth_row,
            slot_plan=has_depth_row or select_plan,
        )

    def resid(x):
        t = unpack(x).call_time_s(
            d.nbytes, d.flops, bw, peak, d.dedup, d.depth, d.steps, d.rows, d.stages
        )
        return np.log(t) - np.log(d.seconds)

    x0 = [0.3 * d.seconds.min()] + [BYTES_EFF_STARTS[0]] * k + [0.6] * k
    lo = [0.0] + [0.01] * k + [0.01] * k
    hi = [d.seconds.min()] + [4.0] * k + [1.5] * k
    if has_h:
        x0, lo, hi = x0 + [0.5], lo + [0.0], hi + [1.0]
    if has_depth:
        depth_hi = _latency_bound(d.seconds, d.depth)
        x0, lo, hi = x0 + [0.3 * depth_hi], lo + [0.0], hi + [depth_hi]
    if has_steps:
        step_hi = _latency_bound(d.seconds, d.steps)
        x0, lo, hi = x0 + [0.3 * step_hi], lo + [0.0], hi + [step_hi]
    if has_rows:
        row_hi = _latency_bound(d.seconds, d.rows)
        x0, lo, hi = x0 + [0.3 * row_hi], lo + [0.0], hi + [row_hi]
    if has_depth_row:
        depth_row_hi = _latency_bound(d.seconds, d.depth * d.rows)
        x0, lo, hi = x0 + [0.3 * depth_row_hi], lo + [0.0], hi + [depth_row_hi]
    for count in d.stages:
        stage_hi = _latency_bound(d.seconds, count)
        x0, lo, hi = x0 + [0.1 * stage_hi], lo + [0.0], hi + [stage_hi]
    if has_l2:  # last: the starts below replace the last parameter
        x0, lo, hi = x0 + [L2_RATIO_STARTS[0]], lo + [1.0], hi + [4.0]
    # r's bound has no gradient where it does not bind, so the fit would keep any start that
    # never binds: start it at a few ratios and keep the lowest loss on the fit rows.
    starts = [x0] + [x0[:-1] + [r] for r in L2_RATIO_STARTS[1:]] if has_l2 else [x0]
    if name.startswith("sparse_verify"):
        # Three bounds compete for a sparse verification call (HBM bytes, the L2-to-SM path,
        # the K/V chain) and the start's byte efficiency decides which one the fit lets bind
        # on which rows: start it at a few efficiencies too.
        starts += [
            [x[0], *[e] * k, *x[1 + k :]] for x in list(starts) for e in BYTES_EFF_STARTS[1:]
        ]
    sols = [
        least_squares(
            resid, x, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, x_scale="jac", max_nfev=4000
        )
        for x in starts
    ]
    return unpack(min(sols, key=lambda s: s.cost).x)
