"""Online serving: arrivals, continuous batching under a KV capacity, TTFT/TPOT/E2E, goodput.

Requests arrive by a Poisson process or from an arrivals file and wait in FIFO order. The
scheduler (iteration-level, prefill first, as vLLM and Orca do) admits waiting requests while
the batch has room and the KV cache can reserve ``prompt + output + K + 1`` tokens for them
(conservative reservation, so the cache is never exceeded and nothing is preempted), prefills
the admitted prompts back to back (``perfmodel.costs.prefill_seconds`` each; the prefill yields
the first token), then runs one draft/verify round of the strategy for every running request at
the batch's size and mean context (``sim.tables.loop_table``). A request whose reservation can
never fit is an input error. Goodput counts requests that meet both SLOs, per second.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import simpy
from ssvkit.perfmodel.costs import kv_capacity_tokens, prefill_seconds
from ssvkit.perfmodel.numbers import figure
from ssvkit.sim.config import MAX_SIM_TOKENS
from ssvkit.sim.loop import STEP_NAMES
from ssvkit.sim.recorder import Recorder
from ssvkit.sim.setup import ScenarioRun, acceptance_for, analytic_round, request_records
from ssvkit.sim.tables import context_grid, loop_table, prefill_table
from ssvkit.sim.workload import generators, poisson_arrivals, read_arrivals

LANES = ("gpu",)


class Server:
    """FIFO queue, reservation-based admission, prefill-first iterations."""

    def __init__(self, env, rec, grid, prefill, samplers, capacity, max_batch, k, name, g):
        self.env, self.rec, self.grid, self.prefill = env, rec, grid, prefill
        self.samplers, self.capacity, self.max_batch = samplers, capacity, max_batch
        self.k, self.name, self.g = k, name, g
        self.waiting: deque = deque()
        self.running: list = []
        self.reserved = 0
        self.max_reserved = 0
        self.max_kv = 0
        self.tokens = 0
        self.wake = env.event()
        self.arrived = 0

    def need(self, r) -> int:
        return r.prompt_len + r.target_tokens + self.k + 1

    def arrivals(self, reqs):
        env = self.env
        for r in reqs:
            if r.arrival_s > env.now:
                yield env.timeout(r.arrival_s - env.now)
            self.waiting.append(r)
            self.arrived += 1
            if not self.wake.triggered:
                self.wake.succeed()

    def run(self, total: int):
        env, rec = self.env, self.rec
        done = 0
        while done < total:
            new = []
            while (
                self.waiting
                and len(self.running) + len(new) < self.max_batch
                and self.reserved + self.need(self.waiting[0]) <= self.capacity
            ):
                r = self.waiting.popleft()
                self.reserved += self.need(r)
                r.admitted_s = env.now
                new.append(r)
            self.max_reserved = max(self.max_reserved, self.reserved)
            spans = rec.timeline_open
            if new:
                dt = sum(self.prefill.at(1, r.prompt_len)[0] for r in new)
                if spans:
                    rec.span("gpu", f"prefill x{len(new)}", env.now, dt)
                yield env.timeout(dt)
                for r in new:
                    r.first_token_s = env.now
                    r.output_tokens = 1
                    self.tokens += 1
                    r.context = r.prompt_len + 1
                    if r.output_tokens >= r.target_tokens:
                        done += self._finish(r)
                    else:
                        self.running.append(r)
                rec.num_steps += 1
            if self.running:
                done += yield from self._decode(spans)
            elif not new:
                if self.arrived >= total and not self.waiting:
                    break
                self.wake = env.event()
                if self.waiting or self.arrived < total:
                    yield self.wake

    def _finish(self, r) -> int:
        r.finish_s = self.env.now
        self.reserved -= self.need(r)
        return 1

    def _decode(self, spans):
        env, rec = self.env, self.rec
        b = len(self.running)
        T = sum(r.context for r in self.running) / b
        q = self.grid.at(b, T, self.g)
        t0 = env.now
        dt = q[0] + q[1] + q[2] + q[3]
        if spans:
            rec.span("gpu", f"decode round b={b}", t0, dt)
        yield env.timeout(dt)
        self.max_kv = max(self.max_kv, sum(r.context for r in self.running) + b * (self.k + 1))
        steps = (q[0], q[1], q[2], q[3])
        still, done = [], 0
        for r in self.running:
            acc = self.samplers[r.request]()
            made = min(acc + 1, r.target_tokens - r.output_tokens)
            r.rounds += 1
            r.drafted += self.k
            r.accepted_drafts += acc
            rec.round(r.request, self.name, t0, r.context, self.k, acc, steps)
            r.output_tokens += made
            r.context += made
            self.tokens += made
            if r.output_tokens >= r.target_tokens:
                done += self._finish(r)
            else:
                still.append(r)
        self.running = still
        rec.num_steps += 1
        return done


def _percentile(x, q):
    return float(np.percentile(x, q)) if len(x) else 0.0


def run_serve(s):
    """Serve the requests of ``s`` (arrivals, admission, prefills and rounds in simpy) and
    report their latencies and goodput beside perfmodel's analytic capacity bound."""
    cfg, sv = s.cfg, s.cfg.serve
    k = len(s.parents)
    t, reqs = _requests(s)
    capacity = _kv_capacity_tokens(s, reqs, k)
    b = min(sv.max_batch, len(reqs))
    grid, prefill = _tables(s, reqs, k, b)
    acc = acceptance_for(s)
    samplers = [acc.sampler(g) for g in generators(s.seeds["acceptance"], len(reqs))]
    rec = Recorder(cfg.timeline_rounds, STEP_NAMES, requests=reqs, progress=s.progress)
    env = simpy.Environment()
    server = Server(env, rec, grid, prefill, samplers, capacity, b, k, s.strategy.name, cfg.overlap)
    env.process(server.arrivals(reqs))
    env.process(server.run(len(reqs)))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    _record_requests(rec, reqs, cfg)
    analytic, pred = _analytic_tokens_per_s(s, reqs, t, acc, capacity, b, k)
    extras = _serve_figures(s, reqs, server, capacity)
    return ScenarioRun(rec, LANES, server.tokens, env.now, wall, analytic, pred.provenance, extras)


