"""Sparse tree verification with overlap-aware query grouping (seed 000, Algorithm 1).

Each verifier query row attends to its selected prefix blocks plus the draft tail under the tree
mask. Queries are grouped into consecutive runs of ``group_size`` (C) in a traversal ``order``
and one program serves a group of one KV head:

- ``per_query``: C = 1, every query streams its own blocks (the decoding-oriented baseline).
- ``union`` (exact): the group streams the deduplicated union of its members' blocks once, each
  query's rows masked to its own blocks by per-block membership bits: equal to ``per_query``.
- ``shared`` (approx): every member uses the blocks of the group's first query in ``order``.

The group plans (``kernels.group_plan``) say which blocks each program streams, the launch plan
(``kernels.sparse_launch``) the splits and tiles; :mod:`kernels.sparse_verify_kernels` holds the
kernel. ``sparse_verify``'s docstring has the kernel's layout and traffic.
"""

from __future__ import annotations

import math

import torch
import triton
from ssvkit.kernels.checks import (
    check_attention_inputs,
    check_block_idx,
    check_order,
    check_tree_mask,
    validate_block_idx,
    validate_prefix_lens,
)
from ssvkit.kernels.dense_verify import dot_precision
from ssvkit.kernels.group_plan import MODES, GroupPlan
from ssvkit.kernels.merge import merge_partials
from ssvkit.kernels.sparse_launch import SparseLaunch, SparseVerifyConfig, plan_launch
from ssvkit.kernels.sparse_verify_kernels import sparse_verify_kernel
from ssvkit.kernels.tree import MAX_TREE_NODES
from ssvkit.perfmodel.sparse_plan import merge_chunk

MAX_ROWS = 128  # C * G packed rows per program: acc [128, D] fp32 still fits in registers


def _validate_values(
    prefix_lens: torch.Tensor,
    block_idx: torch.Tensor,
    order: torch.Tensor | None,
    t_max: int,
    t: int,
    block_size: int,
) -> None:
    # Host-synchronising checks: only with validate=True, never in the engine's hot path.
    validate_prefix_lens(prefix_lens, t, t_max)
    validate_block_idx(block_idx, "block_idx", prefix_lens, block_size)
    if order is not None:
        ident = torch.arange(t, device=order.device, dtype=order.dtype).expand(order.shape[0], t)
        if not torch.equal(torch.sort(order, dim=-1).values, ident):
            raise ValueError("order must be a permutation of 0..t-1 in every row")


