"""The least-squares fit of one op class of the calibrated model (``perfmodel.class_fit``) on
its fit rows (``calibration.features``), as ``calibration.fit`` runs it per class.

``fit_class`` minimises the soft-L1 loss of log(predicted / measured) over the class's
parameters: t0, the efficiency knots in bytes and FLOPs, and the L2-miss share, L2 throughput
ratio, serial-chain, merge, row and stage latencies and overlap exponent its rows' counts call
for (``_layout``).
Deterministic: no random starts; the classes whose optimum depends on the start (sparse
verification, NSA, dense verification, repair) are solved from a few fixed starts each, keeping
the lowest loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import least_squares
from ssvkit.calibration.features import Data, class_data
from ssvkit.calibration.row_work import is_plan_priced
from ssvkit.perfmodel.class_fit import CallInputs, ClassFit
from ssvkit.perfmodel.hardware import GpuSpec

L2_RATIO_STARTS = (1.2, 1.6, 2.0, 2.5, 3.0)  # starts of the L2 throughput ratio r (``fit_class``)
L2_RATIO_OPS = ("sparse_verify", "repair")  # classes fitted with the L2 throughput ratio r
# The byte efficiency of a class with the L2 path (``L2_RATIO_OPS``) is at most what a
# read-only stream reaches over the copy rate: two programs an SM of a read-only kernel stream
# 4.61 TB/s on the H200, whose copy runs 4.21 TB/s in the same run
# (``validation/data/sm-streams-h200.json``). Its memory term counts the bytes that reach HBM
# (the distinct ones and the repeats that miss L2); above that ceiling the fit would price the
# repeats that hit L2 as HBM bytes, which follow the copy rate on another GPU, in place of the
# L2-to-SM path, which follows the GEMM rate: fitted so on the H200, the per-query sparse class
# priced the H100's L2-bound calls 23% high (median).
HBM_READ_EFF_MAX = 1.095
# Chain tiles priced by their rows (t_kr).
DEPTH_ROW_OPS = ("nsa_verify", "sparse_verify", "dense_verify", "select_blocks")
DEPTH_MISS_OPS = ("repair",)  # chain tiles priced by their bytes' L2 misses (t_km)
# Efficiencies as constants: knots in a call's bytes let the fit shape the latency regime of the
# geometries it saw into a size curve, which other geometries' calls of like size do not follow
# (one head geometry left out, median / p90 error with six knots against constants: H100 40 / 44%
# against 11 / 23%, H200 4.8 / 15.1% against 3.8 / 14.7%).
CONSTANT_EFFICIENCY_OPS = ("dense_verify",)
# The launch-plan classes whose fixed costs and chain trade against each other: fitted in units
# of their parameters' upper bounds, from several starts of the latency terms (t_k, t_s, t_r,
# t_kr, t_km; shares of their bounds), the lowest loss kept. In seconds the solver stopped
# where a 1e-9 s rate no longer moved beside an efficiency of 1, and a 1e-12 change of the
# bandwidth moved the H200 dense fit's predictions by 5%; now by 2e-7.
LATENCY_STARTS = (0.03, 0.1, 0.3, 0.5, 0.9)
MULTI_START_OPS = ("dense_verify", "repair")
BYTES_EFF_STARTS = (0.7, 0.4, 1.0)  # starts of sparse verification's byte efficiencies
# NSA's compute bound (its padded row tiles' MMAs, ``perfmodel.nsa_work``) has no gradient where
# it does not bind, and at the first start's FLOP efficiency it binds nowhere: start it low too.
FLOPS_EFF_STARTS = (0.6, 0.15)
FLOPS_EFF_OPS = ("nsa_verify",)
# For the same reason a FLOP knot that no row's compute bound reaches can fall to its lower
# bound, and a call of that size elsewhere (another GPU's, another geometry's) turns compute-bound
# at 1% of the GEMM rate: the H200's refresh/unfused fit priced the H100's 8 q / 2 KV heads calls
# of 2-3e8 FLOPs at 2x. A class of the current kernels' launch plan takes the running maximum
# of its knots: a larger MMA workload runs at no lower a share of the GEMM rate than a smaller
# one. (The H100 profile of record's split-plan NSA classes keep their fit.)
MONOTONE_FLOPS_OPS = ("nsa_verify",)
# Sparse verification: two knots; its launch plan's counts (chain, waves, merge, row tile) carry
# what changes with size and geometry, and a finer curve in total bytes, fitted on one
# geometry's sizes, misprices another's.
TWO_KNOT_OPS = ("sparse_verify",)
# The classes whose chain, memory and compute bounds combine as a fitted p-norm
# (``ClassFit.overlap_p``), from p = 4 within [1, 32] (1: no overlap, their sum; 32: within 3.5%
# of their maximum). NSA's row tiles walk, stream and compute alike at batch 16, where the
# maximum prices the packed tiles low and the row schedules high: with p the H200 NSA classes'
# held-out error falls from 6.8 / 23.1% (median / p90) to 5.8 / 20.7%, one head geometry left
# out from 8.1 / 22.3% to 7.8 / 21.9%. Sparse verification and repair fit worse with a p-norm
# (their held-out and head-set p90 rise), dense verification and selection about alike: they
# keep the maximum. Only classes fitted on their launch plan's counts (``_layout``).
OVERLAP_OPS = ("nsa_verify",)
OVERLAP_P_START, OVERLAP_P_BOUNDS = 4.0, (1.0, 32.0)


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


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """Where each parameter of one class's fit sits in the solver's vector: t0, ``k`` byte and
    ``k`` FLOP efficiencies, the optional latencies the class fits (``at``), one rate per stage
    count, the overlap exponent p (``has_p``), and the L2 throughput ratio r last."""

    name: str
    k: int
    bytes_knots: tuple[float, ...]
    flops_knots: tuple[float, ...]
    # Indices of h, t_k, t_s, t_r, t_kr and t_km (None: not fitted).
    at: tuple[int | None, ...]
    n_stage: int
    has_l2: bool
    plan: bool
    bytes_per_flop: float  # the GPU's BW / PEAK: r over BW -> r_p over PEAK
    has_p: bool = False

    @property
    def n_eff(self) -> int:
        return 1 + 2 * self.k

    @property
    def n_lat(self) -> int:
        return self.n_eff + sum(i is not None for i in self.at)

    @property
    def has_h(self) -> bool:
        return self.at[0] is not None

    def _flops_eff(self, knots: list[float]) -> tuple[float, ...]:
        """The FLOP efficiencies of the knots' values (a launch-plan class of
        ``MONOTONE_FLOPS_OPS``: their running maximum)."""
        if not self.plan or self.name.split("/")[0] not in MONOTONE_FLOPS_OPS:
            return tuple(knots)
        return tuple(float(e) for e in np.maximum.accumulate(knots))

    def unpack(self, x: np.ndarray) -> ClassFit:
        v = x.tolist()
        k, n_lat = self.k, self.n_lat
        i_h, i_depth, i_step, i_row, i_depth_row, i_depth_miss = self.at

        def opt(i):
            return 0.0 if i is None else v[i]

        return ClassFit(
            self.name,
            v[0],
            self.bytes_knots,
            tuple(v[1 : 1 + k]),
            self.flops_knots,
            self._flops_eff(v[1 + k : 1 + 2 * k]),
            None if i_h is None else v[i_h],
            t_depth_s=opt(i_depth),
            t_step_s=opt(i_step),
            t_row_s=opt(i_row),
            t_stage_s=tuple(v[n_lat : n_lat + self.n_stage]),
            overlap_p=v[n_lat + self.n_stage] if self.has_p else 0.0,
            l2_bytes_per_flop=v[n_lat + self.n_stage + self.has_p] * self.bytes_per_flop
            if self.has_l2
            else 0.0,
            t_depth_row_s=opt(i_depth_row),
            t_depth_miss_s=opt(i_depth_miss),
            slot_plan=self.plan,
        )


def fit_class(name: str, rows: list[dict], bw: float, peak: float, gpu: GpuSpec) -> ClassFit:
    """Least-squares fit of one class on its fit rows.

    Per class, minimise the soft-L1 loss of log(predicted / measured) over t0, the efficiency
    knots (K = 2..6 evenly spaced in log10 bytes and log10 FLOPs over the class's fit rows, K
    from the row count; two for sparse verification, one constant pair for dense
    verification), for sparse verification and repair the L2-miss share h and the L2
    throughput ratio r (``perfmodel.class_fit``: requested bytes / (r BW) bound the call beside
    the HBM bytes; bounded to [1, 4]; kept as r BW / PEAK, the path's throughput over the GEMM
    rate), for a dense call's row tiles of one KV head the share h
    alone, for GEMMs, NSA, sparse verification, block selection, dense verification, repair,
    the KV write and sampling the latency t_k of a serial chain (a GEMM's K; the key tiles a
    program walks times its waves, from the launch plans of ``perfmodel.nsa_work``,
    ``perfmodel.sparse_work``, ``perfmodel.select_work``, ``perfmodel.dense_work``,
    ``perfmodel.repair_work``; the elements a KV-write thread stores in series,
    ``perfmodel.torch_plan``; the vocabulary a sampling row walks), for NSA, sparse and dense
    verification the latency t_s of a merge step (the serial walk over split partials), t_r of
    a row-tile row and t_kr of a chain tile's row, for repair t_km of a chain tile's bytes that
    miss L2, and the rates t_x of the stage counts (block selection's top-n stage; NSA's and
    repair's program waves; sparse verification's waves, row waves, tiles an SM and a union
    plan's compares; a dense call's merge launch and tail bytes), and for NSA of the slot plan
    the exponent p of its bounds' p-norm (``OVERLAP_OPS``).

    The starts (``_starts``): sparse verification's from a few byte efficiencies and, with
    repair's, L2 ratios; NSA's from a few FLOP efficiencies; dense verification's and repair's
    from a few shares of their latency bounds. The lowest loss is kept (``_solve``)."""
    d = class_data(name, rows, gpu)
    op = name.split("/")[0]
    layout = _layout(name, d, rows, bw / peak)
    calls = CallInputs.of(d.nbytes, d.flops, d.dedup, d.depth, d.steps, d.rows, d.stages)
    log_seconds = np.log(d.seconds)

    def resid(x):
        return np.log(layout.unpack(x).time_of(calls, bw, peak)) - log_seconds

    x0, lo, hi, bounds = _first_start(d, layout, stage_caps(op, gpu.num_sms / bw))
    starts = _starts(op, x0, bounds, layout)
    return layout.unpack(_solve(resid, starts, lo, hi, scaled=op in MULTI_START_OPS))


def _layout(name: str, d: Data, rows: list[dict], bytes_per_flop: float) -> _Layout:
    """The parameters ``name`` fits on its rows' quantities ``d`` (``class_data``)."""
    op = name.split("/")[0]
    if op in CONSTANT_EFFICIENCY_OPS:
        k = 1
    else:
        k = 2 if op in TWO_KNOT_OPS else int(np.clip(len(rows) // 8, 2, 6))
    bk, fk = _knots(d.nbytes, k), _knots(d.flops, k)
    has_h = d.dedup is not None
    # The L2 throughput bound r only where a call's programs re-read each other's blocks
    # (sparse verification's overlapping selections, repair's rows of one KV head).
    has_l2 = has_h and op in L2_RATIO_OPS
    has_depth = bool(d.depth.any())
    has_steps = bool(d.steps.any())
    has_rows = bool(d.rows.any())
    # A chain whose tiles cost by the rows they compute: the slot-planned NSA calls', sparse
    # verification's (``perfmodel.sparse_work``), dense's.
    has_depth_row = has_depth and has_rows and op in DEPTH_ROW_OPS
    # A chain whose tiles wait longer for the bytes that miss L2: repair's.
    has_depth_miss = has_depth and has_h and op in DEPTH_MISS_OPS
    # Fitted on the kernels' launch-plan counts: the step model prices it with its op's plan.
    plan = all(is_plan_priced(r) for r in rows)
    flags = (has_h, has_depth, has_steps, has_rows, has_depth_row, has_depth_miss)
    at, slot = [], 1 + 2 * k
    for on in flags:
        at.append(slot if on else None)
        slot += on
    # The p-norm combines the launch plan's chain, bytes and MMA work; the NSA rows of the
    # split-plan kernels (the committed H100 rows) count no chain of their own plan.
    has_p = op in OVERLAP_OPS and plan
    return _Layout(name, k, bk, fk, tuple(at), len(d.stages), has_l2, plan, bytes_per_flop, has_p)


def stage_caps(op: str, sm_share_s_per_byte: float) -> tuple[float | None, ...]:
    """Upper bounds of an op's stage rates beside their latency bounds (None: that bound
    alone): a dense call's tail bytes stream at least at an SM's even share of HBM, so their
    rate is at most ``sm_share_s_per_byte`` (the GPU's SMs over its copy rate). Unbounded, a
    fit on one head geometry's rows gives the tail what other terms miss there, which another
    geometry does not share."""
    return (None, sm_share_s_per_byte) if op == "dense_verify" else ()


def _first_start(
    d: Data, layout: _Layout, caps: tuple[float | None, ...] = ()
) -> tuple[list, list, list, list[float]]:
    """The first start, the lower and the upper bounds of the parameters (in ``layout``'s
    order), and the upper bounds of the optional latencies after h; a stage rate is at most
    its latency bound and its cap in ``caps``, where one is given."""
    k = layout.k
    x0 = [0.3 * d.seconds.min()] + [BYTES_EFF_STARTS[0]] * k + [FLOPS_EFF_STARTS[0]] * k
    lo = [0.0] + [0.01] * k + [0.01] * k
    eff_hi = HBM_READ_EFF_MAX if layout.has_l2 else 4.0
    hi = [d.seconds.min()] + [eff_hi] * k + [1.5] * k
    if layout.has_h:
        x0, lo, hi = x0 + [0.5], lo + [0.0], hi + [1.0]
    # The counts of t_k, t_s, t_r, t_kr and t_km.
    latency_counts = (d.depth, d.steps, d.rows, d.depth * d.rows, d.depth)
    bounds = [
        _latency_bound(d.seconds, count)
        for i, count in zip(layout.at[1:], latency_counts, strict=True)
        if i is not None
    ]
    x0, lo, hi = x0 + [0.3 * b for b in bounds], lo + [0.0] * len(bounds), hi + bounds
    for i, count in enumerate(d.stages):
        stage_hi = _latency_bound(d.seconds, count)
        if i < len(caps) and caps[i] is not None:
            stage_hi = min(stage_hi, caps[i])
        x0, lo, hi = x0 + [0.1 * stage_hi], lo + [0.0], hi + [stage_hi]
    if layout.has_p:
        x0, lo, hi = x0 + [OVERLAP_P_START], lo + [OVERLAP_P_BOUNDS[0]], hi + [OVERLAP_P_BOUNDS[1]]
    if layout.has_l2:  # last: the starts below replace the last parameter
        x0, lo, hi = x0 + [L2_RATIO_STARTS[0]], lo + [1.0], hi + [4.0]
    return x0, lo, hi, bounds


def _starts(op: str, x0: list, bounds: list[float], layout: _Layout) -> list[list]:
    """The solver's starts: ``x0`` and its variants in the parameters whose start decides
    where the fit ends (r, the byte and FLOP efficiencies, the latencies of
    ``MULTI_START_OPS``)."""
    k = layout.k
    # r's bound has no gradient where it does not bind, so the fit would keep any start that
    # never binds: start it at a few ratios and keep the lowest loss on the fit rows.
    starts = [x0] + [x0[:-1] + [r] for r in L2_RATIO_STARTS[1:]] if layout.has_l2 else [x0]
    if op == "sparse_verify":
        # Three bounds compete for a sparse verification call (HBM bytes, the L2-to-SM path,
        # the K/V chain) and the start's byte efficiency decides which one the fit lets bind
        # on which rows: start it at a few efficiencies too.
        starts += [
            [x[0], *[e] * k, *x[1 + k :]] for x in list(starts) for e in BYTES_EFF_STARTS[1:]
        ]
    if op in FLOPS_EFF_OPS:
        starts += [
            [*x[: 1 + k], *[e] * k, *x[1 + 2 * k :]]
            for x in list(starts)
            for e in FLOPS_EFF_STARTS[1:]
        ]
    if op in MULTI_START_OPS:
        first = layout.n_eff + layout.has_h
        starts = [
            x[:first] + [share * b for b in bounds] + x[layout.n_lat :]
            for share in LATENCY_STARTS
            for x in starts
        ]
    return starts


def _solve(resid, starts, lo, hi, *, scaled: bool) -> np.ndarray:
    """The parameters of the lowest soft-L1 loss over ``starts`` within ``[lo, hi]``; with
    ``scaled``, solved in units of ``hi`` (``MULTI_START_OPS``)."""
    unit = np.array(hi, dtype=float) if scaled else np.ones(len(hi))
    kw = {} if scaled else {"x_scale": "jac"}
    sols = [
        least_squares(
            lambda z: resid(z * unit),
            np.array(x) / unit,
            bounds=(np.array(lo) / unit, np.array(hi) / unit),
            loss="soft_l1",
            f_scale=0.05,
            max_nfev=4000,
            **kw,
        )
        for x in starts
    ]
    return min(sols, key=lambda s: s.cost).x * unit