def _requests(s):
    """The arrival times and the requests: the arrivals file's, or ``num_requests`` Poisson
    arrivals at the configured rate."""
    cfg, sv = s.cfg, s.cfg.serve
    if sv.arrival == "trace":
        t, pl, ol = read_arrivals(sv.arrivals_file)
        if ol.sum() > MAX_SIM_TOKENS:
            raise ValueError(
                f"arrivals file {sv.arrivals_file!r} asks for {int(ol.sum()):,} output tokens; a "
                f"simulated run takes at most {MAX_SIM_TOKENS:,}"
            )
        return t, request_records(s, len(t), t, pl, ol)
    n = cfg.num_requests
    t = poisson_arrivals(np.random.default_rng(s.seeds["arrivals"]), sv.rate, n)
    return t, request_records(s, n, t)


def _kv_capacity_tokens(s, reqs, k: int) -> int:
    """The KV cache's capacity in tokens (configured, or what GPU memory leaves beside the
    weights); ``ValueError`` where it holds nothing, where a request's reservation can never
    fit, or where the strategy is infeasible at a request's prompt (``ctx.check``)."""
    cfg, ctx = s.cfg, s.ctx
    capacity = cfg.kv_capacity_tokens or kv_capacity_tokens(
        ctx.model, ctx.gpu, cfg.tp, cfg.kv_bytes, cfg.memory_fraction
    )
    if capacity < 1:
        raise ValueError(
            f"impossible capacity: {ctx.model.name} leaves no KV cache on {cfg.tp} x {ctx.gpu.name}"
        )
    for r in reqs:
        need = r.prompt_len + r.target_tokens + k + 1
        if need > capacity:
            raise ValueError(
                f"impossible capacity: request {r.request} needs {need} KV tokens, "
                f"kv_capacity_tokens={capacity}"
            )
    for r in reqs:
        ctx.check(s.strategy, r.prompt_len)
    return capacity


