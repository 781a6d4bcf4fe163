"""SparseSpec (seed 003): self-speculation with sparse draft attention in one unified batch.

Requests sit in ``cycle`` buckets (greedy bin-packing: a new request joins the least-loaded
bucket, ties to the lowest index). Bucket j is at phase ``(step + j) mod cycle``: phases 0..k-1
draft one token with attention over ``s T`` cached tokens, phase k verifies the chain with full
attention, and with delayed verification phase k+1 stalls while the CPU reads the results, so
``cycle = k + 2`` (delayed) or ``k + 1`` (synchronous). Each step is one forward of the mixed
batch (``perfmodel.costs.mixed_step_seconds``); the CPU prepares the next step in
``host_step_seconds``: after the GPU step when synchronous, beside it when delayed.

KV cache: when the resident KV plus one step's growth passes ``offload_threshold`` of capacity,
the newest resident request is offloaded whole to host memory over PCIe (FIFO fairness: the
oldest keep running) and returns, before any new admission, once it fits again. A step that
would exceed the capacity itself waits for in-flight offloads to finish.
"""

from __future__ import annotations

import bisect
import time

import numpy as np
import simpy
from ssvkit.perfmodel.acceptance import chain_parents
from ssvkit.perfmodel.costs import (
    HOST_PER_REQUEST_S,
    host_step_seconds,
    kv_capacity_tokens,
    kv_offload_seconds,
    mixed_step_seconds,
)
from ssvkit.perfmodel.numbers import figure
from ssvkit.perfmodel.sparsespec import delayed_verification
from ssvkit.sim.acceptance import build_acceptance
from ssvkit.sim.recorder import Recorder
from ssvkit.sim.setup import ScenarioRun, request_records
from ssvkit.sim.ssd import uniforms
from ssvkit.sim.tables import context_grid, mixed_tables
from ssvkit.sim.workload import generators

STEP_NAMES = ("gpu", "cpu", "offload")
LANES = ("gpu", "cpu", "pcie")


class Req:
    __slots__ = ("record", "context", "remaining", "bucket", "drafted", "state", "u")

    def __init__(self, record, bucket, u):
        self.record = record
        self.context = record.prompt_len
        self.remaining = record.target_tokens
        self.bucket = bucket
        self.drafted = 0
        self.state = "resident"  # resident | offloading | offloaded | loading
        self.u = u


