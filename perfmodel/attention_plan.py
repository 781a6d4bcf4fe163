"""Launch plans of the verification kernels, without torch: the one source of the arithmetic
their wrappers launch with (``kernels.dense_verify``, ``kernels.sparse_launch``) and the cost
models price (``perfmodel.attention_work``), so the two cannot drift. This module holds the
dense kernel's plan and the helpers both plans share; ``perfmodel.sparse_plan`` the sparse one.

Every function whose answer depends on the GPU takes its SM count as an argument; the kernel
wrappers pass the device's.

``G = Hq / Hkv`` query heads x ``t`` draft rows packed into MMA rows, ``BLOCK_M`` of them a
program (``dense_row_tiles``), the KV prefix cut into ``num_splits`` chunks chosen by
flash-attention 2's wave-efficiency heuristic (``choose_dense_splits``): ``dense_verify_plan``.
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
