"""The launches of :mod:`kernels.nsa_verify`'s steps, on the host: partial-state buffers, the
union plan, the forward and merge launches (the refresh path's selection is
:mod:`kernels.nsa_selection`). Each function launches one step (``forward_and_merge`` one or
two, by the plan's ``merge``); nothing is read on the host. ``chain`` (``kernels.pdl``) is the
call's launches, of which the step's are the next; a step given none starts a chain of its own
(with PDL when the plan has it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.group_plan import GroupPlan
from ssvkit.kernels.nsa_kernels import nsa_fwd_kernel
from ssvkit.kernels.nsa_launch import LaunchPlan
from ssvkit.kernels.nsa_merge_kernels import nsa_merge_kernel
from ssvkit.kernels.nsa_union_plan import union_plan_kernel
from ssvkit.kernels.pdl import LaunchChain, chain_for


def alloc_partials(plan: LaunchPlan, num_slots: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    lead = (plan.programs, num_slots)
    return (
        torch.empty((*lead, plan.block_m, plan.head_dim), dtype=torch.float32, device=device),
        torch.empty((*lead, 2, plan.block_m), dtype=torch.float32, device=device),  # m, l
    )


def union_plan(
    block_idx: torch.Tensor, rows: int, nb_max: int, chain: LaunchChain | None = None
) -> GroupPlan:
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
        **chain_for(chain).meta(),
    )
    return GroupPlan("union", c, tiles, lists, bits, counts, None)


def launch_fwd(
    plan: LaunchPlan,
    args,
    union: GroupPlan | None,
    part,
    *,
    slots,
    slot_base=0,
    comp_scores: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    apply_gates: bool = True,
    chain: LaunchChain | None = None,
) -> None:
    """One ``nsa_fwd_kernel`` launch over the slots of the branches with ``slots[x] > 0``;
    ``comp_scores`` (:func:`alloc_comp_scores`) also receives the compressed tokens' scores.
    With ``out``, the launch also merges slots ``[0, slot_base + sum(slots))`` of ``part`` into
    ``out`` (gated when ``apply_gates``): the folded merge, on the device's arrival counters."""
    q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates = args
    c_s, s_s, w_s = slots
    if comp_scores is not None and (s_s or w_s):
        raise ValueError("comp_scores needs a launch of compressed slots only")
    part_acc, part_ml = part
    lists, bits, counts, all_members, list_len = plan_args(union, prefix_lens)
    fold = out is not None
    chain = chain_for(chain, plan.pdl)
    launch_slots = c_s + s_s + w_s
    layout = merge_layout(plan, slot_base + launch_slots, part_ml.shape[1], q.device)
    mode = layout.mode if fold else 0
    if mode == 2:
        grid = (plan.programs * (launch_slots + layout.chunks),)
        counters = arrival_counters(1 + 2 * plan.programs, q.device, chain.lane)
    else:
        grid = (plan.programs, launch_slots)
        counters = arrival_counters(plan.programs, q.device, chain.lane) if fold else prefix_lens
    nsa_fwd_kernel[grid](
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
        comp_scores if comp_scores is not None else part_ml,
        gates,
        out if fold else q,
        counters,
        *q.stride()[:3],
        *k_cache.stride()[:3],
        *comp_k.stride()[:3],
        *(out if fold else q).stride()[:3],
        plan.num_t,
        plan.num_tiles,
        plan.nc_max,
        plan.window,
        plan.comp_block,
        plan.comp_stride,
        plan.qk_scale,
        list_len,
        branch_bits(slots),
        slot_base,
        part_ml.shape[1],
        launch_slots,
        layout.chunks,
        BLOCK_N=plan.comp_block_n if s_s == w_s == 0 else plan.block_n,
        BLOCK_SIZE=plan.block_size,
        ALL_MEMBERS=all_members,
        T_PAD=max(16, triton.next_power_of_2(plan.num_t)),
        NUM_STAGES=plan.num_stages,
        DOT_PRECISION=plan.dot_precision,
        STORE_S=comp_scores is not None,
        HAS_SEL=s_s > 0,
        MERGE=mode,
        APPLY_GATES=apply_gates,
        S_PAD=_slots_pad(part_ml.shape[1]),
        MERGE_ROWS=layout.rows,
        MERGE_SLOTS=layout.slots_per_load,
        **plan.rows_meta(),
        **chain.meta(),
        num_warps=plan.num_warps,
    )


