"""The launches of :mod:`kernels.nsa_verify`'s steps, on the host: partial-state buffers, the
union plan, the forward and merge launches, and the refresh path's selection (compressed pass,
block scores, top-n). Each function launches one step; nothing is read on the host."""

from __future__ import annotations

import torch
import triton
from ssvkit.kernels.group_plan import GroupPlan
from ssvkit.kernels.nsa_kernels import nsa_fwd_kernel, nsa_merge_kernel
from ssvkit.kernels.nsa_launch import LaunchPlan
from ssvkit.kernels.nsa_select_kernels import block_score_kernel, union_plan_kernel
from ssvkit.kernels.top_blocks import empty_scores, top_blocks


def alloc_partials(plan: LaunchPlan, num_slots: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    lead = (plan.programs, num_slots)
    return (
        torch.empty((*lead, plan.block_m, plan.head_dim), dtype=torch.float32, device=device),
        torch.empty((*lead, 2, plan.block_m), dtype=torch.float32, device=device),  # m, l
    )


def union_plan(block_idx: torch.Tensor, rows: int, nb_max: int) -> GroupPlan:
    """The selected branch's schedule: per (sequence, KV head, row tile of ``rows`` rows) the
    ascending union of the rows' blocks (of ``nb_max`` possible) and each block's member bits
    (``union_plan_kernel``); a tile of one row streams its own ``block_idx`` row."""
    b, hkv, t, top_n = block_idx.shape
    c = min(rows, t)
    tiles = triton.cdiv(t, c)
    if c == 1:
        return GroupPlan("union", 1, tiles, block_idx, None, None, None)
    dev = block_idx.device
    list_len = min(c * top_n, nb_max)
    lists = torch.empty((b, hkv, tiles, list_len), dtype=torch.int32, device=dev)
    bits = torch.empty_like(lists)
    counts = torch.empty((b, hkv, tiles), dtype=torch.int32, device=dev)
    bitmap = torch.empty((b * hkv * tiles, nb_max), dtype=torch.int32, device=dev)
    union_plan_kernel[(b * hkv * tiles,)](
        block_idx,
        bitmap,
        lists,
        bits,
        counts,
        t,
        nb_max,
        top_n,
        list_len,
        ROWS=triton.next_power_of_2(c),
        TOP_N_PAD=triton.next_power_of_2(top_n),
        CHUNK=min(triton.next_power_of_2(nb_max), 1024),
        num_warps=4,
    )
    return GroupPlan("union", c, tiles, lists, bits, counts, None)


def launch_fwd(
    plan: LaunchPlan, args, union: GroupPlan | None, part, *, slots, slot_base=0
) -> None:
    """One ``nsa_fwd_kernel`` launch over the slots of the branches with ``slots[x] > 0``."""
    q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, _ = args
    c_s, s_s, w_s = slots
    part_acc, part_ml = part
    if union is not None:
        lists = union.block_lists
        bits = union.member_mask if union.member_mask is not None else lists
        counts = union.counts if union.counts is not None else prefix_lens
        all_members = union.member_mask is None
        list_len = lists.shape[-1]
    else:  # no selected slots: the plan pointers are never read
        lists = bits = counts = prefix_lens
        all_members, list_len = True, 1
    nsa_fwd_kernel[(plan.programs, c_s + s_s + w_s)](
        q,
        k_cache,
        v_cache,
        comp_k,
        comp_v,
        lists,
        bits,
        counts,
        tree_mask,
        prefix_lens,
        part_acc,
        part_ml,
        *q.stride()[:3],
        *k_cache.stride()[:3],
        *comp_k.stride()[:3],
        plan.num_t,
        plan.num_tiles,
        plan.nc_max,
        plan.window,
        plan.comp_block,
        plan.comp_stride,
        plan.qk_scale,
        list_len,
        c_s,
        s_s,
        slot_base,
        part_ml.shape[1],
        BLOCK_N=plan.block_n,
        BLOCK_SIZE=plan.block_size,
        ALL_MEMBERS=all_members,
        T_PAD=max(16, triton.next_power_of_2(plan.num_t)),
        NUM_STAGES=plan.num_stages,
        DOT_PRECISION=plan.dot_precision,
        **plan.rows_meta(),
        num_warps=plan.num_warps,
    )


def launch_merge(plan: LaunchPlan, part, gates, o, slots, *, apply_gates=True) -> None:
    part_acc, part_ml = part
    s_pad = max(2, triton.next_power_of_2(part_ml.shape[1]))
    nsa_merge_kernel[(plan.programs, plan.block_m)](
        part_acc,
        part_ml,
        gates,
        o,
        *o.stride()[:3],
        plan.num_t,
        plan.num_tiles,
        *slots,
        part_ml.shape[1],
        S_PAD=s_pad,
        APPLY_GATES=apply_gates,
        **plan.rows_meta(),
        num_warps=1 if s_pad * plan.head_dim <= 2048 else 4,
    )


def select_top_blocks(scores: torch.Tensor, prefix_lens: torch.Tensor, plan: LaunchPlan):
    """``[B, Hkv, t, NB_max]`` block importance -> ``[B, Hkv, t, top_n]`` int32 indices,
    ascending and ``-1`` padded, with the first ``num_sink`` and last ``num_local`` blocks of
    each prefix forced (``kernels.top_blocks``; one launch, no host synchronisation)."""
    return top_blocks(
        scores,
        prefix_lens,
        block_size=plan.block_size,
        top_n=plan.top_n,
        num_sink=plan.num_sink,
        num_local=plan.num_local,
    )


def compressed_block_scores(plan: LaunchPlan, args, part, c_slots: int) -> torch.Tensor:
    """Step (2) of the refresh path: ``[B, Hkv, t, NB_max]`` fp32 block importance from the
    compressed partials of ``c_slots`` slots in ``part``."""
    q, _, _, prefix_lens, _, comp_k, _, _ = args
    scores = empty_scores(plan.batch, plan.num_kv_heads, plan.num_t, plan.nb_max, q.device)
    grid = (plan.batch * plan.num_kv_heads, plan.num_tiles, triton.cdiv(plan.nb_max, plan.block_j))
    block_score_kernel[grid](
        q,
        comp_k,
        part[1],
        prefix_lens,
        scores,
        *q.stride()[:3],
        *comp_k.stride()[:3],
        plan.num_t,
        plan.nc_max,
        plan.nb_max,
        scores.stride(2),
        plan.comp_block,
        plan.comp_stride,
        plan.qk_scale,
        c_slots,
        part[1].shape[1],
        BLOCK_C=plan.block_n,
        BLOCK_J=plan.block_j,
        BLOCK_SIZE=plan.block_size,
        DOT_PRECISION=plan.dot_precision,
        OVERLAP_SPLIT=plan.dot_precision != "ieee",
        C_PAD=max(2, triton.next_power_of_2(c_slots)),
        **plan.rows_meta(),
        num_warps=plan.score_warps,
    )
    return scores


def refresh_indices(plan: LaunchPlan, args, part, slots) -> torch.Tensor:
    """Steps (1)-(3) of the refresh path; leaves the compressed partials in ``part``."""
    launch_fwd(plan, args, None, part, slots=(slots[0], 0, 0))
    scores = compressed_block_scores(plan, args, part, slots[0])
    return select_top_blocks(scores, args[3], plan)


def union_for(plan: LaunchPlan, block_idx: torch.Tensor, given: GroupPlan | None) -> GroupPlan:
    if given is None:
        return union_plan(block_idx, plan.rows, plan.nb_max)
    want = min(plan.rows, plan.num_t)
    if given.mode != "union" or given.group_size != want or given.order is not None:
        raise ValueError(
            f"union_plan must be union_plan(block_idx, {plan.rows}) of this call's "
            f"block_idx, got mode {given.mode} with groups of {given.group_size}"
        )
    return given
