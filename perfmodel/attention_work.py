"""The work one dense or sparse verification call does, derived from its launch plan
(``perfmodel.attention_plan``, the arithmetic the kernel wrappers launch with): what the GPU
executes, not what the algorithm needs (``AttentionWork``), as the physical cost model
(``perfmodel.physical``) prices it.

``dense_verify_tiles`` gives the calibrated model's view of a dense call's row tiles: the
share of padded rows in its MMA work and the tile's cost in ``mma.sync`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_plan import (
    DEFAULT_DENSE_CONFIG,
    DenseVerifyConfig,
    cdiv,
    dense_row_tiles,
    dense_verify_plan,
)
from ssvkit.perfmodel.nsa_plan import WGMMA_MIN_ROWS, WGMMA_ROW_COST
from ssvkit.perfmodel.sparse_plan import (
    DEFAULT_SPARSE_CONFIG,
    SparseVerifyConfig,
    choose_sparse_splits,
    list_entries,
    merges_in_launch,
    sparse_tile_shape,
    union_plan_keys,
    union_plan_warps,
)

ELEM_BYTES = 2  # bf16 queries, keys, values, outputs
PARTIAL_BYTES = 4  # fp32 partial outputs and log-sum-exps
INDEX_BYTES = 4  # int32 block indices
WARPGROUP = 4  # warps of one warpgroup (a wgmma's issuing unit)
SPLIT_RULES = ("wave_balance", "fill")
# Union plan programs an SM holds at once: of 4 to 16 warps each, 4 fill its 64 warps at most.
UNION_PLAN_PROGRAMS_PER_SM = 4
# The union plan kernels: ``sort`` (``kernels.group_plan``) and ``compare``, the kernel before it,
# which compared every member's ids with the group's (rows of older kernels keep its counts).
UNION_PLAN_KERNELS = ("sort", "compare")


@dataclass(frozen=True, slots=True)
class AttentionWork:
    """What one call executes; counts and bytes as floats.

    - ``programs`` (the grid) and ``waves`` of it over ``SMs x resident`` slots, where a
      program's residency per SM is what its K/V pipeline's shared memory allows
      (``stages x 2 x BLOCK_N x D x 2`` bytes plus its query tile);
    - ``tiles_per_program``: the K/V tiles the busiest program walks in series (its split's
      share of the list, plus the draft tail on the last split);
    - ``rows_pad``: MMA rows a program computes, padded to the kernel's row tile (the
      ``t x G`` dense rows or ``C x G`` sparse rows, packed as the kernel packs them), and
      ``row_cost``: those rows in ``mma.sync`` rows (a ``wgmma`` tile of >= 64 rows counts
      half, ``perfmodel.nsa_plan.mma_row_cost``'s factor);
    - ``requested_bytes``: the K/V bytes every program streams plus queries, outputs and
      indices; ``unique_bytes``: the distinct bytes of the call (each KV block once), so the
      repeated share ``requested - unique`` is what L2 may serve (row tiles of one KV head
      re-reading it; per-query rows of one KV head re-reading blocks others chose);
    - ``mma_flops``: the FLOPs of the padded MMA tiles (``4 x rows_pad x D`` a key);
    - ``merge_bytes``: the fp32 partials a split call writes and its merge reads; ``launches``;
    - ``plan_compares``: the compare steps of a union call's plan kernel, which runs before
      the attention (``union_plan_compares``).

    It ignores the masked tail's extra passes and the spread of union sizes across groups
    (every group streams the mean).
    """

    programs: float
    waves: float
    resident: float  # programs one SM holds at once
    tiles_per_program: float
    stages: float  # K/V tiles a program keeps in flight
    tile_bytes: float  # one K plus one V tile
    rows_pad: float
    row_cost: float
    requested_bytes: float
    unique_bytes: float
    mma_flops: float
    merge_bytes: float
    launches: float
    num_splits: float
    plan_compares: float = 0.0  # compare steps of the busiest union-plan SM slot


def row_cost(rows_pad: int, num_warps: int = WARPGROUP) -> float:
    """The padded rows one warpgroup of a program of ``num_warps`` warps computes (the
    program's warpgroups split its ``rows_pad`` rows and run side by side), in ``mma.sync``
    rows (``wgmma`` rows count ``WGMMA_ROW_COST``)."""
    rows = rows_pad // max(1, num_warps // WARPGROUP)
    return float(rows if rows < WGMMA_MIN_ROWS else WGMMA_ROW_COST * rows)


def resident_programs(stages: int, block_n: int, rows_pad: int, head_dim: int, smem: int) -> int:
    """Programs one SM holds as its shared memory allows: each buffers ``stages`` K and V
    tiles and its query tile."""
    per_program = (stages * 2 * block_n + rows_pad) * head_dim * ELEM_BYTES
    return max(1, smem // per_program)


def dense_verify_work(
    batch: int,
    t: int,
    context_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_sms: int,
    smem_per_sm_bytes: int,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
) -> AttentionWork:
    """The work of one ``dense_verify`` call over ``context_len`` cached positions plus ``t``
    draft rows, launched as the wrapper launches it with ``T_max = context_len + t``."""
    seq = context_len + t
    plan = dense_verify_plan(
        batch,
        t,
        num_q_heads,
        num_kv_heads,
        head_dim,
        seq,
        num_sms,
        config=config,
        smem_per_sm_bytes=smem_per_sm_bytes,
    )
    s, bn = plan.num_splits, plan.block_n
    programs = plan.num_m_tiles * s * batch * num_kv_heads
    resident = resident_programs(plan.num_stages, bn, plan.block_m, head_dim, smem_per_sm_bytes)
    kv_row = 2 * head_dim * ELEM_BYTES  # one position's K and V
    seq_tiles = cdiv(seq, bn)
    heads = batch * num_kv_heads
    qo = 2 * batch * t * num_q_heads * head_dim * ELEM_BYTES
    return AttentionWork(
        programs=float(programs),
        waves=float(cdiv(programs, num_sms * resident)),
        resident=float(resident),
        tiles_per_program=float(cdiv(cdiv(seq, s), bn)),
        stages=float(plan.num_stages),
        tile_bytes=float(bn * kv_row),
        rows_pad=float(plan.block_m),
        row_cost=row_cost(plan.block_m),
        requested_bytes=float(heads * plan.num_m_tiles * seq * kv_row + qo),
        unique_bytes=float(heads * seq * kv_row + qo),
        mma_flops=float(heads * plan.num_m_tiles * seq_tiles * bn * plan.block_m * head_dim * 4),
        merge_bytes=_merge_bytes(batch, t, num_q_heads, head_dim, s),
        launches=float(1 + (s > 1)),
        num_splits=float(s),
    )


def dense_verify_tiles(
    t: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
) -> tuple[float, float]:
    """``(mma_factor, row_cost)`` of a ``dense_verify`` call's row tiles, from the tile the
    wrapper's launch plan picks for its ``t x G`` packed rows (``G = Hq / Hkv``;
    ``attention_plan.dense_row_tiles``):

    - ``mma_factor``: the rows the tiles compute over the rows that hold a query: a KV head's
      rows run in ``num_m_tiles`` tiles of ``BLOCK_M`` rows, and a tile computes all of them;
      at ``G = 4``, t = 17 packs 68 rows into one 128-row tile (128 / 68), t = 16 packs 64
      rows into a 64-row tile (1);
    - ``row_cost``: a program's row tile in ``mma.sync`` rows (``row_cost``: a ``wgmma``
      tile's rows count half), the rows every program loads, computes and writes.
    """
    block_m, num_m_tiles = dense_row_tiles(t, num_q_heads, num_kv_heads, head_dim, config)
    return num_m_tiles * block_m / (num_q_heads // num_kv_heads * t), row_cost(block_m)


def dense_tile_costs(t, num_q_heads, num_kv_heads, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``dense_verify_tiles`` at every point of broadcastable arrays of rows and heads, as two
    arrays (rows rounded up to whole rows; a point without rows: factor 1, row cost 0),
    evaluated once per distinct point."""
    args = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (t, num_q_heads, num_kv_heads))
    )
    flat = np.ceil(np.stack([a.ravel() for a in args], axis=1))
    distinct, inverse = np.unique(flat, axis=0, return_inverse=True)
    out = np.array(
        [
            dense_verify_tiles(int(r), int(hq), int(hkv), head_dim) if r >= 1 else (1.0, 0.0)
            for r, hq, hkv in distinct
        ]
    ).reshape(-1, 2)
    shape = args[0].shape
    return out[inverse.ravel(), 0].reshape(shape), out[inverse.ravel(), 1].reshape(shape)


