"""Group plans of :func:`kernels.sparse_verify.sparse_verify`: which blocks each (sequence, KV
head, query group) program streams, and for which members.

``union`` plans come from one small Triton kernel that deduplicates by comparing each member's
list with all the others' (C^2 x top_n^2 compares in C wide steps) and sorts the union in
registers (no host synchronisation); ``per_query`` and ``shared`` stream rows of ``block_idx``
directly. A plan is built once per refresh and shared by the layers that reuse its selection.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import check_order

MODES = ("per_query", "union", "shared")
# Plan kernel: one step compares a member's list with CHUNK entries of the group's lists; a
# [N_PAD, CHUNK] tile of 16K int32 stays spill-free at 4 warps (sm_90, Triton 3.6 and 3.9).
_PLAN_TILE = 16384


@dataclasses.dataclass(frozen=True, slots=True)
class GroupPlan:
    """Which blocks each (b, kv head, group) program streams, and for which members.

    Attributes
    ----------
    mode : str
        One of ``MODES``.
    group_size : int
        Members per group (``min(group_size, t)``; 1 for ``per_query``).
    num_groups : int
        ``ceil(t / group_size)``.
    block_lists : torch.Tensor
        ``union``: ``[B, Hkv, num_groups, group_size * top_n]`` int32, the deduplicated union,
        ascending, compacted to the front, ``-1`` after. ``per_query`` / ``shared``:
        ``block_idx`` itself, indexed by the query row of the group's first member.
    member_mask : torch.Tensor or None
        ``union``: ``[B, Hkv, num_groups, group_size * top_n]`` int32, bit ``c`` set when member
        ``c`` (position ``g * group_size + c`` in ``order``) selected the block.
    counts : torch.Tensor or None
        ``union``: ``[B, Hkv, num_groups]`` int32 union sizes.
    order : torch.Tensor or None
        ``[B, t]`` int32 traversal order; None is the identity.
    """

    mode: str
    group_size: int
    num_groups: int
    block_lists: torch.Tensor
    member_mask: torch.Tensor | None
    counts: torch.Tensor | None
    order: torch.Tensor | None


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _union_plan_kernel(
    idx_ptr,
    order_ptr,
    list_ptr,
    mask_ptr,
    count_ptr,
    stride_ib,
    stride_ih,
    stride_it,
    stride_lb,
    stride_lh,
    stride_lg,
    num_rows,
    top_n,
    C: tl.constexpr,
    N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    C_PAD: tl.constexpr,
    HAS_ORDER: tl.constexpr,
):
    tl.static_assert(C <= 31)  # membership bits live in an int32
    NO_BLOCK: tl.constexpr = 0x7FFFFFFFFFFFFFFF  # sorts after every (id << 32 | bits) key
    tl.static_assert(CHUNK % N_PAD == 0)
    MEMBERS_PER_CHUNK: tl.constexpr = CHUNK // N_PAD
    g = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    num_groups = tl.num_programs(0)
    idx_base = idx_ptr + b.to(tl.int64) * stride_ib + h.to(tl.int64) * stride_ih
    out_base = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + g.to(tl.int64) * stride_lg
    offs = tl.arange(0, N_PAD)
    # A chunk is MEMBERS_PER_CHUNK members' lists side by side: [CHUNK] = [members x N_PAD].
    offs_f = tl.arange(0, CHUNK)
    member_f = offs_f // N_PAD
    total = tl.full([], 0, tl.int32)  # a tensor, so the loop can carry it
    members = tl.arange(0, C_PAD)
    keys = tl.full([C_PAD, N_PAD], NO_BLOCK, tl.int64)
    for c in range(0, C):
        slot = g * C + c
        if HAS_ORDER:
            row = tl.load(order_ptr + b * num_rows + slot, mask=slot < num_rows, other=0)
        else:
            row = slot
        mine = tl.load(
            idx_base + row.to(tl.int64) * stride_it + offs,
            mask=offs < tl.where(slot < num_rows, top_n, 0),
            other=-1,
        )  # [N_PAD]
        # bits[j]: which members list block mine[j]. One [N_PAD, CHUNK] compare per chunk keeps
        # this throughput-bound (C x C narrow compares would be C^2 dependent load latencies).
        bits = tl.zeros([N_PAD], dtype=tl.int32)
        for c0 in range(0, C, MEMBERS_PER_CHUNK):
            member = c0 + member_f
            slot_f = g * C + member
            ok_f = (member < C) & (slot_f < num_rows) & (offs_f % N_PAD < top_n)
            if HAS_ORDER:
                row_f = tl.load(order_ptr + b * num_rows + slot_f, mask=ok_f, other=0)
            else:
                row_f = slot_f
            theirs = tl.load(
                idx_base + row_f.to(tl.int64) * stride_it + offs_f % N_PAD, mask=ok_f, other=-1
            )  # [CHUNK]
            their_bit = tl.where(theirs >= 0, 1 << tl.minimum(member, 30), 0)
            hit = tl.where(mine[:, None] == theirs[None, :], their_bit[None, :], 0)
            bits = bits | tl.reduce(hit, 1, _bit_or)
        bits = tl.where(mine >= 0, bits, 0)
        # The first member that selected a block owns it; each owned block's key (id, bits)
        # takes the member's row of the sort tile, the others sort last.
        owner = ((bits & ((1 << c) - 1)) == 0) & (mine >= 0)
        key = (mine.to(tl.int64) << 32) | bits.to(tl.int64)
        keys = tl.where((members == c)[:, None] & owner[None, :], key[None, :], keys)
        total += tl.sum(owner.to(tl.int32), axis=0)
    tl.store(count_ptr + (b * tl.num_programs(1) + h) * num_groups + g, total)
    # Ascending block ids: the group's programs walk the context in the order the other
    # groups' (and per-query rows') programs of the KV head do, so L2 serves the blocks they
    # share while they are in flight.
    keys = tl.sort(tl.reshape(keys, [C_PAD * N_PAD]))
    p = tl.arange(0, C_PAD * N_PAD)
    used = p < total
    on = p < C * top_n
    tl.store(list_ptr + out_base + p, tl.where(used, (keys >> 32).to(tl.int32), -1), mask=on)
    tl.store(mask_ptr + out_base + p, tl.where(used, (keys & 0x7FFFFFFF).to(tl.int32), 0), mask=on)


def build_group_plan(
    block_idx: torch.Tensor,
    order: torch.Tensor | None,
    group_size: int,
    mode: str,
) -> GroupPlan:
    """Group plan for ``sparse_verify``; static shapes, no host synchronisation.

    Parameters
    ----------
    block_idx : torch.Tensor
        ``[B, Hkv, t, top_n]`` int32, ``-1`` pads; no duplicates within a row.
    order : torch.Tensor or None
        ``[B, t]`` int32 permutation of the query rows (None: identity); group ``g`` is
        ``order[:, g * C : (g + 1) * C]``.
    group_size : int
        C >= 1; clamped to ``t``. Ignored (1) for ``per_query``.
    mode : str
        ``"per_query"``, ``"union"`` or ``"shared"``.

    Returns
    -------
    GroupPlan
        Only ``union`` launches a kernel (one program per (b, kv head, group)); the other modes
        stream rows of ``block_idx`` directly.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if block_idx.dim() != 4 or block_idx.dtype != torch.int32 or not block_idx.is_contiguous():
        raise ValueError("block_idx must be a contiguous [B, Hkv, t, top_n] int32 tensor")
    b, hkv, t, top_n = block_idx.shape
    check_order(order, b, t, block_idx.device)
    c = 1 if mode == "per_query" else min(group_size, t)
    num_groups = triton.cdiv(t, c)
    if mode != "union" or c == 1:
        return GroupPlan(mode, c, num_groups, block_idx, None, None, order)
    if c > 31:
        raise ValueError(f"group_size must be <= 31 for union mode, got {group_size}")
    list_len = c * top_n
    lists = torch.empty((b, hkv, num_groups, list_len), dtype=torch.int32, device=block_idx.device)
    masks = torch.empty_like(lists)
    counts = torch.empty((b, hkv, num_groups), dtype=torch.int32, device=block_idx.device)
    n_pad = max(16, triton.next_power_of_2(top_n))
    _union_plan_kernel[(num_groups, hkv, b)](
        block_idx,
        order if order is not None else block_idx,
        lists,
        masks,
        counts,
        block_idx.stride(0),
        block_idx.stride(1),
        block_idx.stride(2),
        lists.stride(0),
        lists.stride(1),
        lists.stride(2),
        t,
        top_n,
        C=c,
        N_PAD=n_pad,
        CHUNK=max(n_pad, min(n_pad * triton.next_power_of_2(c), _PLAN_TILE // n_pad)),
        C_PAD=triton.next_power_of_2(c),
        HAS_ORDER=order is not None,
        num_warps=min(16, max(4, triton.next_power_of_2(c) * n_pad // 256)),
    )
    return GroupPlan(mode, c, num_groups, lists, masks, counts, order)
