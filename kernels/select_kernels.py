"""Triton code of :mod:`kernels.select_blocks`' launches: the block scores alone
(``block_scores_kernel``, then ``kernels.top_blocks`` picks in a second launch), and scores and
pick in one launch (``select_kernel``); the block metadata's kernel is
:mod:`kernels.block_metadata_kernels`'.

``score_range`` is the scoring of one program: it averages its KV head's ``G`` queries once,
then scores ``TILES`` consecutive tiles of ``BLOCK_NB`` blocks in a loop pipelined over
``NUM_STAGES`` tiles, as ``[T_PAD, BLOCK_NB]`` matrix products against the metadata. The
metadata holds each fp32 summary in two bf16 parts (``kernels.block_metadata``), and the
averaged query is split the same way once per program, so a product is three bf16 MMAs
(``hi.hi + hi.lo + lo.hi``, ``PRECISION`` "bf16x3": within ~2^-16 of the fp32 dot) with no
conversion of the streamed tiles; the interpreter ("ieee") multiplies the fp32 sums of the parts
instead. A head dimension of twice ``D_CHUNK`` is scored in two halves, each a product of
``D_CHUNK`` columns, so that a tile's operands in registers stay the size they have at
``D_CHUNK``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import arrive, leave, take_ticket, wait_for
from ssvkit.kernels.block_metadata_kernels import bf16_parts
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.tile_pick_kernels import ordered_max
from ssvkit.kernels.top_blocks_kernels import threshold_pick


@triton.jit
def score_range(
    q_ptr,
    mean_ptr,
    min_ptr,
    max_ptr,
    prefix_ptr,
    out_ptr,
    pid_n,
    h,
    b,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_mp,
    stride_ob,
    stride_oh,
    stride_ot,
    num_rows,
    num_blocks,
    tmax_ptr,
    stride_xb,
    stride_xh,
    num_tiles,
    G: tl.constexpr,
    T_PAD: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    D: tl.constexpr,
    D_CHUNK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUEST: tl.constexpr,
    PRECISION: tl.constexpr,
    TILE_MAX: tl.constexpr,
    PDL: tl.constexpr,
):
    """Scores of blocks ``[pid_n * TILES * BLOCK_NB, (pid_n + 1) * TILES * BLOCK_NB)`` of KV head
    ``h`` of sequence ``b`` for every query row; ``-inf`` past the prefix. ``TILE_MAX``:
    each tile's maximum per row too (``kernels.tile_pick_kernels.ordered_max``), into
    ``[.., num_tiles]`` int32 rows at ``tmax_ptr``. ``PDL``: the queries and the length load
    before ``pdl_gate``, the metadata after."""
    tl.static_assert(T_PAD >= 16)  # tl.dot needs >= 16 rows
    tl.static_assert(BLOCK_NB >= 16)
    tl.static_assert(D == D_CHUNK or D == 2 * D_CHUNK)
    offs_t = tl.arange(0, T_PAD)
    offs_d = tl.arange(0, D_CHUNK)
    row_ok = offs_t < num_rows

    q_base = q_ptr + b.to(tl.int64) * stride_qb + (h * G).to(tl.int64) * stride_qh
    q_offs = offs_t[:, None].to(tl.int64) * stride_qt + offs_d[None, :]
    qbar = mean_query(q_base, q_offs, row_ok, stride_qh, G, T_PAD, D_CHUNK)  # [T_PAD, D_CHUNK]
    if QUEST:
        pos_hi, pos_lo = split_query(tl.maximum(qbar, 0.0), PRECISION)
        neg_hi, neg_lo = split_query(tl.minimum(qbar, 0.0), PRECISION)
    else:
        q_hi, q_lo = split_query(qbar, PRECISION)
    if D > D_CHUNK:
        qbar2 = mean_query(q_base + D_CHUNK, q_offs, row_ok, stride_qh, G, T_PAD, D_CHUNK)
        if QUEST:
            pos_hi2, pos_lo2 = split_query(tl.maximum(qbar2, 0.0), PRECISION)
            neg_hi2, neg_lo2 = split_query(tl.minimum(qbar2, 0.0), PRECISION)
        else:
            q_hi2, q_lo2 = split_query(qbar2, PRECISION)
    prefix_len = tl.load(prefix_ptr + b)
    m_base = b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    o_base = out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    o_base += offs_t[:, None].to(tl.int64) * stride_ot
    x_base = tmax_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh
    x_base += offs_t.to(tl.int64) * num_tiles
    pdl_gate(PDL)

    for i in tl.range(0, TILES, num_stages=NUM_STAGES):
        offs_nb = (pid_n * TILES + i) * BLOCK_NB + tl.arange(0, BLOCK_NB)
        blk_ok = offs_nb < num_blocks
        m_offs = m_base + offs_nb[:, None].to(tl.int64) * stride_mn + offs_d[None, :]
        if QUEST:
            # max(q*lo, q*hi) = relu(q)*hi + min(q, 0)*lo, elementwise: two matrix products.
            s = part_dot(pos_hi, pos_lo, max_ptr, m_offs, stride_mp, blk_ok, PRECISION)
            s += part_dot(neg_hi, neg_lo, min_ptr, m_offs, stride_mp, blk_ok, PRECISION)
            if D > D_CHUNK:
                m_2 = m_offs + D_CHUNK
                s += part_dot(pos_hi2, pos_lo2, max_ptr, m_2, stride_mp, blk_ok, PRECISION)
                s += part_dot(neg_hi2, neg_lo2, min_ptr, m_2, stride_mp, blk_ok, PRECISION)
        else:
            s = part_dot(q_hi, q_lo, mean_ptr, m_offs, stride_mp, blk_ok, PRECISION)
            if D > D_CHUNK:
                m_2 = m_offs + D_CHUNK
                s += part_dot(q_hi2, q_lo2, mean_ptr, m_2, stride_mp, blk_ok, PRECISION)
        live = offs_nb.to(tl.int64) * BLOCK_SIZE < prefix_len
        s = tl.where(live[None, :], s, -float("inf"))
        tl.store(o_base + offs_nb[None, :], s, mask=row_ok[:, None] & blk_ok[None, :])
        if TILE_MAX:
            tile = pid_n * TILES + i
            tiles_ok = tl.where(row_ok, tile, num_tiles) < num_tiles
            tl.store(x_base + tile, ordered_max(s, 1), mask=tiles_ok)


@triton.jit
def mean_query(
    q_base, q_offs, row_ok, stride_qh, G: tl.constexpr, T_PAD: tl.constexpr, D_CHUNK: tl.constexpr
):
    """``[T_PAD, D_CHUNK]`` fp32 mean of the ``G`` query heads at ``q_base`` (rows past
    ``row_ok`` zero)."""
    qbar = tl.zeros([T_PAD, D_CHUNK], dtype=tl.float32)
    for g in tl.static_range(G):
        qbar += tl.load(q_base + g * stride_qh + q_offs, mask=row_ok[:, None], other=0.0).to(
            tl.float32
        )
    return qbar / G


@triton.jit
def split_query(q, PRECISION: tl.constexpr):
    """The operands of ``part_dot`` for the fp32 query tile ``q``: its bf16 parts ("bf16x3"),
    or ``q`` itself twice ("ieee", the second unused)."""
    if PRECISION == "bf16x3":
        q_hi, q_lo = bf16_parts(q)
    else:
        q_hi = q
        q_lo = q
    return q_hi, q_lo


@triton.jit
def part_dot(q_hi, q_lo, ptr, m_offs, stride_mp, blk_ok, PRECISION: tl.constexpr):
    """``[T_PAD, BLOCK_NB]`` dots of a query tile (``split_query``'s operands) with the blocks'
    summaries at ``m_offs``, stored as bf16 parts ``stride_mp`` apart: three bf16 MMAs
    accumulated in fp32 (the parts' product but for ``lo . lo``), or the fp32 product of the
    parts' sum in the interpreter."""
    k_hi = tl.load(ptr + m_offs, mask=blk_ok[:, None], other=0.0)  # [BLOCK_NB, D_CHUNK]
    k_lo = tl.load(ptr + m_offs + stride_mp, mask=blk_ok[:, None], other=0.0)
    if PRECISION == "bf16x3":
        s = tl.dot(q_hi, tl.trans(k_hi))
        s = tl.dot(q_hi, tl.trans(k_lo), s)
        s = tl.dot(q_lo, tl.trans(k_hi), s)
    else:
        k = k_hi.to(tl.float32) + k_lo.to(tl.float32)
        s = tl.dot(q_hi, tl.trans(k), input_precision="ieee")
    return s


@triton.jit
def block_scores_kernel(
    q_ptr,
    mean_ptr,
    min_ptr,
    max_ptr,
    prefix_ptr,
    out_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_mp,
    stride_ob,
    stride_oh,
    stride_ot,
    num_rows,
    num_blocks,
    tmax_ptr,
    stride_xb,
    stride_xh,
    num_tiles,
    G: tl.constexpr,
    T_PAD: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    D: tl.constexpr,
    D_CHUNK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUEST: tl.constexpr,
    PRECISION: tl.constexpr,
    TILE_MAX: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(cdiv(NB, TILES * BLOCK_NB), Hkv, B)``: ``score_range`` of each program."""
    score_range(
        q_ptr,
        mean_ptr,
        min_ptr,
        max_ptr,
        prefix_ptr,
        out_ptr,
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        stride_qb,
        stride_qt,
        stride_qh,
        stride_mb,
        stride_mh,
        stride_mn,
        stride_mp,
        stride_ob,
        stride_oh,
        stride_ot,
        num_rows,
        num_blocks,
        tmax_ptr,
        stride_xb,
        stride_xh,
        num_tiles,
        G,
        T_PAD,
        BLOCK_NB,
        TILES,
        NUM_STAGES,
        D,
        D_CHUNK,
        BLOCK_SIZE,
        QUEST,
        PRECISION,
        TILE_MAX,
        PDL,
    )


@triton.jit
def select_kernel(
    q_ptr,
    mean_ptr,
    min_ptr,
    max_ptr,
    prefix_ptr,
    score_ptr,  # [B, Hkv, t, NB] fp32 scratch, rows stride_ot apart
    out_ptr,  # [B, Hkv, t, TOP_N + LOCAL_SLOTS] i32
    scratch_ptr,  # [B * Hkv * t, CAP] i64
    counter_ptr,  # 1 + 2 * B * Hkv zeroed i32 counters (kernels.arrivals)
    pos_ptr,  # [B, t] i64 row positions (read where LOCAL_SLOTS > 0)
    stride_qb,
    stride_qt,
    stride_qh,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_mp,
    stride_ob,
    stride_oh,
    stride_ot,
    num_rows,
    num_blocks,
    tmax_ptr,
    stride_xb,
    stride_xh,
    num_tiles,
    num_sink,
    num_local,
    window,
    score_programs,
    NUM_KV_HEADS: tl.constexpr,
    G: tl.constexpr,
    T_PAD: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    D: tl.constexpr,
    D_CHUNK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUEST: tl.constexpr,
    PRECISION: tl.constexpr,
    TILE_MAX: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    TAIL: tl.constexpr,
    GROUPS: tl.constexpr,
    TAIL_ROWS: tl.constexpr,
    CAP: tl.constexpr,
    LOCAL_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * (score_programs + t),)``: the scores and the top-n pick of every row
    in one launch.

    ``kernels.arrivals``' tickets (counter 0): tickets below ``B * Hkv * score_programs`` score
    a block range of one (sequence, KV head) (``score_range``) and arrive on that pair's counter
    (counters ``1 + pair``); each later ticket picks one row
    (``kernels.top_blocks_kernels.threshold_pick``, scores read from L2) once every score program of
    its pair has arrived, and counts itself out (counters ``1 + B * Hkv + pair``). A row's pick
    runs in one program, as in the two-launch path, so a pair's rows are picked side by side
    (the pair's last score program alone would pick them one after another). With ``PDL``
    every program waits (``pdl_gate``) before its ticket."""
    pdl_gate(PDL)
    num_pairs = tl.num_programs(0) // (score_programs + num_rows)
    arrive_ptr = counter_ptr + 1
    done_ptr = counter_ptr + 1 + num_pairs
    ticket = take_ticket(counter_ptr)
    num_scoring = num_pairs * score_programs
    if ticket < num_scoring:
        pair = ticket // score_programs
        score_range(
            q_ptr,
            mean_ptr,
            min_ptr,
            max_ptr,
            prefix_ptr,
            score_ptr,
            ticket % score_programs,
            pair % NUM_KV_HEADS,
            pair // NUM_KV_HEADS,
            stride_qb,
            stride_qt,
            stride_qh,
            stride_mb,
            stride_mh,
            stride_mn,
            stride_mp,
            stride_ob,
            stride_oh,
            stride_ot,
            num_rows,
            num_blocks,
            tmax_ptr,
            stride_xb,
            stride_xh,
            num_tiles,
            G,
            T_PAD,
            BLOCK_NB,
            TILES,
            NUM_STAGES,
            D,
            D_CHUNK,
            BLOCK_SIZE,
            QUEST,
            PRECISION,
            TILE_MAX,
            False,
        )
        arrive(arrive_ptr + pair)
    else:
        r = ticket - num_scoring  # row (b * Hkv + h) * t + i
        pair = r // num_rows
        wait_for(arrive_ptr + pair, score_programs)
        threshold_pick(
            r,
            score_ptr,
            prefix_ptr,
            out_ptr,
            scratch_ptr,
            pos_ptr,
            num_rows,
            num_blocks,
            stride_ot,
            num_sink,
            num_local,
            window,
            NUM_KV_HEADS,
            BLOCK_SIZE,
            TOP_N,
            TOP_N_PAD,
            CHUNK,
            TAIL,
            GROUPS,
            TAIL_ROWS,
            CAP,
            LOCAL_SLOTS,
            ".cg",
            False,
        )
        leave(arrive_ptr + pair, done_ptr + pair, num_rows)
