"""Run a sweep: partition the grid, evaluate the partitions on an executor, assemble one table.

``run_sweep(spec)`` returns a ``SweepResult`` whose ``table`` has one row per point in the
canonical grid order (``sweep.partition``), whatever the executor: the index columns (model,
GPU, strategy, base baseline, the workload axes, the strategy's fields), the analytic figures,
the speedups over ``ar_dense`` and ``ar_sparse`` of the same cell (those baselines are always
evaluated, and dropped again when the spec does not list them), ``tpot_s`` (seconds per output
token of one sequence), ``best`` (the highest tokens/s among the feasible strategies that fit
in memory, per cell), flags and ``provenance``. A cell is every column but the strategy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from ssvkit.perfmodel.intervals import LogBounds, interval
from ssvkit.perfmodel.strategy import BASELINES
from ssvkit.sim.progress import Progress
from ssvkit.sweep import capacity as cap
from ssvkit.sweep.executors import make_executor
from ssvkit.sweep.partition import (
    DEFAULT_PARTITION_POINTS,
    DEFAULT_SIM_PARTITION_POINTS,
    ROUND_BOUNDS,
    evaluate,
    partitions,
)
from ssvkit.sweep.spec import AXES, SweepSpec, SweepStrategy

ANCHORS = ("ar_dense", "ar_sparse")
STRATEGY_COLUMNS = (
    "tree",
    "attention",
    "mode",
    "group_size",
    "top_n",
    "block_size",
    "refresh_every",
    "fusion",
)


@dataclass(slots=True)
class SweepResult:
    """A finished sweep: the point table, the capacity table (or None) and run facts."""

    spec: SweepSpec
    table: dict[str, np.ndarray]
    capacity: dict[str, np.ndarray] | None
    facts: dict = field(default_factory=dict)

    @property
    def num_points(self) -> int:
        return len(self.table["tokens_per_s"])

    def to_pandas(self):
        from ssvkit.sweep.table import to_pandas

        return to_pandas(self.table)

    def capacity_frame(self):
        from ssvkit.sweep.table import to_pandas

        return None if self.capacity is None else to_pandas(self.capacity)

    def best(self) -> dict[str, np.ndarray]:
        """The rows flagged ``best`` (one per cell that has a runnable strategy)."""
        m = self.table["best"]
        return {k: v[m] for k, v in self.table.items()}


def grid_strategies(spec: SweepSpec) -> tuple[list[SweepStrategy], np.ndarray]:
    """The spec's strategies plus any missing anchor baselines, and which ones were asked for."""
    labels = {s.label for s in spec.strategies}
    extra = [SweepStrategy(a, BASELINES[a]) for a in ANCHORS if a not in labels]
    requested = np.array([True] * len(spec.strategies) + [False] * len(extra))
    return [*spec.strategies, *extra], requested


def _bar(label: str, total: int, unit: str, show: bool) -> Progress:
    """A progress bar over ``total`` ``unit``, drawn from the start when ``show`` (on a
    terminal or not: sweeps run in CI logs too), never otherwise."""
    bar = Progress(label, unit=unit, enabled=show, delay_s=0.0)
    bar.start(total)
    return bar


def plan(spec: SweepSpec, partition_points: int | None = None):
    """``(strategies, requested mask, partitions)`` of a run."""
    strategies, requested = grid_strategies(spec)
    if partition_points is None:
        partition_points = (
            DEFAULT_SIM_PARTITION_POINTS if spec.simulate is not None else DEFAULT_PARTITION_POINTS
        )
    return strategies, requested, partitions(spec, strategies, partition_points)


def run_sweep(
    spec: SweepSpec,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    partition_points: int | None = None,
    progress: bool = False,
    scheduler_timeout_s: float = 10.0,
) -> SweepResult:
    """Evaluate every point of ``spec`` (and its simulations and capacity search).

    ``scheduler``: a Dask scheduler address (``tcp://host:port``); else ``workers`` local
    processes (default: one per core; 1 runs in this process). ``partition_points`` sets the
    task size (default 5,000 points, 8 with simulation); results do not depend on the executor.
    """
    t0 = time.perf_counter()
    strategies, requested, parts = plan(spec, partition_points)
    cap_tasks = cap.capacity_tasks(spec) if spec.capacity is not None else []
    total = len(strategies) * spec.num_workload_points * len(spec.models) * len(spec.gpus)
    ex = make_executor(
        workers, scheduler, max(len(parts), len(cap_tasks)), timeout_s=scheduler_timeout_s
    )
    try:
        results: list = [None] * len(parts)
        bar = _bar("sweep", total, "points", progress)
        for i, res in ex.map(evaluate, parts):
            results[i] = res
            bar.advance(parts[i].num_points)
        bar.close()
        t_points = time.perf_counter() - t0
        cap_results: list = [None] * len(cap_tasks)
        if cap_tasks:
            bar = _bar("capacity", len(cap_tasks), "searches", progress)
            for i, res in ex.map(cap.search, cap_tasks):
                cap_results[i] = res
                bar.advance(1)
            bar.close()
    finally:
        ex.close()
    table = assemble(spec, strategies, requested, parts, results, total)
    capacity = cap.capacity_table(cap_tasks, cap_results) if cap_tasks else None
    elapsed = time.perf_counter() - t0
    facts = {
        "points": total // len(strategies) * int(requested.sum()),
        "evaluated_points": total,
        "partitions": len(parts),
        "capacity_searches": len(cap_tasks),
        "executor": ex.name,
        "points_s": t_points,
        "elapsed_s": elapsed,
        "provenance": sorted({r["provenance"] for r in results}),
    }
    return SweepResult(spec, table, capacity, facts)


