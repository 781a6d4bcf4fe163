"""The work one dense verification call does, counted from the launch plan its wrapper makes
(``perfmodel.attention_plan.dense_verify_plan``, via ``perfmodel.attention_work``), without
torch: the counts the calibrated ``dense_verify`` class is fitted on and priced with
(``DenseWork``).

A call runs ``m_tiles x S x B x Hkv`` programs (row tiles of ``BLOCK_M`` packed rows times KV
splits), each walking its split's key tiles one after another, ``resident`` programs an SM as
shared memory allows, in ``waves``; a split call then merges ``S`` partials a row, 16 at a time
(``kernels.merge``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_plan import (
    DEFAULT_DENSE_CONFIG,
    DenseVerifyConfig,
    cdiv,
    dense_verify_plan,
)
from ssvkit.perfmodel.attention_work import ELEM_BYTES, resident_programs, row_cost
from ssvkit.perfmodel.sparse_plan import MERGE_BLOCK_S
from ssvkit.perfmodel.work_points import at_distinct_points

# The special-function unit's exponentials against the tensor cores' FLOPs of one SM: Hopper
# runs 16 exp2 a clock against 4096 dense bf16 FLOPs (FlashAttention-3, Shah et al. 2024: H100
# SXM5 989 TFLOPS of matmul, 3.9 TFLOPS of special functions), so an exponential costs what
# 256 MMA FLOPs do.
EXP_FLOPS = 256
REF_HEAD_DIM = 128  # key_tile_weight is 1 at this head dimension


def key_tile_weight(head_dim) -> np.ndarray:
    """The work of one key tile for one row at ``head_dim`` over its work at D = 128: the MMAs
    (``4 x BLOCK_N x D`` FLOPs) and the softmax's ``BLOCK_N`` exponentials (``EXP_FLOPS``
    each), ``(D + EXP_FLOPS / 4) / (128 + EXP_FLOPS / 4)``: 2/3 at D = 64."""
    extra = EXP_FLOPS / 4
    return (np.asarray(head_dim, dtype=float) + extra) / (REF_HEAD_DIM + extra)


@dataclass(frozen=True, slots=True)
class DenseWork:
    """What one ``dense_verify`` call executes; counts and bytes as floats.

    - ``requested_bytes``: K/V once per row tile of a KV head (each row tile streams the
      prefix), q and o, the fp32 partials a split call writes and its merge reads;
      ``unique_bytes``: the same with K/V once per KV head, so ``requested - unique`` is what
      the other row tiles may find in L2;
    - ``flops``: the padded tiles' MMAs and the softmax's exponentials at ``EXP_FLOPS`` each;
    - ``chain_tiles``: the key tiles one program walks in series times the waves;
    - ``sm_rows``: MMA rows an SM holds at once -- its resident programs (averaged over the
      waves, the last one as the grid fills it) times the row tile's cost in ``mma.sync`` rows
      (``attention_work.row_cost``), weighted by ``key_tile_weight``: what one key tile costs
      the SM (its MMAs and softmax) and what every program loads and writes;
    - ``merge_steps``: the merge's serial reads, ``ceil(S / 16)``, 0 unsplit; ``splits``: 1
      when a merge launch follows;
    - ``tail_bytes``: the K/V bytes the busiest SMs stream past an even share of the programs,
      ``(ceil(P / SMs) - P / SMs)`` programs' walks: once the other SMs finish, those few SMs
      stream alone at what their programs keep in flight, not at the GPU's rate over the SMs
      (the calibration design's wave lines: at Llama-3.1-8B attention, t = 16 and 64K, batch
      17 takes 1.24x batch 16 for 1.06x its bytes; ``validation.sm_streams``).

    It ignores the masked tail's extra pass and the spread of sequence lengths within a batch.
    """

    requested_bytes: float
    unique_bytes: float
    flops: float
    chain_tiles: float
    sm_rows: float
    merge_steps: float
    splits: float
    tail_bytes: float = 0.0


def dense_call_work(
    batch: int,
    t: int,
    context_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_sms: int,
    smem_per_sm_bytes: int,
    config: DenseVerifyConfig = DEFAULT_DENSE_CONFIG,
) -> DenseWork:
    """The work of one ``dense_verify`` call of ``t`` draft rows over ``context_len`` cached
    positions, launched as the wrapper launches it (``T_max = context_len + t``, under
    ``config``) on a GPU of ``num_sms`` SMs and ``smem_per_sm_bytes`` of shared memory each.
    A KV head packs
    ``num_q_heads // num_kv_heads`` query heads, as the plan does (a tensor-parallel split
    whose heads do not divide is priced so; the sweep flags such a point)."""
    for name, v in (("batch", batch), ("t", t), ("num_kv_heads", num_kv_heads)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if num_q_heads < num_kv_heads:
        raise ValueError(f"num_q_heads must be >= num_kv_heads {num_kv_heads}, got {num_q_heads}")
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
    s, bn, bm = plan.num_splits, plan.block_n, plan.block_m
    programs = plan.num_m_tiles * s * batch * num_kv_heads
    resident = resident_programs(plan.num_stages, bn, bm, head_dim, smem_per_sm_bytes)
    slots = num_sms * resident
    waves = cdiv(programs, slots)
    last = programs - (waves - 1) * slots
    per_sm = ((waves - 1) * resident + cdiv(last, num_sms)) / waves
    heads = batch * num_kv_heads
    kv_row = 2 * head_dim * ELEM_BYTES  # one position's K and V
    qo = 2 * batch * t * num_q_heads * head_dim * ELEM_BYTES
    partials = 2 * batch * t * num_q_heads * s * (head_dim + 1) * 4 if s > 1 else 0
    mma = heads * plan.num_m_tiles * cdiv(seq, bn) * bn * bm * head_dim * 4
    program_bytes = cdiv(seq, s) * kv_row
    tail = (cdiv(programs, num_sms) - programs / num_sms) * program_bytes
    return DenseWork(
        requested_bytes=float(heads * plan.num_m_tiles * seq * kv_row + qo + partials),
        unique_bytes=float(heads * seq * kv_row + qo + partials),
        flops=float(mma * (head_dim + EXP_FLOPS / 4) / head_dim),
        chain_tiles=float(cdiv(cdiv(seq, s), bn) * waves),
        sm_rows=float(per_sm * row_cost(bm) * key_tile_weight(head_dim)),
        merge_steps=float(math.ceil(s / MERGE_BLOCK_S) if s > 1 else 0),
        splits=float(s > 1),
        tail_bytes=float(tail),
    )


WORK_FIELDS = DenseWork.__slots__


def dense_work_arrays(
    shape: dict, *, num_sms: int, smem_per_sm_bytes: int
) -> dict[str, np.ndarray]:
    """``dense_call_work`` at every point of ``shape`` (its argument names ``batch``, ``t``,
    ``context_len``, ``num_q_heads``, ``num_kv_heads``, ``head_dim`` to arrays or scalars that
    broadcast; ``t`` rounded up to whole rows), one array per ``DenseWork`` field, evaluated
    once per distinct point; a point of no rows or sequences counts nothing."""

    def work(kw: dict) -> DenseWork | None:
        if kw["batch"] < 1 or kw["t"] < 1:
            return None
        return dense_call_work(**kw, num_sms=num_sms, smem_per_sm_bytes=smem_per_sm_bytes)

    key = ("dense_call_work", num_sms, smem_per_sm_bytes)
    return at_distinct_points(shape, work, WORK_FIELDS, ceil=True, memo_key=key)
