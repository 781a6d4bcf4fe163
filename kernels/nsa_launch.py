"""Launch plan of :mod:`kernels.nsa_verify` under its tuning knobs (``NsaVerifyConfig``,
:mod:`kernels.nsa_config`): the shapes and row packing of one call (``make_plan``), how many
slots each branch gets (``plan_slots``) and the compressed branch's own tiles
(``context_plan``), all on the host.

Row packing: a row tile holds ``rows`` draft rows x ``group_pad`` head slots, ``BLOCK_M =
rows x group_pad`` MMA rows (at least 16, ``tl.dot``'s minimum), and streams the union of its
rows' selected blocks. ``NsaVerifyConfig.rows_per_tile`` caps ``rows`` (the strategy's schedule,
``perfmodel.strategy.nsa_rows_per_tile``: 1 for ``per_query``, C for ``union``, 0 = as many as
fit), rounded down to a power of two (C = 3 packs 2 rows a tile). Where ``rows x
next_pow2(G)`` is under 16, ``group_pad`` grows to ``16 / rows`` so that a tile still holds
exactly ``rows`` draft rows (the kernels' ``ROWS = BLOCK_M // GROUP_PAD``); the extra head
slots are padding, as those past ``G`` always are. From ``NsaVerifyConfig.warpgroup_rows_from``
packed rows on, a tile under ``WGMMA_MIN_ROWS`` rows at a head dim up to
``WGMMA_MAX_HEAD_DIM`` grows its head slots likewise to that many rows (a ``wgmma`` tile in
place of ``mma.sync``). Above that head dim a tile holds at most
``NsaVerifyConfig.wide_tile_elems / D`` MMA rows (16 at D = 256, ``nsa_plan.wide_block_m_max``):
its ``mma.sync`` operands and accumulator sit in registers, and larger tiles spill."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.nsa_config import NsaVerifyConfig
from ssvkit.kernels.pdl import check_pdl
from ssvkit.perfmodel import nsa_plan, nsa_slots

LOG2E = 1.4426950408889634
ALL_BRANCHES = (True, True, True)
# Draft rows of one row tile: the union plan keeps a block's rows as bits of an int32.
MAX_TILE_ROWS = nsa_plan.MAX_TILE_ROWS
# Head dims up to which a 32-row tile may grow to a 64-row one (why: ``nsa_plan``).
WGMMA_MAX_HEAD_DIM = nsa_plan.WGMMA_MAX_HEAD_DIM


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Shapes, semantics and launch geometry of one call, all known on the host."""

    batch: int
    num_t: int
    num_kv_heads: int
    group: int
    group_pad: int
    head_dim: int
    nc_max: int
    nb_max: int
    top_n: int
    block_size: int
    window: int
    comp_block: int
    comp_stride: int
    num_sink: int
    num_local: int
    qk_scale: float
    block_m: int
    rows: int
    num_tiles: int
    block_n: int
    comp_block_n: int  # keys per tile of a launch of the compressed branch alone
    block_j: int
    score_warps: int
    score_source: str
    score_map: str
    num_warps: int
    num_stages: int
    dot_precision: str
    merge: str
    pick: str
    pdl: bool
    tile_plan: str = "fixed"

    def rows_meta(self) -> dict:
        """Constexprs of the row packing, shared by the kernels."""
        return dict(
            NUM_KV_HEADS=self.num_kv_heads,
            GROUP=self.group,
            GROUP_PAD=self.group_pad,
            HEAD_DIM=self.head_dim,
            BLOCK_M=self.block_m,
        )

    @property
    def programs(self) -> int:
        """(sequence x KV head, row tile) pairs."""
        return self.batch * self.num_kv_heads * self.num_tiles

    def branch_tiles(self, expected_overlap: float) -> tuple[float, float, float]:
        """Key tiles of one (sequence x KV head, row tile) per branch at the longest prefix
        the cache holds: compressed, selected (the union of the tile's rows at
        ``expected_overlap``), window plus draft tail."""
        rows = min(self.num_t, self.rows)
        union = self.top_n * (1 + (rows - 1) * (1.0 - expected_overlap))
        subs = self.block_size // self.block_n
        return (
            math.ceil(self.nc_max / self.block_n),
            min(union, self.nb_max) * subs,
            math.ceil(
                (min(self.window, self.nb_max * self.block_size) + self.num_t) / self.block_n
            ),
        )


