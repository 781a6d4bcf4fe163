"""NSA tree verification: compressed, selected and sliding-window branches with gates.

For each draft row and query head (seed 000, "detailed NSA math"; NSA, Yuan et al. 2025),
``o = g_c * Attn(q, compressed) + g_s * Attn(q, selected blocks) + g_w * Attn(q, window)``, each
branch with its own softmax. :func:`nsa_verify` fuses the branches: a (sequence x KV head, row
tile) program packs the tile's draft rows times the KV head's query heads into the MMA rows, so
every key tile is read once per KV head; the key tiles are spread over slots sized to fill the
SMs, and a merge combines each branch's slots and gates them, so no branch output touches HBM.
A reuse call (``block_idx`` given) streams the given blocks; a refresh call (``block_idx=None``)
first selects them from the compressed branch's attention and returns them for the following
reuse layers. :func:`nsa_verify_unfused` (``kernels.nsa_unfused``) is the baseline, each branch
launched on its own.
Nothing is read on the host. ``nsa_verify``'s docstring has the branches, both paths and the
knobs; ``docs/results/kernels.md`` the measurements behind each default.
"""

from __future__ import annotations

import torch
import triton
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.group_plan import GroupPlan
from ssvkit.kernels.nsa_checks import checked_plan
from ssvkit.kernels.nsa_compress import (
    compress_kv,
    reference_compress_kv,
    update_compressed_kv,
)
from ssvkit.kernels.nsa_config import DEFAULT_CONFIG, NsaVerifyConfig
from ssvkit.kernels.nsa_launch import (
    LaunchPlan,
    context_plan,
    plan_slots,
    refresh_slots,
    tile_packing,
)
from ssvkit.kernels.nsa_pair import launch_pair
from ssvkit.kernels.nsa_reference import reference_nsa_verify
from ssvkit.kernels.nsa_selection import refresh_indices
from ssvkit.kernels.nsa_steps import (
    alloc_partials,
    forward_and_merge,
    launch_fwd,
    launch_merge,
    union_for,
    union_plan,
)
from ssvkit.kernels.nsa_unfused import nsa_verify_unfused
from ssvkit.kernels.pdl import LaunchChain
from ssvkit.perfmodel import nsa_plan

__all__ = [
    "NsaVerifyConfig",
    "compress_kv",
    "nsa_verify",
    "nsa_union_plan",
    "nsa_verify_unfused",
    "reference_compress_kv",
    "reference_nsa_verify",
    "update_compressed_kv",
]


