"""The shape of one NSA verification call (``NsaShape``: what its work depends on) and the
forward launches the current kernels make for it (``forward_launches``, ``live_launches``), each
with its row tiles' draft rows, key tiles per branch and MMA rows, from the launch plan
(``perfmodel.nsa_plan``: ``tile_packing``), without torch. ``perfmodel.nsa_work`` counts a
call's work from them.

A tile's selected blocks follow the selection model (``tile_union_blocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ssvkit.perfmodel.nsa_plan import (
    COMPRESSED_CTAS_PER_SM,
    CONTEXT_TILES,
    TILE_PLANS,
    WIDE_TILE_ELEMS,
    tile_packing,
)
from ssvkit.perfmodel.numbers import require_at_least_one

ELEM_BYTES = 2  # bf16 K/V, queries, outputs
F32 = 4
NUM_STAGES = 3  # NsaVerifyConfig.num_stages: K/V tiles a program keeps in flight
BLOCK_N = 64  # NsaVerifyConfig.block_n: keys per tile
ONLY = ((True, False, False), (False, True, False), (False, False, True))
ALL = (True, True, True)


# NsaShape.shared_context of context_tiles "paired".
PAIRED = CONTEXT_TILES.index("paired")


@dataclass(frozen=True, slots=True)
class NsaShape:
    """What an NSA call's work depends on (the kernel sweep's defaults for the branches)."""

    batch: int
    t: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int
    overlap: float  # row-to-row overlap of the selections (the selection model's gamma)
    rows_per_tile: int = 0
    top_n: int = 16
    block_size: int = 64
    window: int = 512
    comp_block: int = 32
    # 0: no compressed branch (the step model's NSA with that branch switched off).
    comp_stride: int = 16
    # NsaVerifyConfig.context_tiles as its index in nsa_plan.CONTEXT_TILES: 0 "per_tile",
    # 1 "shared", 2 "paired".
    shared_context: int = 0
    # NsaVerifyConfig.branch_streams: 1, an unfused call's branches side by side on streams of
    # their own (kernels.nsa_unfused.nsa_verify_unfused); 0, in series. Fused calls ignore it.
    branch_streams: int = 0
    # NsaVerifyConfig.compressed_ctas: the programs an SM a lone compressed launch of one slot a
    # row tile is sized for (nsa_slots.compressed_capacity); 1 for rows timed before it.
    compressed_ctas: int = COMPRESSED_CTAS_PER_SM
    # NsaVerifyConfig.tile_plan as its index in nsa_plan.TILE_PLANS: 0 "fixed" (what every
    # calibration row ran), 1 "fit" (larger row tiles, slots sized by the launch's makespan),
    # 2 "fit_slots" ("fixed"'s tiles, "fit"'s slots).
    tile_plan: int = 0
    # 1: a reuse call handed its union plan (``kernels.nsa_verify``'s ``union``), as the engine's
    # fused reuse layers are by the refresh before them; 0: the call builds it (a refresh call,
    # an unfused call, a kernel-sweep row).
    union_given: int = 0
    # NsaVerifyConfig.wide_tile_elems: the cap on a row tile's MMA rows x head dim above
    # nsa_plan.WGMMA_MAX_HEAD_DIM (nsa_plan.wide_block_m_max); 0 for rows timed before it.
    wide_tile_elems: int = WIDE_TILE_ELEMS

    def __post_init__(self) -> None:
        require_at_least_one(
            self, ("batch", "t", "num_q_heads", "num_kv_heads", "head_dim", "top_n")
        )
        if self.comp_stride < 0:
            raise ValueError(f"comp_stride must be >= 0, got {self.comp_stride}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if self.rows_per_tile < 0:
            raise ValueError(f"rows_per_tile must be >= 0, got {self.rows_per_tile}")
        if not 0 <= self.tile_plan < len(TILE_PLANS):
            raise ValueError(f"tile_plan must index {TILE_PLANS}, got {self.tile_plan}")

    @property
    def num_blocks(self) -> int:
        """Blocks of the scored cache: the context plus the draft rows."""
        return math.ceil((self.context_len + self.t) / self.block_size)

    @property
    def plan(self) -> str:
        """The tile plan's name (``nsa_plan.TILE_PLANS``)."""
        return TILE_PLANS[self.tile_plan]


