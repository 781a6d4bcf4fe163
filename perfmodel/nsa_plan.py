"""Launch geometry of the NSA verification kernels, without torch: the geometry of the kernels
the committed H100 rows were measured with (``calibration/profiles/h100-sxm``), whose features
the H100 profile's NSA classes keep (``tile_rows_of``, ``num_splits``, ``merge_steps``,
``mma_row_cost``), and the current kernels' row tiles (``kernels/nsa_launch.py``:
``tile_packing``), whose slots ``perfmodel.nsa_slots`` sizes and from which
``perfmodel.nsa_work`` counts a call's work.

At small batch an NSA call's time is set by how the wrapper cut the work more than by its bytes
and FLOPs: a split call's merge walks its tile's partial slots one after another, and every
program carries its whole row tile whatever the draft rows. A call's row schedule
(``rows_per_tile``, ``perfmodel.strategy.nsa_rows_per_tile``) caps the draft rows of a tile;
the "fit" tile plan (``NsaVerifyConfig.tile_plan``) packs more rows a tile and sizes the slots
by the launch's finish time (``nsa_slots.fit_slots``).
"""

from __future__ import annotations

import numpy as np

# NsaVerifyConfig defaults (kernels/nsa_verify.py); tests/perfmodel/test_nsa_plan.py checks them.
BLOCK_M_MAX = 64
MIN_BLOCK_M = 16
MAX_SPLITS = 64
CTAS_PER_SM = 1
# A launch of the compressed branch alone whose one wave would leave every row tile a single
# slot (more row tiles than half the places) is sized for this many resident programs an SM
# (``compressed_capacity``).
COMPRESSED_CTAS_PER_SM = 2
COMPRESSED_ALONE = (True, False, False)
NUM_BRANCHES = 3
WGMMA_MIN_ROWS = 64  # rows of one warpgroup's wgmma (m64nNk16); fewer rows take mma.sync
# Head dims up to which a row tile may be a 64-row wgmma tile: at D = 256 a 64-row tile's
# pipelined K/V and Q tiles do not fit an SM's shared memory (Triton refuses to launch it on an
# H100 with OutOfResources, at 8 query / 4 KV heads of 256).
WGMMA_MAX_HEAD_DIM = 128
# Most MMA rows x head dim of a row tile at a head dim above WGMMA_MAX_HEAD_DIM
# (NsaVerifyConfig.wide_tile_elems; 0: no cap): such a tile runs mma.sync, whose K and V
# fragments and fp32 accumulator a 4-warp program holds in registers, and at 32 rows x 256
# dims every forward launch runs at 255 registers with local-memory spills
# (validation/data/nsa-ncu-d256-h100.txt). So a tile of 256 dims holds 16 MMA rows.
WIDE_TILE_ELEMS = 4096
WGMMA_ROW_COST = 0.5  # a wgmma row's latency in mma.sync rows (wgmma's ~2x rate on an H100)
# Draft rows one row tile holds at most: the union plan keeps a block's rows as int32 bits.
MAX_TILE_ROWS = 16
# NsaVerifyConfig.tile_plan: "fixed" (the plan every committed row was measured with), "fit"
# (tiles of up to FIT_BLOCK_M_MAX MMA rows and FIT_MAX_TILE_ROWS draft rows, slots sized by
# the launch's makespan; ``fit_slots``) or "fit_slots" (the "fixed" plan's tiles, "fit"'s
# slots).
TILE_PLANS = ("fixed", "fit", "fit_slots")
DEFAULT_TILE_PLAN = "fixed"
# The plans whose slots ``fit_slots`` sizes.
MAKESPAN_PLANS = ("fit", "fit_slots")
FIT_BLOCK_M_MAX = 128
FIT_MAX_TILE_ROWS = 32
FORWARD_WARPS = 4  # warps of a forward program (NsaVerifyConfig.num_warps defaults to it)
MAX_FORWARD_WARPS = 16
# NsaVerifyConfig.context_tiles: the compressed branch on the row schedule's tiles ("per_tile",
# also what a kernel row without params.context_tiles ran) or, where that saves tiles, on the
# tiles of the packed schedule in a launch of its own ("shared"), or so and, in a reuse call
# whose two forward launches one wave of PAIRED_RESIDENT programs an SM holds, in one launch
# with the other branches ("paired", the default; ``pairs_launches``).
CONTEXT_TILES = ("per_tile", "shared", "paired")
DEFAULT_CONTEXT_TILES = "paired"
# NsaVerifyConfig.branch_streams: the unfused baseline's branches side by side on streams of
# their own (True, the default) or in series on one (also what an unfused kernel row without
# params.branch_streams ran).
DEFAULT_BRANCH_STREAMS = True
# Programs of kernels.nsa_pair's launch one SM holds (ptxas, sm_90, D = 128: 203 registers and
# 112 KB of shared memory a program, on Triton 3.6).
PAIRED_RESIDENT = 2
# Name suffix of the NSA ops and classes of one draft row a tile (the kernels' one-row path).
PER_QUERY = "per_query"


