"""A separate small draft model with its own KV cache (dense attention), and self-speculation:
the target's own weights with sparse attention over a small share of its cache (seed 003).

``ModelDrafter`` expands the tree level by level (``engine.drafter``), the whole draft one CUDA
graph per tree; a kept leaf of the deepest level is run at the next round (catch-up), and a
warm drafter that sat out rounds runs only the tokens committed since (``resume``), not a
prefill of the whole context. ``SelfSparseDrafter`` drafts a chain with the target runner
itself under ``shared`` sparse attention; it writes the target's tail, which the verify forward
then overwrites.
"""

from __future__ import annotations

import math

import torch
from ssvkit.engine.acceptance import AcceptedPath
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.drafter import Draft, LevelPlan, draw_children
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree


class _LevelExpander:
    """Level-by-level expansion of a tree through ``runner`` with attention ``attn``."""

    def __init__(self, runner: ModelRunner, attn: AttentionConfig, temperature: float) -> None:
        self.runner, self.attn, self.temperature = runner, attn, temperature
        # The draft graphs (keyed by attention, tree and temperature on the runner) index with the
        # plan's tensors: the plans are kept on the runner too, or a graph captured for an
        # earlier drafter would replay reading that drafter's freed tensors.
        self._plans: dict[DraftTree, tuple] = runner.graph_constants.setdefault("level_plans", {})

    def plan(self, tree: DraftTree):
        if tree not in self._plans:
            lp = LevelPlan.build(tree)
            dev = self.runner.device
            kids = [lp.children_index(level, dev) for level in range(lp.dtree.max_depth)]
            v2d = [0] * tree.num_nodes  # verify label -> level-order label
            for k, v in enumerate(lp.to_verify):
                v2d[v] = k
            self._plans[tree] = (lp, kids, torch.tensor(v2d, dtype=torch.int64, device=dev))
        return self._plans[tree]

    def level(self, lp: LevelPlan, level: int, kids, tokens_d: torch.Tensor):
        """One level: the forward of the nodes up to ``level``, then its children's draw."""
        sub = lp.level_tree(level)
        lo = lp.upto[level - 1] if level > 0 else 0
        parent_row, rank = kids
        logits, _, _ = self.runner.tree_forward(tokens_d, sub, self.attn)
        rows = logits[:, lo:]  # [B, n_level, V]
        cand, probs = draw_children(rows, lp.dtree.max_children, self.temperature)
        return cand[:, parent_row, rank], probs  # [B, n_next], [B, n_level, V] or None

    def expand(self, roots: torch.Tensor, tree: DraftTree) -> Draft:
        """The whole draft below ``roots`` ``[B]``: one CUDA graph per tree (every level and
        the glue between them), so a round issues one replay, not a replay per level and the
        eager ops between them (launched one by one, a draft-model round is host-bound)."""
        lp, kids, v2d = self.plan(tree)
        key = ("draft", self.attn, lp.dtree, self.temperature)
        return self.runner.graphs(key, lambda r: self._expand(r, tree, lp, kids, v2d), (roots,))

    def _expand(self, roots, tree, lp, kids, v2d) -> Draft:
        b = roots.shape[0]
        tokens_d = roots[:, None]
        prob_rows = []
        for level in range(lp.dtree.max_depth):
            child, probs = self.level(lp, level, kids[level], tokens_d)
            tokens_d = torch.cat([tokens_d, child], dim=1)
            if probs is not None:
                prob_rows.append(probs)
        tokens = tokens_d.index_select(1, v2d)
        if not prob_rows:
            return Draft(tokens, None)
        v = prob_rows[0].shape[-1]
        leaves = tree.num_nodes - lp.upto[-2] if lp.dtree.max_depth else 0
        probs_d = torch.cat(
            prob_rows + [torch.zeros((b, leaves, v), device=roots.device)], dim=1
        )  # rows of every internal node in level order, zeros for the deepest level
        return Draft(tokens, probs_d.index_select(1, v2d))


