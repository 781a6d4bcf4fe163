"""Scenarios: build the cost tables and processes of a ``SimConfig``, run them, summarise.

``simulate(config)`` is the one entry point: it returns a ``SimResult`` with the recorder (round
log, spans, requests) and the summary figures, each with its provenance. The analytic figure is
perfmodel's steady-state tokens/s for the same workload (strategy, model, GPU, batch, context at
the run's midpoint and the acceptance process's expected tokens per round).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import simpy

from perfmodel.calibrated import make_predictor
from perfmodel.costs import kv_capacity_tokens
from perfmodel.step import build_columns, predict_columns
from perfmodel.strategy import Strategy, Workload
from sim.acceptance import build_acceptance
from sim.config import BATCH_SCENARIOS, LOOP_SCENARIOS, SimConfig
from sim.loop import LANES, STEP_NAMES, DecodeLoop, Sequence
from sim.overlap import LayerValues
from sim.progress import Progress
from sim.recorder import Recorder, RequestRecord
from sim.tables import OVERLAP_GRID, CostContext, context_grid, loop_table, needs_overlap_axis
from sim.trace import make_header, read_trace
from sim.workload import generators, lengths, streams


def figure(value, unit: str, provenance: str) -> dict:
    return {"value": value, "unit": unit, "provenance": provenance}


@dataclass(slots=True)
class SimResult:
    """A finished run: its config, strategy, recorder, lanes and summary figures."""

    config: SimConfig
    strategy: Strategy
    recorder: Recorder
    lanes: tuple[str, ...]
    figures: dict[str, dict]
    trace_header: dict

    @property
    def requests(self) -> list[RequestRecord]:
        return self.recorder.requests


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
        cfg.model, cfg.gpu, cfg.tp, cfg.kv_bytes, cfg.acceptance, roofline=cfg.roofline
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
    )
    cols = build_columns(s.ctx.model, [(strategy, w)])
    pred = predict_columns(
        s.ctx.model, cols, make_predictor(s.ctx.gpu, "bf16", cols.tp), strategy.drafter
    )
    return pred


def run_loop(s: Setup):
    """ar_dense, ar_sparse, sd_dense, sd_sparse_naive and ssv."""
    cfg, ctx, strategy = s.cfg, s.ctx, s.strategy
    b = cfg.resolved_batch
    reqs = request_records(s, b)
    acc = acceptance_for(s)
    k = len(s.parents)
    hi = max(r.prompt_len + r.target_tokens for r in reqs) + k + 1
    lo = min(r.prompt_len for r in reqs)
    contexts = context_grid(lo, hi, cfg.context_bucket)
    g_proc, c_proc = layer_processes(s)
    varies = not g_proc.fixed
    overlaps = OVERLAP_GRID if needs_overlap_axis(strategy, varies) else [cfg.overlap]
    grid, levels = loop_table(ctx, strategy, contexts, b, overlaps)
    rec = Recorder(cfg.timeline_rounds, STEP_NAMES, requests=reqs, progress=s.progress)
    gens = generators(s.seeds["acceptance"], b)
    seqs = [Sequence(r, acc.sampler(g)) for r, g in zip(reqs, gens, strict=True)]
    env = simpy.Environment()
    loop = DecodeLoop(
        env,
        grid,
        levels,
        seqs,
        rec,
        strategy,
        k,
        ctx.model.num_layers,
        g_proc,
        c_proc,
        cfg.per_layer,
        cfg.loop_overhead_s,
    )
    env.process(loop.run())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    mid = int(round(np.mean([r.prompt_len + r.target_tokens / 2 for r in reqs])))
    pred = analytic_round(s, mid, b)
    round_s = float(pred.round_s[0]) + cfg.loop_overhead_s
    analytic = b * acc.expected_tokens() / round_s
    extras = {
        "expected_tokens_per_round": figure(acc.expected_tokens(), "tokens", f"model:{acc.name}"),
        "analytic_round_s": figure(round_s, "s", pred.provenance),
    }
    return rec, LANES, loop.tokens, env.now, wall, analytic, pred.provenance, extras


RUNNERS = {name: run_loop for name in LOOP_SCENARIOS}


def register(name: str):
    def deco(fn):
        RUNNERS[name] = fn
        return fn

    return deco


def simulate(cfg: SimConfig, progress: bool = False) -> SimResult:
    """Build and run the scenario of ``cfg``; deterministic for a given config and seed.
    ``progress`` shows a bar on a terminal's stderr while a long run goes (``sim.progress``)."""
    from sim import prr, serving, sparsespec, ssd  # noqa: F401  (register their scenarios)

    build0 = time.perf_counter()
    s = setup(cfg, progress)
    try:
        rec, lanes, tokens, sim_s, wall, analytic, aprov, extras = RUNNERS[cfg.scenario](s)
    finally:
        if s.progress is not None:
            s.progress.close()
    total_wall = time.perf_counter() - build0
    if sim_s <= 0:
        raise ValueError("the simulation produced no time (nothing to decode)")
    figures = {
        "simulated_tokens_per_s": figure(tokens / sim_s, "tokens/s", s.sim_provenance),
        "analytic_tokens_per_s": figure(analytic, "tokens/s", aprov),
        "rounds_per_wall_s": figure(
            rec.num_rounds / max(wall, 1e-9), "rounds/s", "measured:wall-clock"
        ),
        "simulated_time_s": figure(sim_s, "s", s.sim_provenance),
        "tokens": figure(tokens, "tokens", s.sim_provenance),
        "rounds": figure(rec.num_rounds, "rounds", s.sim_provenance),
        "wall_s": figure(total_wall, "s", "measured:wall-clock"),
    }
    figures.update(extras)
    header = make_header(
        f"sim:{cfg.scenario}",
        s.ctx.model.name,
        s.ctx.model.num_layers,
        {s.strategy.name: _strategy_doc(s.strategy)},
        gpu=s.ctx.gpu.name,
        seed=cfg.seed,
        provenance=s.ctx.provenance,
    )
    return SimResult(cfg, s.strategy, rec, lanes, figures, header)


def _strategy_doc(strategy: Strategy) -> dict:
    d = dataclasses.asdict(strategy)
    d["drafter"] = {k: v for k, v in d["drafter"].items() if v is not None}
    return d
