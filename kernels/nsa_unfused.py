"""The unfused baseline of :func:`kernels.nsa_verify.nsa_verify`: each NSA branch launched on
its own, sized to fill the SMs alone, merged into its own output, then one gating launch; the
branches that do not wait on one another run side by side (``kernels.branch_streams``)."""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from ssvkit.kernels.branch_streams import Branches
from ssvkit.kernels.nsa_checks import checked_plan
from ssvkit.kernels.nsa_config import DEFAULT_CONFIG, NsaVerifyConfig
from ssvkit.kernels.nsa_kernels import nsa_gate_kernel
from ssvkit.kernels.nsa_launch import context_plan, plan_slots
from ssvkit.kernels.nsa_selection import refresh_indices
from ssvkit.kernels.nsa_steps import alloc_partials, forward_and_merge, launch_merge, union_for
from ssvkit.kernels.pdl import LaunchChain


def nsa_verify_unfused(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    comp_k: torch.Tensor,
    comp_v: torch.Tensor,
    gates: torch.Tensor,
    *,
    block_idx: torch.Tensor | None = None,
    top_n: int,
    block_size: int,
    window: int,
    comp_block: int,
    comp_stride: int,
    num_sink: int = 1,
    num_local: int = 1,
    sm_scale: float | None = None,
    validate: bool = True,
    config: NsaVerifyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline of :func:`nsa_verify`: each branch launched on its own, then gated.

    Same parameters and result as :func:`nsa_verify`. Branch ``x`` is ``nsa_fwd_kernel`` with
    only ``x``'s slots, sized to fill the SMs on its own, and its own merge (folded as
    configured) writing its normalised output ``o_x`` to HBM (the selected branch streams the
    same union as the fused path); one more launch gates them,
    ``g_c * o_c + g_s * o_s + g_w * o_w``. The refresh path's selection is the one
    :func:`nsa_verify` uses, and its compressed states (which the selection needs) are the
    compressed branch's: that branch is not computed twice. With ``config.branch_streams``
    the branches that do not wait on one another run side by side (``kernels.branch_streams``):
    the window branch throughout, the compressed branch (on a refresh call, its merge after the
    selection) beside the selected one.
    """
    config = config or DEFAULT_CONFIG
    kw = dict(
        top_n=top_n,
        block_size=block_size,
        window=window,
        comp_block=comp_block,
        comp_stride=comp_stride,
        num_sink=num_sink,
        num_local=num_local,
        sm_scale=sm_scale,
    )
    args = (q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates)
    plan = checked_plan(args, block_idx, kw, validate, config)
    # The compressed branch on row tiles of its own under context_tiles "shared".
    comp_plan = context_plan(plan, q, k_cache, comp_k, config, **kw) or plan
    outs = torch.empty((3, *q.shape), dtype=q.dtype, device=q.device)
    branches = Branches(q.device, config.branch_streams)
    chain = LaunchChain(plan.pdl)

    def side_chain(slot: int) -> LaunchChain:
        """The launches forked onto side stream ``slot``: a chain of their own (its first
        launch follows work it knows nothing about) on a counter lane of their own, as they
        run beside the call's other launches; else the call's chain."""
        return LaunchChain(plan.pdl, lane=1 + slot) if branches.main is not None else chain

    # The window branch reads nothing another branch writes: it runs beside them throughout.
    with branches.fork(0):
        _unfused_branch(plan, args, outs[2], WINDOW, None, config, side_chain(0))
    if block_idx is None:  # the selection's compressed states are the compressed branch's
        slots = plan_slots(comp_plan, q.device, config, COMPRESSED)
        part = alloc_partials(comp_plan, slots[0], q.device)
        block_idx = refresh_indices(comp_plan, args, part, slots, chain)
        with branches.fork(1):
            launch_merge(
                comp_plan, args, None, part, outs[0], slots, apply_gates=False, chain=side_chain(1)
            )
    else:
        # Beside the other branches: one program an SM (nsa_slots.compressed_capacity's rule).
        beside = replace(config, compressed_ctas=1) if branches.main is not None else config
        with branches.fork(1):
            _unfused_branch(comp_plan, args, outs[0], COMPRESSED, None, beside, side_chain(1))
    _unfused_branch(plan, args, outs[1], SELECTED, block_idx, config, chain)
    branches.join()
    o = torch.empty_like(q)
    rows = o.numel() // plan.head_dim
    block_r = max(1, min(64, 4096 // plan.head_dim))
    nsa_gate_kernel[(triton.cdiv(rows, block_r),)](
        outs, gates, o, rows, HEAD_DIM=plan.head_dim, BLOCK_R=block_r, num_warps=4
    )
    return o, block_idx


# The branches of one launch of the unfused baseline (compressed, selected, window).
COMPRESSED, SELECTED, WINDOW = (True, False, False), (False, True, False), (False, False, True)


def _unfused_branch(plan, args, out, branches, block_idx, config, chain) -> None:
    """One branch of :func:`nsa_verify_unfused`: its forward, sized to fill the SMs on its
    own, and its merge into ``out``, ungated."""
    device = args[0].device
    slots = plan_slots(plan, device, config, branches)
    part = alloc_partials(plan, sum(slots), device)
    union = union_for(plan, block_idx, None, chain) if branches[1] else None
    forward_and_merge(plan, args, union, part, out, slots, apply_gates=False, chain=chain)