def assemble(spec, strategies, requested, parts, results, total) -> dict[str, np.ndarray]:
    """Place partition results at their offsets, add index columns, speedups and ``best``."""
    metrics, prov = _place(parts, results, total)
    shape = (len(spec.models) * len(spec.gpus), len(strategies), spec.num_workload_points)
    sizes = [shape[0], shape[1]] + [len(getattr(spec, a)) for a in AXES]
    idx = np.indices(sizes).reshape(len(sizes), -1)
    table = _index_columns(spec, strategies, idx)
    grid = metrics["tokens_per_s"].reshape(shape)
    round_bounds = LogBounds(*(metrics.pop(k) for k in ROUND_BOUNDS))
    _add_speedups(table, grid, round_bounds, [s.label for s in strategies], idx, sizes)
    _add_rates(table, metrics)
    for k, v in metrics.items():
        if k not in table:
            table[k] = v
    keep = requested[idx[1]]
    ok = metrics["feasible"] & metrics["fits_memory"] & keep
    table["best"] = _best(metrics["tokens_per_s"], ok, shape)
    flagged = np.where(table["extrapolated"], prov + ":extrapolated", prov).astype(object)
    table["provenance"] = np.where(table["stand_in"], flagged + ":stand-in", flagged)
    if keep.all():
        return table
    return {k: v[keep] for k, v in table.items()}


def _place(parts, results, total) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The partitions' figures as whole columns, each result at its partition's offset, and
    the provenance column."""
    metrics: dict[str, np.ndarray] = {}
    prov = np.empty(total, dtype=object)
    for p, res in zip(parts, results, strict=True):
        sl = slice(p.start, p.start + p.num_points)
        for k, v in res.items():
            if k == "provenance":
                continue
            if k not in metrics:
                metrics[k] = np.empty(total, dtype=v.dtype)
            metrics[k][sl] = v
        prov[sl] = res["provenance"]
    return metrics, prov


def _index_columns(spec, strategies, idx) -> dict[str, np.ndarray]:
    """The columns that say what each point is: model, GPU, strategy and its base, the
    workload axes, the strategy's fields and its drafter (``idx``: each point's index on
    the (model x GPU, strategy, *AXES) grid)."""
    b_idx, s_idx = idx[0], idx[1]
    models = np.array([m for m in spec.models for _ in spec.gpus], dtype=object)
    gpus = np.array([g for _ in spec.models for g in spec.gpus], dtype=object)
    table: dict[str, np.ndarray] = {
        "model": models[b_idx],
        "gpu": gpus[b_idx],
        "strategy": np.array([s.label for s in strategies], dtype=object)[s_idx],
        "base": np.array([s.base for s in strategies], dtype=object)[s_idx],
    }
    for i, a in enumerate(AXES):
        values = np.array(getattr(spec, a))
        table[a] = values[idx[i + 2]]
    for name in STRATEGY_COLUMNS:
        values = np.array([getattr(s.strategy, name) for s in strategies])
        table[name] = values.astype(object)[s_idx] if values.dtype.kind == "U" else values[s_idx]
    table["drafter"] = np.array([s.strategy.drafter.kind for s in strategies], dtype=object)[s_idx]
    return table


def _add_speedups(table, grid, round_bounds, labels, idx, sizes) -> None:
    """``speedup_vs_<anchor>`` with its interval for each of ``ANCHORS``: tokens/s over the
    anchor's at the same model, GPU and workload (``grid``: tokens/s as [model x GPU,
    strategy, workload])."""
    b_idx, s_idx = idx[0], idx[1]
    for a in ANCHORS:
        ref = grid[:, labels.index(a), :][:, None, :]
        table[f"speedup_vs_{a}"] = (grid / ref).reshape(-1)
        # The anchor point of every point: same model, GPU and workload.
        anchor = np.ravel_multi_index(
            (b_idx, np.full_like(s_idx, labels.index(a)), *idx[2:]), sizes
        )
        iv = interval(
            table[f"speedup_vs_{a}"],
            over=round_bounds.take(anchor),
            under=round_bounds,
            same=s_idx == labels.index(a),
        )
        table[f"speedup_vs_{a}_low"], table[f"speedup_vs_{a}_high"] = iv[:, 0], iv[:, 1]


def _add_rates(table, metrics) -> None:
    """tokens/s, tokens/s per GPU and ``tpot_s``, with their intervals."""
    tps = metrics["tokens_per_s"]
    table["tokens_per_s"] = tps
    table["tokens_per_s_per_gpu"] = tps / table["tp"]
    table["tpot_s"] = metrics["round_s"] / metrics["tokens_per_round"]
    # tpot and per-GPU rate are the round and tokens/s scaled: their intervals scale alike
    for x in ("low", "high"):
        table[f"tpot_s_{x}"] = metrics[f"round_s_{x}"] / metrics["tokens_per_round"]
    for x in ("low", "high"):
        table[f"tokens_per_s_per_gpu_{x}"] = metrics[f"tokens_per_s_{x}"] / table["tp"]


def _best(tps, ok, shape) -> np.ndarray:
    """Per cell, the ``ok`` point with the highest tokens/s (``shape``: [model x GPU,
    strategy, workload])."""
    score = np.where(ok, tps, -np.inf).reshape(shape)
    winner = np.argmax(score, axis=1)  # [n_b, n_w]; ties keep the first strategy
    best = np.zeros(shape, dtype=bool)
    np.put_along_axis(best, winner[:, None, :], True, axis=1)
    return best.reshape(-1) & ok
