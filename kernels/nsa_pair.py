"""One launch for both forward steps of an NSA reuse call on shared compressed tiles
(``NsaVerifyConfig.context_tiles`` "paired", :mod:`kernels.nsa_verify`).

Under ``context_tiles`` "shared" a reuse call runs the compressed branch over the packed
schedule's row tiles and the selected and window branches over the strategy's row tiles. The
two steps do not depend on each other, so ``nsa_pair_fwd_kernel`` runs both in one grid: its
first ``comp_programs x c_slots`` programs are the compressed launch's, the rest the selected
and window launch's, each writing its own partial buffer as the two launches would (the same
``forward_slot`` code with each plan's row packing), so the merge is unchanged. One launch
instead of two saves a launch's ramp and drain, and the two kinds of program share the SMs
instead of each filling one wave on its own. Past one wave of both kinds of program, the paired
launch's second wave costs more than the launch it saves: ``perfmodel.nsa_plan.pairs_launches``
keeps the two launches there (``validation.nsa_tile_plans --knob paired`` compares them)."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.group_plan import GroupPlan
from ssvkit.kernels.nsa_forward import forward_slot
from ssvkit.kernels.nsa_launch import LaunchPlan
from ssvkit.kernels.nsa_steps import plan_args
from ssvkit.kernels.pdl import LaunchChain, chain_for


@triton.jit
def nsa_pair_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ck_ptr,
    cv_ptr,
    list_ptr,
    bits_ptr,
    count_ptr,
    tree_ptr,
    prefix_ptr,
    comp_acc_ptr,
    comp_ml_ptr,  # the compressed launch's partials
    part_acc_ptr,
    part_ml_ptr,  # the selected and window launch's partials
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    comp_tiles,
    num_tiles,
    nc_max,
    window,
    comp_block,
    comp_stride,
    qk_scale,
    list_len,
    comp_programs,
    c_slots,
    sw_slots,
    sw_branches,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    COMP_GROUP_PAD: tl.constexpr,
    COMP_BLOCK_M: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ALL_MEMBERS: tl.constexpr,
    T_PAD: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SEL: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(comp_programs * c_slots + B * Hkv * tiles * sw_slots,)``: program ``i <
    comp_programs * c_slots`` is slot ``i % c_slots`` of compressed-plan tile ``i // c_slots``;
    the others, slot ``j % sw_slots`` of the call's tile ``j // sw_slots`` over the branches
    ``sw_branches`` (selected 2, window 4)."""
    i = tl.program_id(0)
    n_comp = comp_programs * c_slots
    if i < n_comp:
        forward_slot(
            i // c_slots,
            i % c_slots,
            c_slots,
            q_ptr,
            k_ptr,
            v_ptr,
            ck_ptr,
            cv_ptr,
            list_ptr,
            bits_ptr,
            count_ptr,
            tree_ptr,
            prefix_ptr,
            comp_acc_ptr,
            comp_ml_ptr,
            comp_ml_ptr,
            stride_qb,
            stride_qt,
            stride_qh,
            stride_kb,
            stride_kh,
            stride_kt,
            stride_cb,
            stride_ch,
            stride_ct,
            num_t,
            comp_tiles,
            nc_max,
            window,
            comp_block,
            comp_stride,
            qk_scale,
            list_len,
            1,
            0,
            c_slots,
            NUM_KV_HEADS,
            GROUP,
            COMP_GROUP_PAD,
            HEAD_DIM,
            COMP_BLOCK_M,
            BLOCK_N,
            BLOCK_SIZE,
            True,
            T_PAD,
            NUM_STAGES,
            DOT_PRECISION,
            False,
            False,
            PDL,
        )
    else:
        j = i - n_comp
        forward_slot(
            j // sw_slots,
            j % sw_slots,
            sw_slots,
            q_ptr,
            k_ptr,
            v_ptr,
            ck_ptr,
            cv_ptr,
            list_ptr,
            bits_ptr,
            count_ptr,
            tree_ptr,
            prefix_ptr,
            part_acc_ptr,
            part_ml_ptr,
            part_ml_ptr,
            stride_qb,
            stride_qt,
            stride_qh,
            stride_kb,
            stride_kh,
            stride_kt,
            stride_cb,
            stride_ch,
            stride_ct,
            num_t,
            num_tiles,
            nc_max,
            window,
            comp_block,
            comp_stride,
            qk_scale,
            list_len,
            sw_branches,
            0,
            sw_slots,
            NUM_KV_HEADS,
            GROUP,
            GROUP_PAD,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_N,
            BLOCK_SIZE,
            ALL_MEMBERS,
            T_PAD,
            NUM_STAGES,
            DOT_PRECISION,
            False,
            HAS_SEL,
            PDL,
        )


def launch_pair(
    plan: LaunchPlan,
    comp_plan: LaunchPlan,
    args,
    union: GroupPlan,
    comp_part,
    part,
    slots,
    chain: LaunchChain | None = None,
) -> None:
    """The compressed slots ``slots[0]`` over ``comp_plan``'s tiles into ``comp_part`` and the
    selected and window slots ``slots[1:]`` over ``plan``'s into ``part``, in one launch."""
    q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, _ = args
    c_s, s_s, w_s = slots
    if plan.num_warps != comp_plan.num_warps or plan.num_stages != comp_plan.num_stages:
        raise ValueError("a paired launch needs one warp count and one pipeline depth")
    lists, bits, counts, all_members, list_len = plan_args(union, prefix_lens)
    sw = s_s + w_s
    grid = (comp_plan.programs * c_s + plan.programs * sw,)
    nsa_pair_fwd_kernel[grid](
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
        *comp_part,
        *part,
        *q.stride()[:3],
        *k_cache.stride()[:3],
        *comp_k.stride()[:3],
        plan.num_t,
        comp_plan.num_tiles,
        plan.num_tiles,
        plan.nc_max,
        plan.window,
        plan.comp_block,
        plan.comp_stride,
        plan.qk_scale,
        list_len,
        comp_plan.programs,
        c_s,
        sw,
        (2 if s_s else 0) | (4 if w_s else 0),
        NUM_KV_HEADS=plan.num_kv_heads,
        GROUP=plan.group,
        COMP_GROUP_PAD=comp_plan.group_pad,
        COMP_BLOCK_M=comp_plan.block_m,
        GROUP_PAD=plan.group_pad,
        HEAD_DIM=plan.head_dim,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        BLOCK_SIZE=plan.block_size,
        ALL_MEMBERS=all_members,
        T_PAD=max(16, triton.next_power_of_2(plan.num_t)),
        NUM_STAGES=plan.num_stages,
        DOT_PRECISION=plan.dot_precision,
        HAS_SEL=s_s > 0,
        **chain_for(chain, plan.pdl).meta(),
        num_warps=plan.num_warps,
    )
