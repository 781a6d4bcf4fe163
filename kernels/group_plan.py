"""Group plans of :func:`kernels.sparse_verify.sparse_verify`: which blocks each (sequence, KV
head, query group) program streams, and for which members.

``union`` plans come from one small Triton kernel that sorts the members' block ids in
registers and merges each block's member bits with two scans (no host synchronisation);
``per_query`` and ``shared`` stream rows of ``block_idx`` directly. A plan is built once per
refresh and shared by the layers that reuse its selection.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import check_order
from ssvkit.perfmodel.sparse_plan import union_plan_warps

MODES = ("per_query", "union", "shared")


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
def _or_same_block(a, b):
    """Scan step over ``(block id << 32) | member bits`` keys sorted ascending: ``b`` with
    ``a``'s member bits where both name one block. The keys of a block are adjacent, so this
    is associative over them."""
    same = (a >> 32) == (b >> 32)
    return tl.where(same, b | (a & 0xFFFFFFFF), b)


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
    C_PAD: tl.constexpr,
    HAS_ORDER: tl.constexpr,
):
    """One program per (group, KV head, sequence): every member's ids as one tile of
    ``(id << 32) | 1 << member`` keys, sorted; a forward scan of ``_or_same_block`` marks each
    block's first key (the one no earlier key of its block adds a bit to), a reverse scan gives
    that key every member's bit, and a prefix count of the first keys places them."""
    tl.static_assert(C <= 31)  # membership bits live in an int32
    NO_BLOCK: tl.constexpr = 0x7FFFFFFFFFFFFFFF  # sorts after every real key
    g = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    num_groups = tl.num_programs(0)
    members = tl.arange(0, C_PAD)
    slot = g * C + members
    live = (members < C) & (slot < num_rows)
    if HAS_ORDER:
        row = tl.load(order_ptr + b * num_rows + slot, mask=live, other=0)
    else:
        row = slot
    offs = tl.arange(0, N_PAD)
    idx_base = idx_ptr + b.to(tl.int64) * stride_ib + h.to(tl.int64) * stride_ih
    ok = live[:, None] & (offs < top_n)[None, :]
    ids = tl.load(
        idx_base + row.to(tl.int64)[:, None] * stride_it + offs[None, :], mask=ok, other=-1
    )  # [C_PAD, N_PAD]
    bit = (tl.full([C_PAD], 1, tl.int64) << members.to(tl.int64))[:, None]
    keys = tl.where(ids >= 0, (ids.to(tl.int64) << 32) | bit, NO_BLOCK)
    keys = tl.sort(tl.reshape(keys, [C_PAD * N_PAD]))
    first = (tl.associative_scan(keys, 0, _or_same_block) == keys) & (keys != NO_BLOCK)
    union = tl.associative_scan(keys, 0, _or_same_block, reverse=True)
    dest = tl.cumsum(first.to(tl.int32), 0) - 1
    total = tl.sum(first.to(tl.int32), 0)
    tl.store(count_ptr + (b * tl.num_programs(1) + h) * num_groups + g, total)
    # Ascending block ids: the group's programs walk the context in the order the other
    # groups' (and per-query rows') programs of the KV head do, so L2 serves the blocks they
    # share while they are in flight.
    out = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + g.to(tl.int64) * stride_lg
    tl.store(list_ptr + out + dest, (union >> 32).to(tl.int32), mask=first)
    tl.store(mask_ptr + out + dest, (union & 0x7FFFFFFF).to(tl.int32), mask=first)
    p = tl.arange(0, C_PAD * N_PAD)
    pad = (p >= total) & (p < C * top_n)
    tl.store(list_ptr + out + p, tl.full([C_PAD * N_PAD], -1, tl.int32), mask=pad)
    tl.store(mask_ptr + out + p, tl.zeros([C_PAD * N_PAD], tl.int32), mask=pad)


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
        C_PAD=triton.next_power_of_2(c),
        HAS_ORDER=order is not None,
        num_warps=union_plan_warps(c, top_n),
    )
    return GroupPlan(mode, c, num_groups, lists, masks, counts, order)