def resident_programs(block_m: int, head_dim: int, smem_per_sm_bytes: int) -> int:
    """Forward programs one SM holds: each buffers ``NUM_STAGES`` K and V tiles and its query
    tile in shared memory."""
    per_program = (NUM_STAGES * 2 * BLOCK_N + block_m) * head_dim * ELEM_BYTES
    return max(1, smem_per_sm_bytes // per_program)


def tile_packing_of(s: NsaShape, rows_per_tile: int) -> tuple[int, int, int]:
    """``nsa_plan.tile_packing`` of the shape's call under ``rows_per_tile``: its draft rows,
    head slots and MMA rows a tile."""
    group = s.num_q_heads // s.num_kv_heads
    return tile_packing(s.t, group, rows_per_tile, s.plan, s.head_dim, s.wide_tile_elems)


def tile_rows(s: NsaShape, rows_per_tile: int | None = None) -> list[int]:
    """Draft rows of each row tile (the last one the rest), under ``rows_per_tile`` (default
    the shape's)."""
    r = s.rows_per_tile if rows_per_tile is None else rows_per_tile
    rows = tile_packing_of(s, r)[0]
    return [min(rows, s.t - i) for i in range(0, s.t, rows)]


def tile_union_blocks(s: NsaShape, rows: int) -> float:
    """Selected blocks a row tile of ``rows`` draft rows streams, by the selection model
    (``perfmodel.sparse.union_blocks``): ``n (1 + (rows - 1)(1 - overlap))`` of ``top_n = n``,
    capped by the blocks of the context and the draft rows."""
    num_blocks = s.num_blocks
    return min(s.top_n * (1 + (rows - 1) * (1.0 - s.overlap)), num_blocks)


def compressed_tokens(s: NsaShape) -> int:
    """Compressed tokens of a (sequence, KV head): one a stride from the first full window;
    none without the compressed branch (``comp_stride`` 0)."""
    if s.comp_stride == 0 or s.context_len < s.comp_block:
        return 0
    return (s.context_len - s.comp_block) // s.comp_stride + 1


def branch_units(s: NsaShape, union: float) -> tuple[int, int, int]:
    """Key tiles of one row tile per branch: compressed, selected, window plus draft tail."""
    nc = compressed_tokens(s)
    subs = s.block_size // min(BLOCK_N, s.block_size)
    return (
        math.ceil(nc / BLOCK_N),
        math.ceil(union) * subs,
        math.ceil((min(s.window, s.context_len) + s.t) / BLOCK_N),
    )


@dataclass(frozen=True, slots=True)
class Launch:
    """One forward launch of a call: its branches, each row tile's draft rows and key tiles
    per branch, and its tiles' MMA rows."""

    branches: tuple[bool, bool, bool]
    rows: list[int]
    units: list[tuple[int, int, int]]
    block_m: int
    # Whether the launch has the SMs alone (not beside an unfused reuse call's other branches):
    # the slot sizing of a lone compressed launch (``nsa_slots.compressed_capacity``) is for it.
    alone: bool = True


def forward_launches(s: NsaShape, *, fused: bool, refresh: bool) -> list[Launch]:
    """The forward launches of one call, in series (``kernels.nsa_verify``): fused, one over
    every branch (a reuse call) or the compressed branch, whose states feed the selection, and
    then the other two (a refresh call); unfused, one per branch. With ``shared_context`` and a
    row schedule of more tiles than the packed one, the compressed branch runs alone on the
    packed schedule's tiles (``kernels.nsa_launch.context_plan``) and the other branches on the
    schedule's."""
    beside = not fused and not refresh and bool(s.branch_streams)

    def launch(branches, rows_per_tile: int) -> Launch:
        rows = tile_rows(s, rows_per_tile)
        units = [branch_units(s, tile_union_blocks(s, r)) for r in rows]
        block_m = tile_packing_of(s, rows_per_tile)[2]
        return Launch(branches, rows, units, block_m, alone=not beside)

    if s.shared_context and s.rows_per_tile and len(tile_rows(s, 0)) < len(tile_rows(s)):
        rest = [(False, True, True)] if fused else list(ONLY[1:])
        return [launch(ONLY[0], 0), *(launch(b, s.rows_per_tile) for b in rest)]
    if refresh:
        branches = [(True, False, False), (False, True, True)] if fused else list(ONLY)
    else:
        branches = [ALL] if fused else list(ONLY)
    return [launch(b, s.rows_per_tile) for b in branches]


def live_launches(s: NsaShape, *, fused: bool, refresh: bool) -> list[Launch]:
    """``forward_launches`` of the branches the call has: without the compressed branch
    (``comp_stride`` 0) every launch drops it, and a launch of it alone is not made."""
    launches = forward_launches(s, fused=fused, refresh=refresh)
    if s.comp_stride:
        return launches
    kept = (replace(la, branches=(False, *la.branches[1:])) for la in launches)
    return [la for la in kept if any(la.branches)]
