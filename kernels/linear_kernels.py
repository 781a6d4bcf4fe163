"""The weight-streaming kernel of ``kernels.linear`` and its epilogues.

A program computes one tile of ``y.T`` (``BLOCK_N`` weight rows against all of ``x``'s rows)
over its share of the input dimension; with ``SPLIT`` programs a tile, each stores fp32
partials and the last to arrive sums them. The tile's sum then takes the epilogue the call
asks for: the input rows' pending RMSNorm scale, the bias, and one of three stores: the
products; ``silu(gate) * up`` of a tile whose halves are matching gate and up rows; or the
products added to a residual, stored with their product by the next norm's weight and their
squares summed over the tile's columns, so the next projection applies that norm (``linear``'s
``pending``) without a launch of its own.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import last_to_arrive


@triton.jit
def linear_kernel(
    x_ptr,  # [M, K], rows at stride_x
    w_ptr,  # [N, K], rows at stride_w; SWIGLU: the gate's N / 2 rows, then the up's
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [M, N] (SWIGLU: [M, N / 2]), rows at stride_y
    part_ptr,  # [SPLIT, M, N] fp32 partials (SPLIT > 1)
    count_ptr,  # [tiles] arrival counters (SPLIT > 1)
    res_ptr,  # [M, N] residual added to the product, rows at stride_res (ADD_NORM)
    nw_ptr,  # [N] weight of the norm of the sum (ADD_NORM)
    g_ptr,  # [M, N] the sum times the norm's weight, rows at stride_y (ADD_NORM)
    ss_out_ptr,  # [tiles, M] fp32 the sum's squares over each tile's columns (ADD_NORM)
    ss_in_ptr,  # [SS_PARTS, M] fp32 the input rows' squares in parts (ROW_SCALE)
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    stride_res,
    K_STEPS,  # BLOCK_K steps a program takes
    SS_PARTS,
    inv_dim,  # 1 / the normed rows' width (ROW_SCALE)
    eps,
    SS_BLOCK: tl.constexpr,  # SS_PARTS rounded up to a power of two
    HAS_BIAS: tl.constexpr,
    ADD_NORM: tl.constexpr,
    ROW_SCALE: tl.constexpr,
    SWIGLU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
):
    tile = tl.program_id(0)
    part = tl.program_id(1)
    lanes = tl.arange(0, BLOCK_N)
    if SWIGLU:
        # A tile's first half of weight rows are gate rows, its second half the matching up rows.
        HALF: tl.constexpr = BLOCK_N // 2
        cols = tile * HALF + lanes % HALF
        n_ok = cols < N // 2
        offs_n = cols + (lanes // HALF) * (N // 2)
    else:
        offs_n = tile * BLOCK_N + lanes
        n_ok = offs_n < N
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    out_mask = n_ok[:, None] & m_ok[None, :]
    # What the epilogue reads besides the products, loaded before the walk and used after it,
    # so that the loads' latency hides behind the weight's stream: the input rows' squares in
    # parts (their pending norm's scale), the bias, the residual, the next norm's weight.
    parts = tl.arange(0, SS_BLOCK)
    ss_mask = (parts < SS_PARTS)[:, None] & m_ok[None, :] & ROW_SCALE
    ss = tl.load(ss_in_ptr + parts[:, None] * M + offs_m[None, :], mask=ss_mask, other=0.0)
    bias = tl.load(b_ptr + offs_n, mask=n_ok & HAS_BIAS, other=0.0)
    res_offs = offs_m[None, :] * stride_res + offs_n[:, None]
    res = tl.load(res_ptr + res_offs, mask=out_mask & ADD_NORM, other=0.0)
    norm_w = tl.load(nw_ptr + offs_n, mask=n_ok & ADD_NORM, other=0.0)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_x
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    k_start = part * K_STEPS * BLOCK_K
    for step in range(K_STEPS):
        offs_k = k_start + step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_cols + offs_k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
    if SPLIT == 1:
        _store_tile(
            acc, ss, bias, res, norm_w, inv_dim, eps, tile, offs_n, n_ok, offs_m, m_ok, N,
            y_ptr, stride_y, g_ptr, ss_out_ptr, M, ROW_SCALE, HAS_BIAS, ADD_NORM, SWIGLU,
            BLOCK_N, BLOCK_M,
        )  # fmt: skip
    else:
        p_offs = offs_m[None, :] * N + offs_n[:, None]
        tl.store(part_ptr + part * M * N + p_offs, acc, mask=out_mask)
        if last_to_arrive(count_ptr + tile, SPLIT):
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(SPLIT):
                total += tl.load(
                    part_ptr + s * M * N + p_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            _store_tile(
                total, ss, bias, res, norm_w, inv_dim, eps, tile, offs_n, n_ok, offs_m, m_ok, N,
                y_ptr, stride_y, g_ptr, ss_out_ptr, M, ROW_SCALE, HAS_BIAS, ADD_NORM, SWIGLU,
                BLOCK_N, BLOCK_M,
            )  # fmt: skip


@triton.jit
def _store_tile(
    acc,
    ss,
    bias,
    res,
    norm_w,
    inv_dim,
    eps,
    tile,
    offs_n,
    n_ok,
    offs_m,
    m_ok,
    N,
    y_ptr,
    stride_y,
    g_ptr,
    ss_out_ptr,
    M,
    ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ADD_NORM: tl.constexpr,
    SWIGLU: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """A tile's summed products ``acc`` [BLOCK_N, BLOCK_M] (y.T) finished and stored: scaled by
    the input rows' pending norm (ROW_SCALE: ``ss`` their squares in parts; the norm's weight is
    in the rows already), the bias added; then stored as they are, as ``silu(gate) * up`` of
    the tile's two halves (SWIGLU), or added to the residual ``res`` (ADD_NORM) and stored with
    the sum's product by the next norm's weight ``norm_w`` and its squares summed over the
    tile's columns."""
    dtype = y_ptr.dtype.element_ty
    if ROW_SCALE:
        acc = acc * tl.rsqrt(tl.sum(ss, axis=0) * inv_dim + eps)[None, :]
    if HAS_BIAS:
        acc += bias.to(tl.float32)[:, None]
    if ADD_NORM:
        acc += res.to(tl.float32)
    if SWIGLU:
        HALF: tl.constexpr = BLOCK_N // 2
        gate, up = tl.split(tl.permute(tl.reshape(acc, [2, HALF, BLOCK_M]), [1, 2, 0]))
        cols = tile * HALF + tl.arange(0, HALF)
        mask = (cols < N // 2)[:, None] & m_ok[None, :]
        out = gate * tl.sigmoid(gate) * up
        tl.store(y_ptr + offs_m[None, :] * stride_y + cols[:, None], out.to(dtype), mask=mask)
    else:
        mask = n_ok[:, None] & m_ok[None, :]
        y_offs = offs_m[None, :] * stride_y + offs_n[:, None]
        s = acc.to(dtype)
        tl.store(y_ptr + y_offs, s, mask=mask)
        if ADD_NORM:
            # The sum as stored (rounded to the output's dtype) is what the norm reads.
            sf = tl.where(mask, s.to(tl.float32), 0.0)
            tl.store(g_ptr + y_offs, (sf * norm_w.to(tl.float32)[:, None]).to(dtype), mask=mask)
            tl.store(ss_out_ptr + tile * M + offs_m, tl.sum(sf * sf, axis=0), mask=m_ok)