class SparseSpecRun:
    """The unified batch: admission, bucket phases, mixed steps, KV offload and reload."""

    def __init__(self, env, rec, tables, cdfs, capacity, k, cycle, delayed, knobs):
        self.env, self.rec, self.tables, self.cdfs = env, rec, tables, cdfs
        self.capacity, self.k, self.cycle, self.delayed = capacity, k, cycle, delayed
        self.name = knobs["name"]
        self.batch = knobs["batch"]
        self.uniform_for = knobs["uniform_for"]
        self.per_request_s = knobs["per_request_s"]
        self.move_s = knobs["move_s"]
        self.threshold = knobs["threshold"] * capacity
        self.pending = list(rec.requests)
        self.active: list[Req] = []
        self.offloaded: list[Req] = []
        self.buckets = [0] * cycle
        self.kv = 0  # tokens held on the GPU (resident, loading or offloading)
        self.max_kv = 0
        self.tokens = 0
        self.offloads = 0
        self.offload_tokens = 0
        self.inflight: list = []
        self.step = 0
        self.pcie_out = simpy.Resource(env, 1)
        self.pcie_in = simpy.Resource(env, 1)

    def _resident(self):
        return [r for r in self.active if r.state == "resident"]

    def _transfer(self, req: Req, out: bool):
        env, rec = self.env, self.rec
        link = self.pcie_out if out else self.pcie_in
        with link.request() as slot:
            yield slot
            dt = self.move_s(req.context)
            rec.span(
                "pcie", ("offload r" if out else "reload r") + str(req.record.request), env.now, dt
            )
            yield env.timeout(dt)
        if out:
            req.state = "offloaded"
            self.kv -= req.context
            self.offloaded.append(req)
        else:
            req.state = "resident"

    def _manage_kv(self):
        """Offload newest residents above the threshold; reload oldest offloaded, admit new."""
        resident = self._resident()
        while len(resident) > 1 and self.kv + len(resident) > self.threshold:
            victim = max(resident, key=lambda r: r.record.request)
            victim.state = "offloading"
            victim.record.offloads += 1
            self.offloads += 1
            self.offload_tokens += victim.context
            self.inflight.append(self.env.process(self._transfer(victim, True)))
            resident.remove(victim)
        while (
            self.offloaded
            and self.kv + self.offloaded[0].context + len(resident) + 1 <= self.threshold
        ):
            req = self.offloaded.pop(0)
            req.state = "loading"
            self.kv += req.context
            self.offload_tokens += req.context
            self.inflight.append(self.env.process(self._transfer(req, False)))
        while (
            self.pending
            and not self.offloaded
            and len(self.active) < self.batch
            and self.kv + self.pending[0].prompt_len + len(resident) + 1 <= self.threshold
        ):
            rec = self.pending.pop(0)
            j = min(range(self.cycle), key=lambda i: (self.buckets[i], i))
            self.buckets[j] += 1
            rec.admitted_s = self.env.now
            req = Req(rec, j, self.uniform_for(rec.request))
            self.active.append(req)
            self.kv += req.context
            resident.append(req)
        self.inflight = [p for p in self.inflight if p.is_alive]

    def run(self):
        """The unified batch's steps until every request has finished."""
        while self.pending or self.active:
            self._manage_kv()
            resident = self._resident()
            yield from self._wait_for_room(resident)
            if not resident:
                if not self.inflight:
                    raise ValueError("KV capacity too small for any request to run")
                yield self.env.any_of(self.inflight)
                continue
            yield from self._step(resident)

    def _wait_for_room(self, resident):
        """Wait for in-flight transfers while a step's growth would pass the KV capacity."""
        while self.kv + len(resident) > self.capacity and self.inflight:
            yield self.env.any_of(self.inflight)
            self.inflight = [p for p in self.inflight if p.is_alive]

    def _phases(self, resident):
        """The resident requests that draft this step and those that verify."""
        k = self.k
        drafting, verifying = [], []
        for r in resident:
            phase = (self.step + r.bucket) % self.cycle
            if phase < k and r.drafted < k:  # a reloaded request may be ahead of its bucket
                drafting.append(r)
            elif phase == k:
                verifying.append(r)
        return drafting, verifying

    def _step(self, resident):
        """One forward of the mixed batch beside the CPU's schedule, then its drafts and
        verifications."""
        env, rec, k = self.env, self.rec, self.k
        drafting, verifying = self._phases(resident)
        nd, nv = len(drafting), len(verifying)
        td = sum(r.context for r in drafting) / nd if nd else 0.0
        tv = sum(r.context for r in verifying) / nv if nv else 0.0
        gpu = self.tables.step_s(nd, nv, k, td, tv) if (nd or nv) else 0.0
        cpu = self.per_request_s * len(self.active)
        spans = rec.timeline_open
        t0 = env.now
        if spans:
            rec.span("gpu", f"step {self.step}: {nd} draft + {nv} verify", t0, gpu)
            rec.span("cpu", "schedule", t0 if self.delayed else t0 + gpu, cpu)
        if self.delayed:
            yield env.timeout(gpu) & env.timeout(cpu)
        else:
            yield env.timeout(gpu + cpu)
        now = env.now
        self.kv += nd
        self.max_kv = max(self.max_kv, self.kv)
        for r in drafting:
            r.drafted += 1
            r.context += 1
        steps = (gpu, cpu, 0.0)
        for r in verifying:
            self._verify(r, t0, now, steps)
        self.step += 1
        rec.num_steps += 1

    def _verify(self, r: Req, t0: float, now: float, steps: tuple) -> None:
        """Verify ``r``'s chain: draw its accepted drafts, count its round, keep the accepted
        drafts and the bonus token in the cache, and retire the request once it has all its
        tokens."""
        acc = bisect.bisect_right(self.cdfs[r.drafted], r.u())
        made = min(acc + 1, r.remaining)
        rr = r.record
        rr.count_round(now, r.drafted, acc, made)
        self.rec.round(rr.request, self.name, t0, r.context - r.drafted, r.drafted, acc, steps)
        # Rejected drafts leave the cache; the accepted ones and the bonus token stay.
        self.kv += made - r.drafted
        r.context += made - r.drafted
        self.max_kv = max(self.max_kv, self.kv)
        r.remaining -= made
        r.drafted = 0
        self.tokens += made
        if r.remaining <= 0:
            rr.finish_s = now
            self.active.remove(r)
            self.buckets[r.bucket] -= 1
            self.kv -= r.context


