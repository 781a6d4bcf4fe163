"""Capacity: how many GPUs serve R requests/s under TTFT/TPOT SLOs, from simulated serving.

For one cell (model, GPU, TP degree, context, acceptance, overlap, KV bytes) and strategy, a
*replica* is ``tp`` GPUs running the simulator's serving scenario (``sim.serving``: Poisson
arrivals, continuous batching under the KV capacity, prefill first). ``search`` finds the
largest arrival rate r* at which at least ``attainment`` of ``num_requests`` requests meet both
SLOs, by bisection below the saturation rate.

Then ``replicas = ceil(R / r*)`` and ``gpus = replicas * tp``. Assumes replicas are independent
(data parallel) and a load balancer splits the Poisson stream evenly (a random split of a
Poisson process is Poisson); one seed, so the arrival pattern scales exactly with the rate
(the search is deterministic). Ignores the warm-up bias of a finite run and prefix caching.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.strategy import Workload, check_feasible
from ssvkit.sweep.partition import cached_model, kv_capacity
from ssvkit.sweep.spec import CapacitySpec, SweepSpec, SweepStrategy

LOW_LOAD_FRACTION = 1 / 64
STATUSES = ("slo_bound", "throughput_bound", "slo_unattainable", "does_not_fit", "infeasible")


@dataclass(frozen=True, slots=True)
class CapacityTask:
    """One rate search: a cell and a strategy."""

    model: str
    gpu: str
    roofline: bool
    any_architecture: bool
    tp: int
    context_len: int
    acceptance: float
    overlap: float
    kv_bytes: int
    strategy: SweepStrategy
    spec: CapacitySpec


def capacity_tasks(spec: SweepSpec) -> list[CapacityTask]:
    """Every (cell, strategy) of the sweep's capacity search; batch is the server's business."""
    cap = spec.capacity
    wanted = set(cap.strategies) if cap.strategies else None
    strategies = [s for s in spec.strategies if wanted is None or s.label in wanted]
    cells = itertools.product(
        spec.models,
        spec.gpus,
        spec.tp,
        spec.context_len,
        spec.acceptance,
        spec.overlap,
        spec.kv_bytes,
        strategies,
    )
    out = [
        CapacityTask(m, g, spec.roofline, spec.any_architecture, tp, ctx, acc, ov, kv, s, cap)
        for m, g, tp, ctx, acc, ov, kv, s in cells
    ]
    if len(out) > cap.max_cells:
        raise ValueError(
            f"the capacity search covers {len(out)} (cell, strategy) pairs, more than "
            f"capacity.max_cells={cap.max_cells} (each takes ~{cap.iterations + 3} serving "
            "runs): narrow the grid, name capacity strategies, or raise max_cells"
        )
    return out


def _serve(t: CapacityTask, rate: float):
    from ssvkit.sim.config import ServeConfig, SimConfig
    from ssvkit.sim.scenarios import simulate

    c = t.spec
    cfg = SimConfig(
        scenario="serve",
        model=t.model,
        gpu=t.gpu,
        roofline=t.roofline,
        any_architecture=t.any_architecture,
        strategy=t.strategy.strategy,
        context_len=t.context_len,
        num_tokens=c.output_tokens,
        num_requests=c.num_requests,
        tp=t.tp,
        kv_bytes=t.kv_bytes,
        acceptance=t.acceptance,
        overlap=t.overlap,
        seed=c.seed,
        timeline_rounds=0,
        serve=ServeConfig(
            rate=rate, max_batch=c.max_batch, slo_ttft_s=c.slo_ttft_s, slo_tpot_s=c.slo_tpot_s
        ),
    )
    return simulate(cfg).figures


def search(t: CapacityTask) -> dict:
    """The rate search of one task: ``replica_requests_per_s`` (r*),
    ``replica_saturation_requests_per_s`` (mu), ``attainment_at_max``, ``simulations``,
    ``status`` (``STATUSES``) and ``provenance``.

    r* is the largest arrival rate at which at least ``attainment`` of ``num_requests``
    requests meet both SLOs:

    1. saturation rate mu: every request arrives at once; mu = requests / makespan;
    2. if the SLOs hold at mu, r* = mu (``throughput_bound``); if they fail at mu / 64
       (``LOW_LOAD_FRACTION``), they are unattainable at any load (``slo_unattainable``,
       r* = 0: more replicas cannot lower one request's latency);
    3. otherwise (``slo_bound``) ``iterations`` bisection steps in log(rate) between the two;
       r* is the highest rate found to meet the SLOs.

    A strategy that cannot run the cell is ``infeasible``, one whose sequence does not fit the
    KV capacity ``does_not_fit`` (r* = 0, no simulation).
    """
    out = {
        "replica_requests_per_s": 0.0,
        "replica_saturation_requests_per_s": float("nan"),
        "attainment_at_max": float("nan"),
        "simulations": 0,
        "status": "slo_bound",
        "provenance": "",
    }
    model = cached_model(t.model)
    try:
        check_feasible(t.strategy.strategy, Workload(context_len=t.context_len, tp=t.tp), model)
    except ValueError:
        return {**out, "status": "infeasible"}
    k = t.strategy.strategy.num_draft_tokens(t.acceptance)
    need = t.context_len + t.spec.output_tokens + k + 1
    if need > kv_capacity(t.model, t.gpu, t.roofline, t.tp, t.kv_bytes):
        return {**out, "status": "does_not_fit"}
    n = t.spec.num_requests

    def attained(rate):
        figs = _serve(t, rate)
        out["simulations"] += 1
        out["provenance"] = figs["slo_met"]["provenance"]
        return figs["slo_met"]["value"] / n, figs

    _, figs = attained(1e9)
    mu = n / figs["simulated_time_s"]["value"]
    out["replica_saturation_requests_per_s"] = mu
    hi_att, _ = attained(mu)
    if hi_att >= t.spec.attainment:
        return {
            **out,
            "replica_requests_per_s": mu,
            "attainment_at_max": hi_att,
            "status": "throughput_bound",
        }
    lo = mu * LOW_LOAD_FRACTION
    lo_att, _ = attained(lo)
    if lo_att < t.spec.attainment:
        return {**out, "attainment_at_max": lo_att, "status": "slo_unattainable"}
    hi = mu
    for _ in range(t.spec.iterations):
        mid = math.sqrt(lo * hi)
        att, _ = attained(mid)
        if att >= t.spec.attainment:
            lo, lo_att = mid, att
        else:
            hi = mid
    return {**out, "replica_requests_per_s": lo, "attainment_at_max": lo_att}


def capacity_table(tasks: list[CapacityTask], results: list[dict]) -> dict[str, np.ndarray]:
    """One row per (task, requested rate R): replicas and GPUs needed, and ``best``: the fewest
    GPUs for that R among all TP degrees and strategies of the same model, GPU, context,
    acceptance, overlap and KV bytes (ties: higher r*, then grid order)."""
    rows = [
        _capacity_row(t, r, rate)
        for t, r in zip(tasks, results, strict=True)
        for rate in t.spec.rates
    ]
    best = _fewest_gpus(rows)
    for i, row in enumerate(rows):
        row["best"] = i in best
    names = list(rows[0]) if rows else []
    return {k: _column([row[k] for row in rows]) for k in names}


def _capacity_row(t: CapacityTask, r: dict, rate: float) -> dict:
    """The row of task ``t`` with search result ``r`` sized for ``rate`` requests/s."""
    rstar = r["replica_requests_per_s"]
    replicas = math.ceil(rate / rstar - 1e-9) if rstar > 0 else float("nan")
    return {
        "model": t.model,
        "gpu": t.gpu,
        "tp": t.tp,
        "context_len": t.context_len,
        "acceptance": t.acceptance,
        "overlap": t.overlap,
        "kv_bytes": t.kv_bytes,
        "strategy": t.strategy.label,
        "base": t.strategy.base,
        "requests_per_s": float(rate),
        "replica_requests_per_s": rstar,
        "replica_saturation_requests_per_s": r["replica_saturation_requests_per_s"],
        "attainment_at_max": r["attainment_at_max"],
        "replicas": float(replicas),
        "gpus_needed": float(replicas * t.tp) if rstar > 0 else float("nan"),
        "status": r["status"],
        "slo_ttft_s": t.spec.slo_ttft_s,
        "slo_tpot_s": t.spec.slo_tpot_s,
        "attainment": t.spec.attainment,
        "num_requests": t.spec.num_requests,
        "output_tokens": t.spec.output_tokens,
        "simulations": r["simulations"],
        "provenance": r["provenance"],
    }


def _fewest_gpus(rows: list[dict]) -> set[int]:
    """The indices of the rows that need the fewest GPUs for their rate in their cell (model,
    GPU, context, acceptance, overlap, KV bytes); ties: higher r*, then the first row."""
    cell = ("model", "gpu", "context_len", "acceptance", "overlap", "kv_bytes", "requests_per_s")
    best_of: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        if not row["gpus_needed"] > 0:
            continue
        key = tuple(row[k] for k in cell)
        j = best_of.get(key)
        if j is None or (row["gpus_needed"], -row["replica_requests_per_s"]) < (
            rows[j]["gpus_needed"],
            -rows[j]["replica_requests_per_s"],
        ):
            best_of[key] = i
    return set(best_of.values())


def _column(values: list) -> np.ndarray:
    if values and all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=float)
    return np.array(values, dtype=object)
