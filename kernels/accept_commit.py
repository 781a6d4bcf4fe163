"""A round's acceptance and KV commit in two launches (plus the target's argmax).

``accept_commit``, one program per sequence: the greedy walk of the draft tree (or a sampled
walk's result, ``kernels.accept``), the cut of each sequence's kept count at the tokens it may
still emit, the packed host read and the committed lengths. ``move_kept``, one launch over
every (layer, key/value, head) row of every sequence: the move of the kept path's KV entries to
consecutive positions. The torch version of the same step (``engine.acceptance.accept_greedy``,
``engine.accept_graph``'s cut and packing, ``engine.cache.KVCache.commit``) is about fifty
small launches. Neither launch synchronises with the host (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.tree import MAX_TREE_NODES


@triton.jit
def _accept_commit_kernel(
    argmax_ptr,  # [B, T] int64 (GREEDY)
    tokens_ptr,  # [B, T] int64
    parents_ptr,  # [T] int64 (GREEDY)
    depth_ptr,  # [T] int64 (GREEDY)
    mask_ptr,  # [B, T] int64 (GREEDY)
    path_in_ptr,  # [B, P] int64 (not GREEDY)
    count_in_ptr,  # [B] int32 (not GREEDY)
    bonus_in_ptr,  # [B] int64 (not GREEDY)
    remaining_ptr,  # [B] int32, lowered in place
    enable_ptr,  # [1] int32
    lens_ptr,  # [B] int32, raised in place
    path_ptr,  # [B, P] int64
    kept_ptr,  # [B] int32
    bonus_ptr,  # [B] int64
    packed_ptr,  # [B, P + 3] int64
    old_lens_ptr,  # [B] int32
    T,
    P,
    GREEDY: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_P)
    jm = j < P
    if GREEDY:
        i = tl.arange(0, BLOCK_T)
        im = i < T
        par = tl.load(parents_ptr + i, mask=im, other=0)
        tok = tl.load(tokens_ptr + b * T + i, mask=im, other=0)
        at_parent = tl.load(argmax_ptr + b * T + tl.maximum(par, 0), mask=im, other=0)
        match = ((tok == at_parent) | (par < 0)) & im
        one = tl.full((BLOCK_T,), 1, tl.int64)
        # Distinct bits: their sum is their OR (bit 63 wraps to the sign, as an OR would set).
        matched = tl.sum(tl.where(match, one << i.to(tl.int64), 0), axis=0)
        anc = tl.load(mask_ptr + b * T + i, mask=im, other=0)
        ok = ((anc & matched) == anc) & im
        d = tl.load(depth_ptr + i, mask=im, other=0)
        score = tl.where(ok, d * (T + 1) - i, -1)
        best = tl.argmax(score, axis=0).to(tl.int64)
        count = tl.load(depth_ptr + best) + 1
        bonus = tl.load(argmax_ptr + b * T + best)
        on = (((tl.load(mask_ptr + b * T + best) >> i.to(tl.int64)) & 1) != 0) & im
        hit = on[None, :] & (d[None, :] == j[:, None])
        path = tl.sum(tl.where(hit, i[None, :].to(tl.int64), 0), axis=1)
        path = tl.where(j >= count, j.to(tl.int64), path)
    else:
        path = tl.load(path_in_ptr + b * P + j, mask=jm, other=0)
        count = tl.load(count_in_ptr + b).to(tl.int64)
        bonus = tl.load(bonus_in_ptr + b)
    rem = tl.load(remaining_ptr + b)
    kept = tl.minimum(count.to(tl.int32), rem) * tl.load(enable_ptr)
    tl.store(remaining_ptr + b, rem - kept)
    # Cut short, the path's next node is a token the target emits there: it is the bonus.
    cut = tl.sum(tl.where(j == tl.minimum(kept, P - 1), path, 0), axis=0)
    bonus = tl.where(kept < count, tl.load(tokens_ptr + b * T + cut), bonus)
    tl.store(path_ptr + b * P + j, path, mask=jm)
    tl.store(kept_ptr + b, kept)
    tl.store(bonus_ptr + b, bonus)
    row = packed_ptr + b * (P + 3)
    tl.store(row, kept.to(tl.int64))
    tl.store(row + 1, bonus)
    tl.store(row + 2 + j, tl.load(tokens_ptr + b * T + path, mask=jm, other=0), mask=jm)
    tl.store(row + 2 + P, count)
    old = tl.load(lens_ptr + b)
    tl.store(old_lens_ptr + b, old)
    tl.store(lens_ptr + b, old + kept)


@triton.jit
def _move_kept_kernel(
    kv_ptr,  # [L, 2, B, HKV, T_MAX, HEAD_D]
    path_ptr,  # [B, P] int64
    kept_ptr,  # [B] int32
    lens_ptr,  # [B] int32, after the commit
    B,
    HKV,
    T_MAX,
    ROWS,  # L * 2 * HKV
    HEAD_D,
    P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    e = tl.arange(0, BLOCK_D)
    rm = r < ROWS
    em = e < HEAD_D
    first = (((r // HKV) * B + b) * HKV + r % HKV) * T_MAX  # position 0 of each row
    kept = tl.load(kept_ptr + b)
    base = (tl.load(lens_ptr + b) - kept).to(tl.int64)
    m2 = rm[:, None] & em[None, :]
    # Entry j lands on position j of the tail, read from path[j] >= j: in increasing j, no
    # entry is overwritten before it is read (and each element's load and store are one thread's).
    for jj in range(1, P):
        src = tl.load(path_ptr + b * P + jj)
        if (jj < kept) & (src != jj):
            x = tl.load(kv_ptr + ((first + base + src) * HEAD_D)[:, None] + e[None, :], mask=m2)
            tl.store(kv_ptr + ((first + base + jj) * HEAD_D)[:, None] + e[None, :], x, mask=m2)


def _check(tokens) -> tuple[int, int]:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be [B, t] int64, got {tuple(tokens.shape)} {tokens.dtype}")
    b, t = tokens.shape
    if not 1 <= t <= MAX_TREE_NODES:  # one int64 bit a node in the ancestor bitmask
        raise ValueError(f"a tree of {t} nodes is outside 1..{MAX_TREE_NODES}")
    return b, t


def accept_commit(
    tokens: torch.Tensor,
    remaining: torch.Tensor,
    enable: torch.Tensor,
    lens: torch.Tensor,
    depth: int,
    *,
    greedy: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    sampled: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Accept one round's draft tree and commit its lengths, one program per sequence.

    Greedy acceptance (``engine.acceptance``): node ``i`` matches when its token is the
    target's argmax at its parent (the root always matches); it is accepted when it and all its
    ancestors match: with ``mask[i]`` the ancestor-or-self bitmask of ``kernels.tree`` (one
    int64 bit per node) and ``matched`` the bits of the matching nodes,
    ``mask[i] & matched == mask[i]``. The deepest accepted node, lowest label among equals,
    ends the path; the target's argmax there is the bonus token. A sampled walk
    (``kernels.accept.accept_sampled``) hands its ``(path, count, bonus)`` in instead, and the
    program does the rest.

    The cut (``remaining``, ``enable``): a sequence keeps ``min(count, remaining) * enable``
    nodes; cut short, the next node of its path stands in for the bonus token (the target emits
    it there). One launch, no host synchronisation (CUDA-graph safe).

    Parameters
    ----------
    tokens : torch.Tensor
        ``[B, t]`` int64, column 0 the root.
    remaining : torch.Tensor
        ``[B]`` int32, the tokens each sequence may still emit; lowered in place by the kept
        count.
    enable : torch.Tensor
        ``[1]`` int32; 0 keeps nothing.
    lens : torch.Tensor
        ``[B]`` int32 committed lengths; raised in place by the kept count.
    depth : int
        The tree's depth ``D``, in ``[0, t)``.
    greedy : tuple of torch.Tensor, optional
        ``(argmax, parents, depth, mask)``: ``argmax`` ``[B, t]`` int64, the target's token at
        each node; ``parents`` and ``depth`` ``[t]`` int64 (the root's parent -1); ``mask``
        ``[B, t]`` int64. Walks the tree.
    sampled : tuple of torch.Tensor, optional
        ``(path, count, bonus)`` of a sampled walk, taken as its result. Give exactly one of
        ``greedy`` and ``sampled``.

    Returns
    -------
    path : torch.Tensor
        ``[B, D + 1]`` int64, uncut; entry ``j >= count`` holds ``j``.
    kept : torch.Tensor
        ``[B]`` int32, the nodes kept after the cut.
    bonus : torch.Tensor
        ``[B]`` int64.
    packed : torch.Tensor
        ``[B, D + 4]`` int64, the host read of sequence ``b``: ``[kept, bonus, tokens of the
        path (root first), count before the cut]``.
    old_lens : torch.Tensor
        ``[B]`` int32, the lengths before the commit.
    """
    if (greedy is None) == (sampled is None):
        raise ValueError("give exactly one of greedy= and sampled=")
    b, t = _check(tokens)
    if not 0 <= depth < t:
        raise ValueError(f"depth must be in [0, {t}), got {depth}")
    for name, x, dtype in (("remaining", remaining, torch.int32), ("lens", lens, torch.int32)):
        if tuple(x.shape) != (b,) or x.dtype != dtype or not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{b}] {dtype}, got {tuple(x.shape)}")
    p = depth + 1
    dev = tokens.device
    path = torch.empty((b, p), dtype=torch.int64, device=dev)
    kept = torch.empty(b, dtype=torch.int32, device=dev)
    bonus = torch.empty(b, dtype=torch.int64, device=dev)
    packed = torch.empty((b, p + 3), dtype=torch.int64, device=dev)
    old_lens = torch.empty(b, dtype=torch.int32, device=dev)
    if greedy is not None:
        argmax, parents, node_depth, mask = (x.contiguous() for x in greedy)
        path_in, count_in, bonus_in = path, kept, bonus  # unread
    else:
        path_in, count_in, bonus_in = (x.contiguous() for x in sampled)
        argmax, parents, node_depth, mask = tokens, tokens, tokens, tokens  # unread
    _accept_commit_kernel[(b,)](
        argmax,
        tokens.contiguous(),
        parents,
        node_depth,
        mask,
        path_in,
        count_in,
        bonus_in,
        remaining,
        enable,
        lens,
        path,
        kept,
        bonus,
        packed,
        old_lens,
        t,
        p,
        GREEDY=greedy is not None,
        BLOCK_T=max(16, triton.next_power_of_2(t)),
        BLOCK_P=max(16, triton.next_power_of_2(p)),
        num_warps=4,
    )
    return path, kept, bonus, packed, old_lens


