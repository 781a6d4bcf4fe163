"""The NSA refresh path's block importance with the compressed scores computed again, mapped onto
the selection blocks by one overlap band that every key tile shares (``NsaVerifyConfig(score_map=
"band")``; :mod:`kernels.nsa_selection` launches it).

Compressed token ``c`` covers prefix tokens ``[c * stride, c * stride + comp_block)``; where the
selection block size is a multiple of the stride (``R = block_size / stride`` tokens start in each
block), block ``j`` overlaps tokens ``[j * R - E, j * R + R)`` with ``E = (comp_block - 1) //
stride`` (``band_geometry``). A key tile of ``BLOCK_C`` tokens starting at ``j0 * R - E`` then
holds every token of the ``JB = (BLOCK_C - E) // R`` blocks from ``j0`` on, and the 0/1 matrix
mapping its tokens onto those blocks (token ``i`` overlaps block ``jj`` iff ``0 <= i - jj * R <
R + E``) is the same for every tile: the kernel builds it once, where ``block_score_kernel``
builds a ``BLOCK_C x BLOCK_J`` matrix per tile for the few blocks the tile's tokens touch. Each
tile's ``JB`` blocks are complete when it ends, so their importance is stored there (the tiles of
a program read ``E`` tokens twice).
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.nsa_select_kernels import overlap_product, tile_queries_and_normaliser


def band_geometry(block_size: int, comp_block: int, comp_stride: int, block_c: int):
    """``(R, E, JB)`` of the band (module docstring), or None where the block size is no multiple
    of the stride or a tile of ``block_c`` tokens holds no whole block."""
    if block_size % comp_stride:
        return None
    r = block_size // comp_stride
    e = (comp_block - 1) // comp_stride
    jb = (block_c - e) // r
    return (r, e, jb) if jb >= 1 else None


@triton.jit
def band_score_kernel(
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
    band_r,
    band_e,
    band_jb,
    tiles_per_program,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    JB_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OVERLAP_SPLIT: tl.constexpr,
    C_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv, row tiles, cdiv(NB_max, band_jb * tiles_per_program))``: the importance
    of ``band_jb * tiles_per_program`` blocks for the draft rows of one row tile, one key tile of
    ``BLOCK_C`` compressed tokens per ``band_jb`` blocks. The compressed softmax normaliser
    comes from the compressed partials (slots ``[0, c_splits)``), as ``block_score_kernel``'s;
    each token's probability, summed over the tile's query heads, is added to every block its
    window overlaps. ``PDL``: the queries and the length load before ``pdl_gate``, the partials
    after."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_C >= 16, "tl.dot needs at least 16 compressed tokens per tile")
    tl.static_assert(JB_PAD >= 16, "tl.dot needs at least 16 selection blocks per tile")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    bh = tl.program_id(0)
    tile = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    b, kvh, q, m_c, inv_l, nc = tile_queries_and_normaliser(
        bh,
        tile,
        tl.num_programs(1),
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
    offs_i = tl.arange(0, BLOCK_C)
    offs_jj = tl.arange(0, JB_PAD)
    # The band, once: token i of a tile overlaps its block jj iff 0 <= i - jj * R < R + E.
    rel = offs_i[:, None] - offs_jj[None, :] * band_r
    ov = ((rel.to(tl.uint32) < band_r + band_e) & (offs_jj < band_jb)[None, :]).to(tl.float32)
    c_base = ck_ptr + b * stride_cb + kvh * stride_ch
    rows = tile * ROWS + tl.arange(0, ROWS)
    out_base = ((b * NUM_KV_HEADS + kvh) * num_t + rows)[:, None] * score_stride
    j_first = tl.program_id(2) * band_jb * tiles_per_program
    for k in range(tiles_per_program):
        j0 = j_first + k * band_jb
        c = j0 * band_r - band_e + offs_i
        c_ok = (c >= 0) & (c < nc)
        # Loads of tokens clamped into [0, nc), predicated only on there being any: a token
        # outside gets the -inf bias (weight 0), and a prefix without compressed tokens reads
        # nothing and scores every block 0.
        c_ld = tl.maximum(tl.minimum(c, nc - 1), 0).to(tl.int64)
        any_c = offs_i < tl.where(nc > 0, BLOCK_C, 0)  # [BLOCK_C]: one uniform predicate
        k_tile = tl.load(
            c_base + c_ld[:, None] * stride_ct + offs_d[None, :], mask=any_c[:, None], other=0.0
        )
        bias = tl.where(c_ok, 0.0, float("-inf"))
        s = tl.dot(q, tl.trans(k_tile), input_precision=DOT_PRECISION) * qk_scale + bias[None, :]
        p = tl.exp2(s - m_c[:, None]) * inv_l[:, None]
        imp = tl.zeros([BLOCK_M, JB_PAD], dtype=tl.float32)
        imp = overlap_product(imp, p, ov, k_tile, OVERLAP_SPLIT)
        imp = tl.sum(tl.reshape(imp, [ROWS, GROUP_PAD, JB_PAD]), 1)  # over the query heads
        j = j0 + offs_jj
        ok = (rows < num_t)[:, None] & ((offs_jj < band_jb) & (j < nb_max))[None, :]
        tl.store(score_ptr + out_base + j[None, :], imp, mask=ok)
