"""Saguaro speculative speculative decoding (seed 002): the draft runs on its own device.

While the target verifies round t, the draft device pre-speculates for the likely outcomes of
that verification and fills the speculation cache (``budget`` outcomes per sequence, split over
the outcomes k = 0..K by the integer geometric fan-out F_k). Each sequence's outcome k is drawn
from the acceptance of the speculation it verified; the outcome hits the cache with probability
``h(F_k) = 1 - (1 - h1) F_k^(-r)``. When every sequence hits, the next round starts at once
with the cached speculations; when any misses, the batch waits for a fallback speculation from
the primary draft or the fast backup (prompt lookup, lower acceptance), chosen by the batch-size
threshold b* (``perfmodel.saguaro.critical_batch_size``) unless forced.
"""

from __future__ import annotations

import bisect
import time

import numpy as np
import simpy
from ssvkit.perfmodel.numbers import figure
from ssvkit.perfmodel.saguaro import (
    cache_hit_probability,
    critical_batch_size,
    hit_rate_of_fanout,
    integer_fanout,
    sd_round_time_s,
)
from ssvkit.sim.acceptance import CHUNK, build_acceptance
from ssvkit.sim.recorder import Recorder
from ssvkit.sim.setup import ScenarioRun, acceptance_for, analytic_round, request_records
from ssvkit.sim.tables import context_grid, ssd_table
from ssvkit.sim.workload import generators

STEP_NAMES = ("verify", "speculate", "fallback")
LANES = ("target", "draft device")


def uniforms(rng: np.random.Generator):
    """A callable returning the next uniform in [0, 1) from chunked draws."""

    def chunks():
        while True:
            yield from rng.random(CHUNK).tolist()

    return chunks().__next__


def fanout_hits(budget: int, acceptance: float, hit_at_one: float, exponent: float, k: int):
    """Integer fan-out F_0..F_K for the budget and the per-outcome hit rates h(F_k)."""
    a = min(max(acceptance, 1e-6), 1 - 1e-6)  # the fan-out needs 0 < a < 1
    f = integer_fanout(budget, a, exponent, k)
    return f, hit_rate_of_fanout(f, hit_at_one, exponent)


def choose_fallback(mode: str, batch: int, b_star) -> str:
    """The fallback speculator a miss uses: forced, or by b* (the backup at b >= b*)."""
    if mode != "auto":
        return mode
    return "backup" if b_star is not None and batch >= b_star else "primary"


class SsdRun:
    """Target and draft device of one lockstep batch."""

    def __init__(self, env, grid, seqs, rec, hits, cdfs, fallback, k, name):
        self.env, self.grid, self.seqs, self.rec = env, grid, seqs, rec
        self.hits, self.cdfs, self.fallback, self.k, self.name = hits, cdfs, fallback, k, name
        self.tokens = 0
        self.seq_rounds = 0
        self.seq_hits = 0
        self.batch_misses = 0

    def draft_device(self, dt: float, what: str, spans: bool):
        if spans:
            self.rec.span("draft device", what, self.env.now, dt)
        yield self.env.timeout(dt)

    def target(self):
        env, rec, ix = self.env, self.rec, self.grid.index
        active = list(self.seqs)
        source = {id(s): "primary" for s in active}
        b0 = len(active)
        q = self.grid.at(b0, sum(s["context"] for s in active) / b0)
        yield from self.draft_device(q[ix["primary_s"]], "initial draft", rec.timeline_open)
        while active:
            b = len(active)
            T = sum(s["context"] for s in active) / b
            q = self.grid.at(b, T)
            spans = rec.timeline_open
            t0 = env.now
            spec = env.process(self.draft_device(q[ix["speculate_s"]], "pre-speculate", spans))
            if spans:
                rec.span("target", "verify", t0, q[ix["verify_s"]])
            yield env.timeout(q[ix["verify_s"]])
            yield spec
            outcomes = []
            for s in active:
                src = source[id(s)]
                acc = bisect.bisect_right(self.cdfs[src], s["u"]())
                hit = s["h"]() < self.hits[acc]
                outcomes.append((s, acc, hit))
                self.seq_rounds += 1
                self.seq_hits += hit
            t_ready = env.now
            fb = 0.0
            if not all(h for _, _, h in outcomes):
                self.batch_misses += 1
                fb = q[ix["primary_s" if self.fallback == "primary" else "backup_s"]]
                yield from self.draft_device(fb, f"fallback ({self.fallback})", spans)
            steps = (q[ix["verify_s"]], q[ix["speculate_s"]], fb)
            still = []
            for s, acc, hit in outcomes:
                r = s["record"]
                made = min(acc + 1, s["remaining"])
                r.count_round(t_ready, self.k, acc, made)
                label = self.name if source[id(s)] == "primary" else f"{self.name}/backup"
                rec.round(r.request, label, t0, s["context"], self.k, acc, steps)
                s["context"] += made
                s["remaining"] -= made
                self.tokens += made
                source[id(s)] = "primary" if hit else self.fallback
                if s["remaining"] > 0:
                    still.append(s)
                else:
                    r.finish_s = t_ready
            rec.num_steps += 1
            active = still