def forward_and_merge(
    plan: LaunchPlan,
    args,
    union: GroupPlan | None,
    part,
    o,
    slots,
    *,
    comp_apart: bool = False,
    apply_gates: bool = True,
    chain: LaunchChain | None = None,
) -> None:
    """The forward over ``slots`` (compressed, selected, window) and their merge into ``o``:
    one launch (the merge folded in, ``merge_layout``), or a forward and a merge launch when
    ``plan.merge`` is ``separate``. ``comp_apart``: the compressed slots ``[0, slots[0])`` are
    already in ``part`` (the refresh path's compressed launch) and the forward runs the other
    branches."""
    fwd_slots = (0, *slots[1:]) if comp_apart else tuple(slots)
    base = slots[0] if comp_apart else 0
    chain = chain_for(chain, plan.pdl)
    if plan.merge != "separate":
        launch_fwd(
            plan,
            args,
            union,
            part,
            slots=fwd_slots,
            slot_base=base,
            out=o,
            apply_gates=apply_gates,
            chain=chain,
        )
        return
    launch_fwd(plan, args, union, part, slots=fwd_slots, slot_base=base, chain=chain)
    launch_merge(
        plan,
        args,
        union,
        part,
        o,
        slots,
        comp_apart=comp_apart,
        apply_gates=apply_gates,
        chain=chain,
    )


# Elements of one partial load of the folded merge (``merge_rows``): 64 fp32 per thread of a
# 4-warp program, the most it holds without spilling beside its row chunk's output.
MERGE_LOAD_ELEMS = 8192
# MMA rows one merge step handles (fewer when a tile has fewer real rows, not fewer than
# MERGE_ROWS_MIN: no tensor dimension of 1).
MERGE_ROWS_MAX = 16
MERGE_ROWS_MIN = 4


@dataclass(frozen=True, slots=True)
class MergeLayout:
    """How a forward launch folds in its merge (``nsa_fwd_kernel``'s ``MERGE``): 1, the row
    tile's last program merges it, ``rows`` MMA rows at a time; 2, ``chunks`` merge programs
    per tile of ``rows`` rows each; ``slots_per_load`` partials per load either way."""

    mode: int
    rows: int
    slots_per_load: int
    chunks: int