def fill_sparse_splits(
    cfg: SparseVerifyConfig, programs: int, top_n: int, num_sms: int, programs_per_sm: int = 4
) -> int:
    """The split rule of the sparse kernel that timed the committed H100 rows: split until the
    grid fills one wave of ``programs_per_sm x SMs`` (that kernel's wave: 4 programs an SM),
    at most 16 splits and ``top_n / 4`` (a split walked 4 blocks or more); ``cfg.num_splits``
    forces the count."""
    if cfg.num_splits is not None:
        return cfg.num_splits
    want = cdiv(programs_per_sm * num_sms, programs)
    return max(1, min(want, 16, top_n // 4))


def sparse_verify_work(
    batch: int,
    t: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    mode: str,
    group_size: int,
    top_n: int,
    block_size: int,
    num_sms: int,
    smem_per_sm_bytes: int,
    *,
    list_blocks: float | None = None,
    unique_kv_bytes: float | None = None,
    split_rule: str = "wave_balance",
    union_plan: str = "sort",
    config: SparseVerifyConfig = DEFAULT_SPARSE_CONFIG,
) -> AttentionWork:
    """The work of one ``sparse_verify`` call (plan built inside the call, as the wrapper does).

    ``list_blocks``: the blocks of one group's list (union mode: its mean union size; default
    ``top_n``, the list of ``per_query`` and ``shared``); ``unique_kv_bytes``: the call's
    distinct K/V bytes (default: the requested ones, no repeats); ``split_rule``:
    ``wave_balance`` (``sparse_plan.choose_sparse_splits``) or ``fill``
    (``fill_sparse_splits``); ``union_plan``: the union plan kernel (``union_plan_compares``)."""
    if split_rule not in SPLIT_RULES:
        raise ValueError(f"split_rule must be one of {SPLIT_RULES}, got {split_rule!r}")
    c = 1 if mode == "per_query" else min(group_size, t)
    groups = cdiv(t, c)
    n_list = float(top_n if list_blocks is None else list_blocks)
    m_pad, num_warps, stages = sparse_tile_shape(
        config, c, num_q_heads, num_kv_heads, block_size, head_dim
    )
    lists = batch * num_kv_heads * groups
    if split_rule == "wave_balance":
        entries = list_entries(mode, c, top_n)
        s = choose_sparse_splits(config, lists, entries, num_warps, num_sms)
    else:
        s = fill_sparse_splits(config, lists, top_n, num_sms)
    programs = lists * s
    in_launch = merges_in_launch(config, s, programs, m_pad, head_dim, num_warps, num_sms)
    merge_launch = s > 1 and not in_launch
    resident = resident_programs(stages, block_size, m_pad, head_dim, smem_per_sm_bytes)
    kv_row = 2 * head_dim * ELEM_BYTES
    tail_tiles = cdiv(t, block_size)
    kv = lists * (n_list * block_size + t) * kv_row
    other = 2 * batch * t * num_q_heads * head_dim * ELEM_BYTES
    other += batch * num_kv_heads * t * top_n * INDEX_BYTES
    return AttentionWork(
        programs=float(programs),
        waves=float(cdiv(programs, num_sms * resident)),
        resident=float(resident),
        tiles_per_program=float(-(-n_list // s) + tail_tiles),
        stages=float(stages),
        tile_bytes=float(block_size * kv_row),
        rows_pad=float(m_pad),
        row_cost=row_cost(m_pad),
        requested_bytes=float(kv + other),
        unique_bytes=float(min(kv, kv if unique_kv_bytes is None else unique_kv_bytes) + other),
        mma_flops=float(lists * (n_list + tail_tiles) * block_size * m_pad * head_dim * 4),
        merge_bytes=_merge_bytes(batch, t, num_q_heads, head_dim, s),
        launches=float(1 + merge_launch + (mode == "union" and c > 1)),
        num_splits=float(s),
        plan_compares=union_plan_compares(mode, c, top_n, lists, num_sms, union_plan),
    )


def union_plan_compares(
    mode: str, c: int, top_n: int, lists: int, num_sms: int, kernel: str = "sort"
) -> float:
    """Compare steps one SM slot of the union plan kernel takes in series, over its waves of
    programs (one per group list, ``UNION_PLAN_PROGRAMS_PER_SM`` an SM). ``sort``: a program
    sorts its ``K`` keys (``sparse_plan.union_plan_keys``) in ``log2 K (log2 K + 1) / 2``
    compare-exchange steps and scans them three times (``log2 K`` steps each), ``K`` over its
    threads at every step. ``compare``: every member's ``top_n`` ids against the group's
    ``C x top_n``."""
    if kernel not in UNION_PLAN_KERNELS:
        raise ValueError(f"kernel must be one of {UNION_PLAN_KERNELS}, got {kernel!r}")
    if mode != "union" or c <= 1:
        return 0.0
    waves = cdiv(lists, num_sms * UNION_PLAN_PROGRAMS_PER_SM)
    if kernel == "compare":
        return float(waves * c * c * top_n * top_n)
    keys = union_plan_keys(c, top_n)
    log_k = keys.bit_length() - 1
    per_thread = keys / (32 * union_plan_warps(c, top_n))
    return float(waves * per_thread * (log_k * (log_k + 1) / 2 + 3 * log_k))


def _merge_bytes(batch: int, t: int, num_q_heads: int, head_dim: int, splits: int) -> float:
    """fp32 partials (o and lse) written by a split call and read by its merge."""
    if splits <= 1:
        return 0.0
    return float(2 * batch * t * num_q_heads * splits * (head_dim + 1) * PARTIAL_BYTES)