def run_ssd(s):
    """Decode the batch of ``s`` with Saguaro's speculation cache (simpy) and report its hit
    rates, b* and fallback beside perfmodel's analytic tokens/s."""
    cfg, ctx, strategy = s.cfg, s.ctx, s.strategy
    sc = cfg.ssd
    b = cfg.resolved_batch
    if b > sc.max_batch:
        raise ValueError(f"batch={b} exceeds the b* search range ssd max_batch={sc.max_batch}")
    k = len(s.parents)
    reqs = request_records(s, b)
    hi = max(r.prompt_len + r.target_tokens for r in reqs) + k + 1
    lo = min(r.prompt_len for r in reqs)
    contexts = context_grid(lo, hi, cfg.context_bucket)
    grid = ssd_table(ctx, strategy, contexts, sc.max_batch, sc.budget)
    fan, hits = fanout_hits(sc.budget, cfg.acceptance, sc.hit_at_one, sc.exponent, k)
    h = cache_hit_probability(fan, cfg.acceptance, sc.hit_at_one, sc.exponent)
    primary = acceptance_for(s)
    backup = build_acceptance("iid", s.parents, sc.backup_acceptance)
    mid = float(np.mean([r.prompt_len + r.target_tokens / 2 for r in reqs]))
    b_star, tok_p, tok_b = _critical_batch_size(s, grid, mid, h)
    fallback = choose_fallback(sc.fallback, b, b_star)
    rec = Recorder(cfg.timeline_rounds, STEP_NAMES, requests=reqs, progress=s.progress)
    seqs = _sequences(s, reqs)
    cdfs = {"primary": primary.cdf.tolist(), "backup": backup.cdf.tolist()}
    env = simpy.Environment()
    run = SsdRun(env, grid, seqs, rec, hits.tolist(), cdfs, fallback, k, strategy.name)
    env.process(run.target())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    tokens_per_s = tok_p if fallback == "primary" else tok_b
    analytic = float(tokens_per_s[b - 1])
    pred = analytic_round(s, int(round(mid)), b)
    sd = float(b * primary.expected_tokens() / sd_round_time_s(pred.verify_s[0], pred.draft_s[0]))
    extras = _ssd_figures(s, run, fan, h, b_star, fallback, sd)
    return ScenarioRun(rec, LANES, run.tokens, env.now, wall, analytic, ctx.provenance, extras)


def _critical_batch_size(s, grid, mid: float, h: float):
    """b* and the tokens/s with the primary and with the backup fallback at batches
    1..max_batch, from perfmodel at the run's midpoint context ``mid``."""
    cfg, sc = s.cfg, s.cfg.ssd
    bs = np.arange(1, sc.max_batch + 1)
    tab = np.array([grid.at(int(x), mid) for x in bs])  # [B, 4]
    ix = grid.index
    v, p_s, b_s, sp = (tab[:, ix[n]] for n in ("verify_s", "primary_s", "backup_s", "speculate_s"))
    return critical_batch_size(
        bs, v, h, cfg.acceptance, len(s.parents), p_s, b_s, sc.backup_acceptance, sp
    )


def _sequences(s, reqs) -> list[dict]:
    """Each request's decoding state: its record, context, remaining tokens, and its uniforms
    for the acceptance and for the cache's misses."""
    u_gens = generators(s.seeds["acceptance"], len(reqs))
    h_gens = generators(s.seeds["misses"], len(reqs))
    return [
        {
            "record": r,
            "context": r.prompt_len,
            "remaining": r.target_tokens,
            "u": uniforms(ug),
            "h": uniforms(hg),
        }
        for r, ug, hg in zip(reqs, u_gens, h_gens, strict=True)
    ]


def _ssd_figures(s, run: SsdRun, fan, h: float, b_star, fallback: str, sd: float) -> dict:
    """The cache's modelled and simulated hit rates, the batches that missed, b*, the fallback
    taken, the analytic SD baseline and the fan-out."""
    sc, prov, sp = s.cfg.ssd, s.ctx.provenance, s.sim_provenance
    return {
        "hit_rate_model": figure(h, "share", "model:saguaro:cache_hit_probability"),
        "hit_rate_simulated": figure(run.seq_hits / max(run.seq_rounds, 1), "share", sp),
        "batch_miss_share": figure(run.batch_misses / max(run.rec.num_steps, 1), "share", sp),
        "b_star": figure(None if b_star is None else int(b_star), "sequences", prov),
        "fallback": figure(
            fallback, "", "model:saguaro:critical_batch_size" if sc.fallback == "auto" else "config"
        ),
        "sd_analytic_tokens_per_s": figure(sd, "tokens/s", prov),
        "fanout": figure([int(x) for x in fan], "speculations", "model:saguaro:integer_fanout"),
    }
