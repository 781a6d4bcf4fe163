"""Triton code of the NSA refresh path's selection (:mod:`kernels.nsa_verify`): block
importance from the compressed branch's partial states, with the compressed scores computed
again from the compressed keys (``block_score_kernel``). Read from where the compressed launch
stored them instead, it is :mod:`kernels.nsa_stored_scores`'s; with the top-n pick in one
launch, :mod:`kernels.nsa_folded_pick`'s; the union plan of a row tile's picks is
:mod:`kernels.nsa_union_plan`'s."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.nsa_merge_kernels import NEG_SENTINEL
from ssvkit.kernels.pdl import pdl_gate


@triton.jit
def tile_queries_and_normaliser(
    bh,
    tile,
    num_tiles,
    q_ptr,
    part_ml_ptr,
    prefix_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    num_t,
    nc_max,
    comp_block,
    comp_stride,
    c_splits,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """What a block-scoring program of (sequence x KV head) ``bh`` and row tile ``tile`` needs
    before its compressed keys: the sequence and KV head, the tile's queries ``[BLOCK_M, D]``,
    each MMA row's compressed softmax maximum and inverse normaliser from the compressed
    partials (slots ``[0, c_splits)``; 0 for padding rows and rows without a compressed token),
    and the sequence's compressed token count. ``PDL``: the queries and the length load before
    ``pdl_gate``, the partials after."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = (bh % NUM_KV_HEADS).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row = tile * ROWS + offs_m // GROUP_PAD
    g = offs_m % GROUP_PAD
    m_ok = (row < num_t) & (g < GROUP)
    head = kvh * GROUP + g
    q_off = b * stride_qb + row * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    prefix = tl.load(prefix_ptr + b)
    pdl_gate(PDL)

    ml_base = part_ml_ptr + (bh * num_tiles + tile).to(tl.int64) * num_slots * 2 * BLOCK_M
    # Every compressed slot's (m, l) at once: [C_PAD, BLOCK_M], one round trip to memory.
    sl = tl.arange(0, C_PAD)
    ml_off = sl[:, None] * 2 * BLOCK_M + offs_m[None, :]
    sl_ok = (sl < c_splits)[:, None]
    m_s = tl.load(ml_base + ml_off, mask=sl_ok, other=NEG_SENTINEL)
    l_s = tl.load(ml_base + ml_off + BLOCK_M, mask=sl_ok, other=0.0)
    m_c = tl.max(m_s, 0)
    l_c = tl.sum(l_s * tl.exp2(m_s - m_c[None, :]), 0)
    # Padding rows and rows with no compressed token contribute nothing (and no 0 / 0).
    inv_l = tl.where(m_ok & (l_c > 0.0), 1.0 / tl.where(l_c > 0.0, l_c, 1.0), 0.0)

    nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
    nc = tl.minimum(nc, nc_max)
    return b, kvh, q, m_c, inv_l, nc


@triton.jit
def overlap_product(acc, p, ov, keys, OVERLAP_SPLIT: tl.constexpr):
    """``acc + p @ ov``: probabilities [M, C] onto blocks through the 0/1 overlap ``ov`` [C, J],
    accumulated in the MMA. One pass in the keys' 16-bit dtype (``keys``: the key tile) would
    round the probabilities and flip near-tied selections: ``OVERLAP_SPLIT`` splits p into its
    head in that dtype and the rest (the 0/1 overlap is exact), two passes that keep about
    twice its mantissa; on the H200 the block scoring runs faster with them than with two tf32
    passes. Without it (fp32 operands), one fp32 pass."""
    if OVERLAP_SPLIT:
        ov_k = ov.to(keys.dtype)
        head = p.to(keys.dtype)
        acc = tl.dot(head, ov_k, acc, out_dtype=tl.float32)
        acc = tl.dot((p - head.to(tl.float32)).to(keys.dtype), ov_k, acc, out_dtype=tl.float32)
    else:
        acc = tl.dot(p, ov, acc, input_precision="ieee")
    return acc


