"""Lossless acceptance of a sampled draft tree in one launch (multi-draft rejection sampling).

``accept_sampled`` runs ``engine.acceptance``'s algorithm (SpecInfer's recursive rejection
sampling down the tree, drafts drawn without replacement; deterministic drafts as a one-hot
``q``) with one program per sequence: its ``p`` and ``q`` rows live in registers (the
vocabulary is one block, ``V <= MAX_VOCAB``), the tree's child table and the tokens are scalar
loads, and every uniform is read from ``u``, drawn beforehand, so it and its fp32 torch version
``reference_accept_sampled`` make the same decisions from the same ``u`` (up to float rounding
in the softmax and the CDF). ``accept_sampled``'s docstring has the walk and the shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_VOCAB = 8192  # one fp32 register row per distribution; beyond this the torch path runs


def uniforms_needed(depth: int, width: int, *, deterministic: bool) -> int:
    """Columns of ``u``: sampled drafts one per (level, sibling rank) and one for the bonus
    token; deterministic drafts one per level of the kept path (``depth + 1``)."""
    return depth + 1 if deterministic else depth * width + 1


@triton.jit
def _inv_cdf(p, vmask, uu, V):
    """The token at ``uu`` in [0, 1) of ``p``'s CDF (``reference_sample``)."""
    cdf = tl.cumsum(p, axis=0)
    x = uu * tl.max(tl.where(vmask, cdf, 0.0), axis=0)
    idx = tl.sum(((cdf <= x) & vmask).to(tl.int64), axis=0)
    return tl.minimum(idx, V - 1)


@triton.jit
def _softmax_row(ptr, offs, vmask, temperature):
    x = tl.load(ptr + offs, mask=vmask, other=float("-inf")).to(tl.float32) / temperature
    e = tl.exp(x - tl.max(x, axis=0))
    e = tl.where(vmask, e, 0.0)
    return e / tl.sum(e, axis=0)


