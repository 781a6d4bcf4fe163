"""Partitions of a sweep grid and their evaluation: the unit of work a worker runs.

The grid is laid out in one canonical order: models, then GPUs, then ``perfmodel.step
.product_columns``'s order (strategy, context, batch, tp, acceptance, overlap, kv_bytes). A
partition is a run of consecutive strategies (with one drafter) times the workload axes, or one
strategy times a run of consecutive contexts when a strategy alone exceeds the partition size;
either way its rows are one contiguous slice of the canonical order. Partitions are fixed by
the spec and ``partition_points`` alone (not by the number of workers), so every executor
evaluates exactly the same arrays and the results are identical to a serial run.

``evaluate`` needs only the partition: it rebuilds the model, GPU and predictor by name, so a
partition pickles to a few hundred bytes and a worker returns numpy arrays (no files).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.baselines import op_group
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.costs import kv_capacity_tokens
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.intervals import bounds, interval, uncovered_share
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.step import (
    StepPrediction,
    feasible_mask,
    predict_columns,
    product_columns,
)
from ssvkit.sweep.spec import AXES, SimulateSpec, SweepSpec, SweepStrategy

OP_GROUPS = ("gemm", "attention", "selection", "other", "draft", "loop")
# The figures whose intervals a sweep carries as <figure>_low and <figure>_high, and the round's
# interval in log form (``perfmodel.intervals.LogBounds``), which the runner's speedups combine
# and then drops.
INTERVAL_FIGURES = ("tokens_per_s", "round_s", "draft_s", "verify_s")
ROUND_BOUNDS = ("_round_log_centre", "_round_log_up2", "_round_log_down2")
DEFAULT_PARTITION_POINTS = 5000
DEFAULT_SIM_PARTITION_POINTS = 8


@dataclass(frozen=True, slots=True)
class Partition:
    """One task: a contiguous slice ``[start, start + num_points)`` of the canonical grid."""

    start: int
    model: str
    gpu: str
    roofline: bool
    any_architecture: bool
    strategies: tuple[SweepStrategy, ...]
    axes: tuple[tuple[str, tuple], ...]  # AXES order; contexts may be a sub-run
    simulate: SimulateSpec | None

    @property
    def num_points(self) -> int:
        return len(self.strategies) * math.prod(len(v) for _, v in self.axes)


def _drafter_key(s: SweepStrategy):
    """What ``predict_columns`` needs per call beyond the columns: the draft model and EAGLE's
    vocabulary. AR strategies draft nothing and fit any call."""
    return (s.strategy.drafter.model, s.strategy.drafter.draft_vocab) if s.speculative else None


def _runs(strategies: tuple[SweepStrategy, ...]) -> list[tuple[int, int]]:
    """``[start, stop)`` runs of consecutive strategies whose drafter keys agree."""
    runs, start, key = [], 0, None
    for i, s in enumerate(strategies):
        k = _drafter_key(s)
        if k is not None and key is not None and k != key:
            runs.append((start, i))
            start, key = i, None
        key = key if k is None else k
    runs.append((start, len(strategies)))
    return runs


def partitions(spec: SweepSpec, strategies, partition_points: int) -> list[Partition]:
    """The tasks of ``spec`` over ``strategies`` (the spec's plus any hidden anchors), in
    canonical order, each near ``partition_points`` points."""
    if partition_points < 1:
        raise ValueError(f"partition_points must be >= 1, got {partition_points}")
    strategies = tuple(strategies)
    axes = [(a, tuple(getattr(spec, a))) for a in AXES]
    n_w = math.prod(len(v) for _, v in axes)
    per_context = n_w // len(spec.context_len)
    out: list[Partition] = []
    start = 0
    for model in spec.models:
        for gpu in spec.gpus:
            block = start
            for lo, hi in _runs(strategies):
                if n_w >= partition_points:
                    step = max(1, partition_points // per_context)
                    for i in range(lo, hi):
                        for c0 in range(0, len(spec.context_len), step):
                            ctx = spec.context_len[c0 : c0 + step]
                            sub = [(a, ctx if a == "context_len" else v) for a, v in axes]
                            off = block + i * n_w + c0 * per_context
                            out.append(_part(off, model, gpu, spec, strategies[i : i + 1], sub))
                else:
                    step = max(1, partition_points // n_w)
                    for i in range(lo, hi, step):
                        chunk = strategies[i : min(i + step, hi)]
                        out.append(_part(block + i * n_w, model, gpu, spec, chunk, axes))
            start += len(strategies) * n_w
    return out


def _part(start, model, gpu, spec, strategies, axes) -> Partition:
    return Partition(
        start,
        model,
        gpu,
        spec.roofline,
        spec.any_architecture,
        tuple(strategies),
        tuple(axes),
        spec.simulate,
    )


@functools.lru_cache(maxsize=64)
def cached_model(name: str):
    return get_model(name)


@functools.lru_cache(maxsize=64)
def cached_gpu(name: str, roofline: bool, any_architecture: bool = False):
    return get_gpu(name, measured=not roofline, any_architecture=any_architecture)


@functools.lru_cache(maxsize=256)
def kv_capacity(model: str, gpu: str, roofline: bool, tp: int, kv_bytes: int) -> int:
    return kv_capacity_tokens(cached_model(model), cached_gpu(gpu, roofline), tp, kv_bytes)


def evaluate(p: Partition) -> dict[str, np.ndarray]:
    """Analytic figures of every point of ``p`` (and its DES run when ``p.simulate``).

    Returns arrays of ``p.num_points`` entries: tokens/s, round/draft/verify seconds, tokens per
    round, draft nodes, seconds/FLOPs/bytes per op group (``OP_GROUPS``), and the flags
    ``feasible`` (sparse selection fits the context, TP divides the heads), ``fits_memory``
    (weights plus ``batch (T + K + 1)`` KV tokens fit in 90% of ``tp`` GPUs' memory) and
    ``extrapolated`` (some op outside the calibrated range) and ``stand_in`` (some op priced by
    a stand-in class, ``perfmodel.calibrated``); the intervals of ``INTERVAL_FIGURES`` and the
    share of the round without residuals (``interval_figures``). Figures of infeasible points
    are NaN.
    """
    model, gpu = cached_model(p.model), cached_gpu(p.gpu, p.roofline, p.any_architecture)
    axes = dict(p.axes)
    cols = product_columns(model, [s.strategy for s in p.strategies], **axes)
    spec_strats = [s for s in p.strategies if s.speculative]
    drafter = spec_strats[0].strategy.drafter if spec_strats else None
    pred = predict_columns(model, cols, make_predictor(gpu, "bf16", cols.tp), drafter)
    n = len(cols)
    feasible = feasible_mask(cols) & ((cols.tp == 1) | (model.num_q_heads % cols.tp == 0))
    cap = np.zeros(n)
    for tp in np.unique(cols.tp):
        for kv in np.unique(cols.kv_bytes):
            m = (cols.tp == tp) & (cols.kv_bytes == kv)
            cap[m] = kv_capacity(p.model, p.gpu, p.roofline, int(tp), int(kv))
    need = cols.batch * (cols.context_len + cols.num_draft + 1)
    out = {
        "tokens_per_s": pred.tokens_per_s,
        "round_s": pred.round_s,
        "draft_s": pred.draft_s,
        "verify_s": pred.verify_s,
        "tokens_per_round": np.asarray(pred.tokens_per_round, dtype=float),
        "num_draft_tokens": cols.num_draft.astype(np.int64),
    }
    out.update(interval_figures(pred))
    for g in OP_GROUPS:
        for q in ("s", "flops", "bytes"):
            if f"{g}_{q}" not in out:  # draft_s is the step model's own total
                out[f"{g}_{q}"] = np.zeros(n)
    for name, secs in pred.op_seconds.items():
        g = op_group(name)
        op = pred.ops[name]
        if g != "draft":
            out[f"{g}_s"] += secs
        out[f"{g}_flops"] += np.broadcast_to(op.flops, (n,))
        out[f"{g}_bytes"] += np.broadcast_to(op.bytes, (n,))
    for k, v in out.items():
        if v.dtype.kind == "f":
            out[k] = np.where(feasible, v, np.nan)
    out["feasible"] = feasible
    out["fits_memory"] = need <= cap
    out["extrapolated"] = np.asarray(pred.extrapolated, dtype=bool) & feasible
    out["stand_in"] = np.asarray(pred.stand_in, dtype=bool) & feasible
    out["provenance"] = pred.provenance
    if p.simulate is not None:
        # The simulated run grows every sequence by num_tokens: those points must fit too.
        grown = need + cols.batch * p.simulate.num_tokens
        out.update(_simulate(p, cols, feasible & (grown <= cap)))
    return out


def interval_figures(pred: StepPrediction) -> dict[str, np.ndarray]:
    """``<figure>_low`` and ``<figure>_high`` of ``INTERVAL_FIGURES``, ``uncovered_share``, and
    the round's ``ROUND_BOUNDS``; NaN without residuals (the roofline)."""
    n = len(pred.round_s)
    parts = {f: pred.spread(prefix=f.removesuffix("_s") + ".") for f in ("draft_s", "verify_s")}
    if parts["draft_s"] is None:
        nan = np.full(n, np.nan)
        names = [f"{f}_{x}" for f in INTERVAL_FIGURES for x in ("low", "high")]
        return {k: nan.copy() for k in (*names, "uncovered_share", *ROUND_BOUNDS)}
    rnd = pred.spread()  # draft, verify and the loop's host time
    rb = bounds(rnd)
    ivs = {
        "tokens_per_s": interval(pred.tokens_per_s, under=rb),
        "round_s": interval(pred.round_s, over=rb),
    }
    for f, sp in parts.items():
        ivs[f] = interval(getattr(pred, f), over=bounds(sp))
    out = {}
    for f in INTERVAL_FIGURES:
        out[f"{f}_low"], out[f"{f}_high"] = ivs[f][:, 0], ivs[f][:, 1]
    out["uncovered_share"] = np.asarray(uncovered_share(rnd), dtype=float)
    for k, v in zip(ROUND_BOUNDS, (rb.centre, rb.up2, rb.down2), strict=True):
        out[k] = v
    return out


def _simulate(p: Partition, cols, run: np.ndarray) -> dict[str, np.ndarray]:
    """One ``sim.scenarios.simulate`` run of the base loop per runnable point."""
    from ssvkit.sim.config import SimConfig
    from ssvkit.sim.scenarios import simulate

    n = len(cols)
    tps = np.full(n, np.nan)
    prov = np.full(n, "", dtype=object)
    per_strategy = n // len(p.strategies)
    for i in np.flatnonzero(run):
        s = p.strategies[i // per_strategy]
        cfg = SimConfig(
            scenario=s.base,
            model=p.model,
            gpu=p.gpu,
            roofline=p.roofline,
            any_architecture=p.any_architecture,
            strategy=s.strategy,
            context_len=int(cols.context_len[i]),
            num_tokens=p.simulate.num_tokens,
            batch=int(cols.batch[i]),
            tp=int(cols.tp[i]),
            kv_bytes=int(cols.kv_bytes[i]),
            acceptance=float(cols.acceptance[i]),
            overlap=float(cols.overlap[i]),
            seed=p.simulate.seed,
            timeline_rounds=0,
        )
        fig = simulate(cfg).figures["simulated_tokens_per_s"]
        tps[i] = fig["value"]
        prov[i] = fig["provenance"]
    return {"sim_tokens_per_s": tps, "sim_provenance": prov}
