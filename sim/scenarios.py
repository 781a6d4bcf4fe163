"""Scenarios: build the cost tables and processes of a ``SimConfig``, run them, summarise.

``simulate(config)`` is the one entry point: it returns a ``SimResult`` with the recorder (round
log, spans, requests) and the summary figures, each with its provenance. The analytic figure is
perfmodel's steady-state tokens/s for the same workload (strategy, model, GPU, batch, context at
the run's midpoint and the acceptance process's expected tokens per round).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from ssvkit.perfmodel.intervals import bounds, interval
from ssvkit.perfmodel.numbers import figure
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.perfmodel.trace import make_header
from ssvkit.sim.config import LOOP_SCENARIOS, SimConfig
from ssvkit.sim.loop import LANES, STEP_NAMES, DecodeLoop, Sequence
from ssvkit.sim.prr import run_prr
from ssvkit.sim.recorder import Recorder, RequestRecord
from ssvkit.sim.serving import run_serve
from ssvkit.sim.setup import (
    ScenarioRun,
    Setup,
    acceptance_for,
    analytic_round,
    layer_processes,
    request_records,
    setup,
)
from ssvkit.sim.sparsespec import run_sparsespec
from ssvkit.sim.ssd import run_ssd
from ssvkit.sim.tables import OVERLAP_GRID, context_grid, loop_table, needs_overlap_axis
from ssvkit.sim.workload import generators


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
    seqs = [
        Sequence(r, acc.sampler(g, i, b)) for i, (r, g) in enumerate(zip(reqs, gens, strict=True))
    ]
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
        cfg.static_batch,
    )
    env.process(loop.run())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    mid = int(round(np.mean([r.prompt_len + r.target_tokens / 2 for r in reqs])))
    pred = analytic_round(s, mid, b)
    round_s = float(pred.round_s[0]) + cfg.loop_overhead_s
    analytic = b * acc.expected_tokens() / round_s
    round_iv, tps_iv = None, None
    rnd = pred.spread()
    if rnd is not None:  # the added loop overhead, an input here, adds no width
        rnd.add_op(np.array([cfg.loop_overhead_s]))
        rb = bounds(rnd)
        round_iv = [float(x) for x in interval([round_s], over=rb)[0]]
        tps_iv = [float(x) for x in interval([analytic], under=rb)[0]]
    extras = {
        "expected_tokens_per_round": figure(acc.expected_tokens(), "tokens", f"model:{acc.name}"),
        "analytic_round_s": {**figure(round_s, "s", pred.provenance), "interval": round_iv},
    }
    return ScenarioRun(
        rec, LANES, loop.tokens, env.now, wall, analytic, pred.provenance, extras, tps_iv
    )


# Every scenario's runner, by ``SimConfig.scenario``: the five loop baselines share one.
RUNNERS: dict[str, Callable[[Setup], ScenarioRun]] = {
    **dict.fromkeys(LOOP_SCENARIOS, run_loop),
    "prr": run_prr,
    "ssd": run_ssd,
    "sparsespec": run_sparsespec,
    "serve": run_serve,
}


def simulate(cfg: SimConfig, progress: bool = False) -> SimResult:
    """Build and run the scenario of ``cfg``; deterministic for a given config and seed.
    ``progress`` shows a bar on a terminal's stderr while a long run goes (``sim.progress``)."""
    build0 = time.perf_counter()
    s = setup(cfg, progress)
    try:
        run = RUNNERS[cfg.scenario](s)
    finally:
        if s.progress is not None:
            s.progress.close()
    total_wall = time.perf_counter() - build0
    if run.simulated_s <= 0:
        raise ValueError("the simulation produced no time (nothing to decode)")
    sim_s, rounds, prov = run.simulated_s, run.recorder.num_rounds, s.sim_provenance
    figures = {
        "simulated_tokens_per_s": figure(run.tokens / sim_s, "tokens/s", prov),
        "analytic_tokens_per_s": {
            **figure(run.analytic_tokens_per_s, "tokens/s", run.analytic_provenance),
            "interval": run.analytic_interval,
        },
        "rounds_per_wall_s": figure(
            rounds / max(run.wall_s, 1e-9), "rounds/s", "measured:wall-clock"
        ),
        "simulated_time_s": figure(sim_s, "s", prov),
        "tokens": figure(run.tokens, "tokens", prov),
        "rounds": figure(rounds, "rounds", prov),
        "wall_s": figure(total_wall, "s", "measured:wall-clock"),
    }
    figures.update(run.extras)
    header = make_header(
        f"sim:{cfg.scenario}",
        s.ctx.model.name,
        s.ctx.model.num_layers,
        {s.strategy.name: _strategy_doc(s.strategy)},
        gpu=s.ctx.gpu.name,
        seed=cfg.seed,
        provenance=s.ctx.provenance,
    )
    return SimResult(cfg, s.strategy, run.recorder, run.lanes, figures, header)


def _strategy_doc(strategy: Strategy) -> dict:
    d = dataclasses.asdict(strategy)
    d["drafter"] = {k: v for k, v in d["drafter"].items() if v is not None}
    return d
