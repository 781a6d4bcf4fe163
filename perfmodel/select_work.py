"""The work one block-selection call (``kernels.select_blocks.select_blocks``) does, counted from
the launch plan its wrapper makes, without torch (``SelectWork``).

The scoring (``kernels.select_kernels.score_range``) runs ``P`` programs per (sequence, KV
head), each averaging its KV head's ``G`` queries once and then walking its tiles of blocks
**one after another** (``score_tile``, ``score_tiles``); the pick (``kernels.top_blocks``'
threshold pick) runs one program per score row, ``R = B Hkv t`` (``pick_row_elems``,
``threshold_warps``). Two launches by default; one (``fused``) runs the score programs and the
pick programs on tickets of one grid (``perfmodel.pick_work``: the pick's plan).

The H100 rows (``SELECT_TORCH_PICK_COMMITS`` in ``calibration.row_work``) timed the earlier
kernels (one tile a program, the pick in torch): they keep ``perfmodel.torch_plan.topn_counts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.numbers import require_at_least_one
from ssvkit.perfmodel.pick_work import (
    CANDIDATES_PER_PICK,
    WARP_LANES,
    pick_row_elems,
    pick_sorts,
    pick_tail_elems,
    pow2,
    row_layout,
    threshold_warps,
    tile_pick_pays,
    tile_pick_plan,
    tile_pick_sorts,
)
from ssvkit.perfmodel.work_points import at_distinct_points

# The two-launch selection's impl param and class suffix (scoring, then the pick).
TWO_LAUNCH = "two_launch"
TILE_PICK_WARPS = 1  # kernels.top_blocks: the tile pick's warps a row
SCORE_TILE = 1024  # kernels.block_scores._SCORE_TILE: T_PAD x BLOCK_NB
WIDE_QUERY_COLUMNS = 256  # kernels.block_scores._WIDE_QUERY_COLUMNS: 16-block tiles past 16 rows
MIN_TILES, MAX_TILES = 2, 4  # score tiles a program walks (_score_tiles)
NUM_STAGES = 3  # score_range's pipelined loop
MMA_PASSES = 3  # bf16x3: a product of split operands in three bf16 MMAs
F32 = 4
# A metadata element: an fp32 summary in two bf16 parts (kernels.block_metadata).
SUMMARY_BYTES = 4
I32 = 4
I64 = 8
ELEM_BYTES = 2  # bf16 queries
MAX_WARPS_PER_SM = 64  # Hopper / Ampere
MAX_PROGRAMS_PER_SM = 32
SMSPS = 4  # an SM's sub-partitions: warps past four share their issue slots
WARPGROUP_ROWS, WARPGROUP_WARPS = 64, 4  # a warpgroup MMA: 64 rows over four warps
# Shared memory the CUDA runtime reserves for each resident block (sm_80 and later): a program
# of S bytes fits an SM of M where S + 1 KiB <= M, and M // (S + 1 KiB) of them reside.
RESERVED_SMEM_PER_BLOCK = 1024
# The chain's unit: one [16, 32, 128] single-kind tile's MMA work issued by one warp.
UNIT_TILE_WORK = 16 * 32 * 128


@dataclass(frozen=True, slots=True)
class SelectShape:
    """What a block-selection call's work depends on."""

    batch: int
    t: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int
    top_n: int
    block_size: int = 64
    kinds: int = 1  # metadata tensors a tile reads: mean 1, quest 2
    # Local blocks the pick forces at the prefix's end: 1 under the kernel sweep's prefix rule,
    # 0 under the engine's position-relative rule (its window's blocks are added after the pick).
    num_local: int = 1

    def __post_init__(self) -> None:
        require_at_least_one(
            self, ("batch", "t", "num_q_heads", "num_kv_heads", "head_dim", "top_n")
        )
        if self.num_local < 0:
            raise ValueError(f"num_local must be >= 0, got {self.num_local}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads {self.num_q_heads} must be a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.kinds not in (1, 2):
            raise ValueError(f"kinds must be 1 (mean) or 2 (quest), got {self.kinds}")

    @property
    def num_blocks(self) -> int:
        """``NB_max``: blocks of the scored cache, context plus draft rows."""
        return math.ceil((self.context_len + self.t) / self.block_size)


@dataclass(frozen=True, slots=True)
class SelectWork:
    """What one block-selection call executes; counts as floats.

    - ``requested_bytes``: the metadata (``kinds`` tensors, an element an fp32 value in two
      bf16 parts), the queries each score program averages, the score rows written and read
      back by the pick, the picked ids; ``unique_bytes``: the same with each (sequence, KV
      head)'s queries once: its score programs all read them, and the repeats may hit L2
      (about half a call's requested bytes at 64 query rows of 32 / 8 heads at 64K);
    - ``flops``: the score tiles' MMAs, padded rows and blocks included, three passes each;
    - ``chain_tiles``: score tiles an SM walks in series: a program's tiles times the SM's
      waves of resident programs, a wave weighted by the warps that share each of the SM's
      four sub-partitions (``shared_waves``: one program of a few warps issues at its warps'
      rate, a full SM at the sub-partitions');
    - ``tile_work``: one such tile's MMA work a warp issues, in units of a ``[16, 32, 128]``
      single-kind tile's: its ``T_PAD x BLOCK_NB x D x kinds`` over the program's warps. A
      tile in series costs a fixed latency (its loads' wait, its barriers) plus its work, so
      a 64-row shape of 16-block tiles walks twice the tiles of a 32-row shape of 32-block
      tiles for the same work, and takes longer;
    - ``pick_chain``: the pick's score elements one warp walks in series (its rows' waves over
      the SMs' resident rows times a row's register tile over its warps);
    - ``pick_rows``: score rows picked (``R``);
    - ``query_chain``: the elements of one ``[T_PAD, D]`` query tile a lane of a score program
      loads before its first tile (over the launch's warps: the one launch's are the more of
      its two steps'), times the grid's waves over its resident programs. Every program
      averages its KV head's ``G`` queries, but the ``G`` loads are unrolled and independent,
      so they are in flight together and the prologue waits about one of them (counted per
      query head, the term prices the group of 16, 32 query / 2 KV heads, 12-24% high when
      the H200 fit leaves that geometry out);
    - ``launches``: 2, or 1 fused;
    - ``pick_tail_chain``: the part of ``pick_chain`` that is the row's tail past its
      power-of-two chunk (``row_layout``), which the threshold pick loads behind per-block
      masks (the chunk as whole vectors) and reduces, scans and merges as a tile of its own:
      a block of the tail costs more than one of the chunk;
    - ``sort_chain``: the threshold pick's two sorts (its ``GROUPS`` group maxima and its
      ``CAP`` candidates, 64-bit keys, bitonic: ``log2 n (log2 n + 1) / 2`` compare-exchange
      stages of ``n / (32 warps)`` keys a lane each, ``sort_steps``) in the rows' waves over
      the SMs' resident rows: the pick's work that grows with ``top_n``.

    ``stage_counts`` lists the counts its class's stage rates price.
    """

    requested_bytes: float
    flops: float
    chain_tiles: float
    tile_work: float
    pick_chain: float
    pick_rows: float
    query_chain: float
    launches: float
    sort_chain: float = 0.0
    pick_tail_chain: float = 0.0
    unique_bytes: float = 0.0  # requested_bytes with each KV head's queries read once

    @property
    def stage_counts(self) -> tuple[float, ...]:
        """The counts of a selection class's stage rates (``perfmodel.class_fit``'s t_x): the
        pick's walk, its rows, the query prologue, the pick's sorts and its row tail."""
        return (
            self.pick_chain,
            self.pick_rows,
            self.query_chain,
            self.sort_chain,
            self.pick_tail_chain,
        )


def score_tile(t: int, kinds: int = 1, head_dim: int = 128) -> tuple[int, int, int]:
    """``(T_PAD, BLOCK_NB, warps)`` of the scoring's tile for ``t`` query rows and ``kinds``
    metadata tensors (1 mean, 2 quest; ``kernels.block_scores.score_block_nb``,
    ``score_warps``): ``T_PAD = max(16, pow2(t))`` query rows, ``BLOCK_NB = min(32, 1024 /
    T_PAD)`` blocks (16 past 16 rows where ``head_dim * kinds >= 256``), 2 warps for the mean
    key up to ``T_PAD`` 32, else 4 (quest, wider tiles). A tile is a ``[T_PAD, D] x [D,
    BLOCK_NB]`` product per metadata kind of operands split in bf16 parts, three bf16 MMAs
    each."""
    t_pad = max(16, pow2(t))
    warps = 4 if kinds == 2 or t_pad > 32 else 2
    block_nb = min(32, SCORE_TILE // t_pad)
    if t_pad > 16 and head_dim * kinds >= WIDE_QUERY_COLUMNS:
        block_nb = 16
    return t_pad, block_nb, warps


def score_tiles(num_tiles: int, num_sms: int) -> int:
    """Tiles a score program walks (``kernels.block_scores._score_tiles``): 4 where that
    leaves at least two programs per SM over the ``num_tiles`` tiles, else 2."""
    tiles = MAX_TILES
    while tiles > MIN_TILES and math.ceil(num_tiles / tiles) < 2 * num_sms:
        tiles //= 2
    return tiles


def score_shared_bytes(
    t_pad: int,
    block_nb: int,
    head_dim: int,
    kinds: int,
    stages: int = NUM_STAGES,
    warps: int = 2,
    smem_per_sm_bytes: int | None = None,
) -> int:
    """Shared memory of one score program: the metadata tiles its pipeline keeps in flight
    (``stages - 1`` of ``BLOCK_NB`` blocks per kind, at least one: the MMA's operand passes
    through shared memory), its ``[T_PAD, D]`` fp32 query tile per kind and its ``[T_PAD,
    BLOCK_NB]`` fp32 score tile. A tile of 64 rows or more over a multiple of four warps is a
    warpgroup MMA, which reads its operand from shared memory while the next loads land: the
    pipeline then keeps ``stages`` tiles, where the program still fits an SM of
    ``smem_per_sm_bytes`` (when given) beside the block's reserved shared memory.
    The compiled kernels' shared memory on sm_90 (``validation/data/score-tiles-h200.json``):
    equal at every shape."""
    buffers = max(stages - 1, 1)
    fixed = t_pad * head_dim * kinds * F32 + t_pad * block_nb * F32
    tile = block_nb * head_dim * SUMMARY_BYTES * kinds
    if t_pad >= WARPGROUP_ROWS and warps % WARPGROUP_WARPS == 0 and stages > 1:
        wide = (buffers + 1) * tile + fixed
        if smem_per_sm_bytes is None or wide + RESERVED_SMEM_PER_BLOCK <= smem_per_sm_bytes:
            return wide
    return buffers * tile + fixed


def one_launch_fits(t: int, head_dim: int, kinds: int, smem_per_sm_bytes: int) -> bool:
    """Whether the one-launch selection of ``t`` query rows fits an SM's shared memory at its
    smallest score shape (16 blocks, one stage): the scoring alone splits rows that do not
    fit into launches of 32 (``kernels.block_scores``), the one launch cannot, and its wrapper
    refuses them (none of at most 64 rows on an H100 or H200, whose SMs hold 227 KiB; quest at
    head dimension 256 past 32 rows on an SM of 128 KiB)."""
    t_pad = max(16, pow2(t))
    return score_shared_bytes(t_pad, 16, head_dim, kinds, stages=1) <= smem_per_sm_bytes


def resident_score_programs(
    block_nb: int, head_dim: int, kinds: int, warps: int, smem_per_sm_bytes: int, t_pad: int
) -> int:
    """Score programs one SM holds: within its shared memory (``score_shared_bytes``), its
    warps and its programs."""
    per_program = score_shared_bytes(
        t_pad, block_nb, head_dim, kinds, warps=warps, smem_per_sm_bytes=smem_per_sm_bytes
    )
    by_smem = max(1, smem_per_sm_bytes // (per_program + RESERVED_SMEM_PER_BLOCK))
    return int(min(by_smem, MAX_WARPS_PER_SM // warps, MAX_PROGRAMS_PER_SM))


def shared_waves(per_sm: int, resident: int, warps: int) -> float:
    """The waves of ``per_sm`` programs of ``warps`` warps an SM runs, ``resident`` at a time,
    each wave weighted by how many warps share a sub-partition's issue slots (at least one
    wave's worth: up to ``SMSPS`` warps each issue alone)."""
    full, rest = divmod(per_sm, resident)
    shared = full * max(1.0, resident * warps / SMSPS)
    return shared + (max(1.0, rest * warps / SMSPS) if rest else 0.0)


def select_call_work(
    s: SelectShape,
    *,
    fused: bool,
    num_sms: int,
    smem_per_sm_bytes: int,
    tile_pick: bool | None = None,
) -> SelectWork:
    """The work of one ``select_blocks`` call on ``num_sms`` SMs: two launches, or one
    (``fused``). The two launches pick with the threshold pick over whole rows, or with the
    tile pick (``tile_pick``, where its plan serves the rows; None: where
    ``perfmodel.pick_work.tile_pick_pays`` says it pays, as ``kernels.select_blocks``
    decides); the one launch with the threshold pick."""
    nb = s.num_blocks
    pairs = s.batch * s.num_kv_heads
    group = s.num_q_heads // s.num_kv_heads
    t_pad, block_nb, warps = score_tile(s.t, s.kinds, s.head_dim)
    nb_tiles = math.ceil(nb / block_nb)
    tiles = score_tiles(nb_tiles * pairs, num_sms)
    programs = math.ceil(nb / (block_nb * tiles)) * pairs
    rows = pairs * s.t
    if tile_pick is None:
        tile_pick = tile_pick_pays(rows, nb, s.top_n, 1, s.num_local, block_nb, num_sms)
    tiled = tile_pick and not fused and tile_pick_plan(nb, s.top_n, 1, s.num_local, block_nb)
    pw = TILE_PICK_WARPS if tiled else threshold_warps(rows, row_layout(nb)[0], num_sms)
    # One kernel runs both steps at the more warps of the two: its score programs share
    # their queries' loads over those warps and fit as many of them an SM.
    lw = max(pw, warps) if fused else warps
    resident = resident_score_programs(block_nb, s.head_dim, s.kinds, lw, smem_per_sm_bytes, t_pad)
    waves = math.ceil(programs / (num_sms * resident))
    chain_tiles = shared_waves(math.ceil(programs / num_sms), resident, lw) * tiles
    meta = pairs * nb * s.head_dim * SUMMARY_BYTES * s.kinds
    queries = programs * s.t * group * s.head_dim * ELEM_BYTES
    per_sm = resident if fused else min(MAX_WARPS_PER_SM // pw, MAX_PROGRAMS_PER_SM)
    pick_waves = math.ceil(rows / (num_sms * per_sm))
    # Every program of the one launch reserves the scoring's shared memory.
    if tiled:
        pick = _tile_pick(nb, s.top_n, s.num_local, rows, block_nb, pick_waves)
    else:
        pick = _threshold_pick(nb, s.top_n, rows, lw if fused else pw, pick_waves)
    flops = MMA_PASSES * 2 * pairs * t_pad * nb_tiles * block_nb * s.head_dim * s.kinds
    pick["requested_bytes"] += meta + queries + rows * s.top_n * I32
    distinct_queries = s.batch * s.t * s.num_q_heads * s.head_dim * ELEM_BYTES
    pick["unique_bytes"] = pick["requested_bytes"] - queries + distinct_queries
    return SelectWork(
        flops=float(flops),
        chain_tiles=float(chain_tiles),
        tile_work=float(t_pad * block_nb * s.head_dim * s.kinds / lw / UNIT_TILE_WORK),
        pick_rows=float(rows),
        query_chain=float(waves * t_pad * s.head_dim / (lw * WARP_LANES)),
        launches=1.0 if fused else 2.0,
        **{k: float(v) for k, v in pick.items()},
    )


def _threshold_pick(nb: int, top_n: int, rows: int, warps: int, waves: int) -> dict:
    """The threshold pick's share of ``SelectWork`` (``rows`` score rows of ``nb`` blocks at
    ``warps`` warps a row, ``waves`` waves): the scores written and read back and its
    candidates' scratch, its walk of the row, its sorts and its tail."""
    scores = rows * nb * F32
    scratch = rows * CANDIDATES_PER_PICK * max(16, pow2(top_n)) * I64
    return dict(
        requested_bytes=2 * scores + scratch,
        pick_chain=waves * pick_row_elems(nb, top_n) / warps,
        sort_chain=waves * pick_sorts(nb, top_n, warps),
        pick_tail_chain=waves * pick_tail_elems(nb, top_n) / warps,
    )


def _tile_pick(nb: int, top_n: int, num_local: int, rows: int, width: int, waves: int) -> dict:
    """The tile pick's share of ``SelectWork`` (``rows`` score rows of ``nb`` blocks in
    tiles of ``width``, ``waves`` waves of one-warp rows): the scores written, the tile maxima
    written and read, the gathered tiles read and the scratch; its walk of the gathered tile
    and its two sorts. The forced blocks (one sink, ``num_local`` local ones) set the tiles
    it gathers. (A ``top_n`` past the tile pick, ``tile_pick_plan`` None, takes the threshold
    pick or its rounds, as ``kernels.top_blocks`` does.)"""
    plan = tile_pick_plan(nb, top_n, 1, num_local, width)
    gathered = min(plan["S_CAP"] * width, nb)
    maxima = math.ceil(nb / width)
    scratch = plan["S_CAP"] + plan["CAP"]
    return dict(
        requested_bytes=rows * (nb + 2 * maxima + gathered + scratch) * F32,
        pick_chain=waves * plan["S_CAP"] * width / TILE_PICK_WARPS,
        sort_chain=waves * tile_pick_sorts(plan, TILE_PICK_WARPS),
        pick_tail_chain=0.0,
    )


WORK_FIELDS = SelectWork.__slots__


def select_work_arrays(
    shape: dict, *, fused: bool, num_sms: int, smem_per_sm_bytes: int
) -> dict[str, np.ndarray]:
    """``select_call_work`` at every point of ``shape`` (``SelectShape`` field names to arrays
    or scalars that broadcast), one array per ``SelectWork`` field, evaluated once per distinct
    point; a point of no rows, heads or picks counts nothing."""

    def work(kw: dict) -> SelectWork | None:
        if min(kw["batch"], kw["t"], kw["num_q_heads"], kw["num_kv_heads"], kw["top_n"]) < 1:
            return None
        return select_call_work(
            SelectShape(**kw),
            fused=fused,
            num_sms=num_sms,
            smem_per_sm_bytes=smem_per_sm_bytes,
        )

    key = ("select_call_work", fused, num_sms, smem_per_sm_bytes)
    return at_distinct_points(shape, work, WORK_FIELDS, memo_key=key)
