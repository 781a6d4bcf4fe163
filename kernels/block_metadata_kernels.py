"""Triton code of :mod:`kernels.block_metadata`: ``block_metadata_kernel`` summarises each
KV block's keys (mean, channel-wise min and max) and stores each fp32 summary as its two bf16
parts (``store_parts``); ``bf16_parts`` is the split, which the block scoring
(:mod:`kernels.select_kernels`) also applies to its averaged query."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_metadata_kernel(
    k_ptr,
    old_ptr,
    new_ptr,
    mean_ptr,
    min_ptr,
    max_ptr,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_mp,
    num_kv_heads,
    t_max,
    NUM_PROGS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    D: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    HAS_MINMAX: tl.constexpr,
):
    """Grid ``(B * Hkv, NUM_PROGS)``: the mean and/or min/max key of every block spanned by
    positions ``[min(old, new), max(old, new))`` of one (sequence, KV head), the programs
    taking every ``NUM_PROGS``-th block, each stored as its bf16 parts (``store_parts``)."""
    tl.static_assert(BLOCK_SIZE >= 1)
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_bh // num_kv_heads
    h = pid_bh % num_kv_heads
    # Clamped to the cache so that bad lengths cannot read or write out of bounds.
    old_len = tl.minimum(tl.maximum(tl.load(old_ptr + b), 0), t_max)
    new_len = tl.minimum(tl.maximum(tl.load(new_ptr + b), 0), t_max)
    # A shrink (rolled-back tail) touches the same span as a growth: both ends are rewritten.
    first = tl.minimum(old_len, new_len) // BLOCK_SIZE
    end = (tl.maximum(old_len, new_len) + BLOCK_SIZE - 1) // BLOCK_SIZE
    offs_n = tl.arange(0, BLOCK_SIZE)
    offs_d = tl.arange(0, D)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    m_base = b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    for blk_i in range(first + pid_p, end, NUM_PROGS):
        blk = tl.cast(blk_i, tl.int64)  # the interpreter yields Python ints here
        pos = blk * BLOCK_SIZE + offs_n  # [BLOCK_SIZE]
        valid = pos < new_len
        k = tl.load(
            k_base + pos[:, None] * stride_kt + offs_d[None, :], mask=valid[:, None], other=0.0
        ).to(tl.float32)  # [BLOCK_SIZE, D]
        count = tl.sum(valid.to(tl.int32), axis=0)
        m_off = m_base + blk * stride_mn + offs_d
        if HAS_MEAN:
            mean = tl.sum(k, axis=0) / tl.maximum(count, 1).to(tl.float32)
            store_parts(mean_ptr + m_off, stride_mp, mean)
        if HAS_MINMAX:
            # Empty blocks (past a rolled-back length) are zeroed: scores mask them anyway.
            kmin = tl.min(tl.where(valid[:, None], k, float("inf")), axis=0)
            kmax = tl.max(tl.where(valid[:, None], k, -float("inf")), axis=0)
            # The reductions skip a NaN key; the block's summaries carry it, as the mean does.
            nan = tl.sum((valid[:, None] & (k != k)).to(tl.int32), axis=0) > 0
            kmin = tl.where(nan, float("nan"), kmin)
            kmax = tl.where(nan, float("nan"), kmax)
            store_parts(min_ptr + m_off, stride_mp, tl.where(count > 0, kmin, 0.0))
            store_parts(max_ptr + m_off, stride_mp, tl.where(count > 0, kmax, 0.0))


@triton.jit
def store_parts(ptr, stride_mp, x):
    """Store fp32 ``x`` as its bf16 parts: ``hi = bf16(x)`` at ``ptr``, ``bf16(x - hi)`` one
    part further (``kernels.block_metadata.split_parts``)."""
    hi, lo = bf16_parts(x)
    tl.store(ptr, hi)
    tl.store(ptr + stride_mp, lo)


@triton.jit
def bf16_parts(x):
    """fp32 ``x`` as its two bf16 parts: ``bf16(x)`` and ``bf16(x - bf16(x))``, each rounded to
    nearest (``bf16_nearest``)."""
    hi = bf16_nearest(x)
    return hi.to(tl.bfloat16), bf16_nearest(x - hi).to(tl.bfloat16)


@triton.jit
def bf16_nearest(x):
    """fp32 ``x`` rounded to the nearest bf16 value (ties to even), as fp32: its conversion to
    bf16 is then exact whatever rounding the conversion applies (the interpreter truncates).
    NaN stays NaN (its rounded bits could carry into the sign)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)
