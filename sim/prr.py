"""PRR, predict-reuse-repair (seed 004): per layer, block selection runs beside speculative
attention over the predicted blocks, then a repair kernel folds in the blocks the prediction
missed.

Per layer: ``selection + compressed branch`` and ``speculative attention`` start together (two
concurrent timeouts joined by ``&``), then ``repair_fixed + missed * repair_block``, then the
layer's linear ops. Missed blocks per layer and round are ``Binomial(top_n, 1 - h)`` with h
fixed, estimated by the Holt EMA predictor on a synthetic block-score trajectory (``ema``), or
replayed from a trace's per-layer ``predict_hit``. Costs: ``perfmodel.prr_costs.prr_layer_costs``.
"""

from __future__ import annotations

import time

import numpy as np
import simpy
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.numbers import figure
from ssvkit.perfmodel.prr import (
    PAPER_HIT_RATE,
    HoltParams,
    calibrate,
    critical_path_s,
    predictor_hit_rate,
)
from ssvkit.perfmodel.prr_costs import prr_layer_costs
from ssvkit.perfmodel.step import build_columns
from ssvkit.perfmodel.strategy import Workload
from ssvkit.sim.acceptance import CHUNK
from ssvkit.sim.recorder import Recorder
from ssvkit.sim.setup import ScenarioRun, acceptance_for, request_records
from ssvkit.sim.tables import context_grid, prr_table
from ssvkit.sim.workload import generators

STEP_NAMES = ("draft", "select", "speculate", "repair", "verify", "accept")
LANES = ("drafter", "selector", "speculator", "repairer", "verifier", "acceptor")
EMA_GRID = ((0.2, 0.5, 0.8), (0.0, 0.3), (0.9, 1.0))


def synthetic_scores(rng, num_blocks: int, num_steps: int, drift: float) -> np.ndarray:
    """Block-importance trajectory ``[steps, blocks]``: each block's log-score is a stationary
    AR(1) process ``z_t = (1 - drift) z_{t-1} + sqrt(1 - (1 - drift)^2) e_t`` with N(0, 1)
    marginals; scores are ``exp(z)``. ``drift`` 0 freezes the selection, 1 redraws it every
    step (no temporal locality)."""
    rho = 1.0 - drift
    z = np.empty((num_steps, num_blocks))
    z[0] = rng.standard_normal(num_blocks)
    noise = np.sqrt(1.0 - rho * rho) * rng.standard_normal((num_steps, num_blocks))
    for t in range(1, num_steps):
        z[t] = rho * z[t - 1] + noise[t]
    return np.exp(z)


def ema_hit_rate(rng, top_n: int, num_blocks: int, drift: float, budget_ratio: float) -> float:
    """Hit rate of the Holt EMA predictor (seed 004 §4.1-4.2): calibrate on the first half of a
    synthetic trajectory (the prefill), measure the score-weighted hit rate on the second."""
    nb = int(min(max(num_blocks, top_n + 1), 512))
    s = synthetic_scores(rng, nb, 128, drift)
    params, _ = calibrate(s[:64], top_n, budget_ratio, EMA_GRID)
    return predictor_hit_rate(s[64:], top_n, budget_ratio, params or HoltParams(0.5, 0.0, 1.0))


class MissProcess:
    """Missed blocks per layer for each round."""

    def __init__(self, rng, top_n: int, num_layers: int, hit_rate: float, replay=None):
        self.rng, self.n, self.L, self.h = rng, top_n, num_layers, hit_rate
        if replay is not None:
            hits = np.where(np.isnan(replay), hit_rate, replay)
            self._rows = [
                (tuple(np.rint(top_n * (1 - r)).astype(int).tolist()), tuple(r.tolist()))
                for r in hits
            ]
        else:
            self._rows = []
        self._replay = replay is not None
        self._i = 0

    def next(self):
        if self._replay:
            row = self._rows[self._i % len(self._rows)]
            self._i += 1
            return row
        if self._i >= len(self._rows):
            miss = self.rng.binomial(self.n, 1.0 - self.h, size=(CHUNK, self.L))
            self._rows = [(tuple(m), tuple(1.0 - np.asarray(m) / self.n)) for m in miss.tolist()]
            self._i = 0
        row = self._rows[self._i]
        self._i += 1
        return row


def _layers(env, rec, q, ix, miss, L, spans):
    """The round's ``L`` layers: each runs its selection beside speculative attention, then the
    repair of its ``miss[layer]`` missed blocks, then its linear ops. Returns the selection's,
    the speculation's and the repair's busy seconds."""
    sel_s = q[ix["selection_s"]] + q[ix["compressed_s"]]
    spec_s = q[ix["speculative_s"]]
    fixed, per_block = q[ix["repair_fixed_s"]], q[ix["repair_block_s"]]
    linear = q[ix["linear_s"]]
    busy = {"select": 0.0, "speculate": 0.0, "repair": 0.0}
    for layer in range(L):
        ts = env.now
        if spans:
            rec.span("selector", f"select L{layer}", ts, sel_s)
            rec.span("speculator", f"spec attn L{layer}", ts, spec_s)
        yield env.timeout(sel_s) & env.timeout(spec_s)
        busy["select"] += sel_s
        busy["speculate"] += spec_s
        rep = fixed + miss[layer] * per_block
        if spans:
            rec.span("repairer", f"repair {miss[layer]} L{layer}", env.now, rep)
        yield env.timeout(rep)
        busy["repair"] += rep
        if spans:
            rec.span("verifier", f"layer {layer}", env.now, linear)
        yield env.timeout(linear)
    return busy