def _tables(s, reqs, k: int, b: int):
    """The round costs at up to ``b`` requests over every context the requests reach, and
    the prefill costs over their prompts."""
    cfg, ctx = s.cfg, s.ctx
    lo = min(r.prompt_len for r in reqs)
    hi = max(r.prompt_len + r.target_tokens for r in reqs) + k + 1
    contexts = context_grid(lo, hi, cfg.context_bucket)
    grid, _ = loop_table(ctx, s.strategy, contexts, b, [cfg.overlap])
    prefill = prefill_table(
        ctx, context_grid(lo, max(r.prompt_len for r in reqs), cfg.context_bucket)
    )
    return grid, prefill


def _record_requests(rec: Recorder, reqs, cfg) -> None:
    """Each request's SLO verdict, and the queued, prefill and decode spans of the first
    ``timeline_rounds`` requests."""
    sv = cfg.serve
    for r in reqs:
        r.slo_met = r.ttft_s <= sv.slo_ttft_s and r.tpot_s <= sv.slo_tpot_s
        if r.request < cfg.timeline_rounds:
            rec.span(f"request {r.request}", "queued", r.arrival_s, r.admitted_s - r.arrival_s)
            rec.span(
                f"request {r.request}", "prefill", r.admitted_s, r.first_token_s - r.admitted_s
            )
            rec.span(
                f"request {r.request}", "decode", r.first_token_s, r.finish_s - r.first_token_s
            )


def _analytic_tokens_per_s(s, reqs, t, acc, capacity: int, b: int, k: int):
    """Analytic capacity bound and the round prediction it uses: the offered token rate, or the
    GPU's rate when every request's prefill runs alone and its decode shares rounds at the
    largest batch the KV cache and max_batch allow (perfmodel at the mean prompt and mean
    context)."""
    cfg, ctx = s.cfg, s.ctx
    mean_need = float(np.mean([r.prompt_len + r.target_tokens + k + 1 for r in reqs]))
    b_kv = int(max(1, min(b, capacity // mean_need)))
    mid = int(round(np.mean([r.prompt_len + r.target_tokens / 2 for r in reqs])))
    pred = analytic_round(s, mid, b_kv)
    decode_rate = b_kv * acc.expected_tokens() / float(pred.round_s[0])
    mean_prompt = float(np.mean([r.prompt_len for r in reqs]))
    mean_out = float(np.mean([r.target_tokens for r in reqs]))
    prefill_s = float(
        prefill_seconds(ctx.model, ctx.predictor(), mean_prompt, 1, cfg.kv_bytes, cfg.elementwise)
    )
    capacity_rate = mean_out / (prefill_s + mean_out / decode_rate)
    offered = sum(r.target_tokens for r in reqs) / max(float(t[-1] - t[0]), 1e-9)
    analytic = min(offered, capacity_rate) if len(reqs) > 1 else capacity_rate
    return analytic, pred


def _serve_figures(s, reqs, server: Server, capacity: int) -> dict[str, dict]:
    """Goodput, SLO, TTFT/TPOT percentile and KV-cache figures of the finished run."""
    cfg = s.cfg
    span_s = max(r.finish_s for r in reqs) - min(r.arrival_s for r in reqs)
    met = sum(bool(r.slo_met) for r in reqs)
    sp = s.sim_provenance
    ttft = [r.ttft_s for r in reqs]
    tpot = [r.tpot_s for r in reqs]
    return {
        "goodput_requests_per_s": figure(met / span_s, "requests/s", sp),
        "slo_met": figure(met, "requests", sp),
        "ttft_p50_s": figure(_percentile(ttft, 50), "s", sp),
        "ttft_p99_s": figure(_percentile(ttft, 99), "s", sp),
        "tpot_p50_s": figure(_percentile(tpot, 50), "s", sp),
        "tpot_p99_s": figure(_percentile(tpot, 99), "s", sp),
        "kv_capacity_tokens": figure(
            capacity, "tokens", "config" if cfg.kv_capacity_tokens else s.ctx.provenance
        ),
        "max_kv_tokens": figure(server.max_kv, "tokens", sp),
        "max_reserved_kv_tokens": figure(server.max_reserved, "tokens", sp),
    }
