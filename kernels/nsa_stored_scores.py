"""Triton code of the NSA refresh path's block importance from the compressed scores its
compressed launch stored (``stored_block_score_kernel``; where it stores them:
``perfmodel.nsa_plan.stores_scores``), normalised by the compressed branch's partial states
and folded onto the selection blocks. Computed again from the compressed keys instead, it is
:mod:`kernels.nsa_select_kernels`'s."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.nsa_merge_kernels import NEG_SENTINEL
from ssvkit.kernels.pdl import pdl_gate


@triton.jit
def stored_importance(
    pid,
    r,
    jb,
    s_ptr,  # [B*Hkv*tiles, ROWS * GROUP, NC_max] fp32 compressed scores (nsa_fwd_kernel)
    part_ml_ptr,
    prefix_ptr,  # compressed partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32, rows score_stride apart
    num_t,
    num_tiles,
    nc_max,
    nb_max,
    score_stride,
    comp_block,
    comp_stride,
    c_splits,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    W_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """NSA block importance of blocks ``[jb * BLOCK_J, (jb + 1) * BLOCK_J)`` for draft row ``r``
    of (sequence x KV head, row tile) ``pid`` (nothing for a row past ``num_t``). Each of the
    row's ``GROUP`` query heads gets its compressed softmax normaliser from the compressed
    partials (slots ``[0, c_splits)``); each compressed token's probability, from the score the
    compressed launch stored, summed over the heads, is added to every selection block its
    window overlaps. Block ``j`` overlaps the compressed tokens
    ``[c_lo(j), c_hi(j)]``, at most ``W_PAD`` of them, gathered as ``[BLOCK_J, W_PAD]``.
    ``PDL``: the length loads before ``pdl_gate``, the partials and scores after."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    row = (pid % num_tiles) * ROWS + r
    if row < num_t:
        bh = pid // num_tiles
        b = bh // NUM_KV_HEADS
        prefix = tl.load(prefix_ptr + b)
        nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
        nc = tl.minimum(nc, nc_max)
        # Tokens i whose window [i * stride, i * stride + comp_block) overlaps block j
        # (c_lo written without negative integer division).
        offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
        first_tok = offs_j * BLOCK_SIZE - comp_block + 1
        c_lo = tl.where(first_tok > 0, (first_tok + comp_stride - 1) // comp_stride, 0)
        c_hi = tl.minimum(nc, (offs_j * BLOCK_SIZE + BLOCK_SIZE - 1) // comp_stride + 1)
        c = c_lo[:, None] + tl.arange(0, W_PAD)[None, :]  # [BLOCK_J, W_PAD]
        valid = c < c_hi[:, None]
        pdl_gate(PDL)
        ml_base = part_ml_ptr + pid.to(tl.int64) * num_slots * 2 * BLOCK_M
        sl = tl.arange(0, C_PAD)
        sl_ok = sl < c_splits
        imp = tl.zeros([BLOCK_J], dtype=tl.float32)
        for g in tl.static_range(GROUP):
            m = r * GROUP_PAD + g
            # Every compressed slot's (m, l) of this MMA row: one round trip to memory.
            m_s = tl.load(ml_base + sl * 2 * BLOCK_M + m, mask=sl_ok, other=NEG_SENTINEL)
            l_s = tl.load(ml_base + sl * 2 * BLOCK_M + BLOCK_M + m, mask=sl_ok, other=0.0)
            m_c = tl.max(m_s, 0)
            l_c = tl.sum(l_s * tl.exp2(m_s - m_c), 0)
            inv_l = tl.where(l_c > 0.0, 1.0 / tl.where(l_c > 0.0, l_c, 1.0), 0.0)
            s_row = ((pid.to(tl.int64) * ROWS + r) * GROUP + g) * nc_max
            s = tl.load(s_ptr + s_row + c, mask=valid, other=NEG_SENTINEL)
            p = tl.where(valid, tl.exp2(s - m_c), 0.0) * inv_l
            imp += tl.sum(p, 1)
        out_off = (bh.to(tl.int64) * num_t + row) * score_stride + offs_j
        tl.store(score_ptr + out_off, imp, mask=offs_j < nb_max)


@triton.jit
def stored_block_score_kernel(
    s_ptr,  # [B*Hkv*tiles, ROWS * GROUP, NC_max] fp32 compressed scores (nsa_fwd_kernel)
    part_ml_ptr,
    prefix_ptr,  # compressed partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32, rows score_stride apart
    num_t,
    num_tiles,
    nc_max,
    nb_max,
    score_stride,
    comp_block,
    comp_stride,
    c_splits,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    W_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles, rows per tile, NB_max / BLOCK_J)``: ``stored_importance`` of
    each program."""
    stored_importance(
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        s_ptr,
        part_ml_ptr,
        prefix_ptr,
        score_ptr,
        num_t,
        num_tiles,
        nc_max,
        nb_max,
        score_stride,
        comp_block,
        comp_stride,
        c_splits,
        num_slots,
        NUM_KV_HEADS,
        GROUP,
        GROUP_PAD,
        BLOCK_M,
        BLOCK_J,
        W_PAD,
        BLOCK_SIZE,
        C_PAD,
        PDL,
    )