def _prr_loop(env, grid, seq, rec, misses, k, L, strategy_name, tokens):
    at = grid.at
    ix = grid.index
    while seq.remaining > 0:
        T = seq.context
        q = at(1, T)
        miss, hits = misses.next()
        spans = rec.timeline_open
        t0 = env.now
        draft = q[ix["draft_s"]]
        if draft > 0:
            if spans:
                rec.span("drafter", "draft", t0, draft)
            yield env.timeout(draft)
        busy = yield from _layers(env, rec, q, ix, miss, L, spans)
        linear = q[ix["linear_s"]]
        head = q[ix["head_s"]]
        if spans:
            rec.span("verifier", "lm head", env.now, head)
        yield env.timeout(head)
        accept = q[ix["accept_s"]]
        if accept > 0:
            if spans:
                rec.span("acceptor", "accept", env.now, accept)
            yield env.timeout(accept)
        now = env.now
        acc = seq.sample()
        made = min(acc + 1, seq.remaining)
        r = seq.record
        r.count_round(now, k, acc, made)
        verify = L * linear + head
        steps = (draft, busy["select"], busy["speculate"], busy["repair"], verify, accept)
        rec.round(r.request, strategy_name, t0, T, k, acc, steps, (None, None, hits))
        seq.context += made
        seq.remaining -= made
        tokens[0] += made
        rec.num_steps += 1
        if seq.remaining <= 0:
            r.finish_s = now


class _Seq:
    __slots__ = ("record", "context", "remaining", "sample")

    def __init__(self, record, sample):
        self.record, self.context, self.remaining, self.sample = (
            record,
            record.prompt_len,
            record.target_tokens,
            sample,
        )


def run_prr(s):
    cfg, ctx, strategy = s.cfg, s.ctx, s.strategy
    pc = cfg.prr
    L = ctx.model.num_layers
    reqs = request_records(s, 1)
    acc = acceptance_for(s)
    k = len(s.parents)
    r0 = reqs[0]
    contexts = context_grid(
        r0.prompt_len, r0.prompt_len + r0.target_tokens + k + 1, cfg.context_bucket
    )
    grid = prr_table(ctx, strategy, contexts, 1, pc.budget_ratio)
    miss_rng = np.random.default_rng(s.seeds["misses"])
    hit = pc.hit_rate
    if pc.hit_source == "ema":
        nb = int(np.ceil(cfg.context_len / strategy.block_size))
        hit = ema_hit_rate(miss_rng, strategy.top_n, nb, pc.ema_drift, pc.budget_ratio)
    replay = s.trace.layer_column("predict_hit") if pc.hit_source == "trace" else None
    if pc.hit_source == "trace" and replay is None:
        raise ValueError("PRR hit_source=trace: the trace has no predict_hit per layer")
    misses = MissProcess(miss_rng, strategy.top_n, L, hit, replay)
    rec = Recorder(cfg.timeline_rounds, STEP_NAMES, requests=reqs, progress=s.progress)
    seq = _Seq(r0, acc.sampler(generators(s.seeds["acceptance"], 1)[0]))
    env = simpy.Environment()
    tokens = [0]
    env.process(_prr_loop(env, grid, seq, rec, misses, k, L, strategy.name, tokens))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    # Analytic: perfmodel.prr's critical path per layer at the run's midpoint context.
    mean_hit = float(np.mean(replay[~np.isnan(replay)])) if replay is not None else hit
    mid = int(round(r0.prompt_len + r0.target_tokens / 2))
    w = Workload(
        context_len=mid,
        tp=cfg.tp,
        acceptance=cfg.acceptance,
        kv_bytes=cfg.kv_bytes,
        elementwise=cfg.elementwise,
        loop=cfg.loop,
    )
    cols = build_columns(ctx.model, [(strategy, w)])
    pred = make_predictor(ctx.gpu, "bf16", cols.tp)
    p = prr_layer_costs(ctx.model, cols, pred, pc.budget_ratio, strategy.drafter)
    layer = p.linear_s + critical_path_s(
        p.selection_s + p.compressed_s,
        p.speculative_s,
        strategy.top_n,
        mean_hit,
        p.repair_block_s,
        p.repair_fixed_s,
    )
    round_s = float((p.draft_s + L * layer + p.head_s + p.accept_s)[0])
    serial_s = float((p.draft_s + p.serial_verify_s)[0])
    e = acc.expected_tokens()
    extras = {
        "hit_rate": figure(mean_hit, "share", _hit_rate_source(pc)),
        "serial_dsa_tokens_per_s": figure(e / serial_s, "tokens/s", ctx.provenance),
        "prr_speedup_vs_serial": figure(serial_s / round_s, "x", ctx.provenance),
    }
    return ScenarioRun(rec, LANES, tokens[0], env.now, wall, e / round_s, ctx.provenance, extras)


def _hit_rate_source(pc) -> str:
    """Where the hit rate comes from: the paper's constant, the user's, or a model of it."""
    if pc.hit_source != "fixed":
        return f"model:prr:{pc.hit_source}"
    if pc.hit_rate == PAPER_HIT_RATE:
        return f"paper:004 (PRR's reported hit rate {PAPER_HIT_RATE}; --prr-hit-rate sets another)"
    return "input:prr_hit_rate"