def move_kept(kv: torch.Tensor, path: torch.Tensor, kept: torch.Tensor, lens: torch.Tensor):
    """Move every sequence's kept tail entries ``path[b, j]`` (``j < kept[b]``) to tail
    position ``j`` of the cache ``kv`` ``[L, 2, B, Hkv, T_max, D]``, the tail starting at
    ``lens[b] - kept[b]`` (``lens`` after the commit). One launch; no host synchronisation."""
    if kv.dim() != 6 or not kv.is_contiguous():
        raise ValueError(f"kv must be a contiguous [L, 2, B, Hkv, T_max, D], got {tuple(kv.shape)}")
    layers, _, b, hkv, t_max, d = kv.shape
    if path.dim() != 2 or path.shape[0] != b or path.dtype != torch.int64:
        raise ValueError(f"path must be [{b}, P] int64, got {tuple(path.shape)} {path.dtype}")
    p = path.shape[1]
    if p < 2:
        return  # the root alone never moves
    rows = layers * 2 * hkv
    block_d = triton.next_power_of_2(d)
    block_r = max(1, min(64, 4096 // block_d))
    _move_kept_kernel[(b, triton.cdiv(rows, block_r))](
        kv,
        path.contiguous(),
        kept,
        lens,
        b,
        hkv,
        t_max,
        rows,
        d,
        P=p,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        num_warps=4,
    )