def sparse_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    mode: str = "per_query",
    group_size: int = 1,
    order: torch.Tensor | None = None,
    block_size: int = 64,
    sm_scale: float | None = None,
    validate: bool = True,
    plan: GroupPlan | None = None,
    config: SparseVerifyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each draft row over its selected prefix blocks plus its tree ancestors.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]`` fp16/bf16/fp32, contiguous; ``t <= 64``, ``D`` a power of two.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]``, contiguous, dtype of ``q``; the prefix is ``[0, prefix_lens[b])``
        and the tail ``[prefix_lens[b], prefix_lens[b] + t)``.
    prefix_lens : torch.Tensor
        ``[B]`` int32.
    tree_mask : torch.Tensor
        ``[B, t]`` int64 ancestor-or-self bitmask (``kernels.tree.ancestor_bitmask``).
    block_idx : torch.Tensor
        ``[B, Hkv, t, top_n]`` int32 prefix block ids per query row, ``-1`` pads.
    mode : str
        ``"per_query"``, ``"union"`` (exact) or ``"shared"`` (approx).
    group_size : int
        C, queries per group (consecutive in ``order``).
    order : torch.Tensor or None
        ``[B, t]`` int32 traversal order of the query rows; None is the identity.
    block_size : int
        Tokens per block; a power of two >= 16 (the K/V tile height).
    sm_scale : float or None
        Softmax scale; ``1 / sqrt(D)`` by default.
    validate : bool
        Also check values (index ranges, duplicates, permutation); synchronises with the host.
    plan : GroupPlan or None
        A plan from ``build_group_plan`` for these ``block_idx``/``order`` (e.g. shared by the
        reuse layers of a round); built here when None.
    config : SparseVerifyConfig or None
        Launch tunables.

    Returns
    -------
    o : torch.Tensor
        ``[B, t, H, D]`` in ``q.dtype``; 0 for a row that attended to nothing.
    lse : torch.Tensor
        ``[B, H, t]`` float32 natural-log sum of exp of the scaled scores; ``-inf`` when empty.

    Notes
    -----
    The group's C x G query-head rows are packed into the MMA rows
    (``M_PAD = max(16, next_pow2(C * G))``), so one K/V tile of ``BLOCK_N = block_size``
    tokens feeds all of them; the score tile gets a per-row mask from the membership bits. The
    block list of a (b, kv head, group) is split across programs where shorter walks end the
    call's waves sooner (``perfmodel.sparse_plan.choose_sparse_splits``); the last split also
    attends to the tail; the last split program of a group to finish combines the group's fp32
    partial ``(o, lse)`` in the same launch where one load holds them and the programs fit
    one wave (``perfmodel.sparse_plan.merges_in_launch``; arrival counters of
    ``kernels.arrivals``), else ``kernels.merge.merge_partials`` does in a launch of its own.

    Traffic: a (b, kv head, group) program reads ``|union| * block_size * D * 2`` bytes of K/V
    (``top_n`` blocks for ``shared``, ``C * top_n`` for ``per_query`` over its C programs),
    plus the ``t``-entry tail once per group.
    """
    cfg = config or SparseVerifyConfig()
    c = _check_inputs(
        q, k_cache, v_cache, prefix_lens, tree_mask, block_idx, order, mode, group_size, block_size
    )
    if validate:
        _validate_values(prefix_lens, block_idx, order, k_cache.shape[2], q.shape[1], block_size)
    launch = plan_launch(
        q, k_cache, block_idx, order, mode, group_size, c, block_size, sm_scale, plan, cfg
    )
    _launch(q, k_cache, v_cache, prefix_lens, tree_mask, order, block_size, launch)
    if launch.num_splits > 1 and launch.counters is None:
        merge_partials(
            launch.o_dst, launch.lse_dst, o_out=launch.o, lse_out=launch.lse.transpose(1, 2)
        )
    return launch.o, launch.lse


def _check_inputs(
    q, k_cache, v_cache, prefix_lens, tree_mask, block_idx, order, mode, group_size, block_size
) -> int:
    """Check shapes, dtypes, devices and layouts (no host synchronisation); returns the
    group size C the kernel packs (1 for ``per_query``, at most ``t``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    check_attention_inputs(q, k_cache, v_cache, prefix_lens)
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
    if not 1 <= t <= MAX_TREE_NODES:
        raise ValueError(f"q has t={t} rows; 1..{MAX_TREE_NODES} are supported")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    check_tree_mask(tree_mask, b, t, q.device)
    check_block_idx(block_idx, "block_idx", (b, hkv, t), q.device)
    if block_idx.shape[3] < 1:
        raise ValueError("block_idx must have top_n >= 1")
    check_order(order, b, t, q.device)
    c = 1 if mode == "per_query" else min(group_size, t)
    if c * (h // hkv) > MAX_ROWS:
        raise ValueError(
            f"group_size * (H / Hkv) = {c} * {h // hkv} exceeds {MAX_ROWS} packed rows"
        )
    return c


def _launch(
    q, k_cache, v_cache, prefix_lens, tree_mask, order, block_size, la: SparseLaunch
) -> None:
    """Launch the kernel over (group x split, KV head, sequence) programs."""
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
    plan, c = la.plan, la.c
    group_lists = plan.counts is not None
    lists = plan.block_lists
    sparse_verify_kernel[(plan.num_groups * la.num_splits, hkv, b)](
        q,
        k_cache,
        v_cache,
        prefix_lens,
        tree_mask,
        order if order is not None else prefix_lens,
        lists,
        plan.member_mask if group_lists else lists,
        plan.counts if group_lists else prefix_lens,
        la.o_dst,
        la.lse_dst,
        la.o,
        la.lse,
        la.counters if la.counters is not None else prefix_lens,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        lists.stride(0),
        lists.stride(1),
        lists.stride(2),
        *la.o_strides,
        *la.lse_strides,
        *la.o.stride()[:3],
        *la.lse.stride(),
        la.scale,
        t,
        lists.shape[3],
        plan.num_groups,
        la.num_splits,
        G=h // hkv,
        C=c,
        M_PAD=la.m_pad,
        D=d,
        BLOCK_N=block_size,
        T_PAD=max(16, triton.next_power_of_2(t)),
        HAS_ORDER=order is not None and c > 1,
        GROUP_LISTS=group_lists,
        DOT_PRECISION=dot_precision(q.dtype),
        TILE_BLOCKS=la.tile_blocks,
        MERGE=la.counters is not None,
        MERGE_CHUNK=merge_chunk(la.num_splits, la.m_pad, d, la.num_warps),
        num_warps=la.num_warps,
        num_stages=la.num_stages,
    )


def reference_sparse_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    mode: str = "per_query",
    group_size: int = 1,
    order: torch.Tensor | None = None,
    block_size: int = 64,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch ``sparse_verify``: a per-query masked softmax over ``[0, T_max)``.

    ``per_query`` and ``union`` give every row its own blocks; ``shared`` gives every row the
    blocks of the first member of its group in ``order``.
    """
    b, t, h, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    dev = q.device
    if order is None:
        order = torch.arange(t, device=dev, dtype=torch.int32).expand(b, t)
    order = order.long()
    if mode == "shared":
        c = min(group_size, t)
        inv = torch.argsort(order, dim=1)  # position of each query row in the order
        rep = torch.gather(order, 1, (inv // c) * c)  # [B, t]: its group's first member
        block_idx = torch.gather(
            block_idx, 2, rep.view(b, 1, t, 1).expand(-1, hkv, -1, block_idx.shape[3])
        )
    nb = -(-t_max // block_size)
    sel = torch.zeros((b, hkv, t, nb + 1), dtype=torch.bool, device=dev)
    sel.scatter_(3, torch.where(block_idx < 0, nb, block_idx).long(), True)
    pos = torch.arange(t_max, device=dev)
    allowed = sel[..., :nb].repeat_interleave(block_size, dim=3)[..., :t_max]
    allowed &= (pos < prefix_lens.long().view(b, 1, 1, 1)).view(b, 1, 1, t_max)
    j = pos.view(1, t_max) - prefix_lens.long().view(b, 1)  # [B, T_max] tail index
    in_tail = (j >= 0) & (j < t)
    bit = (tree_mask.view(b, t, 1) >> j.clamp(0, 63).view(b, 1, t_max)) & 1  # [B, t, T_max]
    allowed |= ((bit != 0) & in_tail.view(b, 1, t_max)).view(b, 1, t, t_max)

    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    qf = q.float().view(b, t, hkv, h // hkv, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, t, D]
    s = torch.einsum("bkgtd,bksd->bkgts", qf, k_cache.float()) * scale
    s = s.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, Hkv, G, t]
    p = torch.where(allowed.unsqueeze(2), torch.exp(s - lse.clamp(min=-1e30).unsqueeze(-1)), 0.0)
    o = torch.einsum("bkgts,bksd->bkgtd", p, v_cache.float())
    o = o.permute(0, 3, 1, 2, 4).reshape(b, t, h, d)
    return o, lse.reshape(b, h, t)
