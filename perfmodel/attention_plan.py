"""Launch plans of the dense and sparse verification kernels, without torch: the one source of
the arithmetic their wrappers launch with (``kernels.dense_verify``, ``kernels.sparse_launch``)
and the cost models price (``perfmodel.attention_work``), so the two cannot drift.

Every function whose answer depends on the GPU takes its SM count as an argument; the kernel
wrappers pass the device's.

- dense: ``G = Hq / Hkv`` query heads x ``t`` draft rows packed into MMA rows, ``BLOCK_M`` of
  them a program (``dense_row_tiles``), the KV prefix cut into ``num_splits`` chunks chosen by
  flash-attention 2's wave-efficiency heuristic (``choose_dense_splits``): ``dense_verify_plan``;
- sparse: a group of C queries x G heads packed into ``M_PAD`` rows a program, its block list
  cut into ``num_splits`` parts by the waves of their walks (``choose_sparse_splits``),
  pipeline depth and warps by tile size (``sparse_tile_shape``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.nsa_plan import WGMMA_MIN_ROWS
from ssvkit.perfmodel.numbers import require_at_least_one


def next_pow2(x: int) -> int:
    """Smallest power of two >= ``x`` (1 for x <= 1), as ``triton.next_power_of_2``."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# Shared memory per SM of the Hopper GPUs (``perfmodel.hardware``): the plans' default where the
# caller gives no device's.
DEFAULT_SMEM_PER_SM_BYTES = 228 * 1024


