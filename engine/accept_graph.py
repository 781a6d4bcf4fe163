"""The acceptance step of a round as one graph (``AcceptGraph.accept``): acceptance (greedy or
rejection sampling, ``engine.acceptance``), the cap of each sequence's kept count at the tokens
it may still emit, and the commit of the kept path's KV in the target's cache, keyed by the
verify graph whose logits it reads. On the triton backend the step is the target's argmax (or
the sampled walk of ``kernels.accept``) and two launches of ``kernels.accept_commit`` before
the summaries' refresh; on the torch backend, some fifty batched torch ops
(``cut_to_remaining``, ``engine.cache.KVCache.commit``). Its device state lives on the target runner
(``graph_constants``), since its graphs read it by address and a later ``engine.loop.Engine``
on the same runner replays them: the remaining-token counter (``remaining``) and the table of
one uniform per sequence position (``position_uniforms``) that deterministic drafts are
accepted with (``uniforms``).
"""

from __future__ import annotations

import torch
from ssvkit.engine.acceptance import AcceptedPath, accept
from ssvkit.engine.drafter import Draft
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree, TreeTensors
from ssvkit.kernels.accept_commit import accept_commit


def cut_to_remaining(acc: AcceptedPath, tokens, remaining, enable):
    """The torch backend's cut of ``acc`` at the tokens each sequence may still emit
    (``remaining`` ``[B]`` int32, lowered in place; all of them times ``enable``) and the
    round's packed host read ``[kept, bonus, tokens of the path, count before the cut]`` (the
    triton backend's ``kernels.accept_commit``). Cut short, a path's next accepted node is a
    token the target emits there (greedy: its argmax; sampling: an accepted draft is
    distributed as the target), so it stands in for the bonus."""
    count = torch.minimum(acc.count, remaining) * enable
    remaining.sub_(count)
    last = acc.path.shape[1] - 1
    cut = acc.path.gather(1, count.long().clamp(max=last)[:, None])
    bonus = torch.where(count < acc.count, tokens.gather(1, cut)[:, 0], acc.bonus)
    head = [count[:, None].long(), bonus[:, None], tokens.gather(1, acc.path)]
    packed = torch.cat(head + [acc.count[:, None].long()], dim=1)
    return AcceptedPath(acc.path, count, bonus), packed


class AcceptGraph:
    """The acceptance graph of one engine's target runner and decode settings."""

    def __init__(self, target: ModelRunner, config: DecodeConfig) -> None:
        self.target, self.config = target, config
        self._one: torch.Tensor | None = None  # the graph's "enable" input

    def remaining(self) -> torch.Tensor:
        """``[B]`` int32 tokens each sequence may still emit, on the device. The acceptance
        graph caps each round's kept count by it and lowers it, so it lives on the target
        runner (``graph_constants``): the graph reads it by address, also for a later Engine."""
        cache = self.target.cache
        buf = self.target.graph_constants.get("remaining")
        if buf is None:
            buf = torch.zeros(cache.batch, dtype=torch.int32, device=cache.lens.device)
            self.target.graph_constants["remaining"] = buf
        return buf

    def position_uniforms(self, seed: int | None = None) -> torch.Tensor:
        """``[B, t_max + 1]`` uniforms, column ``j`` sampling the token at position ``j``; with
        ``seed``, drawn afresh from it alone (a generator of their own, on the CPU: the same on
        every device and whatever else drew from the global one). The buffer is the target
        runner's (``graph_constants``): the acceptance graphs read it by address, and a later
        Engine on the same runner replays them."""
        cache = self.target.cache
        shape = (cache.batch, cache.t_max + 1)
        table = self.target.graph_constants.get("position_uniforms")
        if table is None or tuple(table.shape) != shape:
            table = torch.rand(shape, generator=torch.Generator().manual_seed(seed or 0))
            table = self.target.graph_constants["position_uniforms"] = table.to(cache.lens.device)
        elif seed is not None:
            g = torch.Generator().manual_seed(seed)
            table.copy_(torch.rand(shape, generator=g))
        return table

    def uniforms(self, tree: DraftTree):
        """At temperature > 0, a function giving ``[B, max_depth + 1]`` the uniforms of the
        positions a round's kept path takes (deterministic drafts: ``engine.acceptance``);
        None when greedy. Called inside captured work: a tensor made outside would be read by
        address after the caller freed it."""
        if self.config.temperature == 0:
            return None
        table, cache, depth = self.position_uniforms(), self.target.cache, tree.max_depth

        def uniforms():
            steps = torch.arange(1, depth + 2, device=table.device)
            at = (cache.lens.long()[:, None] + steps).clamp(max=table.shape[1] - 1)
            return table.gather(1, at)

        return uniforms

    def _fused(self, tt: TreeTensors, tokens, logits, maybe_probs, enable, uniforms):
        """The triton backend's acceptance step: the target's argmax (greedy) or the sampled
        walk, then the cut, the packed host read, the lengths and the KV move in two launches
        (``kernels.accept_commit``), then the summaries' refresh."""
        cache, tree, temp = self.target.cache, tt.tree, self.config.temperature
        depth = tree.max_depth
        if temp == 0:
            greedy = (logits.argmax(-1), tt.parents, tt.depth, tt.mask)
            out = accept_commit(tokens, self.remaining(), enable, cache.lens, depth, greedy=greedy)
        else:
            probs = maybe_probs[0] if maybe_probs else None
            acc = accept(tt, tokens, logits, probs, temp, backend="triton", uniforms=uniforms)
            walk = (acc.path, acc.count, acc.bonus)
            out = accept_commit(tokens, self.remaining(), enable, cache.lens, depth, sampled=walk)
        path, kept, bonus, packed, old_lens = out
        # A chain's kept entries already sit where they are kept: nothing moves.
        cache.commit_kept(path, kept, old_lens, move=not tree.is_chain)
        return AcceptedPath(path, kept, bonus), packed

    def accept(self, tree: DraftTree, draft: Draft, logits: torch.Tensor, verify_key):
        """Acceptance + target commit as one graph; ``enable`` = 0 makes warm-up a no-op.
        Under graphs it reads the verify graph's logits buffer, so it is keyed by that graph."""
        target, temp = self.target, self.config.temperature
        tt = target.tree_tensors(tree)
        probs = draft.probs if temp > 0 else None

        # Deterministic drafts take the uniforms of the positions they sample.
        positional = self.uniforms(tree) if probs is None else None
        uniforms = positional or (lambda: None)

        remaining = self.remaining()
        fused = target.backend == "triton"

        def fn(tokens, enable, *maybe_probs):
            if fused:
                return self._fused(tt, tokens, logits, maybe_probs, enable, uniforms())
            acc = accept(
                tt,
                tokens,
                logits,
                maybe_probs[0] if maybe_probs else None,
                temp,
                backend=target.backend,
                uniforms=uniforms(),
            )
            cut, packed = cut_to_remaining(acc, tokens, remaining, enable)
            target.cache.commit(acc.path, cut.count)
            return cut, packed

        one = self._one
        if one is None or one.device != draft.tokens.device:
            one = self._one = torch.ones(1, dtype=torch.int32, device=draft.tokens.device)
        inputs = (draft.tokens, one) + ((probs,) if probs is not None else ())
        neutral = lambda: (draft.tokens, torch.zeros_like(one)) + inputs[2:]  # noqa: E731
        key = ("accept", verify_key, temp, probs is not None)
        return target.graphs(key, fn, inputs, neutral)
