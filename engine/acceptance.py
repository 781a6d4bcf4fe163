"""Lossless acceptance of a verified draft tree: greedy, and multi-draft rejection sampling.

Greedy (temperature 0): a draft node is accepted when its token is the target's argmax at its
parent and its parent is accepted; the deepest accepted node (lowest label among equals) ends
the path and the target's argmax there is the bonus token. Every emitted token is the target's
greedy choice given its prefix, so the output equals greedy autoregressive decoding.

Stochastic (temperature > 0): recursive rejection sampling down the tree (SpecInfer's
multi-round speculative sampling; Jeon et al. 2024 for drafts drawn without replacement). At an
accepted node with target distribution ``p`` and draft distribution ``q`` whose children
``c_1, c_2, ...`` were drawn in that order without replacement:

    for i = 1, 2, ...:  q_i = q with c_1..c_{i-1} removed, renormalised
                        accept c_i with probability min(1, p_i(c_i) / q_i(c_i)) -> descend
                        else p_{i+1} = norm(max(0, p_i - q_i))
    no child accepted:  the bonus token ~ p_last  (at a leaf: ~ p)

Each step is a standard speculative-sampling step of ``p_i`` against ``q_i``, and ``c_i ~ q_i``
given the earlier draws, so its outcome (the accepted ``c_i`` or a draw from the residual) is
distributed as ``p_i``; by induction the emitted token is distributed as ``p``: the target
distribution is preserved exactly. Deterministic drafts (n-gram, greedy drafting) are the case
``q = one-hot``: ``draft_probs=None``.

Both run on the device with static shapes and no host synchronisation (CUDA-graph safe); the
loop over depth and sibling rank is unrolled to the tree's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.tree import TreeTensors


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Outcome of one round, on the device.

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


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]`` (unnormalised is fine) by inverse CDF; no
    host synchronisation (``torch.multinomial`` checks its input on the host)."""
    cdf = probs.float().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, device=probs.device, generator=generator) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True)[:, 0]
    return idx.clamp(max=probs.shape[-1] - 1)


def accept_greedy(tree: TreeTensors, tokens: torch.Tensor, logits: torch.Tensor) -> Acceptance:
    """Greedy acceptance of ``tokens`` ``[B, t]`` (``tokens[:, 0]`` the root) given the target
    ``logits`` ``[B, t, V]`` of the same rows."""
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
    return Acceptance(_path_of(tree, best), count, bonus)


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
) -> Acceptance:
    """Multi-draft rejection sampling (module docstring).

    ``draft_probs`` ``[B, t, V]``: row ``i`` is the draft distribution node ``i``'s children
    were drawn from (without replacement, in sibling-rank order); ``None`` for deterministic
    drafts.
    """
    b, t = tokens.shape
    dev = tokens.device
    p_all = target_probs(logits, temperature)
    rows = torch.arange(b, device=dev)
    cur = torch.zeros(b, dtype=torch.int64, device=dev)
    p = p_all[:, 0]
    q = draft_probs[:, 0].float() if draft_probs is not None else None
    active = torch.ones(b, dtype=torch.bool, device=dev)
    depth = tree.tree.max_depth
    path = torch.arange(depth + 1, device=dev).expand(b, depth + 1).clone()
    count = torch.ones(b, dtype=torch.int32, device=dev)
    for level in range(depth):
        moved = torch.zeros(b, dtype=torch.bool, device=dev)
        for r in range(tree.children.shape[1]):
            child = tree.children[cur, r]  # [B]
            valid = active & ~moved & (child >= 0)
            tok = tokens[rows, child.clamp(min=0)]
            p_tok = p[rows, tok]
            if q is None:
                q_tok = torch.ones_like(p_tok)
                resid = p.scatter(1, tok[:, None], 0.0)
            else:
                qn = q / q.sum(-1, keepdim=True).clamp(min=1e-30)
                q_tok = qn[rows, tok]
                resid = (p - qn).clamp(min=0.0)
            u = torch.rand(b, device=dev, generator=generator)
            acc = valid & (q_tok > 0) & (u * q_tok < p_tok)
            # A child the exhausted draft could not have proposed (q_i = 0) is skipped.
            rej = valid & ~acc & (q_tok > 0)
            mass = resid.sum(-1, keepdim=True)
            resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p)
            p = torch.where(rej[:, None], resid, p)
            if q is not None:
                q = torch.where(rej[:, None], q.scatter(1, tok[:, None], 0.0), q)
            cur = torch.where(acc, child, cur)
            moved = moved | acc
        active = active & moved
        path[:, level + 1] = torch.where(moved, cur, path[:, level + 1])
        count = count + moved.to(torch.int32)
        p = torch.where(moved[:, None], p_all[rows, cur], p)
        if q is not None:
            q = torch.where(moved[:, None], draft_probs[rows, cur].float(), q)
    return Acceptance(path, count, sample_from(p, generator))


def accept(
    tree: TreeTensors,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """Greedy when ``temperature == 0`` (``draft_probs`` is then irrelevant), else stochastic."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return accept_greedy(tree, tokens, logits)
    return accept_stochastic(tree, tokens, logits, draft_probs, temperature, generator)