def run_sparsespec(s):
    """Decode the requests of ``s`` in SparseSpec's unified batch (simpy) and report the KV
    figures beside perfmodel's analytic steady state."""
    cfg, ctx, strategy = s.cfg, s.ctx, s.strategy
    sc = cfg.sparsespec
    k = len(s.parents)
    n = max(cfg.num_requests, cfg.resolved_batch)
    reqs = request_records(s, n)
    capacity = _kv_capacity_tokens(s, reqs, k)
    delayed = sc.delayed == "on"
    cycle = k + 2 if delayed else k + 1
    hi = max(r.prompt_len + r.target_tokens for r in reqs) + k + 1
    contexts = context_grid(min(r.prompt_len for r in reqs), hi, cfg.context_bucket)
    tables = mixed_tables(ctx, k, strategy.drafter.sparsity_ratio, contexts, cfg.resolved_batch)
    accs = [
        build_acceptance(
            cfg.acceptance_model, chain_parents(d), cfg.acceptance, cfg.acceptance_table, s.trace
        )
        for d in range(k + 1)
    ]
    cdfs = [a.cdf.tolist() for a in accs]
    knobs = _knobs(s, n)
    rec = Recorder(cfg.timeline_rounds, STEP_NAMES, requests=reqs, progress=s.progress)
    env = simpy.Environment()
    run = SparseSpecRun(env, rec, tables, cdfs, capacity, k, cycle, delayed, knobs)
    env.process(run.run())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    analytic = _analytic_tokens_per_s(s, reqs, accs[k], cycle)
    extras = _sparsespec_figures(s, run, capacity)
    return ScenarioRun(rec, LANES, run.tokens, env.now, wall, analytic, ctx.provenance, extras)


def _kv_capacity_tokens(s, reqs, k: int) -> int:
    """The KV cache's capacity in tokens (configured, or what GPU memory leaves beside the
    weights); ``ValueError`` where a request could never fit under the offload threshold."""
    cfg, ctx = s.cfg, s.ctx
    capacity = cfg.kv_capacity_tokens or kv_capacity_tokens(
        ctx.model, ctx.gpu, cfg.tp, cfg.kv_bytes, cfg.memory_fraction
    )
    threshold = cfg.sparsespec.offload_threshold
    need = max(r.prompt_len + r.target_tokens + k + 1 for r in reqs)
    if need > threshold * capacity:
        raise ValueError(
            f"impossible capacity: a request needs {need} KV tokens, the offload threshold "
            f"allows {int(threshold * capacity)} of kv_capacity_tokens={capacity}"
        )
    return capacity


def _knobs(s, n: int) -> dict:
    """The settings of ``SparseSpecRun`` beyond its tables: each request's uniforms, the CPU
    time per request, the offload time of a KV size and the offload threshold."""
    cfg, ctx, sc = s.cfg, s.ctx, s.cfg.sparsespec
    gens = generators(s.seeds["acceptance"], n)
    return {
        "name": s.strategy.name,
        "batch": cfg.resolved_batch,
        "uniform_for": lambda i: uniforms(gens[i]),
        "per_request_s": sc.host_per_request_s,
        "move_s": lambda tokens: float(
            kv_offload_seconds(tokens, ctx.model, ctx.gpu, cfg.kv_bytes)
        ),
        "threshold": sc.offload_threshold,
    }


def _analytic_tokens_per_s(s, reqs, acc, cycle: int) -> float:
    """Balanced buckets of b requests at the midpoint context (seed 003 model): b times the
    chain's expected tokens per round over the delayed or synchronous round's time."""
    cfg, ctx, sc = s.cfg, s.ctx, s.cfg.sparsespec
    k, b = len(s.parents), cfg.resolved_batch
    mid = float(np.mean([r.prompt_len + r.target_tokens / 2 for r in reqs]))
    gpu = mixed_step_seconds(
        ctx.model,
        ctx.predictor(),
        b * k / cycle,
        b / cycle,
        k,
        mid,
        s.strategy.drafter.sparsity_ratio,
        cfg.kv_bytes,
        cfg.elementwise,
    )["total_s"]
    dv = delayed_verification(gpu, host_step_seconds(b, sc.host_per_request_s), k)
    round_s = float(dv["delayed_round_s" if sc.delayed == "on" else "sync_round_s"])
    return b * acc.expected_tokens() / round_s


def _sparsespec_figures(s, run: SparseSpecRun, capacity: int) -> dict[str, dict]:
    """The CPU time per request, the KV capacity and the run's KV and offload figures."""
    cfg, sc, sp = s.cfg, s.cfg.sparsespec, s.sim_provenance
    return {
        "host_per_request_s": figure(sc.host_per_request_s, "s", _host_source(sc)),
        "kv_capacity_tokens": figure(
            capacity, "tokens", s.ctx.provenance if not cfg.kv_capacity_tokens else "config"
        ),
        "max_kv_tokens": figure(run.max_kv, "tokens", sp),
        "offloads": figure(run.offloads, "requests", sp),
        "offload_tokens": figure(run.offload_tokens, "tokens", sp),
    }


def _host_source(sc) -> str:
    """Where the CPU time per request comes from: the paper's constant or the user's."""
    if sc.host_per_request_s == HOST_PER_REQUEST_S:
        return "paper:003 (3.2 ms of CPU per step at batch 128; --sparsespec-host-per-request-s)"
    return "input:sparsespec_host_per_request_s"
