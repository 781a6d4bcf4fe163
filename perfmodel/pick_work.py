"""The top-n pick's launch plans, without torch: the threshold pick that walks each score row
(``kernels.top_blocks``: ``row_layout``, ``pick_row_elems``, ``pick_sorts``,
``threshold_warps``) and the tile pick that reads the score tiles' maxima and gathers the tiles
that can hold a pick (``tile_pick_plan``, ``tile_pick_sorts``), and which of the two a call
takes (``tile_pick_pays``).

``perfmodel.select_work`` counts a whole selection call's work from them.
"""

from __future__ import annotations

import math

WARP_LANES = 32
# kernels.top_blocks: rows in registers up to one chunk plus a tail; threshold pick groups.
TOPK_CHUNK = 4096
MIN_GROUPS = 64
GROUPS_PER_PICK = 2
CANDIDATES_PER_PICK = 2
THRESHOLD_MAX_TOP_N = 256  # kernels.top_blocks: larger top_n take the rounds kernel
# The whole-row pick's values an SM from which the tile pick is faster, between the two
# measured sides: 8,440 (512 rows of 2,049 blocks: the tile pick 0-5% slower) and 16,384
# (512 rows of 4,097 blocks, 1,024 of 2,049: 2-9% faster); validation/data/select-picks-*.
TILE_PICK_MIN_VALUES_PER_SM = 12288


def pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def row_layout(nb_max: int) -> tuple[int, int, int]:
    """``(CHUNK, TAIL, NUM_CHUNKS)`` of a row of ``nb_max`` blocks, as ``kernels.top_blocks``
    lays it out. A row that fits in one power-of-two chunk of at most ``TOPK_CHUNK`` plus a
    smaller power-of-two tail stays in registers (``NUM_CHUNKS`` 1): 2049 blocks are 2048 + 16
    keys, not 4096. A longer row is walked in ``TOPK_CHUNK`` chunks every round."""
    nb_max = max(nb_max, 1)
    chunk = min(1 << (nb_max.bit_length() - 1), TOPK_CHUNK)
    rest = nb_max - chunk
    if rest == 0:
        return chunk, 0, 1
    if rest <= chunk:
        return chunk, min(chunk, max(16, pow2(rest))), 1
    return TOPK_CHUNK, 0, math.ceil(nb_max / TOPK_CHUNK)


