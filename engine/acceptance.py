"""Lossless acceptance of a verified draft tree: greedy, and multi-draft rejection sampling.

Greedy (temperature 0, ``accept_greedy``) keeps the deepest path whose every token is the
target's argmax at its parent, so the output equals greedy autoregressive decoding. Stochastic
(temperature > 0, ``accept_stochastic``) is recursive rejection sampling down the tree
(SpecInfer's multi-round speculative sampling; Jeon et al. 2024 for drafts drawn without
replacement), which preserves the target distribution exactly. With deterministic drafts
(n-gram, greedy drafting; ``draft_probs=None``) the emitted token depends on the target and its
position's uniform only, so runs that differ only in such drafts emit the same text.

Both run on the device with static shapes and no host synchronisation (CUDA-graph safe). The
stochastic walk is ``kernels.accept``'s: one Triton program per sequence on the triton backend,
batched torch ops (the loop over depth and sibling rank unrolled) on the torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ssvkit.engine.tree import TreeTensors
from ssvkit.kernels.accept import (
    MAX_VOCAB,
    accept_sampled,
    reference_accept_sampled,
    uniforms_needed,
)


@dataclass(frozen=True, slots=True)
class AcceptedPath:
    """The path one round keeps and its bonus token, on the device.

    ``path`` ``[B, max_depth + 1]`` int64: tail labels of the kept nodes, root first (entry
    ``j >= count[b]`` holds ``j``); ``count`` ``[B]`` int32 kept nodes (1 + accepted drafts);
    ``bonus`` ``[B]`` int64 the token sampled after the last kept node.
    """

    path: torch.Tensor
    count: torch.Tensor
    bonus: torch.Tensor


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / temperature)`` in float32 (temperature > 0)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def accept_greedy(tree: TreeTensors, tokens: torch.Tensor, logits: torch.Tensor) -> AcceptedPath:
    """Greedy acceptance of ``tokens`` ``[B, t]`` (``tokens[:, 0]`` the root) given the target
    ``logits`` ``[B, t, V]`` of the same rows.

    A draft node is accepted when its token is the target's argmax at its parent and its parent
    is accepted; the deepest accepted node (lowest label among equals) ends the path and the
    target's argmax there is the bonus token. Every emitted token is the target's greedy choice
    given its prefix, so the output equals greedy autoregressive decoding.
    """
    b, t = tokens.shape
    tgt = logits.argmax(-1)  # [B, t]
    par = tree.parents.clamp(min=0)
    match = (tokens == tgt[:, par]) | (tree.parents < 0)
    ok = match
    for _ in range(tree.tree.max_depth):
        ok = match & ok[:, par]
    labels = torch.arange(t, device=tokens.device)
    score = torch.where(ok, tree.depth * (t + 1) - labels, -1)
    best = score.argmax(-1)  # [B]
    count = (tree.depth[best] + 1).to(torch.int32)
    bonus = tgt.gather(1, best[:, None])[:, 0]
    return AcceptedPath(_path_of(tree, best), count, bonus)


def _path_of(tree: TreeTensors, node: torch.Tensor) -> torch.Tensor:
    """``[B, D + 1]`` root-first path to ``node`` ``[B]`` (padded with the column index)."""
    d = tree.tree.max_depth
    t = tree.depth.shape[0]
    labels = torch.arange(t, device=node.device)
    anc = tree.mask.gather(1, node[:, None])  # [B, 1] int64 bits
    on_path = ((anc >> labels) & 1) != 0  # [B, t]
    col = torch.where(on_path, tree.depth, d + 1)
    path = torch.arange(d + 2, device=node.device).expand(node.shape[0], d + 2).clone()
    path.scatter_(1, col, labels.expand_as(col).clone())
    return path[:, : d + 1]


def accept_stochastic(
    tree: TreeTensors,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None = None,
    backend: str = "torch",
    uniforms: torch.Tensor | None = None,
) -> AcceptedPath:
    """Multi-draft rejection sampling: recursive rejection sampling down the tree (SpecInfer's
    multi-round speculative sampling; Jeon et al. 2024 for drafts drawn without replacement).

    At an accepted node with target distribution ``p`` and draft distribution ``q`` whose
    children ``c_1, c_2, ...`` were drawn in that order without replacement::

        for i = 1, 2, ...:  q_i = q with c_1..c_{i-1} removed, renormalised
                            accept c_i with probability min(1, p_i(c_i) / q_i(c_i)) -> descend
                            else p_{i+1} = norm(max(0, p_i - q_i))
        no child accepted:  the bonus token ~ p_last  (at a leaf: ~ p)

    Each step is a standard speculative-sampling step of ``p_i`` against ``q_i``, and
    ``c_i ~ q_i`` given the earlier draws, so its outcome (the accepted ``c_i`` or a draw from
    the residual) is distributed as ``p_i``; by induction the emitted token is distributed as
    ``p``: the target distribution is preserved exactly. Deterministic drafts
    (``draft_probs=None``) are the case ``q = one-hot``, walked in an equivalent form: draw
    ``x ~ p`` at the accepted node and descend to the child holding ``x`` (a one-hot child is
    accepted with probability ``p_i(c_i)`` either way). The emitted token then depends on ``p``
    and the node's uniform only, so the decode loop keys those uniforms by sequence position
    (``uniforms``): runs that differ only in deterministic drafts emit the same text, and their
    speeds are compared on it.

    ``draft_probs`` ``[B, t, V]``: row ``i`` is the draft distribution node ``i``'s children
    were drawn from (without replacement, in sibling-rank order); ``None`` for deterministic
    drafts. The uniforms are drawn first, in one call (``kernels.accept``); ``backend`` "triton"
    walks the tree in one kernel launch (vocabularies up to ``MAX_VOCAB``), "torch" in batched
    torch ops; both decide the same from the same uniforms. ``uniforms`` (``kernels.accept``'s
    ``u``) are used instead of fresh ones when given: the decode loop passes, for
    deterministic drafts, those of the positions the kept path's tokens will take.
    """
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend must be 'torch' or 'triton', got {backend!r}")
    b = tokens.shape[0]
    depth, width = tree.tree.max_depth, tree.children.shape[1]
    u = uniforms
    if u is None:
        n = uniforms_needed(depth, width, deterministic=draft_probs is None)
        u = torch.rand(b, n, device=tokens.device, generator=generator)
    fused = backend == "triton" and logits.shape[-1] <= MAX_VOCAB
    run = accept_sampled if fused else reference_accept_sampled
    path, count, bonus = run(tokens, logits, draft_probs, tree.children, depth, temperature, u)
    return AcceptedPath(path, count, bonus)


def accept(
    tree: TreeTensors,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None = None,
    backend: str = "torch",
    uniforms: torch.Tensor | None = None,
) -> AcceptedPath:
    """Greedy when ``temperature == 0`` (``draft_probs`` and ``uniforms`` are then
    irrelevant), else stochastic (on ``backend``, from ``uniforms`` when given)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return accept_greedy(tree, tokens, logits)
    return accept_stochastic(
        tree, tokens, logits, draft_probs, temperature, generator, backend, uniforms
    )