@triton.jit
def _accept_kernel(
    logits_ptr,  # [B, t, V]
    probs_ptr,  # [B, t, V] (unused without HAS_Q)
    tokens_ptr,  # [B, t] int64
    children_ptr,  # [t, W] int64, -1 pads
    u_ptr,  # [B, NUM_U] fp32
    path_ptr,  # [B, DEPTH + 1] int64
    count_ptr,  # [B] int32
    bonus_ptr,  # [B] int64
    temperature,
    NUM_T,
    V,
    WIDTH,
    DEPTH,
    NUM_U,
    HAS_Q: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    vmask = offs < V
    row0 = b * NUM_T
    zero = b * 0  # int64 scalar: the loop-carried integers share its type
    p = _softmax_row(logits_ptr + row0 * V, offs, vmask, temperature)
    cur = zero
    active = zero + 1
    count = zero + 1
    tl.store(path_ptr + b * (DEPTH + 1), zero)
    if not HAS_Q:
        # Deterministic drafts: the target's token at the kept node, then the child holding it.
        for level in range(DEPTH):
            x = _inv_cdf(p, vmask, tl.load(u_ptr + b * NUM_U + level), V)
            moved = zero
            for r in range(WIDTH):
                child = tl.load(children_ptr + cur * WIDTH + r)
                tok = tl.load(tokens_ptr + row0 + tl.maximum(child, 0))
                acc = (active != 0) & (moved == 0) & (child >= 0) & (tok == x)
                cur = tl.where(acc, child, cur)
                moved = tl.where(acc, zero + 1, moved)
            active = active * moved
            count += moved
            kept = tl.where(moved != 0, cur, zero + level + 1)
            tl.store(path_ptr + b * (DEPTH + 1) + level + 1, kept)
            p_next = _softmax_row(logits_ptr + (row0 + cur) * V, offs, vmask, temperature)
            p = tl.where(moved != 0, p_next, p)
        tl.store(count_ptr + b, count.to(tl.int32))
        # The bonus token: the draw at the last kept node (level count - 1), whose p is kept.
        uu = tl.load(u_ptr + b * NUM_U + count - 1)
        tl.store(bonus_ptr + b, _inv_cdf(p, vmask, uu, V))
    else:
        q = tl.load(probs_ptr + row0 * V + offs, mask=vmask, other=0.0).to(tl.float32)
        for level in range(DEPTH):
            moved = zero
            for r in range(WIDTH):
                child = tl.load(children_ptr + cur * WIDTH + r)
                valid = (active != 0) & (moved == 0) & (child >= 0)
                tok = tl.load(tokens_ptr + row0 + tl.maximum(child, 0))
                is_tok = offs == tok
                p_tok = tl.sum(tl.where(is_tok, p, 0.0), axis=0)
                qn = q / tl.maximum(tl.sum(q, axis=0), 1e-30)
                q_tok = tl.sum(tl.where(is_tok, qn, 0.0), axis=0)
                resid = tl.maximum(p - qn, 0.0)
                uu = tl.load(u_ptr + b * NUM_U + level * WIDTH + r)
                acc = valid & (q_tok > 0) & (uu * q_tok < p_tok)
                # A child the exhausted draft could not have proposed (q_i = 0) is skipped.
                rej = valid & (q_tok > 0) & (uu * q_tok >= p_tok)
                mass = tl.sum(resid, axis=0)
                resid = tl.where(mass > 0, resid / tl.maximum(mass, 1e-30), p)
                p = tl.where(rej, resid, p)
                q = tl.where(rej & is_tok, 0.0, q)
                cur = tl.where(acc, child, cur)
                moved = tl.where(acc, zero + 1, moved)
            active = active * moved
            count += moved
            kept = tl.where(moved != 0, cur, zero + level + 1)
            tl.store(path_ptr + b * (DEPTH + 1) + level + 1, kept)
            p_next = _softmax_row(logits_ptr + (row0 + cur) * V, offs, vmask, temperature)
            p = tl.where(moved != 0, p_next, p)
            q_next = tl.load(probs_ptr + (row0 + cur) * V + offs, mask=vmask, other=0.0)
            q = tl.where(moved != 0, q_next.to(tl.float32), q)
        tl.store(count_ptr + b, count.to(tl.int32))
        # The bonus token: inverse CDF of p at u * total (``reference_sample``).
        tl.store(bonus_ptr + b, _inv_cdf(p, vmask, tl.load(u_ptr + b * NUM_U + NUM_U - 1), V))


def _check(tokens, logits, draft_probs, children, depth, temperature, u) -> tuple[int, int, int]:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be [B, t] int64, got {tuple(tokens.shape)} {tokens.dtype}")
    b, t = tokens.shape
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (b, t):
        raise ValueError(f"logits must be [{b}, {t}, V], got {tuple(logits.shape)}")
    v = logits.shape[2]
    if draft_probs is not None and tuple(draft_probs.shape) != (b, t, v):
        raise ValueError(f"draft_probs must be [{b}, {t}, {v}], got {tuple(draft_probs.shape)}")
    if children.dim() != 2 or children.shape[0] != t or children.dtype != torch.int64:
        raise ValueError(f"children must be [{t}, W] int64, got {tuple(children.shape)}")
    if not 0 <= depth < t:
        raise ValueError(f"depth must be in [0, {t}), got {depth}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    w = children.shape[1]
    need = uniforms_needed(depth, w, deterministic=draft_probs is None)
    if tuple(u.shape) != (b, need) or u.dtype != torch.float32:
        raise ValueError(f"u must be [{b}, {need}] float32, got {tuple(u.shape)} {u.dtype}")
    return b, v, w


def accept_sampled(
    tokens: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    children: torch.Tensor,
    depth: int,
    temperature: float,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk a draft tree by rejection sampling, one program per sequence.

    At an accepted node with target distribution ``p`` and draft distribution ``q`` whose
    children ``c_1, c_2, ...`` were drawn in that order (SpecInfer's recursive rejection
    sampling, drafts drawn without replacement)::

        for i = 1, 2, ...:  q_i = q with c_1..c_{i-1} removed, renormalised
                            accept c_i when u * q_i(c_i) < p_i(c_i) -> descend
                            else p_{i+1} = norm(max(0, p_i - q_i))
        no child accepted:  the bonus token ~ p_last (inverse CDF)

    ``draft_probs=None`` is the deterministic draft (``q`` one-hot on the child). Its walk
    draws the target's token ``x ~ p`` at each kept node (inverse CDF at that level's uniform)
    and descends to the child holding ``x``; none holds it: ``x`` is the bonus token. That is
    the loop above in distribution -- a one-hot ``c_i`` is accepted with probability
    ``p_i(c_i)`` either way, and the token emitted is distributed as ``p`` -- and it makes every
    emitted token a function of its node's ``p`` and its level's uniform alone, not of the
    drafts: with uniforms keyed by sequence position (``engine.loop``), decodes that differ
    only in their deterministic drafts (n-gram chains and trees, autoregressive) emit the same
    text. ``reference_accept_sampled`` runs the same loop as ~20 small batched torch ops per
    sibling rank and level, each a launch over a ``[B, V]`` row; this runs the whole walk of a
    sequence in one program. No host synchronisation (CUDA-graph safe).

    Parameters
    ----------
    tokens : torch.Tensor
        ``[B, t]`` int64, the tree's tokens, column 0 the root.
    logits : torch.Tensor
        ``[B, t, V]`` target logits at each node, any float dtype; softmax in fp32 at
        ``temperature``.
    draft_probs : torch.Tensor or None
        ``[B, t, V]``: row ``i`` is the draft distribution node ``i``'s children were drawn
        from; None for deterministic drafts.
    children : torch.Tensor
        ``[t, W]`` int64 child table, ``-1`` pads.
    depth : int
        The tree's depth, in ``[0, t)``.
    temperature : float
        Softmax temperature, > 0.
    u : torch.Tensor
        float32 uniforms in [0, 1) (``uniforms_needed`` columns). With ``draft_probs``
        ``[B, depth * W + 1]``: entry ``level * W + r`` decides sibling rank ``r`` at ``level``,
        the last one draws the bonus token. Without, ``[B, depth + 1]``: entry ``level`` draws
        the target's token at the node kept at ``level``; the bonus token is the draw at the
        last kept node.

    Returns
    -------
    path : torch.Tensor
        ``[B, depth + 1]`` int64, the kept labels root first; entry ``j >= count`` holds ``j``.
    count : torch.Tensor
        ``[B]`` int32, the kept nodes.
    bonus : torch.Tensor
        ``[B]`` int64, the bonus token.

    Raises
    ------
    ValueError
        On a bad shape, dtype, depth or temperature, or ``V > MAX_VOCAB`` (use the torch path).
    """
    b, v, w = _check(tokens, logits, draft_probs, children, depth, temperature, u)
    if v > MAX_VOCAB:
        raise ValueError(f"vocabulary {v} is over MAX_VOCAB = {MAX_VOCAB} (use the torch path)")
    dev = tokens.device
    path = torch.empty((b, depth + 1), dtype=torch.int64, device=dev)
    count = torch.empty(b, dtype=torch.int32, device=dev)
    bonus = torch.empty(b, dtype=torch.int64, device=dev)
    logits = logits.contiguous()
    probs = draft_probs.contiguous() if draft_probs is not None else logits
    _accept_kernel[(b,)](
        logits,
        probs,
        tokens.contiguous(),
        children.contiguous(),
        u.contiguous(),
        path,
        count,
        bonus,
        float(temperature),
        tokens.shape[1],
        v,
        w,
        depth,
        u.shape[1],
        HAS_Q=draft_probs is not None,
        BLOCK_V=triton.next_power_of_2(v),
        num_warps=4 if v <= 2048 else 8,
    )
    return path, count, bonus


def reference_sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]`` (unnormalised is fine) by inverse CDF at
    ``u`` ``[B]`` in [0, 1)."""
    cdf = probs.float().cumsum(-1)
    idx = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)[:, 0]
    return idx.clamp(max=probs.shape[-1] - 1)


def reference_accept_sampled(
    tokens: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    children: torch.Tensor,
    depth: int,
    temperature: float,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 torch version of ``accept_sampled``: batched over the sequences, the loop over
    levels and sibling ranks unrolled (static shapes, no host synchronisation)."""
    b, _, w = _check(tokens, logits, draft_probs, children, depth, temperature, u)
    dev = tokens.device
    p_all = torch.softmax(logits.float() / temperature, dim=-1)
    rows = torch.arange(b, device=dev)
    cur = torch.zeros(b, dtype=torch.int64, device=dev)
    p = p_all[:, 0]
    active = torch.ones(b, dtype=torch.bool, device=dev)
    path = torch.arange(depth + 1, device=dev).expand(b, depth + 1).clone()
    count = torch.ones(b, dtype=torch.int32, device=dev)
    if draft_probs is None:  # the target's token at the kept node, then the child holding it
        for level in range(depth):
            x = reference_sample(p, u[:, level])
            moved = torch.zeros(b, dtype=torch.bool, device=dev)
            for r in range(w):
                child = children[cur, r]
                tok = tokens[rows, child.clamp(min=0)]
                acc = active & ~moved & (child >= 0) & (tok == x)
                cur = torch.where(acc, child, cur)
                moved = moved | acc
            active = active & moved
            path[:, level + 1] = torch.where(moved, cur, path[:, level + 1])
            count = count + moved.to(torch.int32)
            p = torch.where(moved[:, None], p_all[rows, cur], p)
        return path, count, reference_sample(p, u.gather(1, (count.long() - 1)[:, None])[:, 0])
    q = draft_probs[:, 0].float()
    for level in range(depth):
        moved = torch.zeros(b, dtype=torch.bool, device=dev)
        for r in range(w):
            child = children[cur, r]  # [B]
            valid = active & ~moved & (child >= 0)
            tok = tokens[rows, child.clamp(min=0)]
            p_tok = p[rows, tok]
            qn = q / q.sum(-1, keepdim=True).clamp(min=1e-30)
            q_tok = qn[rows, tok]
            resid = (p - qn).clamp(min=0.0)
            uu = u[:, level * w + r]
            acc = valid & (q_tok > 0) & (uu * q_tok < p_tok)
            # A child the exhausted draft could not have proposed (q_i = 0) is skipped.
            rej = valid & ~acc & (q_tok > 0)
            mass = resid.sum(-1, keepdim=True)
            resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p)
            p = torch.where(rej[:, None], resid, p)
            q = torch.where(rej[:, None], q.scatter(1, tok[:, None], 0.0), q)
            cur = torch.where(acc, child, cur)
            moved = moved | acc
        active = active & moved
        path[:, level + 1] = torch.where(moved, cur, path[:, level + 1])
        count = count + moved.to(torch.int32)
        p = torch.where(moved[:, None], p_all[rows, cur], p)
        q = torch.where(moved[:, None], draft_probs[rows, cur].float(), q)
    return path, count, reference_sample(p, u[:, -1])