def merge_layout(
    plan: LaunchPlan, used_slots: int, num_slots: int, device: torch.device
) -> MergeLayout:
    """The folded merge of ``used_slots`` slots (of ``num_slots`` in the partial buffers).

    ``plan.merge`` ``last`` or ``parallel`` force a mode; ``auto`` takes the last program when
    the tile's merge is one load of ``MERGE_LOAD_ELEMS`` (every slot's real rows) or when one
    merge program per chunk would not fit beside one another on the SMs (many tiles: their last
    programs merge side by side anyway), else merge programs of one draft row's heads each
    (``max(MERGE_ROWS_MIN, next_pow2(G))`` rows), so a tile's merge does not run in series in
    one program.

    A draft row's real rows are its ``next_pow2(G)`` first head slots: a tile of fewer draft
    rows than fill 16 MMA rows pads its head slots further (``kernels.nsa_launch``), and the
    merge steps over those (``merge_rows``) as over draft rows past ``t``."""
    heads = triton.next_power_of_2(plan.group)
    draft = min(plan.rows, plan.num_t)
    real = (draft - 1) * plan.group_pad + heads  # MMA rows up to the last real one
    whole = used_slots * triton.next_power_of_2(real) * plan.head_dim <= MERGE_LOAD_ELEMS
    part_rows = max(MERGE_ROWS_MIN, min(MERGE_ROWS_MAX, heads))
    chunks = triton.cdiv(real, part_rows)
    mode = {"last": 1, "parallel": 2}.get(plan.merge)
    if mode is None:
        mode = 1 if whole or plan.programs * chunks > num_sms(device) else 2
    rows = part_rows if mode == 2 else max(MERGE_ROWS_MIN, min(MERGE_ROWS_MAX, real))
    rows = triton.next_power_of_2(rows)
    per_load = max(1, MERGE_LOAD_ELEMS // (rows * plan.head_dim))
    slots_per_load = min(triton.next_power_of_2(per_load), _slots_pad(num_slots))
    return MergeLayout(mode, rows, slots_per_load, triton.cdiv(real, rows))


def _slots_pad(num_slots: int) -> int:
    return max(2, triton.next_power_of_2(num_slots))


def launch_merge(
    plan: LaunchPlan,
    args,
    union: GroupPlan | None,
    part,
    o,
    slots,
    *,
    comp_apart: bool = False,
    shared_comp: tuple[LaunchPlan, tuple] | None = None,
    apply_gates: bool = True,
    chain: LaunchChain | None = None,
) -> None:
    """Merge and gate the ``slots`` (compressed, selected, window) of ``part`` into ``o``;
    ``comp_apart``: the compressed slots came from a launch of their own (the refresh path),
    the rest from one launch over the other branches. ``shared_comp``: that launch's plan and
    partials, on row tiles of its own (``kernels.nsa_launch.context_plan``); ``part`` then
    holds the other branches' slots from slot 0."""
    part_acc, part_ml = part
    prefix_lens, gates = args[3], args[7]
    _, _, counts, all_members, list_len = plan_args(union, prefix_lens)
    comp_fixed = slots[0] if comp_apart or shared_comp else 0
    branches = branch_bits((0, *slots[1:]) if comp_fixed else slots)
    s_pad = _slots_pad(max(sum(slots), part_ml.shape[1]))
    comp_plan, (comp_acc, comp_ml) = shared_comp or (plan, part)
    nsa_merge_kernel[(plan.programs, plan.block_m)](
        part_acc,
        part_ml,
        gates,
        o,
        comp_acc,
        comp_ml,
        prefix_lens,
        counts,
        *o.stride()[:3],
        plan.num_t,
        plan.num_tiles,
        plan.nc_max,
        plan.window,
        plan.comp_block,
        plan.comp_stride,
        list_len,
        comp_fixed,
        branches,
        sum(slots),
        part_ml.shape[1],
        comp_plan.num_tiles,
        BLOCK_N=plan.block_n,
        BLOCK_SIZE=plan.block_size,
        ALL_MEMBERS=all_members,
        S_PAD=s_pad,
        APPLY_GATES=apply_gates,
        SHARED_COMP=shared_comp is not None,
        COMP_GROUP_PAD=comp_plan.group_pad,
        COMP_BLOCK_M=comp_plan.block_m,
        **plan.rows_meta(),
        **chain_for(chain, plan.pdl).meta(),
        num_warps=1 if s_pad * plan.head_dim <= 2048 else 4,
    )


def branch_bits(slots) -> int:
    """The branches with slots, as ``nsa_fwd_kernel``'s ``branches`` bits (1 compressed, 2
    selected, 4 window)."""
    return sum(1 << x for x, n in enumerate(slots) if n)


def plan_args(union: GroupPlan | None, prefix_lens):
    """The union plan's kernel arguments: lists, member bits, counts, whether every row is a
    member of every entry (a plan of one row per tile), and the list length."""
    if union is None:  # no selected slots: the plan pointers are never read
        return prefix_lens, prefix_lens, prefix_lens, True, 1
    lists = union.block_lists
    bits = union.member_mask if union.member_mask is not None else lists
    counts = union.counts if union.counts is not None else prefix_lens
    return lists, bits, counts, union.member_mask is None, lists.shape[-1]


def union_for(
    plan: LaunchPlan,
    block_idx: torch.Tensor,
    given: GroupPlan | None,
    chain: LaunchChain | None = None,
) -> GroupPlan:
    if given is None:
        return union_plan(block_idx, plan.rows, plan.nb_max, chain_for(chain, plan.pdl))
    want = min(plan.rows, plan.num_t)
    if given.mode != "union" or given.group_size != want or given.order is not None:
        raise ValueError(
            f"union_plan must be union_plan(block_idx, {plan.rows}) of this call's "
            f"block_idx, got mode {given.mode} with groups of {given.group_size}"
        )
    return given