def max_block_m(config: NsaVerifyConfig) -> int:
    """Most MMA rows of one row tile: ``config.block_m``, or at least ``FIT_BLOCK_M_MAX`` with
    the "fit" tile plan."""
    if config.tile_plan == "fit":
        return max(config.block_m, nsa_plan.FIT_BLOCK_M_MAX)
    return config.block_m


def draft_rows_per_tile(t: int, group_pad: int, config: NsaVerifyConfig, head_dim: int) -> int:
    """Draft rows of one row tile: a power of two, at most ``MAX_TILE_ROWS`` (the "fit" plan:
    ``FIT_MAX_TILE_ROWS``), ``max_block_m // group_pad`` (capped above ``WGMMA_MAX_HEAD_DIM``
    by ``config.wide_tile_elems``, ``nsa_plan.wide_block_m_max``) and ``config.rows_per_tile``
    (when set)."""
    most = nsa_plan.FIT_MAX_TILE_ROWS if config.tile_plan == "fit" else MAX_TILE_ROWS
    cap = most
    if config.rows_per_tile:
        cap = 1 << (min(config.rows_per_tile, most).bit_length() - 1)
    block_m = nsa_plan.wide_block_m_max(
        max_block_m(config), head_dim, group_pad, config.wide_tile_elems
    )
    return max(1, min(cap, block_m // group_pad, triton.next_power_of_2(t)))


def tile_packing(
    t: int, group: int, config: NsaVerifyConfig, head_dim: int
) -> tuple[int, int, int]:
    """(draft rows, head slots ``group_pad``, MMA rows ``block_m``) of one row tile of a call
    over ``t`` draft rows and a head group of ``group`` at ``head_dim`` (module docstring)."""
    group_pad = triton.next_power_of_2(group)
    if group_pad > max_block_m(config):
        raise ValueError(f"config.block_m ({config.block_m}) must hold a head group ({group})")
    rows = draft_rows_per_tile(t, group_pad, config, head_dim)
    group_pad = max(group_pad, 16 // rows)
    wgmma = nsa_plan.WGMMA_MIN_ROWS
    pads = config.warpgroup_rows_from <= rows * group_pad < wgmma <= max_block_m(config)
    if pads and head_dim <= WGMMA_MAX_HEAD_DIM:
        group_pad = wgmma // rows
    return rows, group_pad, rows * group_pad


def _check_args(
    top_n, block_size, window, comp_block, comp_stride, num_sink, num_local, sm_scale
) -> None:
    """``make_plan``'s checks of the call's selection, window and compression arguments: one
    ``ValueError`` naming the first bad value."""
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if comp_block < 1:
        raise ValueError(f"comp_block must be >= 1, got {comp_block}")
    if not 1 <= comp_stride <= comp_block:
        raise ValueError(f"comp_stride must be in [1, comp_block={comp_block}], got {comp_stride}")
    if num_sink < 0 or num_local < 0 or num_sink + num_local > top_n:
        raise ValueError(
            f"num_sink ({num_sink}) and num_local ({num_local}) must be >= 0 and "
            f"sum to at most top_n ({top_n})"
        )
    if sm_scale is not None and not sm_scale > 0:
        raise ValueError(f"sm_scale must be > 0, got {sm_scale}")


def make_plan(
    q,
    k_cache,
    comp_k,
    *,
    top_n,
    block_size,
    window,
    comp_block,
    comp_stride,
    num_sink,
    num_local,
    sm_scale,
    config: NsaVerifyConfig,
) -> LaunchPlan:
    """The launch plan of one ``nsa_verify`` call on ``q`` ``[B, t, H, D]`` over a cache of
    ``k_cache``'s rows and ``comp_k``'s compressed tokens: its row tiles, tile sizes and warps
    under ``config``, its arguments checked."""
    _check_args(top_n, block_size, window, comp_block, comp_stride, num_sink, num_local, sm_scale)
    if config.pdl:
        check_pdl(q.device)
    b, t, h, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    rows, group_pad, block_m = tile_packing(t, h // hkv, config, d)
    num_warps = nsa_plan.forward_warps(block_m, config.tile_plan, config.num_warps)
    return LaunchPlan(
        batch=b,
        num_t=t,
        num_kv_heads=hkv,
        group=h // hkv,
        group_pad=group_pad,
        head_dim=d,
        nc_max=comp_k.shape[2],
        nb_max=triton.cdiv(t_max, block_size),
        top_n=top_n,
        block_size=block_size,
        window=window,
        comp_block=comp_block,
        comp_stride=comp_stride,
        num_sink=num_sink,
        num_local=num_local,
        qk_scale=(sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E,
        block_m=block_m,
        rows=rows,
        num_tiles=triton.cdiv(t, rows),
        block_n=min(config.block_n, block_size),
        comp_block_n=nsa_plan.comp_tile_keys(
            config.comp_block_n, min(config.block_n, block_size), d
        ),
        block_j=config.block_j,
        score_warps=config.score_warps,
        score_source=config.score_source,
        score_map=config.score_map,
        num_warps=num_warps,
        num_stages=config.num_stages,
        dot_precision="ieee" if q.dtype == torch.float32 else "tf32",
        merge=config.merge,
        pick=config.pick,
        pdl=config.pdl,
        tile_plan=config.tile_plan,
    )


def plan_slots(
    plan: LaunchPlan,
    device: torch.device,
    config: NsaVerifyConfig,
    branches: tuple[bool, bool, bool] = ALL_BRANCHES,
) -> tuple[int, int, int]:
    """Slots (programs) per (sequence x KV head, row tile) for each enabled branch.

    Sized by work: every slot gets about the same number of key tiles, enough of them that the
    grid fills ``ctas_per_sm`` programs on every SM without starting a second wave, and at
    least ``min_tiles_per_slot`` (a slot pays for its query load, its partial and a merge
    step). ``config.num_splits`` instead
    apportions that many slots by work. The interpreter takes one slot per branch. Disabled
    branches get 0, enabled ones at least 1. ``config.tile_plan`` "fit" or "fit_slots" takes
    ``perfmodel.nsa_slots.fit_slots`` instead: the count whose launch finishes first, a second
    wave allowed."""
    work = [
        w if on else 0.0
        for w, on in zip(plan.branch_tiles(config.expected_overlap), branches, strict=True)
    ]
    if config.num_splits:
        total = max(config.num_splits, sum(branches))
        return tuple(max(1, round(total * w / sum(work))) if w else 0 for w in work)
    if device.type != "cuda":
        return tuple(int(on) for on in branches)
    capacity = num_sms(device) * config.ctas_per_sm
    if config.tile_plan in nsa_plan.MAKESPAN_PLANS:
        return nsa_slots.plan_slots(
            tuple(work),
            tuple(branches),
            plan.programs,
            capacity,
            tile_plan=config.tile_plan,
            max_splits=config.max_splits,
            min_tiles_per_slot=config.min_tiles_per_slot,
        )
    # At most one wave (a few programs past it would double the time) and max_splits slots.
    return nsa_slots.plan_slots(
        tuple(work),
        tuple(branches),
        plan.programs,
        capacity,
        max_splits=config.max_splits,
        min_tiles_per_slot=config.min_tiles_per_slot,
        compressed_ctas=config.compressed_ctas,
    )


def refresh_slots(
    plan: LaunchPlan,
    device: torch.device,
    config: NsaVerifyConfig,
    comp_plan: LaunchPlan | None = None,
) -> tuple[int, int, int]:
    """Slots of a call whose compressed branch runs in a launch of its own (a refresh: its
    states feed the selection; any call with a ``comp_plan``, ``context_plan``) and the
    selected and window branches in a second one: each launch is sized to fill the SMs on its
    own, the first over ``comp_plan``'s row tiles when given."""
    c_slots = plan_slots(comp_plan or plan, device, config, (True, False, False))[0]
    return (c_slots, *plan_slots(plan, device, config, (False, True, True))[1:])


def context_plan(plan: LaunchPlan, q, k_cache, comp_k, config: NsaVerifyConfig, **kw):
    """The compressed branch's own launch plan under ``context_tiles`` "shared" or "paired":
    the call's plan with ``rows_per_tile = 0`` (as many draft rows a tile as fit), or None
    where that is no fewer tiles than ``plan``'s (the branch then runs on the call's own
    tiles). ``kw``: the semantics :func:`make_plan` takes."""
    if config.context_tiles == "per_tile" or config.merge != "separate" or not config.rows_per_tile:
        return None
    shared = make_plan(q, k_cache, comp_k, config=replace(config, rows_per_tile=0), **kw)
    return shared if shared.num_tiles < plan.num_tiles else None
