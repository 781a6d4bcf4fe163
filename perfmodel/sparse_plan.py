"""Launch plan of the sparse verification kernel (``kernels.sparse_launch``), without torch:
the arithmetic its wrapper launches with and the cost models price (``perfmodel.sparse_work``).

A group of C queries x G heads packs into ``M_PAD`` rows a program, its block list cut into
``num_splits`` parts by the waves of their walks (``choose_sparse_splits``), pipeline depth and
warps by tile size (``sparse_tile_shape``); a split call merges its partials in a launch of its
own or in its last split programs (``merges_in_launch``); a union call plans its group's block
list in a launch of its own (``union_plan_warps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.attention_plan import cdiv, next_pow2
from ssvkit.perfmodel.numbers import require_at_least_one


@dataclass(frozen=True, slots=True)
class SparseVerifyConfig:
    """Launch tunables of ``sparse_verify`` (defaults tuned on the H200)."""

    num_warps: int | None = field(
        default=None,
        metadata={
            "help": "warps per program (None: 4 up to 64 x 128 accumulator elements, "
            "packed rows x head dim; else 8)"
        },
    )
    num_stages: int | None = field(
        default=None,
        metadata={
            "help": "pipeline depth of the K/V loop (None: 3, 2 for tiles > 16 KB, 1 for "
            "gathered tiles > 32 KB)"
        },
    )
    wave_warps: int = field(
        default=8,
        metadata={"help": "warps of programs one SM streams at once: the wave the splits fill"},
    )
    program_blocks: float = field(
        default=4.0,
        metadata={"help": "a program's fixed cost beside its list walk, in K/V blocks"},
    )
    max_splits: int = field(default=32, metadata={"help": "upper bound on splits"})
    num_splits: int | None = field(
        default=None, metadata={"help": "force this many splits (None: heuristic)"}
    )
    tile_blocks: int = field(
        default=1,
        metadata={"help": "listed blocks a program gathers into one K/V tile (a power of two)"},
    )
    fused_merge: bool = field(
        default=True,
        metadata={
            "help": "a split call whose partials one load holds and whose programs fit one "
            "wave merges them in the last split program of each group (False: never; "
            "otherwise a merge launch of its own)"
        },
    )

    def __post_init__(self) -> None:
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two <= 16, got {self.num_warps}")
        if self.num_stages is not None and self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1 or None, got {self.num_stages}")
        require_at_least_one(self, ("wave_warps", "max_splits"))
        if not self.program_blocks >= 0.0:
            raise ValueError(f"program_blocks must be >= 0, got {self.program_blocks}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 or None, got {self.num_splits}")
        if self.tile_blocks < 1 or self.tile_blocks & (self.tile_blocks - 1):
            raise ValueError(f"tile_blocks must be a power of two >= 1, got {self.tile_blocks}")


DEFAULT_SPARSE_CONFIG = SparseVerifyConfig()


def list_entries(mode: str, c: int, width: int) -> int:
    """Entries of a group's block list, ``width`` a row's: a ``union`` list's bound, ``C x``
    a row's (the host does not know the union's size), else a row's own list."""
    return c * width if mode == "union" else width