def pick_row_elems(nb_max: int, top_n: int) -> int:
    """Score elements of one row's register tile in the threshold pick, whose one program per
    row reads the row's ``NB`` scores as one tile of ``CHUNK + TAIL`` blocks (``row_layout``):
    the chunk and the tail rounded to whole group rows (``threshold_meta``'s ``TAIL_ROWS``);
    the row itself where the rounds kernel serves it (a longer row, or top_n above the
    threshold pick's)."""
    chunk, tail, num_chunks = row_layout(nb_max)
    top_n_pad = max(16, pow2(top_n))
    if num_chunks != 1:
        return num_chunks * chunk
    groups = min(chunk, max(MIN_GROUPS, GROUPS_PER_PICK * top_n_pad))
    tail_rows = max(2, tail // groups) if tail else 0
    return chunk + tail_rows * groups


def pick_tail_elems(nb_max: int, top_n: int) -> int:
    """The tail's share of ``pick_row_elems``: its group rows past the chunk; none where the
    rounds kernel serves the row."""
    chunk, _, num_chunks = row_layout(nb_max)
    return 0 if num_chunks != 1 else pick_row_elems(nb_max, top_n) - chunk


def sort_steps(n: int, warps: int) -> float:
    """Serial work of a bitonic sort of ``n`` keys by ``warps`` warps (``tl.sort``): its
    ``log2 n (log2 n + 1) / 2`` compare-exchange stages, each over the keys one lane holds."""
    k = max(1, math.ceil(math.log2(max(n, 2))))
    return k * (k + 1) / 2 * max(1.0, n / (WARP_LANES * warps))


def pick_sorts(nb_max: int, top_n: int, warps: int) -> float:
    """``sort_steps`` of one row's threshold pick: its ``GROUPS`` group maxima, then its
    ``CAP`` candidates (``kernels.top_blocks.threshold_meta``); none where the rounds kernel
    serves the row (a row past one chunk and its tail)."""
    chunk, _, num_chunks = row_layout(nb_max)
    top_n_pad = max(16, pow2(top_n))
    if num_chunks != 1 or top_n_pad > min(chunk, THRESHOLD_MAX_TOP_N):
        return 0.0
    groups = min(chunk, max(MIN_GROUPS, GROUPS_PER_PICK * top_n_pad))
    return sort_steps(groups, warps) + sort_steps(CANDIDATES_PER_PICK * top_n_pad, warps)


def threshold_warps(rows: int, chunk: int, num_sms: int) -> int:
    """Warps of one row's pick (``kernels.top_blocks.threshold_warps``): 4 up to a row per SM
    (8 for chunks beyond 2048 blocks), else 2 for chunks beyond 2048 blocks and up to eight
    rows per SM for shorter ones, then 1."""
    if rows <= num_sms:
        return 4 if chunk <= 2048 else 8
    if chunk > 2048:
        return 2
    return 2 if rows <= 8 * num_sms else 1


def tile_pick_plan(
    nb_max: int, top_n: int, num_sink: int, num_local: int, width: int
) -> dict | None:
    """The tile pick's constexprs (``kernels.tile_pick_kernels``) for rows of ``nb_max``
    blocks in tiles of ``width``: ``TOP_N``, ``TOP_N_PAD``, ``W``, ``NT_PAD`` (the row's tile
    maxima, padded), ``S_CAP`` (the tiles it gathers: the regular picks' and two edges'),
    ``GROUPS`` (the strided groups of its second bound, as many as the threshold pick's and at
    most half the gathered tile), ``CAP`` (candidates it cuts); None where the gathered tile
    would pass ``TOPK_CHUNK`` blocks."""
    top_n_pad = max(16, pow2(top_n))
    s_cap = pow2(max(top_n - num_sink - num_local, 1) + 2)
    if s_cap * width > TOPK_CHUNK:
        return None
    groups = max(MIN_GROUPS, GROUPS_PER_PICK * top_n_pad)
    return dict(
        TOP_N=top_n,
        TOP_N_PAD=top_n_pad,
        W=width,
        NT_PAD=max(16, pow2(math.ceil(nb_max / width))),
        S_CAP=s_cap,
        GROUPS=max(width, min(groups, s_cap * width // 2)),
        CAP=CANDIDATES_PER_PICK * top_n_pad,
    )


def tile_pick_sorts(plan: dict, warps: int) -> float:
    """``sort_steps`` of one row's tile pick (``tile_pick_plan``'s ``plan``): its ``NT_PAD``
    tile maxima, then its ``CAP`` candidates."""
    return sort_steps(plan["NT_PAD"], warps) + sort_steps(plan["CAP"], warps)


def tile_pick_pays(
    rows: int, nb_max: int, top_n: int, num_sink: int, num_local: int, width: int, num_sms: int
) -> bool:
    """Whether the two launches pick with the tile pick rather than the threshold pick over
    whole rows: where the tile pick serves the rows (``tile_pick_plan``), reads fewer values a
    row than the whole row (its tile maxima and gathered tiles against ``nb_max`` scores), and
    the whole-row pick ranks at least ``TILE_PICK_MIN_VALUES_PER_SM`` values an SM
    (``rows * pick_row_elems / num_sms``). Below that the whole-row pick is one short wave
    whose time is a row's chain, and the tile pick's longer chain (its tile maxima sorted,
    then the gathered tiles ranked) loses; past it the values each SM ranks set the whole-row
    pick's time and the tile pick, reading fewer, wins."""
    plan = tile_pick_plan(nb_max, top_n, num_sink, num_local, width)
    if plan is None:
        return False
    if math.ceil(nb_max / width) + plan["S_CAP"] * width >= nb_max:
        return False
    return rows * pick_row_elems(nb_max, top_n) >= TILE_PICK_MIN_VALUES_PER_SM * num_sms
