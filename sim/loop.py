"""The draft/verify decode loop of ``ar_dense``, ``ar_sparse``, ``sd_dense``,
``sd_sparse_naive`` and ``ssv``: drafter, selector, verifier and acceptor per round.

A batch of sequences decodes in lockstep; a sequence leaves when it has its tokens (with
``static_batch``, as an engine decoding a fixed batch, its slot stays and every round costs the
whole batch at its mean context until the last sequence ends). Each stage
is a simpy generator whose only source of time is ``yield env.timeout(cost)`` with the cost from
the round's cost table (``sim.tables.loop_table``). Round granularity (default) lumps each
stage into one event per round: drafting, the selection of all refresh layers, the rest of the
verification forward, acceptance with the loop's host time per round (the table's ``host_s``,
``perfmodel.loop_host``); their sum is perfmodel's ``round_s``, plus any host time the config
adds (``SimConfig.loop_overhead_s``), which acceptance carries too. ``per_layer``
runs one event per draft level and per layer instead (refresh layers select, reuse layers
inherit, each layer's attention at its own group overlap), which is what the Gantt and traces
show in detail.
"""

from __future__ import annotations

from ssvkit.perfmodel.refresh import schedule_every
from ssvkit.sim.recorder import Recorder, RequestRecord
from ssvkit.sim.tables import Grid

STEP_NAMES = ("draft", "select", "verify", "accept")
LANES = ("drafter", "selector", "verifier", "acceptor")


class Sequence:
    __slots__ = ("record", "context", "remaining", "sample")

    def __init__(self, record: RequestRecord, sample):
        self.record = record
        self.context = record.prompt_len
        self.remaining = record.target_tokens
        self.sample = sample


class DecodeLoop:
    """One lockstep batch running the draft/verify loop to completion."""

    def __init__(
        self,
        env,
        grid: Grid,
        levels: Grid,
        seqs: list[Sequence],
        recorder: Recorder,
        strategy,
        num_draft: int,
        num_layers: int,
        group_overlap,
        layer_overlap,
        per_layer: bool = False,
        host_s: float = 0.0,
        static_batch: bool = False,
    ):
        self.env = env
        self.grid = grid
        self.levels = levels
        self.seqs = seqs
        self.rec = recorder
        self.strategy = strategy
        self.num_draft = num_draft
        self.num_layers = num_layers
        self.group_overlap = group_overlap
        self.layer_overlap = layer_overlap
        self.per_layer = per_layer
        self.host_s = host_s
        self.static_batch = static_batch
        self.refresh = schedule_every(num_layers, strategy.refresh_every).tolist()
        self.sparse = strategy.is_sparse
        self.tokens = 0

    # -- stages ---------------------------------------------------------------------------
    def drafter(self, b, T, g, q, spans):
        env = self.env
        if not self.num_draft:
            return
        if self.per_layer:
            for i, dt in enumerate(self.levels.at(b, T, g)):
                if dt > 0:
                    if spans:
                        self.rec.span("drafter", f"draft level {i + 1}", env.now, dt)
                    yield env.timeout(dt)
            return
        if spans:
            self.rec.span("drafter", "draft", env.now, q[0])
        yield env.timeout(q[0])

    def selector(self, dt, spans, name="select"):
        if spans:
            self.rec.span("selector", name, self.env.now, dt)
        yield self.env.timeout(dt)

    def verifier(self, b, T, g, q, layer_g, spans):
        env = self.env
        if not self.per_layer:
            if self.sparse and q[1] > 0:
                yield from self.selector(q[1], spans)
            if spans:
                self.rec.span("verifier", "verify", env.now, q[2])
            yield env.timeout(q[2])
            return
        at, grid = self.grid.at, self.grid
        iR, iU, iS = (
            grid.index["attention_refresh_s"],
            grid.index["attention_reuse_s"],
            grid.index["selection_s"],
        )
        linear = q[grid.index["linear_s"]]
        for layer in range(self.num_layers):
            ql = at(b, T, layer_g[layer]) if layer_g is not None else q
            if self.refresh[layer]:
                if ql[iS] > 0:
                    yield from self.selector(ql[iS], spans, f"select L{layer}")
                dt = linear + ql[iR]
            else:
                dt = linear + ql[iU]
            if spans:
                self.rec.span("verifier", f"layer {layer}", env.now, dt)
            yield env.timeout(dt)
        head = q[grid.index["head_s"]]
        if spans:
            self.rec.span("verifier", "lm head", env.now, head)
        yield env.timeout(head)

    def acceptor(self, q, spans):
        # The loop's host time per round (the table's and the added one) goes with acceptance.
        dt = q[3] + q[self.grid.index["host_s"]] + self.host_s
        if dt > 0:
            if spans:
                self.rec.span("acceptor", "accept", self.env.now, dt)
            yield self.env.timeout(dt)

    # -- the loop -------------------------------------------------------------------------
    def run(self):
        env, rec = self.env, self.rec
        name = self.strategy.name
        k = self.num_draft
        active = list(self.seqs)
        while active:
            # A static batch keeps its finished sequences' slots (and caches) until the last ends.
            costed = self.seqs if self.static_batch else active
            b = len(costed)
            T = sum(s.context for s in costed) / b
            layer_g, g = self.group_overlap.next()
            layer_c, _ = self.layer_overlap.next()
            q = self.grid.at(b, T, g)
            spans = rec.timeline_open
            t0 = env.now
            yield from self.drafter(b, T, g, q, spans)
            t1 = env.now
            per_layer_g = layer_g if (self.per_layer and not self.group_overlap.fixed) else None
            yield from self.verifier(b, T, g, q, per_layer_g, spans)
            t2 = env.now
            yield from self.acceptor(q, spans)
            now = env.now
            sel = q[1] if self.sparse else 0.0
            steps = (t1 - t0, sel, t2 - t1 - sel, now - t2)
            layers = (layer_g, layer_c, None) if self.sparse else None
            still = []
            for s in active:
                acc = s.sample()
                made = min(acc + 1, s.remaining)
                r = s.record
                r.count_round(now, k, acc, made)
                rec.round(r.request, name, t0, s.context, k, acc, steps, layers)
                s.context += made
                s.remaining -= made
                self.tokens += made
                if s.remaining > 0:
                    still.append(s)
                else:
                    r.finish_s = now
            rec.num_steps += 1
            active = still