class ModelDrafter:
    """Draft tokens from a separate model (``kind = draft_model``).

    The tree is expanded level by level (``engine.drafter``): each level is one tree forward
    plus the children draw; the whole draft (every level) is one CUDA graph per tree. The cache
    holds the committed prefix; the tail of the last level's forward holds every node of depth
    < D, so after the target's acceptance the kept path is committed from it (``commit``,
    device-only). A kept leaf at depth D was never run through the draft model: it is run first
    at the next round (catch-up, a one-node forward of the leaf in its own graph), for the
    sequences that need it.

    The drafter keeps on the host how many committed tokens its cache holds per sequence, so
    after rounds it sat out (a warm drafter, ``resume``) it runs only the tokens committed
    since -- a few graph-captured chain forwards (``ModelRunner.append``), not a prefill of the
    whole context again.
    """

    kind = "draft_model"

    def __init__(self, runner: ModelRunner, temperature: float) -> None:
        self.runner = runner
        self.expander = _LevelExpander(runner, AttentionConfig(kind="dense"), temperature)
        self._tree: DraftTree | None = None
        self._pending: torch.Tensor | None = None  # [B] kept leaf token not yet in the cache
        self._need: torch.Tensor | None = None  # [B] int32: 1 where that leaf is due
        self._catch_up = False
        self.synced: list[int] = []  # committed tokens per sequence in the cache (or pending)
        self.caught_up = 0  # tokens run by ``resume`` since ``start``

    def start(self, prompts: list[list[int]]) -> None:
        self.runner.prefill(prompts)
        self.runner.prepare_append()  # a later ``resume`` replays, never captures
        self._catch_up = False
        self.synced = [len(p) for p in prompts]
        self.caught_up = 0

    def resume(self, history: list[list[int]]) -> None:
        """Catch up with ``history`` (committed tokens, the root last, which a draft feeds
        itself) after rounds it did not draft: the tokens it lacks, the kept leaf it had not run
        yet included, through ``ModelRunner.append``."""
        tails = [h[s : len(h) - 1] for h, s in zip(history, self.synced, strict=True)]
        self.caught_up += self.runner.append(tails)
        self.synced = [len(h) - 1 for h in history]
        self._catch_up = False

    def draft(self, roots: torch.Tensor, tree: DraftTree, history) -> Draft:
        if self._catch_up:
            self._run_catch_up()
        self._tree = tree
        return self.expander.expand(roots, tree)

    def _run_catch_up(self) -> None:
        """The kept leaf of the last round, for the sequences that kept one (``_need``): a
        one-node forward and its commit, one graph."""
        single = DraftTree.from_parents([-1])
        attn, runner = self.expander.attn, self.runner

        def fn(pending, need):
            runner.tree_forward(pending[:, None], single, attn)
            runner.cache.commit(torch.zeros_like(pending)[:, None], need)  # tail entry 0

        runner.graphs(
            ("catch_up", attn),
            fn,
            (self._pending, self._need),
            neutral=lambda: (self._pending, torch.zeros_like(self._need)),
        )
        self._catch_up = False

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Keep the path's first D nodes (the last level's forward ran every node of depth
        < D), and note the kept leaf of depth D, which a catch-up runs: one graph."""
        depth = self._tree.max_depth
        _, _, v2d = self.expander.plan(self._tree)
        runner = self.runner

        def fn(path, count, toks):
            runner.cache.commit(v2d[path[:, :depth]], torch.clamp(count, max=depth))
            return toks.gather(1, path[:, depth:])[:, 0], (count > depth).to(torch.int32)

        self._pending, self._need = runner.graphs(
            ("commit_draft", self._tree),
            fn,
            (acc.path, acc.count, tokens),
            neutral=lambda: (acc.path, torch.zeros_like(acc.count), tokens),
        )

    def observe(self, history, counts: list[int]) -> None:
        depth = self._tree.max_depth
        self._catch_up = any(c > depth for c in counts)
        # All but the root are in the cache, less a kept leaf of depth D (its catch-up is due).
        self.synced = [len(h) - 1 - max(0, c - depth) for h, c in zip(history, counts, strict=True)]


class SelfSparseDrafter:
    """Self-speculation (``kind = self_sparse``): chains drafted by the target with sparse
    attention over ``sparsity_ratio`` of its context (seed 003).

    Every step is a tree forward of the chain so far whose attention is ``shared`` sparse
    attention with a budget of ``sparsity_ratio`` of the context (each row sees the blocks its
    first row selected, plus the local window). PillarAttn reuses the verify step's attention
    scores for ``k`` draft steps; here each draft step re-selects from the block metadata (an
    approximation of the same idea, with the same traffic). The draft writes the target's tail,
    which the verify forward then overwrites.
    """

    kind = "self_sparse"
    device_resident = True  # drafts from the target's cache alone (``engine.pipeline``)

    def __init__(self, runner: ModelRunner, attn: AttentionConfig, temperature: float) -> None:
        self.runner = runner
        self.expander = _LevelExpander(runner, attn, temperature)

    @staticmethod
    def attention(
        context_len: int, sparsity_ratio: float, block_size: int, window: int
    ) -> AttentionConfig:
        """Draft attention: the root's selection shared by the chain (``shared``, one group),
        ``ceil(ratio * T / block_size)`` scored blocks plus the local window."""
        top_n = max(1, math.ceil(sparsity_ratio * context_len / block_size))
        return AttentionConfig(
            kind="sparse",
            mode="shared",
            group_size=64,
            top_n=top_n,
            block_size=block_size,
            window=window,
            metadata="mean",
        )

    def start(self, prompts) -> None:
        self.runner.prepare(self.expander.attn)

    def resume(self, history) -> None:
        """No state of its own (it drafts from the target's cache): its attention's summaries."""
        self.start(history)

    def draft(self, roots: torch.Tensor, tree: DraftTree, history) -> Draft:
        if any(len(c) > 1 for c in tree.children):
            raise ValueError("the self_sparse drafter drafts chains only (tree chain:K)")
        return self.expander.expand(roots, tree)

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Nothing: the draft wrote only the target's tail, which the target's commit handled."""

    def observe(self, history, counts) -> None:
        """Nothing to track on the host."""
