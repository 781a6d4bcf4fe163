"""The NSA refresh path's selection, on the host (steps (1)-(3) of :mod:`kernels.nsa_verify`):
the compressed launch (which keeps its partial states and may store the compressed scores), the
block importance, and the top-n pick, the last two in one launch
(``nsa_folded_pick.refresh_select_kernel``) when the plan's ``pick`` is ``folded`` and
``kernels.top_blocks``' threshold pick serves the rows, else two (importance, then
``kernels.top_blocks``). Nothing is read on the host. ``chain``: as in
:mod:`kernels.nsa_steps`."""

from __future__ import annotations

import torch
import triton
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.nsa_band_scores import band_geometry, band_score_kernel
from ssvkit.kernels.nsa_folded_pick import refresh_select_kernel
from ssvkit.kernels.nsa_launch import LaunchPlan
from ssvkit.kernels.nsa_select_kernels import block_score_kernel
from ssvkit.kernels.nsa_steps import launch_fwd
from ssvkit.kernels.nsa_stored_scores import stored_block_score_kernel
from ssvkit.kernels.pdl import LaunchChain, chain_for
from ssvkit.kernels.top_blocks import empty_scores, threshold_meta, threshold_warps, top_blocks
from ssvkit.perfmodel import nsa_plan


def select_top_blocks(
    scores: torch.Tensor,
    prefix_lens: torch.Tensor,
    plan: LaunchPlan,
    chain: LaunchChain | None = None,
):
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
        chain=chain_for(chain, plan.pdl),
    )


def alloc_comp_scores(plan: LaunchPlan, device) -> torch.Tensor:
    """``[programs, row slots x G, NC_max]`` fp32 (``block_m / G_PAD`` row slots per tile):
    every real MMA row's score of every compressed token, written by the refresh path's
    compressed launch."""
    rows = plan.block_m // plan.group_pad
    return torch.empty(
        (plan.programs, rows * plan.group, plan.nc_max), dtype=torch.float32, device=device
    )


def stores_comp_scores(plan: LaunchPlan, key_bytes: int) -> bool:
    """Whether the refresh path stores the compressed scores instead of computing them again
    for the block scoring: stored, they cost 8 bytes per real MMA row and compressed token (a
    write and a read); computed again, the compressed key (``key_bytes``) and its product with
    the queries. ``plan.score_source`` forces either."""
    if plan.score_source != "auto":
        return plan.score_source == "stored"
    return nsa_plan.stores_scores(min(plan.rows, plan.num_t), plan.group, key_bytes)


def compressed_block_scores(
    plan: LaunchPlan,
    args,
    part,
    c_slots: int,
    comp_scores: torch.Tensor | None = None,
    chain: LaunchChain | None = None,
) -> torch.Tensor:
    """Step (2) of the refresh path: ``[B, Hkv, t, NB_max]`` fp32 block importance from the
    compressed partials of ``c_slots`` slots in ``part`` and the compressed scores: read from
    ``comp_scores`` when given, else computed again from the compressed keys."""
    q, _, _, prefix_lens, _, comp_k, _, _ = args
    scores = empty_scores(plan.batch, plan.num_kv_heads, plan.num_t, plan.nb_max, q.device)
    grid_j = triton.cdiv(plan.nb_max, plan.block_j)
    c_pad = max(2, triton.next_power_of_2(c_slots))
    launch = chain_for(chain, plan.pdl).meta()
    if comp_scores is not None:
        width = (plan.block_size + plan.comp_block - 2) // plan.comp_stride + 1
        stored_block_score_kernel[(plan.programs, plan.rows, grid_j)](
            comp_scores,
            part[1],
            prefix_lens,
            scores,
            plan.num_t,
            plan.num_tiles,
            plan.nc_max,
            plan.nb_max,
            scores.stride(2),
            plan.comp_block,
            plan.comp_stride,
            c_slots,
            part[1].shape[1],
            NUM_KV_HEADS=plan.num_kv_heads,
            GROUP=plan.group,
            GROUP_PAD=plan.group_pad,
            BLOCK_M=plan.block_m,
            BLOCK_J=plan.block_j,
            W_PAD=triton.next_power_of_2(width),
            BLOCK_SIZE=plan.block_size,
            C_PAD=c_pad,
            **launch,
            num_warps=plan.score_warps,
        )
        return scores
    band = band_geometry(plan.block_size, plan.comp_block, plan.comp_stride, plan.block_n)
    if plan.score_map == "band" and band is not None:
        _band_scores(plan, q, comp_k, part, prefix_lens, scores, c_slots, band, launch)
        return scores
    args, meta = _computed_score_args(plan, q, comp_k, part, prefix_lens, scores, c_slots)
    block_score_kernel[(plan.batch * plan.num_kv_heads, plan.num_tiles, grid_j)](
        *args,
        BLOCK_J=plan.block_j,
        BLOCK_SIZE=plan.block_size,
        **meta,
        **launch,
        num_warps=plan.score_warps,
    )
    return scores


