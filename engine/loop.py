"""The decode loop: prefill, then rounds of draft -> one verify forward -> accept -> commit.

``Engine.generate`` (nano-vllm's ``LLMEngine.step`` loop in one sitting) prefills the prompts,
samples the first roots and starts the warm drafters the controller declares; then each round
is timed step by step (``draft``, ``launch``, ``verify``, ``accept``: CUDA events on the GPU,
the wall clock on the CPU) and ends in **one** host read of the kept tokens, after which the
warm n-gram shadow, the selection statistics, the trace and the controller run on the host.
Sequences of a batch finish at different rounds; a finished one rides along in the batch's
static shapes, keeping nothing, until the last one is done. ``Engine.generate`` gives each step.

The first round of each strategy on CUDA captures its graphs (and compiles the kernels); it is
flagged ``warmup`` and left out of the tokens/s figures.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from ssvkit.engine import pipeline
from ssvkit.engine.accept_graph import AcceptGraph
from ssvkit.engine.acceptance import target_probs
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.controller import Controller, KeepStrategy
from ssvkit.engine.draft_model import SelfSparseDrafter
from ssvkit.engine.drafter import Draft, Drafter
from ssvkit.engine.drafter_pool import DrafterPool
from ssvkit.engine.hand_over import HandOver, score_shadow
from ssvkit.engine.ngram import NgramDrafter
from ssvkit.engine.oracle import OracleDrafter, acceptance_label, reference, round_probe
from ssvkit.engine.results import DecodeResult, RoundRecord, reuse_summary
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.stats import RoundSelection, SelectionStats, stats_config
from ssvkit.engine.strategy_check import check_room, check_strategy
from ssvkit.engine.timing import StepTimer
from ssvkit.engine.trace_writer import TraceWriter
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.accept import reference_sample
from ssvkit.perfmodel.strategy import Strategy


class Engine:
    """Speculative decoding of a batch with one target runner and the drafters it needs."""

    def __init__(
        self,
        target: ModelRunner,
        strategy: Strategy,
        config: DecodeConfig,
        *,
        draft_runner: ModelRunner | None = None,
        controller: Controller | None = None,
        trace: TraceWriter | None = None,
    ) -> None:
        self.target, self.draft_runner, self.config = target, draft_runner, config
        self.controller = controller or KeepStrategy()
        self.trace = trace
        if draft_runner is not None and draft_runner.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"draft vocabulary {draft_runner.config.vocab_size} differs from the target's "
                f"{target.config.vocab_size}"
            )
        self.drafters = DrafterPool(target, draft_runner, config, self.controller)
        self._history: list[list[int]] | None = None  # set while generating
        self._longest_prompt = 0  # of the current generate call
        self._shadow: NgramDrafter | None = None  # the n-gram drafter scoring its shadow
        self._switch_s: float | None = None
        self._hand_over: HandOver | None = None  # of the current generate call
        self.acceptor = AcceptGraph(target, config)
        self._clears0 = 0  # graph drops before this generate call's rounds (``_captures``)
        self._oracle_s = 0.0  # the oracle's probe time in this generate call (``_oracle_probes``)
        self.drafter: Drafter | None = None
        self.set_strategy(strategy)

    # ------------------------------------------------------------------ strategy

    def set_strategy(self, strategy: Strategy) -> None:
        """Validate and install ``strategy`` (``ValueError`` when the engine cannot run it).

        Mid-generation, a drafter that was not the current one catches up with the committed
        tokens: a warm one (started in this call) with those it lacks, another from scratch."""
        draft_cfg = self.draft_runner.config if self.draft_runner is not None else None
        tree, attn = check_strategy(strategy, self.target.config, draft_cfg, self.target.backend)
        if tree.num_drafts and self.config.oracle_acceptance is not None:
            self.config.oracle_profile(tree.max_depth)  # one value, or one per depth
        if self._history is not None:
            self._check_room(tree)
        drafter = self.drafters.get(strategy, tree) if tree.num_drafts else None
        if drafter is not None and drafter is not self.drafter and self._history is not None:
            self.drafters.catch_up(drafter, self._history)
        self.strategy, self.tree, self.attn, self.drafter = strategy, tree, attn, drafter
        self.target.prepare(attn)
        self.stats = None
        reads = [attn]  # the target cache's summaries this strategy reads
        if self.config.record_stats:
            scfg = stats_config(strategy, attn, tree.num_nodes)
            self.target.prepare(scfg)
            self.stats = SelectionStats(
                scfg, self.target.config.num_layers, backend=self.target.backend
            )
            reads.append(scfg)
        if isinstance(drafter, SelfSparseDrafter):  # drafts from the target's cache
            reads.append(drafter.expander.attn)
        self.target.retain(reads)
        self._fresh = True

    # ------------------------------------------------------------------ generate

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> DecodeResult:
        """Decode ``max_new_tokens`` after each prompt (a batch of ``target.batch``).

        1. **prefill** the prompts (target and drafter; with the oracle drafter,
           ``engine.oracle``, first its reference: an autoregressive decode of the same prompts
           with the same settings), sample the first token: the first root (at temperature > 0,
           by inverse CDF at the uniform of its position: each run draws one uniform per
           sequence position from its seed, and acceptance of deterministic drafts uses the
           uniforms of the positions it samples, ``engine.acceptance``, so runs with the same
           seed whose drafts are deterministic -- n-gram, oracle, autoregressive -- emit the
           same text). Then start the *warm* drafters the controller declares
           (``drafter_kinds()``), timed apart (``DecodeResult.warm_s``): a later switch to one
           only catches it up (``Drafter.resume``).
        2. per round, with the oracle drafter first its untimed probes (``engine.oracle``:
           verify forwards of the round's own graph that commit nothing; their count and host
           time go to ``RoundRecord.oracle_probes`` / ``oracle_s``, outside the step times and
           the wall time), then timed step by step (CUDA events on the GPU, the wall clock on
           the CPU): ``draft`` the strategy's tree below the roots; ``launch`` -- the time the
           GPU waits for the host to issue the verify step (0 when the GPU is behind the host);
           ``verify`` it in one target forward of the flattened tail (tree mask,
           dense/sparse/NSA attention; one CUDA graph per strategy); ``accept`` -- acceptance
           (greedy or rejection sampling), the KV commit of the kept path and the rollback of
           the rest, the drafter's commit (CUDA graphs too) -- then **one** host read: the kept
           counts, the bonus tokens and the kept path's tokens. Sequences of a batch accept
           different counts and so finish at different rounds: a sequence keeps at most the
           tokens it may still emit (a device counter the acceptance graph lowers), and once
           done it rides along in the batch's static shapes, keeping nothing, until the last
           one is done. A warm n-gram drafter then indexes the committed tokens and scores its
           shadow acceptance (``engine.ngram``; host time ``step_s["shadow"]``, inside the
           round's wall time -- in its own ``observe`` when it is the drafter drafting) -- on a
           fixed sample of the batch when the controller bounds it (``shadow_sequences``).
        3. optionally the selection statistics (``engine.stats``, outside the timed steps), one
           trace record per sequence (``engine.trace_writer``), and ``controller.after_round``,
           which may switch the strategy for the next round (its host time:
           ``step_s["control"]`` of the round it follows; a switch's: ``step_s["switch"]`` of
           the next one). A controller with ``overlap`` true takes its decisions one round late
           instead (``engine.hand_over``): round r is handed over while round r + 1's GPU work
           runs, and a strategy it returns is installed after round r + 1, for round r + 2.
        """
        cfg = self.config
        if len(prompts) != self.target.batch or not all(prompts):
            raise ValueError(
                f"generate needs {self.target.batch} non-empty prompts, got lengths "
                f"{[len(p) for p in prompts]}"
            )
        self._longest_prompt = max(map(len, prompts))
        self._check_room(self.tree)
        if cfg.oracle_acceptance is not None:
            oracle = self.drafters.get(None, None, "oracle")
            oracle.load(prompts, self._reference(prompts))
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        first = self.target.prefill(prompts)
        reused = self.target.prefill_reused
        roots = self._first_roots(first)
        self.drafters.start(self.drafter, prompts)
        if self.stats is not None:
            self.stats = SelectionStats(
                self.stats.cfg, self.target.config.num_layers, backend=self.target.backend
            )
        host_roots = roots.tolist()
        prefill_s = time.perf_counter() - t0
        prefill_forward_s = self.target.prefill_seconds()
        warm_s = self.drafters.start_warm(prompts)
        self._shadow = self.drafters.shadow()
        history = [list(p) + [r] for p, r in zip(prompts, host_roots, strict=True)]
        self._history = history
        self.acceptor.remaining().fill_(cfg.max_new_tokens - 1)  # the first root is generated
        generated = [[r] for r in host_roots]
        timer = StepTimer(self.target.device)
        serial_reason = pipeline.blocker(cfg, self.controller, self.drafter, self.stats is not None)
        rounds = self._rounds(roots, history, generated, pipelined=serial_reason is None)
        if self.trace is not None:
            self.trace.close(
                timer=timer.source,
                provenance=f"measured:{timer.source}",
                warmup_rounds=[r.round for r in rounds if r.warmup],
                **reuse_summary(rounds),
                **acceptance_label(cfg, rounds),
            )
        self._history = None
        tokens = [g[: cfg.max_new_tokens] for g in generated]
        return DecodeResult(
            tokens,
            rounds,
            prefill_s,
            timer.source,
            warm_s,
            reused,
            prefill_forward_s,
            serial_reason=serial_reason,
        )

    def _first_roots(self, first: torch.Tensor) -> torch.Tensor:
        """The first root of each sequence ``[B]`` from the prefill's logits ``first``
        ``[B, V]``: the argmax, or at temperature > 0 the inverse-CDF draw at the uniform of
        its position."""
        cfg = self.config
        if cfg.temperature == 0:
            return first.argmax(-1)
        u = self.acceptor.position_uniforms(cfg.seed)
        at = self.target.cache.lens.long()[:, None].clamp(max=u.shape[1] - 1)
        return reference_sample(target_probs(first, cfg.temperature), u.gather(1, at)[:, 0])

    def _rounds(self, roots, history, generated, *, pipelined: bool) -> list[RoundRecord]:
        """Rounds until every sequence has its ``max_new_tokens``, each handed over to the
        trace and the controller (``engine.hand_over``), whose new strategies are installed;
        ``pipelined`` where nothing on the host decides the next round (``engine.pipeline``)."""
        self._clears0 = self._captures()[1]
        self._hand_over = HandOver(self.controller, self.trace, self._shadow, history)
        self._t_start = time.perf_counter()
        self._oracle_s = 0.0
        driver = pipeline.pipelined_rounds if pipelined else pipeline.serial_rounds
        rounds = driver(
            lambda roots, stage: self._issue(roots, history, stage=stage),
            lambda flight, index, wall0: self._complete(flight, index, history, generated, wall0),
            self._after_round,
            roots,
            generated,
            self.config.max_new_tokens,
        )
        self._hand_over.finish(self.strategy)
        return rounds

    def _after_round(self, rec: RoundRecord, key: str) -> None:
        """Hand round ``rec`` over (its host time in ``step_s[key]``) and install the strategy
        the controller returns, if any."""
        new = self._hand_over.after_round(rec, self.strategy, key=key)
        if new is not None:
            self._switch(new)

    def _reference(self, prompts: list[list[int]]) -> list[list[int]]:
        """The oracle's first guess of the continuation, which its probes correct where the
        verify's numerics leave it: the target's autoregressive continuation of ``prompts``
        with this run's attention and sampling settings (seed and position uniforms included),
        ``max_new_tokens`` plus a draft tree's depth long so that the last round's drafts have
        it too; kept with the runner's prefill for later runs (``engine.oracle.reference``).
        The pass prepares the target for its own strategy, so this one is installed again
        after it."""
        cfg = dataclasses.replace(
            self.config,
            oracle_acceptance=None,
            record_stats=False,
            max_new_tokens=self.config.max_new_tokens + self.tree.max_depth,
        )
        ar = dataclasses.replace(self.strategy, tree="chain:0")

        def decode() -> list[list[int]]:
            tokens = Engine(self.target, ar, cfg).generate(prompts).tokens
            self.set_strategy(self.strategy)
            return tokens

        return reference(self.target, prompts, AttentionConfig.from_strategy(ar), cfg, decode)

    def _check_room(self, tree: DraftTree) -> None:
        """``check_room`` of the target's and the draft model's caches for this call."""
        cfg = self.config
        for runner in (self.target, self.draft_runner):
            if runner is not None:
                check_room(tree, runner.cache.t_max, self._longest_prompt, cfg.max_new_tokens)

    def _issue(self, roots, history, *, stage: bool) -> pipeline.InFlight:
        """Issue one round's GPU work from ``roots`` ``[B]`` (the oracle's probes first); with
        ``stage``, its packed rows are copied where the next round cannot overwrite them."""
        warm = self._fresh and self.target.device.type == "cuda"
        self._fresh = False
        record = self.stats is not None
        captures = self._captures()
        probes, oracle_s = self._oracle_probes(roots, history)
        issued = time.perf_counter()
        lens_before = self.target.cache.lens.clone() if record else None
        timer = StepTimer(self.target.device)
        acc, packed, recorded = self._timed_steps(roots, history, timer, record)
        roots = acc.bonus.clone()
        packed, ready = pipeline.stage(packed) if stage else (packed, None)
        captured = self._captures()[0] != captures[0] and captures[1] == self._clears0
        return pipeline.InFlight(
            roots,
            packed,
            ready,
            timer,
            recorded,
            lens_before,
            warm,
            captured,
            issued,
            probes,
            oracle_s,
        )

    def _complete(self, flight, index, history, generated, wall0) -> RoundRecord:
        """Read the round in ``flight`` and keep its tokens: its record, whose wall time runs
        from ``wall0`` (``time.perf_counter()``)."""
        # The sequences still generating: the others ride along (static shapes) and keep
        # nothing (their remaining count is 0 on the device).
        active = [b for b, g in enumerate(generated) if len(g) < self.config.max_new_tokens]
        lens = [len(history[b]) - 1 for b in active]
        if self._hand_over.pending is not None:  # the last round's, while this round's GPU runs
            self._hand_over.run_pending(self.strategy)
        host = flight.rows()  # the round's one host synchronisation
        step_s = flight.timer.read()
        if self._switch_s is not None:  # the controller's last switch (host wall clock)
            step_s["switch"], self._switch_s = self._switch_s, None
        counts = self._append_kept(active, host, history, generated)
        shadow = None
        if self._shadow is not None and not self._hand_over.overlap:  # current or warm
            shadow, step_s["shadow"] = score_shadow(self._shadow, history)
        wall_s = time.perf_counter() - wall0
        selection, stats_s = (None, 0.0)
        if flight.lens_before is not None:  # the selection statistics record
            selection, stats_s = self._selection(flight.recorded, flight.lens_before)
        return RoundRecord(
            round=index,
            strategy=self.strategy.name,
            context_lens=lens,
            drafted=self.tree.num_drafts,
            accepted=[host[b][-1] - 1 for b in active],
            emitted=[counts[b] for b in active],
            sequences=active,
            step_s=step_s,
            wall_s=wall_s,
            warmup=flight.warm,
            t_s=flight.issued_s - self._t_start - self._oracle_s,
            selection=selection,
            stats_s=stats_s,
            shadow=shadow,
            captured=flight.captured,
            oracle_probes=flight.oracle_probes,
            oracle_s=flight.oracle_s,
        )

    def _oracle_probes(self, roots: torch.Tensor, history: list[list[int]]) -> tuple[int, float]:
        """With the oracle drafter, its probes of the round (``engine.oracle``; untimed: the
        oracle's own overhead): their count and host time; (0, 0.0) with another drafter."""
        if not isinstance(self.drafter, OracleDrafter):
            return 0, 0.0
        o0 = time.perf_counter()
        tree, target = self.tree, self.target
        probe = round_probe(target, tree, self.acceptor, self.config.temperature, self._verify)
        probes = self.drafter.anchor(roots, tree, history, probe)
        oracle_s = time.perf_counter() - o0
        self._oracle_s += oracle_s
        return probes, oracle_s

    def _timed_steps(self, roots, history, timer, record):
        """The round's timed steps: ``draft`` the tree below ``roots`` ``[B]``, issue
        the graph (``launch``) and ``verify``, ``accept`` with the drafter's commit. The
        accepted path, its packed host rows and the recorded per-layer ``q``."""
        tree = self.tree
        timer.start()
        draft = (
            self.drafter.draft(roots, tree, history)
            if self.drafter is not None
            else Draft(roots[:, None], None)
        )
        timer.mark("draft")
        logits, recorded = self._verify(draft.tokens, on_launch=lambda: timer.mark("launch"))
        timer.mark("verify")
        acc, packed = self.acceptor.accept(tree, draft, logits, ("verify", tree, self.attn, record))
        if self.drafter is not None:
            self.drafter.commit(acc, draft.tokens)
        timer.mark("accept")
        return acc, packed, recorded

    def _append_kept(self, active, host, history, generated) -> list[int]:
        """Append each active sequence's kept tokens (its accepted drafts, then the bonus) from
        the round's host rows to its history and its generated tokens, and hand them to the
        drafter; the kept count of every sequence."""
        counts = [row[0] for row in host]
        for b in active:
            row = host[b]
            kept = row[3 : 2 + row[0]] + [row[1]]
            history[b] += kept
            generated[b] += kept
        if self.drafter is not None:
            self.drafter.observe(history, counts)
        return counts

    def _selection(self, recorded, lens_before: torch.Tensor) -> tuple[RoundSelection, float]:
        """The round's selection statistics from the recorded queries, the cache lengths
        ``lens_before`` ``[B]`` of the round's start, and their host time."""
        tree, attn = self.tree, self.attn
        s0 = time.perf_counter()
        positions = lens_before.long()[:, None] + self.target.tree_tensors(tree).depth
        group = 1 if attn.mode == "per_query" or attn.kind == "dense" else attn.group_size
        selection = self.stats.observe(recorded, self.target.cache, lens_before, positions, group)
        return selection, time.perf_counter() - s0

    def _verify(self, tokens: torch.Tensor, on_launch=None):
        """The round's verify forward of ``tokens`` ``[B, t]`` through its graph: the logits
        ``[B, t, V]`` and the recorded per-layer ``q`` (None unless the statistics record)."""
        tree, attn, record = self.tree, self.attn, self.stats is not None
        return self.target.graphs(
            ("verify", tree, attn, record),
            lambda tok: self.target.tree_forward(tok, tree, attn, record=record)[::2],
            (tokens,),
            on_launch=on_launch,
        )

    def _captures(self) -> tuple[int, int]:
        """CUDA graphs the target's and the draft model's runners have captured so far, and
        the times they dropped their graphs."""
        gs = [self.target.graphs] + ([self.draft_runner.graphs] if self.draft_runner else [])
        return sum(g.captures for g in gs), sum(g.clears for g in gs)

    def _switch(self, new: Strategy) -> None:
        s0 = time.perf_counter()
        self.set_strategy(new)
        self._switch_s = time.perf_counter() - s0