@dataclass(frozen=True, slots=True)
class DenseVerifyConfig:
    """Launch parameters of :func:`dense_verify` (tuning knobs, not semantics)."""

    block_n: int = field(default=64, metadata={"help": "KV positions per tile (power of two)"})
    max_block_m: int = field(default=128, metadata={"help": "most packed rows per program"})
    warpgroup_rows_from: int = field(
        default=17,
        metadata={
            "help": "packed rows from which a row tile at a head dim up to 128 takes at least "
            f"{WGMMA_MIN_ROWS} rows (a wgmma warpgroup tile) in place of 32 (mma.sync)"
        },
    )
    num_warps_small: int = field(default=4, metadata={"help": "warps when BLOCK_M <= 64"})
    num_warps_large: int = field(default=8, metadata={"help": "warps when BLOCK_M > 64"})
    num_stages: int = field(default=3, metadata={"help": "software-pipeline depth of KV loads"})
    # One program per SM when sizing splits: fewer splits than two-per-SM wave filling picks
    # (at batch 1 and 32K, 16 splits, one wave of 128 programs, against 29) leave the merge
    # pass fewer partials to read, which gains more than a second resident program per SM.
    ctas_per_sm: int = field(
        default=1, metadata={"help": "resident programs per SM assumed when BLOCK_M <= 64"}
    )
    ctas_per_sm_large: int = field(
        default=1, metadata={"help": "resident programs per SM assumed when BLOCK_M > 64"}
    )
    min_tiles_per_split: int = field(default=4, metadata={"help": "fewest KV tiles in a split"})
    max_splits: int = field(default=128, metadata={"help": "upper bound on KV splits"})

    def __post_init__(self) -> None:
        for name in ("block_n", "max_block_m"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        require_at_least_one(
            self,
            (
                "num_warps_small",
                "num_warps_large",
                "num_stages",
                "ctas_per_sm",
                "ctas_per_sm_large",
                "min_tiles_per_split",
                "max_splits",
                "warpgroup_rows_from",
            ),
        )


DEFAULT_DENSE_CONFIG = DenseVerifyConfig()


def choose_dense_splits(
    num_programs: int,
    num_tiles: int,
    slots: int,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
    resident_slots: int | None = None,
) -> int:
    """KV split count (flash-attention 2's wave-efficiency heuristic).

    ``num_programs`` is the program count without splitting, ``num_tiles`` the KV tiles of the
    longest possible sequence and ``slots`` the programs a wave is sized to (SMs x
    ``ctas_per_sm``). A grid of at least 80% of the slots stays unsplit where its programs run
    at once (at most ``resident_slots``, the programs the SMs hold together; None: any grid)
    or its last wave is at least 85% full: a grid just past what the SMs hold would otherwise
    run a second wave of a few full-length walks, twice the time. Otherwise it picks the
    smallest split count whose last wave is at least 85% as full as the best one, so splits are
    added only where they fill idle SMs, and never below ``min_tiles_per_split`` tiles a split
    (the merge pass and per-split prologue would cost more than they hide).
    """
    max_splits = min(config.max_splits, max(1, num_tiles // config.min_tiles_per_split))
    if max_splits == 1:
        return 1
    waves = num_programs / slots
    at_once = resident_slots is None or num_programs <= resident_slots
    if num_programs >= 0.8 * slots and (at_once or waves / math.ceil(waves) >= 0.85):
        return 1
    effs = []
    for s in range(1, max_splits + 1):
        waves = num_programs * s / slots
        effs.append(waves / math.ceil(waves))
    best = max(effs)
    return next(s for s, e in enumerate(effs, 1) if e >= 0.85 * best)


@dataclass(frozen=True, slots=True)
class DenseVerifyPlan:
    """Launch shape of one ``dense_verify`` call (host-only integers)."""

    block_m: int = field(metadata={"help": "packed (draft row x query head) rows per program"})
    num_m_tiles: int = field(metadata={"help": "row tiles per KV head"})
    block_n: int = field(metadata={"help": "KV positions per tile"})
    num_splits: int = field(metadata={"help": "KV splits (1 = no merge pass)"})
    num_warps: int = field(metadata={"help": "warps per program"})
    num_stages: int = field(metadata={"help": "pipeline depth of the KV loads"})


def dense_row_tiles(
    t: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
) -> tuple[int, int]:
    """(``BLOCK_M``, row tiles) of a KV head's ``t x G`` packed rows: the smallest power of two
    of at least 16 rows that holds them, at most ``max_block_m`` (64 for D > 128); at a head
    dimension of at most 128, at least ``WGMMA_MIN_ROWS`` from ``warpgroup_rows_from`` rows.

    The 32-row tile (``mma.sync`` over 4 warps) walks the prefix slower than the 64-row
    ``wgmma`` tile, though it computes half the rows. Timed against each other on an H100
    (``validation/data/dense-row-tile-h100.json``: five head geometries, batch 1 and 16, 32K
    and 128K), the 64-row tile takes 0.97-0.99x the 32-row one's time at D = 128 and 0.87-0.92x
    at D = 64; on the H200 the committed kernel-sweep rows at Llama-3.1-8B attention take
    1.03-1.18x as long at t = 8 (32 rows) as at t = 16 (a 64-row tile). So 17 to 32 rows run as
    a 64-row tile, its extra rows masked. Head dimensions past 128 keep the 32-row tile: no run
    measures the 64-row one against it there."""
    rows = num_q_heads // num_kv_heads * t
    # Cap rows at 64 for D > 128 to bound the fp32 accumulator's registers.
    cap = config.max_block_m if head_dim <= 128 else min(config.max_block_m, 64)
    block_m = max(16, next_pow2(rows))
    if rows >= config.warpgroup_rows_from and head_dim <= 128:
        block_m = max(block_m, WGMMA_MIN_ROWS)
    block_m = min(block_m, cap)
    return block_m, cdiv(rows, block_m)


def dense_resident_programs(
    block_m: int, head_dim: int, smem_per_sm_bytes: int, config: DenseVerifyConfig
) -> int:
    """Programs of a ``dense_verify`` launch one SM holds at once: a row tile above 64 rows
    runs 8 warps whose fp32 accumulator and operands take about the register file, one an SM;
    a smaller one as many as its K/V pipeline (``num_stages`` K and V tiles) fits in shared
    memory."""
    if block_m > 64:
        return 1
    stage_bytes = config.num_stages * 2 * config.block_n * head_dim * 2  # bf16 K and V tiles
    return max(1, smem_per_sm_bytes // stage_bytes)


def dense_verify_plan(
    bsz: int,
    t: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    t_max: int,
    num_sms: int,
    num_splits: int | None = None,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
    smem_per_sm_bytes: int = DEFAULT_SMEM_PER_SM_BYTES,
) -> DenseVerifyPlan:
    """Tile sizes, warps and split count of a call on a GPU of ``num_sms`` SMs with
    ``smem_per_sm_bytes`` of shared memory each; ``T_max`` bounds the sequence length so no
    length is read on the host."""
    block_m, num_m_tiles = dense_row_tiles(t, num_q_heads, num_kv_heads, head_dim, config)
    large = block_m > 64
    if num_splits is None:
        per_sm = config.ctas_per_sm_large if large else config.ctas_per_sm
        resident = dense_resident_programs(block_m, head_dim, smem_per_sm_bytes, config)
        num_splits = choose_dense_splits(
            num_m_tiles * bsz * num_kv_heads,
            cdiv(t_max, config.block_n),
            num_sms * per_sm,
            config,
            resident_slots=num_sms * resident,
        )
    return DenseVerifyPlan(
        block_m=block_m,
        num_m_tiles=num_m_tiles,
        block_n=config.block_n,
        num_splits=num_splits,
        num_warps=config.num_warps_large if large else config.num_warps_small,
        num_stages=config.num_stages,
    )


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
# takes. On an H100 (validation/data/sparse-warps-h100-*.json, five head geometries), 4 warps
# take 0.71x (64 x 64) and 0.77x (64 x 128) the time of 8 at batch 8 and 32K (medians; 0.60-0.94)
# and 0.92x and 0.99x at batch 1 and 128K (0.80-1.07); at 128 x 128, 2.40x and 1.74x.
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