def nsa_verify(
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
    union: GroupPlan | None = None,
    return_union: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, GroupPlan]:
    """Gated three-branch NSA attention of ``t`` draft rows; fused when ``block_idx`` is given.

    For each draft row ``i`` and query head ``h`` (seed 000, "detailed NSA math"; NSA, Yuan et
    al. 2025)::

        o = g_c * Attn(q, compressed) + g_s * Attn(q, selected blocks) + g_w * Attn(q, window)

    each branch with its own softmax. With ``L = prefix_lens[b]``:

    - compressed: the ``num_compressed(L)`` compressed tokens of :mod:`kernels.nsa_compress`;
      all their tokens lie in the committed prefix, so every draft row sees all of them.
    - selected: the raw prefix tokens of the ``top_n`` blocks of ``block_size`` tokens in
      ``block_idx[b, h // G, i]`` (one set per KV head and row, shared by its ``G`` query
      heads).
    - window: the last ``window`` prefix tokens (the same span for every row: the tail is at
      most 64 tokens, so the window is anchored at the prefix end) plus the draft tail under
      the ancestor bitmask ``tree_mask``.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]`` draft queries (bf16/fp16 on the GPU, fp16/fp32 on the CPU), ``t <= 64``,
        ``D`` a power of two in [16, 256], unit stride in ``D``.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]``: prefix in ``[0, L)``, draft tail in ``[L, L + t)``.
    prefix_lens : torch.Tensor
        ``[B]`` int32 committed lengths ``L`` (device; read on the host only when validating).
    tree_mask : torch.Tensor
        ``[B, t]`` int64 ancestor-or-self bitmask of the draft tail (:mod:`kernels.tree`).
    comp_k, comp_v : torch.Tensor
        ``[B, Hkv, NC_max, D]`` compressed tokens from :func:`compress_kv`; sequence ``b`` uses
        the first ``num_compressed(L)`` of them.
    gates : torch.Tensor
        ``[B, t, H, 3]`` float gates ``(g_c, g_s, g_w)``, contiguous.
    block_idx : torch.Tensor, optional
        ``[B, Hkv, t, top_n]`` int32 selected blocks (``-1`` = unused slot, any order): a reuse
        layer. ``None``: a refresh layer, which selects them.
    top_n, block_size : int
        Selected blocks per row and tokens per block (a power of two >= 16).
    window : int
        Sliding-window prefix tokens (>= 0); the draft tail is always in the window branch.
    comp_block, comp_stride : int
        Compression window and stride, as given to :func:`compress_kv`.
    num_sink, num_local : int
        Blocks forced into the refresh path's selection at the start and end of the prefix.
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    validate : bool
        Also run the checks that read tensor values (lengths, tree mask, index range and
        duplicates); they synchronise with the host, so the engine passes False.
    config : NsaVerifyConfig, optional
        Launch parameters.
    union : GroupPlan, optional
        A reuse layer's union plan, :func:`nsa_union_plan` of ``block_idx`` (the layers of one
        refresh share it); built here when omitted.
    return_union : bool
        Also return the union plan the call streamed (a refresh call's is the one its reuse
        layers take: no second build).

    Returns
    -------
    o : torch.Tensor
        ``[B, t, H, D]`` contiguous, dtype of ``q``.
    block_idx : torch.Tensor
        The indices used: ``block_idx`` itself on a reuse layer, else the refresh path's
        ``[B, Hkv, t, top_n]`` int32 (ascending, ``-1`` padded), on the device.
    union : GroupPlan
        With ``return_union`` only: the union plan of ``block_idx``.

    Notes
    -----
    **Reuse path** (``block_idx`` given, a reuse layer): the forward is one ``nsa_fwd_kernel``
    launch. A (sequence x KV head, row tile) packs the ``G`` query heads x the tile's draft rows
    into the MMA rows (row ``m`` = draft row ``m // G_PAD``, head ``m % G_PAD``, padded to >= 16
    rows), so every key tile is read once per KV head for all of them. Its work is cut into key
    tiles (compressed tiles, the selected blocks of the tile's union list, window tiles) and spread
    over slots, each slot a program that runs an equal slice of one branch in one software-pipelined
    loop and writes its ``(m, l, acc)`` partial. The host sizes the slot count so the grid fills the
    SMs (``plan_slots``); the kernel splits the slots between the branches by the key tiles each has
    in that program, union length included, which the host does not know. The merge combines each
    branch's slots on its own and gates them: the branches stay separate until gating, as the math
    requires, and no branch output touches HBM. The merge is a launch of its own
    (``nsa_merge_kernel``, the default). ``NsaVerifyConfig(merge=...)`` folds it into the forward
    launch on arrival counters (``kernels.arrivals``): the last program of a row tile to finish
    merges the tile (``last``), or merge programs of the launch take one draft row each
    (``parallel``; ``auto`` chooses, ``kernels.nsa_steps.merge_layout``). The selected branch
    streams the deduplicated union of the tile's per-row block lists (SSV's exact merged schedule,
    the ``union`` mode of ``kernels.group_plan``; built by ``kernels.nsa_steps.union_plan``), each
    block once with the bits of the rows that chose it; the plan can be built once per refresh and
    passed to the reuse layers (``union``, :func:`nsa_union_plan`).

    **Refresh path** (``block_idx=None``): (1) the compressed branch alone (its partial states
    are kept), (2) the block scoring merges those states into the softmax normaliser and maps
    each compressed token's probability, summed over the ``G`` heads, onto every selection
    block its window overlaps (NSA's rule; ``kernels.nsa_band_scores`` by default,
    ``block_score_kernel`` where the block size is no multiple of the stride or ``score_map``
    is "matrix"), (3) ``kernels.top_blocks`` picks each row's ``top_n`` blocks with the first
    ``num_sink`` and last ``num_local`` forced -- (2) and (3) fold into one launch with
    ``NsaVerifyConfig(pick="folded")`` where the threshold pick serves the rows
    (``kernels.nsa_selection``) --, (4) the union plan, (5) the selected and window branches
    and (6) the merge and gating as above, reading the compressed partials from (1) too. The
    indices ``[B, Hkv, t, top_n]`` int32 (ascending, ``-1`` padded) are returned for the
    following reuse layers.

    **Compressed tiles** (``NsaVerifyConfig.context_tiles``): every draft row sees all the
    compressed tokens, so where the row schedule cuts the rows into more tiles than the packed
    one would (a ``union`` of C rows, one row for ``per_query``), the compressed branch runs on
    the packed schedule's tiles in a launch of its own (``kernels.nsa_launch.context_plan``; a
    refresh call's selection reads its states there) and the selected and window branches on
    the schedule's tiles; the merge reads the two partial buffers (a reuse call is then three
    launches: compressed, selected and window, merge). "paired", the default, runs a reuse
    call's first two of those as one grid where one wave holds both (``kernels.nsa_pair``).
    "per_tile" keeps the compressed branch on the schedule's tiles, each streaming every
    compressed token.

    ``NsaVerifyConfig(pdl=True)`` launches every step of a call after its first as a
    programmatic dependent of the one before (``kernels.pdl``, compute capability 9.0 or
    later): a step starts, and does what does not need the step before it, while that one
    drains; the output is the same bit for bit. It is off by default;
    ``validation.nsa_stages`` times both (``*_pdl``).

    Examples
    --------
    ::

        comp_k, comp_v, _ = compress_kv(k_cache, v_cache, prefix_lens, comp_block=32,
                                        comp_stride=16)
        kw = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)
        o, idx = nsa_verify(q, k_cache, v_cache, prefix_lens, mask, comp_k, comp_v, gates, **kw)
        o2, _ = nsa_verify(q2, k2, v2, prefix_lens, mask, ck2, cv2, g2, block_idx=idx, **kw)
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
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    chain = LaunchChain(plan.pdl)
    refresh = block_idx is None
    comp_plan = context_plan(plan, q, k_cache, comp_k, config, **kw)
    if comp_plan is not None:
        block_idx, union = _shared_comp_call(
            plan, comp_plan, args, o, block_idx, union, config, chain
        )
        return (o, block_idx, union) if return_union else (o, block_idx)
    if refresh:
        slots = refresh_slots(plan, q.device, config)
    else:
        slots = plan_slots(plan, q.device, config)
    part = alloc_partials(plan, sum(slots), q.device)
    if refresh:
        block_idx = refresh_indices(plan, args, part, slots, chain)
    union = union_for(plan, block_idx, None if refresh else union, chain)
    forward_and_merge(plan, args, union, part, o, slots, comp_apart=refresh, chain=chain)
    return (o, block_idx, union) if return_union else (o, block_idx)


def _shared_comp_call(plan, comp_plan, args, o, block_idx, union, config, chain):
    """:func:`nsa_verify` with the compressed branch on ``comp_plan``'s row tiles
    (``NsaVerifyConfig.context_tiles`` "shared"): that launch (the refresh path's selection
    after it), the selected and window branches on ``plan``'s tiles, and the merge reading
    both partials. Returns the indices and the union plan."""
    device = args[0].device
    slots = refresh_slots(plan, device, config, comp_plan)
    comp_part = alloc_partials(comp_plan, slots[0], device)
    refresh = block_idx is None
    pair = not refresh and _pairs(plan, comp_plan, slots, config, device)
    if refresh:
        block_idx = refresh_indices(comp_plan, args, comp_part, slots, chain)
    elif not pair:
        launch_fwd(comp_plan, args, None, comp_part, slots=(slots[0], 0, 0), chain=chain)
    union = union_for(plan, block_idx, None if refresh else union, chain)
    part = alloc_partials(plan, sum(slots[1:]), device)
    if pair:
        launch_pair(plan, comp_plan, args, union, comp_part, part, slots, chain)
    else:
        launch_fwd(plan, args, union, part, slots=(0, *slots[1:]), chain=chain)
    launch_merge(plan, args, union, part, o, slots, shared_comp=(comp_plan, comp_part), chain=chain)
    return block_idx, union


def _pairs(plan: LaunchPlan, comp_plan: LaunchPlan, slots, config, device) -> bool:
    """Whether a reuse call runs its two forward launches as one (``context_tiles``
    "paired", ``kernels.nsa_pair``): on the GPU, where one wave holds both
    (``perfmodel.nsa_plan.pairs_launches``) and they share a warp count; the interpreter
    always pairs, so the CPU tests take the paired path."""
    if config.context_tiles != "paired" or plan.num_warps != comp_plan.num_warps:
        return False
    programs = comp_plan.programs * slots[0] + plan.programs * sum(slots[1:])
    return device.type != "cuda" or nsa_plan.pairs_launches(programs, num_sms(device))


def nsa_union_plan(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    block_size: int,
    config: NsaVerifyConfig | None = None,
) -> GroupPlan:
    """The union plan :func:`nsa_verify` builds from ``block_idx`` for ``q`` (``[B, t, H, D]``)
    over ``k_cache`` (``[B, Hkv, T_max, D]``): build it once and pass it to every reuse layer of
    one refresh."""
    config = config or DEFAULT_CONFIG
    t, h = q.shape[1], q.shape[2]
    rows = tile_packing(t, h // k_cache.shape[1], config, q.shape[3])[0]
    return union_plan(block_idx, rows, triton.cdiv(k_cache.shape[2], block_size))