def _computed_score_args(plan, q, comp_k, part, prefix_lens, scores, c_slots):
    """The arguments and meta-parameters that ``block_score_kernel`` and
    ``band_score_kernel`` share, in their order."""
    args = (
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
    )
    meta = dict(
        BLOCK_C=plan.block_n,
        DOT_PRECISION=plan.dot_precision,
        OVERLAP_SPLIT=plan.dot_precision != "ieee",
        C_PAD=max(2, triton.next_power_of_2(c_slots)),
        **plan.rows_meta(),
    )
    return args, meta


def _band_scores(plan, q, comp_k, part, prefix_lens, scores, c_slots, band, launch) -> None:
    """``compressed_block_scores``' computed path under ``score_map`` "band"
    (``kernels.nsa_band_scores``): ``plan.block_j // JB`` key tiles a program."""
    r, e, jb = band
    per_program = max(1, plan.block_j // jb)
    grid = (
        plan.batch * plan.num_kv_heads,
        plan.num_tiles,
        triton.cdiv(plan.nb_max, jb * per_program),
    )
    args, meta = _computed_score_args(plan, q, comp_k, part, prefix_lens, scores, c_slots)
    band_score_kernel[grid](
        *args,
        r,
        e,
        jb,
        per_program,
        JB_PAD=max(16, triton.next_power_of_2(jb)),
        **meta,
        **launch,
        num_warps=plan.score_warps,
    )


def refresh_indices(
    plan: LaunchPlan, args, part, slots, chain: LaunchChain | None = None
) -> torch.Tensor:
    """Steps (1)-(3) of the refresh path; leaves the compressed partials in ``part``."""
    chain = chain_for(chain, plan.pdl)
    comp_k = args[5]
    comp_scores = None
    if stores_comp_scores(plan, comp_k.shape[-1] * comp_k.element_size()):
        comp_scores = alloc_comp_scores(plan, comp_k.device)
    launch_fwd(plan, args, None, part, slots=(slots[0], 0, 0), comp_scores=comp_scores, chain=chain)
    return picked_blocks(plan, args, part, slots[0], comp_scores, chain)


def picked_blocks(
    plan: LaunchPlan,
    args,
    part,
    c_slots: int,
    comp_scores: torch.Tensor | None = None,
    chain: LaunchChain | None = None,
) -> torch.Tensor:
    """Steps (2)-(3): the block importance (as ``compressed_block_scores``) and each row's
    top-n (as ``select_top_blocks``): one ``refresh_select_kernel`` launch when ``plan.pick``
    is ``folded`` and the threshold pick serves the rows, else the two launches."""
    chain = chain_for(chain, plan.pdl)
    pick = threshold_meta(plan.nb_max, plan.top_n) if plan.pick == "folded" else None
    if pick is None:
        scores = compressed_block_scores(plan, args, part, c_slots, comp_scores, chain)
        return select_top_blocks(scores, args[3], plan, chain)
    q, _, _, prefix_lens, _, comp_k, _, _ = args
    b, hkv, t = plan.batch, plan.num_kv_heads, plan.num_t
    scores = empty_scores(b, hkv, t, plan.nb_max, q.device)
    out = torch.empty((b, hkv, t, plan.top_n), dtype=torch.int32, device=q.device)
    scratch = torch.empty((b * hkv * t, pick["CAP"]), dtype=torch.int64, device=q.device)
    grid_j = triton.cdiv(plan.nb_max, plan.block_j)
    per_pair = plan.num_tiles * grid_j * (plan.rows if comp_scores is not None else 1)
    width = (plan.block_size + plan.comp_block - 2) // plan.comp_stride + 1
    refresh_select_kernel[(b * hkv * (per_pair + t),)](
        q,
        comp_k,
        comp_scores if comp_scores is not None else part[1],
        part[1],
        prefix_lens,
        scores,
        out,
        scratch,
        arrival_counters(1 + 2 * b * hkv, q.device, chain.lane),
        *q.stride()[:3],
        *comp_k.stride()[:3],
        t,
        plan.num_tiles,
        plan.nc_max,
        plan.nb_max,
        scores.stride(2),
        plan.comp_block,
        plan.comp_stride,
        plan.qk_scale,
        c_slots,
        part[1].shape[1],
        plan.num_sink,
        plan.num_local,
        grid_j,
        BLOCK_C=plan.block_n,
        BLOCK_J=plan.block_j,
        BLOCK_SIZE=plan.block_size,
        DOT_PRECISION=plan.dot_precision,
        OVERLAP_SPLIT=plan.dot_precision != "ieee",
        C_PAD=max(2, triton.next_power_of_2(c_slots)),
        W_PAD=triton.next_power_of_2(width),
        STORED=comp_scores is not None,
        **plan.rows_meta(),
        **pick,
        **chain.meta(),
        num_warps=max(plan.score_warps, threshold_warps(b * hkv * t, pick["CHUNK"], q.device)),
    )
    return out