def choose_sparse_splits(
    cfg: SparseVerifyConfig, lists: int, list_blocks: int, num_warps: int, num_sms: int
) -> int:
    """Splits per group list: the count under which the call's programs end soonest when each
    wave of them lasts one program's walk, its share of the list plus a fixed cost:
    ``cdiv(lists * s, wave) * (cdiv(list_blocks, s) + program_blocks)``, with ``wave = SMs x
    (wave_warps // num_warps)`` programs (two of 4 warps an SM, one of 8). A grid of few
    lists is split until its programs fill the wave; one of a list a slot or more is split
    only where a program's walk is long beside the waves it adds. ``list_blocks``: a list's
    entries, for a union list its bound (``C x`` a row's: the host does not know the union's
    size). The fewest splits of the least cost, at most ``max_splits`` and ``list_blocks``."""
    if cfg.num_splits is not None:
        return cfg.num_splits
    wave = max(1, cfg.wave_warps // num_warps) * num_sms
    best, best_cost = 1, math.inf
    for s in range(1, max(1, min(cfg.max_splits, list_blocks)) + 1):
        cost = cdiv(lists * s, wave) * (cdiv(list_blocks, s) + cfg.program_blocks)
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


# kernels.merge: the partials a merge program reads a row per step.
MERGE_BLOCK_S = 16
# fp32 values a thread of the fused merge holds of one load of partials.
MERGE_VALUES_PER_THREAD = 128


def merge_chunk(num_splits: int, m_pad: int, head_dim: int, num_warps: int) -> int:
    """Splits whose ``[m_pad, head_dim]`` fp32 partials the fused merge of a group loads at
    once: all of them (one L2 round trip) up to ``MERGE_VALUES_PER_THREAD`` values a thread of
    the program's ``num_warps``, a power of two."""
    fit = MERGE_VALUES_PER_THREAD * 32 * num_warps // (m_pad * head_dim)
    return max(1, min(next_pow2(num_splits), 1 << max(0, fit.bit_length() - 1)))


def merges_in_launch(
    cfg: SparseVerifyConfig,
    num_splits: int,
    programs: int,
    m_pad: int,
    head_dim: int,
    num_warps: int,
    num_sms: int,
) -> bool:
    """Whether a split call's last split program of each group merges the group's rows
    (``cfg.fused_merge``): where one load holds every split's partials (``merge_chunk``) and
    the ``programs`` fit one wave (``SMs x (wave_warps // num_warps)``). On the H200 such calls
    took 0.96x the time with the merge in the launch (median of the calibration rows); calls
    of several loads or waves 1.04x, the registers of the merge's load held by every program
    and its chain on the last one's tail."""
    if num_splits <= 1 or not cfg.fused_merge:
        return False
    wave = max(1, cfg.wave_warps // num_warps) * num_sms
    return num_splits <= merge_chunk(num_splits, m_pad, head_dim, num_warps) and programs <= wave


def sparse_merge_steps(num_splits: int, in_launch: bool) -> int:
    """Dependent steps of a call's merge launch: its programs read a row's ``num_splits``
    partials ``MERGE_BLOCK_S`` at a time, as for dense verification; 0 for a call that does
    not split or merges in its launch (``merges_in_launch``: the last program's one load of
    the partials, a step of the program's epilogue, which its row-tile writes price:
    ``perfmodel.sparse_work``'s ``row_waves``)."""
    if num_splits <= 1 or in_launch:
        return 0
    return cdiv(num_splits, MERGE_BLOCK_S)


# The union plan kernel (``kernels.group_plan``): its sort keys a thread holds, and the warps of
# its programs (4 is the fastest at 128 and 256 keys on the H200; wider tiles take a warp per 128).
UNION_PLAN_KEYS_PER_THREAD = 4
UNION_PLAN_MIN_WARPS = 4
UNION_PLAN_MAX_WARPS = 16


def union_plan_keys(group_size: int, width: int) -> int:
    """Sort keys of one union plan program: ``C_PAD x N_PAD``, the group's members and a row's
    ``width`` block ids, each padded to a power of two (ids to at least 16)."""
    return next_pow2(group_size) * max(16, next_pow2(width))


def union_plan_warps(group_size: int, width: int) -> int:
    """Warps of one union plan program: its keys at ``UNION_PLAN_KEYS_PER_THREAD`` a thread,
    within ``UNION_PLAN_MIN_WARPS`` and ``UNION_PLAN_MAX_WARPS``."""
    want = union_plan_keys(group_size, width) // (32 * UNION_PLAN_KEYS_PER_THREAD)
    return min(UNION_PLAN_MAX_WARPS, max(UNION_PLAN_MIN_WARPS, want))


# The largest fp32 accumulator (packed rows x head dim) a sparse verification program of 4 warps
# takes. On the H200 (validation/data/sparse-warps-h200-*.json, five head geometries), 4 warps
# take 0.66x (64 x 64) and 0.63x (64 x 128) the time of 8 at batch 8 and 32K (medians; 0.52-0.87)
# and 0.94x and 0.93x at batch 1 and 128K (0.73-1.04); at 128 x 128, 2.30x and 1.71x. An H100
# (sparse-warps-h100-*.json) agrees but at 16 x 128 and batch 8 of Llama-3.1-70B's attention,
# where 4 warps take 1.16x the time of 8 (the H200: 0.92x).
FOUR_WARP_ACC_ELEMS = 64 * 128
# The most packed rows a program of 4 warps takes: its score and probability tiles grow with the
# rows too (128 x 64 fp32 is another 64 registers a thread), and no 128-row tile on 4 warps was
# measured faster.
FOUR_WARP_MAX_ROWS = 64


def sparse_tile_shape(
    cfg: SparseVerifyConfig,
    group_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int,
) -> tuple[int, int, int]:
    """(``M_PAD``, warps, pipeline stages) of a program packing ``group_size`` queries x
    ``Hq / Hkv`` heads over K/V tiles of ``block_size`` tokens."""
    m_pad = max(16, next_pow2(group_size * (num_q_heads // num_kv_heads)))
    # 4 warps hold an fp32 accumulator of up to FOUR_WARP_ACC_ELEMS (64 registers a thread)
    # and stream faster than 8; a larger one, or more rows, takes 8 (4 would spill).
    four = m_pad <= FOUR_WARP_MAX_ROWS and m_pad * head_dim <= FOUR_WARP_ACC_ELEMS
    num_warps = cfg.num_warps or (4 if four else 8)
    # Each stage buffers one K and one V tile: 2 x 16 KB at block 64, D = 128 (72 KB smem at
    # 3 stages, 3 programs per SM); bigger tiles keep 2 stages to stay under ~140 KB, and a
    # gathered tile of more than 128 x 128 elements one, within the SM's shared memory.
    elems = block_size * cfg.tile_blocks * head_dim
    if cfg.num_stages:
        num_stages = cfg.num_stages
    elif elems <= 64 * 128:
        num_stages = 3
    else:
        num_stages = 2 if cfg.tile_blocks == 1 or elems <= 128 * 128 else 1
    return m_pad, num_warps, num_stages
