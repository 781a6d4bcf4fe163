"""Launch plan of :mod:`kernels.sparse_verify`, on the host: what one call launches
(``plan_launch``: the group plan, the outputs or the fp32 partials the kernel writes, the tile
and pipeline choices). The arithmetic of the plan -- its tuning knobs (``SparseVerifyConfig``),
the split count of each group's block list, the tile shape -- lives in
``perfmodel.attention_plan``, which the cost model prices with as well.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.group_plan import GroupPlan, build_group_plan
from ssvkit.perfmodel.sparse_plan import (
    SparseVerifyConfig,
    choose_sparse_splits,
    list_entries,
    merges_in_launch,
    sparse_tile_shape,
)

LOG2E = 1.4426950408889634


def choose_num_splits(
    cfg: SparseVerifyConfig, lists: int, list_blocks: int, num_warps: int, device: torch.device
) -> int:
    """Splits per group's block list on ``device``
    (``perfmodel.sparse_plan.choose_sparse_splits`` with the device's SM count)."""
    return choose_sparse_splits(cfg, lists, list_blocks, num_warps, num_sms(device))


@dataclasses.dataclass(frozen=True, slots=True)
class SparseLaunch:
    """What one call launches: its group plan, the packed group size C and the split count,
    the outputs, and the destinations the kernel writes (the outputs themselves, or the fp32
    partials that the kernel's last split program of a group or ``merge_partials`` combines)
    with their strides."""

    plan: GroupPlan
    c: int
    num_splits: int
    o: torch.Tensor
    lse: torch.Tensor
    o_dst: torch.Tensor
    lse_dst: torch.Tensor
    o_strides: tuple[int, ...]  # (split, b, t, h)
    lse_strides: tuple[int, ...]  # (split, b, h, t)
    m_pad: int  # packed query-head rows of a program, padded for the MMA
    num_warps: int
    num_stages: int
    scale: float  # softmax scale times log2(e): the kernel works in base 2
    tile_blocks: int  # listed blocks gathered into one K/V tile
    counters: torch.Tensor | None  # a group's arrivals when its last split merges; else None


def plan_launch(
    q, k_cache, block_idx, order, mode, group_size, c, block_size, sm_scale, plan, cfg
) -> SparseLaunch:
    """The group plan (built, or the caller's checked against the inputs), the split count,
    the outputs the launch writes, and the kernel's tile and pipeline choices."""
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
    if plan is None:
        plan = build_group_plan(block_idx, order, group_size, mode)
    elif (
        plan.mode != mode
        or plan.group_size != c
        or tuple(plan.block_lists.shape[:2]) != (b, hkv)
        or (plan.counts is None and plan.block_lists is not block_idx)
        or (c > 1 and plan.order is not order)
    ):
        raise ValueError(f"plan was built for other inputs (mode={plan.mode}, C={plan.group_size})")
    m_pad, num_warps, num_stages = sparse_tile_shape(cfg, c, h, hkv, block_size, d)
    entries = list_entries(mode, c, block_idx.shape[3])
    num_splits = choose_num_splits(cfg, b * hkv * plan.num_groups, entries, num_warps, q.device)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, t), dtype=torch.float32, device=q.device)
    if num_splits == 1:
        o_dst, lse_dst = o, lse
        o_strides = (0, *o.stride()[:3])
        lse_strides = (0, *lse.stride())
    else:
        # merge_partials' layout: [B, t, H, S, D] and [B, t, H, S].
        o_dst = torch.empty((b, t, h, num_splits, d), dtype=torch.float32, device=q.device)
        lse_dst = torch.empty((b, t, h, num_splits), dtype=torch.float32, device=q.device)
        o_strides = (o_dst.stride(3), *o_dst.stride()[:3])
        ls = lse_dst.stride()
        lse_strides = (ls[3], ls[0], ls[2], ls[1])
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E
    counters = None
    programs = b * hkv * plan.num_groups * num_splits
    sms = num_sms(q.device)
    if merges_in_launch(cfg, num_splits, programs, m_pad, d, num_warps, sms):
        counters = arrival_counters(b * hkv * plan.num_groups, q.device)
    return SparseLaunch(
        plan,
        c,
        num_splits,
        o,
        lse,
        o_dst,
        lse_dst,
        o_strides,
        lse_strides,
        m_pad,
        num_warps,
        num_stages,
        scale,
        cfg.tile_blocks,
        counters,
    )