# Bytes a stored compressed score costs a real MMA row and token: an fp32 write and its read.
STORED_SCORE_BYTES = 8
# The most elements of one K or V tile of a launch of the compressed branch alone
# (``NsaVerifyConfig.comp_block_n``): 64 keys at head dim 256, the two tiles of which a pipeline
# stage buffers in 64 KB of shared memory.
COMP_TILE_ELEMS = 64 * 256


def comp_tile_keys(comp_block_n: int, block_n: int, head_dim: int) -> int:
    """Keys per tile of a launch of the compressed branch alone: ``block_n`` (the other
    launches' tile) where ``comp_block_n`` is 0, else ``comp_block_n``, at most the power of two
    of keys whose tile holds ``COMP_TILE_ELEMS`` elements at ``head_dim`` and at least
    ``block_n``."""
    if not comp_block_n:
        return block_n
    return max(block_n, min(comp_block_n, _pow2_floor(COMP_TILE_ELEMS // head_dim)))


def stores_scores(rows: int, group: int, key_bytes: int) -> bool:
    """Whether the refresh path's block scoring reads scores the compressed launch stored for
    its ``rows`` draft rows x ``group`` heads of a tile (``STORED_SCORE_BYTES`` a real row and
    compressed token) rather than computing them again from the compressed key
    (``key_bytes``): whichever moves fewer bytes."""
    return STORED_SCORE_BYTES * rows * group < key_bytes


def forward_warps(block_m: int, tile_plan: str, num_warps: int = FORWARD_WARPS) -> int:
    """Warps of a forward program over a row tile of ``block_m`` MMA rows: ``num_warps``, and
    under "fit" ``num_warps`` for each warpgroup's ``WGMMA_MIN_ROWS`` rows of a taller tile (at
    most ``MAX_FORWARD_WARPS``), so that a 128-row tile's second half has warps of its own.
    Two launches of unlike warp counts never run as one (``pairs_launches``)."""
    if tile_plan == "fit" and block_m > WGMMA_MIN_ROWS:
        return min(MAX_FORWARD_WARPS, num_warps * block_m // WGMMA_MIN_ROWS)
    return num_warps


def pairs_launches(programs: int, num_sms: int) -> bool:
    """Whether a reuse call under ``context_tiles`` "paired" runs its compressed launch and its
    selected and window launch as one: where the ``programs`` of both fit one wave of
    ``PAIRED_RESIDENT`` programs an SM (past it, the paired launch's second wave costs more than
    the launch it saves)."""
    return programs <= PAIRED_RESIDENT * num_sms


def next_pow2(x) -> np.ndarray:
    """Smallest power of two >= x (x >= 1), elementwise."""
    x = np.maximum(np.asarray(x, dtype=float), 1.0)
    return np.exp2(np.ceil(np.log2(x) - 1e-9))


def prev_pow2(x) -> np.ndarray:
    """Largest power of two <= x (x >= 1), elementwise."""
    x = np.maximum(np.asarray(x, dtype=float), 1.0)
    return np.exp2(np.floor(np.log2(x) + 1e-9))


def tile_rows_of(
    t, num_q_heads, num_kv_heads, rows_per_tile=0, tile_plan="fixed", head_dim=WGMMA_MAX_HEAD_DIM
):
    """(``BLOCK_M``, draft rows per tile, row tiles per (sequence, KV head)) of a call over
    ``t`` draft rows with ``rows_per_tile`` draft rows a tile.

    Packed (``rows_per_tile`` 0, the schedule every committed H100 row was measured with), a
    program owns one (sequence x KV head, row tile) of ``BLOCK_M = max(16, min(64,
    next_pow2(t * G_pad)))`` MMA rows (``G_pad`` the next power of two of the head group
    ``G = Hq / Hkv``), i.e. ``BLOCK_M / G_pad`` draft rows (at most ``MAX_TILE_ROWS``), so a
    call has ``ceil(t / (BLOCK_M / G_pad))`` row tiles. A row schedule R > 0 packs
    ``min(R, packed)`` rows, rounded down to a power of two (the kernels' tile holds a power of
    two of rows), into ``max(16, rows x G_pad)`` MMA rows, so one draft row a tile
    (``per_query``) runs ``t`` tiles of 16 MMA rows at 8 q / 2 KV heads; more tiles leave fewer
    splits per tile. ``tile_plan`` "fit" packs up to ``FIT_BLOCK_M_MAX`` MMA rows and
    ``FIT_MAX_TILE_ROWS`` draft rows a tile (Llama-3.1-8B's heads: t <= 32 is one tile). Above
    ``WGMMA_MAX_HEAD_DIM`` the current kernels cap a tile's MMA rows (``wide_block_m_max``);
    ``head_dim`` applies it (the default, 128, leaves the tiles as the H100 rows ran them)."""
    if tile_plan not in TILE_PLANS:
        raise ValueError(f"tile_plan must be one of {', '.join(TILE_PLANS)}, got {tile_plan!r}")
    fit = tile_plan == "fit"
    t = np.asarray(t, dtype=float)
    group_pad = next_pow2(np.ceil(np.asarray(num_q_heads, dtype=float) / num_kv_heads))
    block_m_max = FIT_BLOCK_M_MAX if fit else BLOCK_M_MAX
    d = np.asarray(head_dim, dtype=float)
    wide = np.maximum(np.maximum(MIN_BLOCK_M, group_pad), prev_pow2(WIDE_TILE_ELEMS / d))
    block_m_max = np.where(d > WGMMA_MAX_HEAD_DIM, np.minimum(block_m_max, wide), block_m_max)
    packed_m = np.maximum(MIN_BLOCK_M, np.minimum(block_m_max, next_pow2(t * group_pad)))
    row_cap = FIT_MAX_TILE_ROWS if fit else MAX_TILE_ROWS
    packed = np.minimum(np.maximum(packed_m // group_pad, 1.0), row_cap)
    packed_m = np.maximum(MIN_BLOCK_M, packed * group_pad)
    r = np.asarray(rows_per_tile, dtype=float)
    rows = np.where(r > 0, np.minimum(prev_pow2(r), packed), packed)
    block_m = np.where(r > 0, np.maximum(MIN_BLOCK_M, rows * group_pad), packed_m)
    return block_m, rows, np.ceil(t / rows)


def row_tiles(
    t, num_q_heads, num_kv_heads, rows_per_tile=0, tile_plan="fixed", head_dim=WGMMA_MAX_HEAD_DIM
) -> tuple[np.ndarray, np.ndarray]:
    """(``BLOCK_M``, row tiles per (sequence, KV head)) of a call over ``t`` draft rows
    (``tile_rows_of``). Each program carries its whole row tile: its MMAs, its query load and
    its partial are ``BLOCK_M`` rows whatever ``t`` is, so a program's latency grows with
    ``BLOCK_M``."""
    block_m, _, tiles = tile_rows_of(
        t, num_q_heads, num_kv_heads, rows_per_tile, tile_plan, head_dim
    )
    return block_m, tiles


def is_packed(
    t, num_q_heads, num_kv_heads, rows_per_tile, head_dim=WGMMA_MAX_HEAD_DIM
) -> np.ndarray:
    """Where a ``rows_per_tile`` schedule runs the packed one's tiles (``t`` rows fit one of
    its tiles, or it packs as many rows as the packed schedule)."""
    _, tiles = row_tiles(t, num_q_heads, num_kv_heads, rows_per_tile, head_dim=head_dim)
    return tiles == row_tiles(t, num_q_heads, num_kv_heads, head_dim=head_dim)[1]


def mma_row_cost(t, num_q_heads, num_kv_heads, rows_per_tile=0) -> np.ndarray:
    """A program's row tile in ``mma.sync`` rows: ``BLOCK_M`` below ``WGMMA_MIN_ROWS``, else
    ``WGMMA_ROW_COST x BLOCK_M``.

    Triton issues a tile of fewer than 64 rows (``BLOCK_M`` 16 or 32) as ``mma.sync``
    instructions, their count proportional to the rows, and a 64-row tile as one warpgroup's
    ``wgmma``, which runs at about twice ``mma.sync``'s rate on an H100: so a 64-row tile costs
    a program about what a 32-row one does. ``WGMMA_ROW_COST`` (1/2) is that rate ratio."""
    block_m, _ = row_tiles(t, num_q_heads, num_kv_heads, rows_per_tile)
    return np.where(block_m < WGMMA_MIN_ROWS, block_m, WGMMA_ROW_COST * block_m)


def num_splits(t, num_q_heads, num_kv_heads, batch, num_sms: int, rows_per_tile=0) -> np.ndarray:
    """Programs per (sequence, KV head, row tile): ``_num_splits`` at the default config. When
    ``B x Hkv x tiles`` programs leave SMs idle the grid is split ``S = min(64, SMs // (B x Hkv
    x tiles))`` ways per tile (1 = a single fused pass), each split program writing a
    ``BLOCK_M x D`` fp32 partial. It assumes one resident program per SM (``CTAS_PER_SM``,
    the config's default)."""
    _, tiles = row_tiles(t, num_q_heads, num_kv_heads, rows_per_tile)
    programs = np.asarray(batch, dtype=float) * np.asarray(num_kv_heads, dtype=float) * tiles
    return np.maximum(1.0, np.minimum(MAX_SPLITS, np.floor(num_sms * CTAS_PER_SM / programs)))


def merge_steps(
    t, num_q_heads, num_kv_heads, batch, num_sms: int, *, fused, refresh, rows_per_tile=0
):
    """Partial slots one call's merge kernels walk in series, summed over merges that run one
    after another.

    A merge kernel, one program per tile, walks the tile's partial slots one after another: a
    serial chain after the parallel forward, whose latency adds to the call's time whatever
    the bytes, longest when one tile gets the most splits (``num_splits``'s S):

    - fused (``nsa_verify``) reuse call: 0 for a single pass (S = 1), else the ``max(S, 3)``
      slots that ``_apportion`` spreads over the three branches (its rounding and its floor of
      one slot per branch, which add up to 2 slots to a small split, are ignored);
    - fused refresh call: always split (the compressed partials also feed the block scores):
      ``max(S, 3)``;
    - unfused (``nsa_verify_unfused``): each branch launched with the whole split budget and
      its own merge: ``3 S``, or 0 when S = 1.

    It ignores the block-score kernel's read of the compressed ``(m, l)`` partials (a refresh
    call's). ``fused``, ``refresh`` and ``rows_per_tile`` are scalars or arrays broadcasting
    with ``t``."""
    s = num_splits(t, num_q_heads, num_kv_heads, batch, num_sms, rows_per_tile)
    fused = np.asarray(fused, dtype=float) > 0
    refresh = np.asarray(refresh, dtype=float) > 0
    split = s > 1
    fused_steps = np.where(split | refresh, np.maximum(s, NUM_BRANCHES), 0.0)
    unfused_steps = np.where(split, NUM_BRANCHES * s, 0.0)
    return np.where(fused, fused_steps, unfused_steps)


# The current kernels' row tiles (``kernels.nsa_launch.tile_packing``), scalar and without torch;
# their slot sizing is ``perfmodel.nsa_slots``'.


def wide_block_m_max(
    block_m_max: int, head_dim: int, group_pad: int, tile_elems: int = WIDE_TILE_ELEMS
) -> int:
    """The most MMA rows of a row tile at ``head_dim``: ``block_m_max``, or above
    ``WGMMA_MAX_HEAD_DIM`` at most ``tile_elems / head_dim`` (a power of two, at least
    ``MIN_BLOCK_M`` and one head group's ``group_pad``; ``tile_elems`` 0: no cap)."""
    if head_dim <= WGMMA_MAX_HEAD_DIM or not tile_elems:
        return block_m_max
    return min(block_m_max, max(MIN_BLOCK_M, group_pad, _pow2_floor(tile_elems // head_dim)))


def _pow2_ceil(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


def tile_packing(
    t: int,
    group: int,
    rows_per_tile: int = 0,
    tile_plan: str = "fixed",
    head_dim: int = WGMMA_MAX_HEAD_DIM,
    wide_tile_elems: int = WIDE_TILE_ELEMS,
) -> tuple[int, int, int]:
    """(draft rows, head slots, MMA rows ``BLOCK_M``) of one row tile of the current kernels
    over ``t`` draft rows and a head group of ``group`` at ``head_dim``
    (``kernels.nsa_launch.tile_packing`` at the default config, ``tile_plan`` and
    ``wide_tile_elems``): rows a power of two of at most ``MAX_TILE_ROWS``
    (``FIT_MAX_TILE_ROWS`` "fit"), ``BLOCK_M_MAX / group_pad`` (``FIT_BLOCK_M_MAX`` "fit", both
    capped above ``WGMMA_MAX_HEAD_DIM`` by ``wide_block_m_max``) and ``rows_per_tile`` (when
    > 0), head slots padded so a tile has >= 16 rows."""
    if tile_plan not in TILE_PLANS:
        raise ValueError(f"tile_plan must be one of {', '.join(TILE_PLANS)}, got {tile_plan!r}")
    fit = tile_plan == "fit"
    most = FIT_MAX_TILE_ROWS if fit else MAX_TILE_ROWS
    group_pad = _pow2_ceil(group)
    block_m_max = wide_block_m_max(
        FIT_BLOCK_M_MAX if fit else BLOCK_M_MAX, head_dim, group_pad, wide_tile_elems
    )
    cap = _pow2_floor(min(rows_per_tile, most)) if rows_per_tile else most
    rows = max(1, min(cap, block_m_max // group_pad, _pow2_ceil(t)))
    group_pad = max(group_pad, MIN_BLOCK_M // rows)
    return rows, group_pad, rows * group_pad
