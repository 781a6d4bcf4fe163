"""What every simulator scenario builds first, and what each hands back to ``simulate``.

``setup`` turns a ``SimConfig`` into cost tables, the resolved strategy, seeded random streams
and the replayed trace (``Setup``); a scenario's runner (``sim.scenarios.RUNNERS``) decodes with
them and returns a ``ScenarioRun``. The helpers here (acceptance, per-layer overlap processes,
request records, the analytic point) are shared by the loop, PRR, SSD, SparseSpec and serving
scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.costs import kv_capacity_tokens
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload
from ssvkit.perfmodel.trace import read_trace
from ssvkit.sim.acceptance import build_acceptance
from ssvkit.sim.config import BATCH_SCENARIOS, SimConfig
from ssvkit.sim.overlap import LayerValues
from ssvkit.sim.progress import Progress
from ssvkit.sim.recorder import Recorder, RequestRecord
from ssvkit.sim.tables import CostContext
from ssvkit.sim.workload import lengths, streams


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    """What a scenario's runner hands back: the recorder and lanes of its timeline, the tokens
    it decoded in ``simulated_s`` of simulated time and ``wall_s`` of wall time, perfmodel's
    analytic tokens/s for the same workload with its provenance and (where the scenario gives
    one) its interval (``perfmodel.intervals``), and the scenario's own figures (``figure``
    dicts)."""

    recorder: Recorder
    lanes: tuple[str, ...]
    tokens: int
    simulated_s: float
    wall_s: float
    analytic_tokens_per_s: float
    analytic_provenance: str
    extras: dict[str, dict] = field(default_factory=dict)
    analytic_interval: list[float] | None = None


@dataclass(slots=True)
class Setup:
    """What every scenario builds first."""

    cfg: SimConfig
    ctx: CostContext
    strategy: Strategy
    parents: tuple[int, ...]
    seeds: dict
    trace: object
    sim_provenance: str
    progress: Progress | None = None


def setup(cfg: SimConfig, progress: bool = False) -> Setup:
    ctx = CostContext.build(
        cfg.model,
        cfg.gpu,
        cfg.tp,
        cfg.kv_bytes,
        cfg.acceptance,
        roofline=cfg.roofline,
        any_architecture=cfg.any_architecture,
        elementwise=cfg.elementwise,
        loop=cfg.loop,
    )
    strategy = cfg.resolved_strategy
    ctx.check(strategy, cfg.context_len)
    if cfg.scenario in BATCH_SCENARIOS:
        check_batch_fits(cfg, ctx, len(strategy.parents(cfg.acceptance)))
    trace = read_trace(cfg.trace) if cfg.trace else None
    if trace is not None and trace.header["num_layers"] != ctx.model.num_layers:
        raise ValueError(
            f"trace has num_layers={trace.header['num_layers']} but {ctx.model.name} has "
            f"{ctx.model.num_layers}"
        )
    prov = f"sim:{cfg.scenario}:seed={cfg.seed};costs:{ctx.provenance}"
    if trace is not None:
        prov += f";replay:{trace.header.get('source', 'trace')}"
    return Setup(
        cfg,
        ctx,
        strategy,
        strategy.parents(cfg.acceptance),
        streams(cfg.seed),
        trace,
        prov,
        Progress(f"simulate {cfg.scenario}") if progress else None,
    )


def check_batch_fits(cfg: SimConfig, ctx: CostContext, num_draft: int) -> None:
    """A batch decoded together holds every sequence's KV to its last token: ``ValueError``
    when ``batch * (context_len + num_tokens + num_draft + 1)`` tokens exceed the KV capacity
    (``kv_capacity_tokens``, or what the GPUs' memory leaves beside the weights)."""
    capacity = cfg.kv_capacity_tokens or kv_capacity_tokens(
        ctx.model, ctx.gpu, cfg.tp, cfg.kv_bytes, cfg.memory_fraction
    )
    b = cfg.resolved_batch
    need = b * (cfg.context_len + cfg.num_tokens + num_draft + 1)
    if need > capacity:
        raise ValueError(
            f"batch {b} x (context {cfg.context_len} + {cfg.num_tokens} tokens + "
            f"{num_draft + 1} tail) needs {need:,} KV tokens; {cfg.tp} x {ctx.gpu.name} hold "
            f"{capacity:,} (kv_capacity_tokens)"
        )


def acceptance_for(s: Setup, parents=None):
    cfg = s.cfg
    return build_acceptance(
        cfg.acceptance_model,
        s.parents if parents is None else parents,
        cfg.acceptance,
        cfg.acceptance_table,
        s.trace,
    )


def layer_processes(s: Setup):
    """Per-layer group-overlap and cross-layer-overlap processes (fixed, Beta or replay)."""
    cfg, L = s.cfg, s.ctx.model.num_layers
    replay_g = s.trace.layer_column("group_overlap") if s.trace is not None else None
    replay_c = s.trace.layer_column("layer_overlap") if s.trace is not None else None
    g = LayerValues(
        L,
        cfg.overlap,
        cfg.overlap_spread,
        np.random.default_rng(s.seeds["group_overlap"]),
        replay_g,
        "overlap",
    )
    c = LayerValues(
        L,
        cfg.layer_overlap,
        cfg.overlap_spread,
        np.random.default_rng(s.seeds["layer_overlap"]),
        replay_c,
        "layer_overlap",
    )
    return g, c


def request_records(s: Setup, n: int, arrivals=None, prompts=None, outputs=None):
    cfg = s.cfg
    rng = np.random.default_rng(s.seeds["lengths"])
    if prompts is None:
        prompts = lengths(rng, cfg.context_len, cfg.length_spread, n)
        outputs = lengths(rng, cfg.num_tokens, cfg.length_spread, n)
    if arrivals is None:
        arrivals = np.zeros(n)
    return [
        RequestRecord(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)
    ]


def analytic_round(s: Setup, context_len: int, batch: int, strategy=None):
    """perfmodel's prediction (one point) for the scenario's strategy."""
    strategy = strategy or s.strategy
    w = Workload(
        context_len=int(context_len),
        batch=batch,
        tp=s.cfg.tp,
        acceptance=s.cfg.acceptance,
        overlap=s.cfg.overlap,
        kv_bytes=s.cfg.kv_bytes,
        elementwise=s.ctx.elementwise,
        loop=s.ctx.loop,
    )
    cols = build_columns(s.ctx.model, [(strategy, w)])
    pred = predict_columns(
        s.ctx.model, cols, make_predictor(s.ctx.gpu, "bf16", cols.tp), strategy.drafter
    )
    return pred