@triton.jit
def computed_importance(
    bh,
    tile,
    jb,
    num_tiles,
    q_ptr,
    ck_ptr,
    part_ml_ptr,
    prefix_ptr,  # [B,t,H,D], [B,Hkv,NC_max,D], partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32, rows score_stride apart
    stride_qb,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    nc_max,
    nb_max,
    score_stride,
    comp_block,
    comp_stride,
    qk_scale,
    c_splits,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OVERLAP_SPLIT: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """NSA block importance of blocks ``[jb * BLOCK_J, (jb + 1) * BLOCK_J)`` for the draft rows
    of row tile ``tile`` of (sequence x KV head) ``bh``. The compressed
    softmax normaliser comes from the compressed partials (slots ``[0, c_splits)``); each
    compressed token's probability, summed over the tile's query heads, is added to every
    selection block its window overlaps (a 0/1 overlap matrix built from indices, applied by
    ``tl.dot``). ``PDL``: the queries and the length load before ``pdl_gate``, the partials
    after."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_C >= 16, "tl.dot needs at least 16 compressed tokens per tile")
    tl.static_assert(BLOCK_J >= 16, "tl.dot needs at least 16 selection blocks per tile")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    offs_d = tl.arange(0, HEAD_DIM)
    b, kvh, q, m_c, inv_l, nc = tile_queries_and_normaliser(
        bh,
        tile,
        num_tiles,
        q_ptr,
        part_ml_ptr,
        prefix_ptr,
        stride_qb,
        stride_qt,
        stride_qh,
        num_t,
        nc_max,
        comp_block,
        comp_stride,
        c_splits,
        num_slots,
        NUM_KV_HEADS,
        GROUP,
        GROUP_PAD,
        HEAD_DIM,
        BLOCK_M,
        C_PAD,
        PDL,
    )
    # Tokens i whose window [i * stride, i * stride + comp_block) overlaps blocks [j0, j0 +
    # BLOCK_J) are i in [c_lo, c_hi) (c_lo written without negative integer division).
    j0 = jb * BLOCK_J
    first_tok = j0 * BLOCK_SIZE - comp_block + 1
    c_lo = tl.where(first_tok > 0, (first_tok + comp_stride - 1) // comp_stride, 0)
    c_hi = tl.minimum(nc, ((j0 + BLOCK_J) * BLOCK_SIZE - 1) // comp_stride + 1)
    offs_j = j0 + tl.arange(0, BLOCK_J)
    c_base = ck_ptr + b * stride_cb + kvh * stride_ch
    imp = tl.zeros([BLOCK_M, BLOCK_J], dtype=tl.float32)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        # Unpredicated loads of tokens clamped into [c_lo, c_hi); the -inf bias weighs the
        # tokens past c_hi 0 (m_c is finite: the partials start at the sentinel).
        c_ld = tl.minimum(c, c_hi - 1).to(tl.int64)
        k = tl.load(c_base + c_ld[:, None] * stride_ct + offs_d[None, :])
        bias = tl.where(c < c_hi, 0.0, float("-inf"))
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale + bias[None, :]
        p = tl.exp2(s - m_c[:, None]) * inv_l[:, None]
        # Window [start, start + comp_block) overlaps block [j * BS, (j + 1) * BS) iff
        # 0 <= start - j * BS + comp_block - 1 < BS + comp_block - 1: one unsigned compare.
        d = (c * comp_stride)[:, None] - (offs_j * BLOCK_SIZE)[None, :] + (comp_block - 1)
        overlap = d.to(tl.uint32) < (BLOCK_SIZE + comp_block - 1)  # [BLOCK_C, BLOCK_J]
        imp = overlap_product(imp, p, overlap.to(tl.float32), k, OVERLAP_SPLIT)
    imp = tl.sum(tl.reshape(imp, [ROWS, GROUP_PAD, BLOCK_J]), 1)  # sum over the query heads
    rows = tile * ROWS + tl.arange(0, ROWS)
    out_off = ((b * NUM_KV_HEADS + kvh) * num_t + rows)[:, None] * score_stride + offs_j[None, :]
    tl.store(score_ptr + out_off, imp, mask=(rows < num_t)[:, None] & (offs_j < nb_max)[None, :])


@triton.jit
def block_score_kernel(
    q_ptr,
    ck_ptr,
    part_ml_ptr,
    prefix_ptr,  # [B,t,H,D], [B,Hkv,NC_max,D], partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32, rows score_stride apart
    stride_qb,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    nc_max,
    nb_max,
    score_stride,
    comp_block,
    comp_stride,
    qk_scale,
    c_splits,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OVERLAP_SPLIT: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv, row tiles, NB_max / BLOCK_J)``: ``computed_importance`` of each
    program."""
    computed_importance(
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        tl.num_programs(1),
        q_ptr,
        ck_ptr,
        part_ml_ptr,
        prefix_ptr,
        score_ptr,
        stride_qb,
        stride_qt,
        stride_qh,
        stride_cb,
        stride_ch,
        stride_ct,
        num_t,
        nc_max,
        nb_max,
        score_stride,
        comp_block,
        comp_stride,
        qk_scale,
        c_splits,
        num_slots,
        NUM_KV_HEADS,
        GROUP,
        GROUP_PAD,
        HEAD_DIM,
        BLOCK_M,
        BLOCK_C,
        BLOCK_J,
        BLOCK_SIZE,
        DOT_PRECISION,
        OVERLAP_SPLIT,
        C_PAD,
        PDL,
    )
