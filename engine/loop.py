"""The decode loop: prefill, then rounds of draft -> one verify forward -> accept -> commit.

``Engine.generate`` (nano-vllm's ``LLMEngine.step`` loop in one sitting):

1. **prefill** the prompts (target and drafter; with the oracle drafter, ``engine.oracle``,
   first its reference: an autoregressive decode of the same prompts with the same settings),
   sample the first token: the first root (at temperature > 0, by inverse CDF at the uniform
   of its position: each run draws one uniform per sequence position from its seed, and
   acceptance of deterministic drafts uses the uniforms of the positions it samples,
   ``engine.acceptance``, so runs with the same seed whose drafts are deterministic --
   n-gram, oracle, autoregressive -- emit the same text). Then
   start the *warm* drafters the controller declares (``drafter_kinds()``), timed apart
   (``DecodeResult.warm_s``): a later switch to one only catches it up (``Drafter.resume``).
2. per round, with the oracle drafter first its untimed probes (``engine.oracle``: verify
   forwards of the round's own graph that commit nothing; their count and host time go to
   ``RoundRecord.oracle_probes`` / ``oracle_s``, outside the step times and the wall time), then
   timed step by step (CUDA events on the GPU, the wall clock on the CPU):
   ``draft`` the strategy's tree below the roots; ``launch`` -- the time the GPU waits for the
   host to issue the verify step (0 when the GPU is behind the host); ``verify`` it in one
   target forward of the flattened tail (tree mask, dense/sparse/NSA attention; one CUDA graph
   per strategy);
   ``accept`` -- acceptance (greedy or rejection sampling), the KV commit of the kept path and
   the rollback of the rest, the drafter's commit (CUDA graphs too) -- then **one** host read:
   the kept counts, the bonus tokens and the kept path's tokens. Sequences of a batch accept
   different counts and so finish at different rounds: a sequence keeps at most the tokens it
   may still emit (a device counter the acceptance graph lowers), and once done it rides along
   in the batch's static shapes, keeping nothing, until the last one is done.
   A warm n-gram drafter then indexes the committed tokens and scores its shadow acceptance
   (``engine.ngram``; host time ``step_s["shadow"]``, inside the round's wall time -- in its own
   ``observe`` when it is the drafter drafting) -- on a fixed sample of the batch when the
   controller bounds it (``shadow_sequences``).
3. optionally the selection statistics (``engine.stats``, outside the timed steps), one trace
   record per sequence (``engine.trace_writer``), and ``controller.after_round``, which may
   switch the strategy for the next round (its host time: ``step_s["control"]`` of the round
   it follows; a switch's: ``step_s["switch"]`` of the next one).

   A controller with ``overlap`` true takes its decisions one round late instead: the loop
   hands round r over during round r + 1, between the launch of r + 1's GPU work and its host
   synchronisation, where the host would only wait -- the warm n-gram drafter's shadow of r's
   tokens, r's trace records and ``after_round`` (host times ``step_s["shadow"]`` and
   ``step_s["control_overlap"]`` of round r, inside round r + 1's wall time); a strategy it
   returns is installed after round r + 1, for round r + 2. The last round's is handed over
   after the loop (``step_s["control"]``). Each host microsecond there costs wall time only
   when the GPU's queue runs dry first.

The first round of each strategy on CUDA captures its graphs (and compiles the kernels); it is
flagged ``warmup`` and left out of the tokens/s figures.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from ssvkit.engine.accept_graph import AcceptGraph
from ssvkit.engine.acceptance import accept, target_probs
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.controller import Controller, KeepStrategy
from ssvkit.engine.draft_model import ModelDrafter, SelfSparseDrafter
from ssvkit.engine.drafter import Draft, Drafter
from ssvkit.engine.hand_over import report_round
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter
from ssvkit.engine.oracle import OracleDrafter, acceptance_label, reference
from ssvkit.engine.results import DecodeResult, RoundRecord, reuse_summary
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.stats import SelectionStats
from ssvkit.engine.strategy_check import check_strategy
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
        declared = getattr(self.controller, "drafter_kinds", None)
        # Kinds with state of their own to keep warm (self_sparse drafts from the target's
        # cache; a draft model needs its runner).
        self.warm_kinds = tuple(
            k
            for k in (declared() if declared else ())
            if k == "ngram" or (k == "draft_model" and draft_runner is not None)
        )
        if draft_runner is not None and draft_runner.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"draft vocabulary {draft_runner.config.vocab_size} differs from the target's "
                f"{target.config.vocab_size}"
            )
        self._drafters: dict[str, Drafter] = {}
        self._started: set[str] = set()  # drafter kinds started in this generate call
        self._history: list[list[int]] | None = None  # set while generating
        self._longest_prompt = 0  # of the current generate call
        self._shadow: NgramDrafter | None = None  # the n-gram drafter scoring its shadow
        self._switch_s: float | None = None
        # Overlapped control (a controller with ``overlap``): the last round, whose host work
        # runs in the next round's window, and the strategy the controller returned there.
        self._overlap = False
        self._pending: tuple[RoundRecord, Strategy] | None = None
        self._decided: Strategy | None = None
        self.acceptor = AcceptGraph(target, config)
        self._clears0 = 0  # graph drops before this generate call's rounds (``_captures``)
        self._oracle_s = 0.0  # the oracle's probe time in this generate call (``_round``)
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
        drafter = self._drafter(strategy, tree) if tree.num_drafts else None
        if drafter is not None and drafter is not self.drafter and self._history is not None:
            if drafter.kind in self._started:
                drafter.resume(self._history)
            else:
                drafter.start([h[:-1] for h in self._history])
                self._started.add(drafter.kind)
        self.strategy, self.tree, self.attn, self.drafter = strategy, tree, attn, drafter
        self.target.prepare(attn)
        self.stats = None
        reads = [attn]  # the target cache's summaries this strategy reads
        if self.config.record_stats:
            scfg = self._stats_config(strategy, tree.num_nodes)
            self.target.prepare(scfg)
            self.stats = SelectionStats(
                scfg, self.target.config.num_layers, backend=self.target.backend
            )
            reads.append(scfg)
        if isinstance(drafter, SelfSparseDrafter):  # drafts from the target's cache
            reads.append(drafter.expander.attn)
        self.target.retain(reads)
        self._fresh = True

    def _stats_config(self, strategy: Strategy, t: int) -> AttentionConfig:
        """What the statistics select with: the strategy's own sparse attention, or for a dense
        strategy its sparse fields (top_n, block_size, window) with mean keys."""
        if strategy.is_sparse:
            return self.attn
        return AttentionConfig(
            kind="sparse",
            metadata=strategy.metadata if strategy.metadata != "nsa" else "mean",
            top_n=strategy.top_n,
            block_size=strategy.block_size,
            window=max(strategy.window, t),
        )

    def _drafter(
        self, strategy: Strategy | None, tree: DraftTree | None, kind: str = ""
    ) -> Drafter:
        """The drafter of ``strategy`` (or of ``kind``: draft_model or ngram), built once; the
        oracle for every strategy when the config gives its acceptance."""
        oracle = self.config.oracle_acceptance is not None
        kind = kind or ("oracle" if oracle else strategy.drafter.kind)
        if kind not in self._drafters:
            temp = self.config.draft_temp
            if kind == "oracle":
                d = OracleDrafter(self.target.device, self.target.config.vocab_size, self.config)
            elif kind == "draft_model":
                d = ModelDrafter(self.draft_runner, temp)
            elif kind == "ngram":
                shadow = SHADOW_MAX_CHAIN if "ngram" in self.warm_kinds else 0
                trees = getattr(self.controller, "shadow_trees", None)
                d = NgramDrafter(
                    self.target.device,
                    self.config.ngram_max_n,
                    shadow,
                    trees if trees and shadow else (),
                    getattr(self.controller, "shadow_sequences", 0),
                )
            else:
                attn = SelfSparseDrafter.attention(
                    self.target.cache.t_max,
                    strategy.drafter.sparsity_ratio,
                    strategy.block_size,
                    max(strategy.window, tree.num_nodes),
                )
                attn.check_tree(tree.num_nodes, self.target.config.gqa_group)
                d = SelfSparseDrafter(self.target, attn, temp)
            self._drafters[kind] = d
        return self._drafters[kind]

    # ------------------------------------------------------------------ generate

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> DecodeResult:
        """Decode ``max_new_tokens`` after each prompt (a batch of ``target.batch``)."""
        cfg = self.config
        if len(prompts) != self.target.batch or not all(prompts):
            raise ValueError(
                f"generate needs {self.target.batch} non-empty prompts, got lengths "
                f"{[len(p) for p in prompts]}"
            )
        self._longest_prompt = max(map(len, prompts))
        self._check_room(self.tree)
        if cfg.oracle_acceptance is not None:
            oracle = self._drafter(None, None, "oracle")
            oracle.load(prompts, self._reference(prompts))
        torch.manual_seed(cfg.seed)
        dev = self.target.device
        t0 = time.perf_counter()
        first = self.target.prefill(prompts)
        reused = self.target.prefill_reused
        if cfg.temperature == 0:
            roots = first.argmax(-1)
        else:
            u = self.acceptor.position_uniforms(cfg.seed)
            at = self.target.cache.lens.long()[:, None].clamp(max=u.shape[1] - 1)
            roots = reference_sample(target_probs(first, cfg.temperature), u.gather(1, at)[:, 0])
        if self.drafter is not None:
            self.drafter.start(prompts)
        self._started = {self.drafter.kind} if self.drafter is not None else set()
        if self.stats is not None:
            self.stats = SelectionStats(
                self.stats.cfg, self.target.config.num_layers, backend=self.target.backend
            )
        host_roots = roots.tolist()
        prefill_s = time.perf_counter() - t0
        prefill_forward_s = self.target.prefill_seconds()
        warm_s = self._start_warm(prompts)
        shadow = self._drafters.get("ngram")
        self._shadow = shadow if shadow is not None and shadow.shadow_chain else None
        history = [list(p) + [r] for p, r in zip(prompts, host_roots, strict=True)]
        self._history = history
        self.acceptor.remaining().fill_(cfg.max_new_tokens - 1)  # the first root is generated
        generated = [[r] for r in host_roots]
        timer = StepTimer(dev)
        rounds: list[RoundRecord] = []
        self._clears0 = self._captures()[1]
        self._t_start = time.perf_counter()
        self._oracle_s = 0.0
        self._overlap = bool(getattr(self.controller, "overlap", False))
        self._pending, self._decided = None, None
        while min(len(g) for g in generated) < cfg.max_new_tokens:
            rec, roots = self._round(len(rounds), roots, history, generated, timer)
            rounds.append(rec)
            if self._overlap:
                self._defer(rec)
            else:
                self._after_round(rec)
        if self._pending is not None:  # the last round's, after the loop: nothing to hide it
            self._run_pending(serial=True)
            self._decided = None
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
            tokens, rounds, prefill_s, timer.source, warm_s, reused, prefill_forward_s
        )

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
        """``ValueError`` unless every cache holds the longest prompt, ``max_new_tokens`` and a
        verify tail of ``tree`` past them. A sequence stops at ``max_new_tokens`` (its kept
        count is capped there, ``AcceptGraph.accept``) while the batch's slower ones go on, so
        its cache length ends at most at ``prompt + max_new_tokens - 1`` and each later round
        still writes its tail of ``tree.num_nodes`` entries after that."""
        need = self._longest_prompt + self.config.max_new_tokens + tree.num_nodes - 1
        for runner in (self.target, self.draft_runner):
            if runner is not None and need > runner.cache.t_max:
                raise ValueError(
                    f"a prompt of {self._longest_prompt} tokens + {self.config.max_new_tokens} "
                    f"new tokens + a verify tail of {tree.num_nodes} need {need} cache "
                    f"positions; the cache holds {runner.cache.t_max}"
                )

    def _start_warm(self, prompts: list[list[int]]) -> float:
        """Start the warm drafters that are not the current one; their host wall time."""
        todo = [k for k in self.warm_kinds if k not in self._started]
        if not todo:
            return 0.0
        t0 = time.perf_counter()
        for kind in todo:
            self._drafter(None, None, kind).start(prompts)
            self._started.add(kind)
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()  # the draft model's prefill runs asynchronously
        return time.perf_counter() - t0

    def _round(self, index, roots, history, generated, timer):
        tree, attn = self.tree, self.attn
        # The sequences still generating: the others ride along (static shapes) and keep
        # nothing (their remaining count is 0 on the device).
        active = [b for b, g in enumerate(generated) if len(g) < self.config.max_new_tokens]
        lens = [len(history[b]) - 1 for b in active]
        warm = self._fresh and self.target.device.type == "cuda"
        self._fresh = False
        record = self.stats is not None
        captures = self._captures()
        probes, oracle_s = 0, 0.0
        if isinstance(self.drafter, OracleDrafter):  # untimed: the oracle's own overhead
            o0 = time.perf_counter()
            probes = self.drafter.anchor(roots, tree, history, self._probe)
            oracle_s = time.perf_counter() - o0
            self._oracle_s += oracle_s
        wall0 = time.perf_counter()
        lens_before = self.target.cache.lens.clone() if record else None
        timer.start()
        draft = (
            self.drafter.draft(roots, tree, history)
            if self.drafter is not None
            else Draft(roots[:, None], None)
        )
        timer.mark("draft")
        logits, recorded = self._verify(draft.tokens, on_launch=lambda: timer.mark("launch"))
        timer.mark("verify")
        acc, packed = self.acceptor.accept(tree, draft, logits, ("verify", tree, attn, record))
        if self.drafter is not None:
            self.drafter.commit(acc, draft.tokens)
        timer.mark("accept")
        if self._pending is not None:  # the last round's host work, while this round's GPU runs
            self._run_pending()
        host = packed.cpu().tolist()  # the round's one host synchronisation
        step_s = timer.read()
        if self._switch_s is not None:  # the controller's last switch (host wall clock)
            step_s["switch"], self._switch_s = self._switch_s, None
        counts = [row[0] for row in host]
        for b in active:
            row = host[b]
            kept = row[3 : 2 + row[0]] + [row[1]]
            history[b] += kept
            generated[b] += kept
        if self.drafter is not None:
            self.drafter.observe(history, counts)
        shadow = None
        if self._shadow is not None and not self._overlap:  # current or warm: every round
            s0 = time.perf_counter()
            self._shadow.sync(history)
            shadow = {"ngram": self._shadow.take_shadow()}
            step_s["shadow"] = time.perf_counter() - s0
        wall_s = time.perf_counter() - wall0
        selection, stats_s = None, 0.0
        if record:
            s0 = time.perf_counter()
            positions = lens_before.long()[:, None] + self.target.tree_tensors(tree).depth
            group = 1 if attn.mode == "per_query" or attn.kind == "dense" else attn.group_size
            selection = self.stats.observe(
                recorded, self.target.cache, lens_before, positions, group
            )
            stats_s = time.perf_counter() - s0
        rec = RoundRecord(
            round=index,
            strategy=self.strategy.name,
            context_lens=lens,
            drafted=tree.num_drafts,
            accepted=[host[b][-1] - 1 for b in active],
            emitted=[counts[b] for b in active],
            sequences=active,
            step_s=step_s,
            wall_s=wall_s,
            warmup=warm,
            t_s=wall0 - self._t_start - self._oracle_s,
            selection=selection,
            stats_s=stats_s,
            shadow=shadow,
            captured=self._captures()[0] != captures[0] and captures[1] == self._clears0,
            oracle_probes=probes,
            oracle_s=oracle_s,
        )
        return rec, acc.bonus.clone()

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

    def _probe(self, tokens: torch.Tensor) -> list[list[int]]:
        """The tokens each sequence would emit from draft ``tokens`` ``[B, t]`` this round (its
        accepted drafts, then the bonus; uncapped by ``max_new_tokens``): the round's own verify
        graph and acceptance (the same uniforms), committing nothing. It changes no state
        that outlives the round: the forward writes only the verify tail past each committed
        length, which the round's verify writes again before anything reads it; the lengths,
        block metadata, compressed tokens, ``remaining`` and every generator are untouched."""
        tree, temp = self.tree, self.config.temperature
        logits, _ = self._verify(tokens)
        uniforms = self.acceptor.uniforms(tree)
        acc = accept(
            self.target.tree_tensors(tree),
            tokens,
            logits,
            None,
            temp,
            backend=self.target.backend,
            uniforms=uniforms() if uniforms is not None else None,
        )
        packed = torch.cat(
            [acc.count[:, None].long(), acc.bonus[:, None], tokens.gather(1, acc.path)], dim=1
        )
        return [row[3 : 2 + row[0]] + [row[1]] for row in packed.cpu().tolist()]

    def _captures(self) -> tuple[int, int]:
        """CUDA graphs the target's and the draft model's runners have captured so far, and
        the times they dropped their graphs."""
        gs = [self.target.graphs] + ([self.draft_runner.graphs] if self.draft_runner else [])
        return sum(g.captures for g in gs), sum(g.clears for g in gs)

    def _after_round(self, rec: RoundRecord) -> None:
        """The round's trace records and controller call, serially; its switch at once."""
        new = report_round(rec, self.strategy, "control", self.trace, self.controller)
        if new is not None and new != self.strategy:
            self._switch(new)

    def _defer(self, rec: RoundRecord) -> None:
        """Overlapped control: install what the controller decided during this round (on the
        round before), and leave this round's host work to the next round's window."""
        strategy = self.strategy
        if self._decided is not None:
            new, self._decided = self._decided, None
            self._switch(new)
        self._pending = (rec, strategy)

    def _run_pending(self, serial: bool = False) -> None:
        """The pending round's host work: the warm n-gram drafter's shadow of its tokens, its
        trace records and the controller call -- inside the next round's wall time, while that
        round's GPU work runs (``step_s["shadow"]`` and ``step_s["control_overlap"]`` of the
        pending round), or after the last round (``serial``: ``step_s["control"]``)."""
        rec, strategy = self._pending
        self._pending = None
        if self._shadow is not None:
            s0 = time.perf_counter()
            self._shadow.sync(self._history)
            rec.shadow = {"ngram": self._shadow.take_shadow()}
            rec.step_s["shadow"] = time.perf_counter() - s0
        new = report_round(
            rec,
            strategy,
            "control" if serial else "control_overlap",
            self.trace,
            self.controller,
        )
        if new is not None and new != self.strategy:
            self._decided = new

    def _switch(self, new: Strategy) -> None:
        s0 = time.perf_counter()
        self.set_strategy(new)
        self._switch_s = time.perf_counter() - s0
