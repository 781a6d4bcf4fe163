"""Triton code of :mod:`kernels.nsa_verify` (the wrappers, plan and docs live there).

Row packing shared by all three kernels: a program owns one (sequence x KV head, row tile); MMA
row ``m`` is draft row ``tile * ROWS + m // GROUP_PAD`` and query head ``kvh * GROUP +
m % GROUP_PAD`` (``GROUP_PAD`` = next power of two of ``G``, rows with ``m % GROUP_PAD >= G``
are padding). Softmax states are in the log2 domain (scores pre-multiplied by
``sm_scale * log2(e)``).

Partial states of a split (``SPLIT=True``): slot ``s`` of tile ``(bh, tile)`` holds ``m``, ``l``
(``[2, BLOCK_M]``) and the unnormalised ``acc`` (``[BLOCK_M, D]``) of one slice of one branch;
slots ``[0, c)`` are compressed, ``[c, c + s)`` selected, the rest window.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.tree import MAX_TREE_NODES

# Finite stand-in for -inf: masked scores and empty states stay finite, so no exp(-inf - -inf).
NEG_SENTINEL = tl.constexpr(-1.0e30)
# Larger than any block id: the "no more blocks" value of the union walk.
NO_BLOCK = tl.constexpr(2**30)
MAX_TREE_BIT = tl.constexpr(MAX_TREE_NODES - 1)


@triton.jit
def _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """Fold keys ``k`` / values ``v`` [N, D] into the state of ``q`` [M, D]; ``visible`` is a
    boolean broadcastable to [M, N]."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, N]
    s = tl.where(visible, s, NEG_SENTINEL)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    # Guard as well as the sentinel: a row with nothing visible has s == m_new == sentinel.
    p = tl.where(visible, tl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _chunk(n, chunk, n_chunks):
    """``[lo, hi)`` of slice ``chunk`` of ``n`` items cut into ``n_chunks`` equal slices."""
    per = tl.cdiv(n, n_chunks)
    lo = chunk * per
    return lo, tl.minimum(lo + per, n)


@triton.jit
def _comp_branch(q, ck_base, cv_base, stride_ct, nc, chunk, n_chunks, m_i, l_i, acc, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    lo, hi = _chunk(tl.cdiv(nc, BLOCK_N), chunk, n_chunks)
    for it in range(lo, hi):
        c = it * BLOCK_N + offs_n  # [N] compressed-token ids
        valid = c < nc
        off = c.to(tl.int64)[:, None] * stride_ct + offs_d[None, :]
        k = tl.load(ck_base + off, mask=valid[:, None], other=0.0)
        v = tl.load(cv_base + off, mask=valid[:, None], other=0.0)
        m_i, l_i, acc = _online_update(q, k, v, valid[None, :], m_i, l_i, acc, qk_scale,
                                       DOT_PRECISION)  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def _load_sel_tile(k_base, v_base, stride_kt, prefix, blk, sub, ok, BLOCK_SIZE: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    tok = blk.to(tl.int64) * BLOCK_SIZE + sub * BLOCK_N + tl.arange(0, BLOCK_N)
    # The prefix's last block may be partial; a tile past the walk's end (ok false) loads nothing.
    valid = tok < tl.where(ok, prefix, 0)
    off = tok[:, None] * stride_kt + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_base + off, mask=valid[:, None], other=0.0)
    v = tl.load(v_base + off, mask=valid[:, None], other=0.0)
    return k, v, valid


@triton.jit
def _next_block(idx_rows, blk):
    """Smallest block id in ``idx_rows`` above ``blk`` (``NO_BLOCK`` if none): registers only."""
    return tl.min(tl.where(idx_rows > blk, idx_rows, NO_BLOCK))


@triton.jit
def _sel_branch(q, k_base, v_base, stride_kt, prefix, idx_rows, chunk, n_chunks, m_i, l_i, acc,
                qk_scale, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """Walk the union of the tile's block lists ``idx_rows`` [M, TOP_N_PAD] in ascending block
    order, restricted to this slice's block-id range: each union block is loaded once and each
    row masks to its own list (SSV's exact merged schedule). The next block comes from
    registers alone, so its tile is loaded before the current one is computed on: a one-tile
    prefetch, which Triton's pipeliner cannot do for a data-dependent walk."""
    SUBS: tl.constexpr = BLOCK_SIZE // BLOCK_N
    lo, hi = _chunk(tl.cdiv(prefix, BLOCK_SIZE), chunk, n_chunks)
    first = _next_block(idx_rows, lo - 1)  # the -1 pads are never above lo - 1 >= -1
    # Count the union first (register reductions, no loads): Triton 3.6 cannot carry the
    # prefetched tile through a while loop, but can through a counted for loop.
    n_blocks = 0
    blk = first
    while blk < hi:
        n_blocks += 1
        blk = _next_block(idx_rows, blk)
    blk = first
    sub = blk * 0
    k, v, valid = _load_sel_tile(k_base, v_base, stride_kt, prefix, blk, sub, blk < hi,
                                 BLOCK_SIZE, HEAD_DIM, BLOCK_N)  # fmt: skip
    for _ in range(n_blocks * SUBS):
        member = tl.max((idx_rows == blk).to(tl.int32), 1) > 0  # [M] rows that chose blk
        last = sub == SUBS - 1
        nxt_blk = tl.where(last, _next_block(idx_rows, blk), blk)
        nxt_sub = tl.where(last, 0, sub + 1)
        k_n, v_n, valid_n = _load_sel_tile(k_base, v_base, stride_kt, prefix, nxt_blk, nxt_sub,
                                           nxt_blk < hi, BLOCK_SIZE, HEAD_DIM, BLOCK_N)  # fmt: skip
        m_i, l_i, acc = _online_update(q, k, v, member[:, None] & valid[None, :], m_i, l_i, acc,
                                       qk_scale, DOT_PRECISION)  # fmt: skip
        k, v, valid, blk, sub = k_n, v_n, valid_n, nxt_blk, nxt_sub
    return m_i, l_i, acc


@triton.jit
def _win_branch(q, k_base, v_base, stride_kt, prefix, num_t, window, row_bits, chunk, n_chunks,
                m_i, l_i, acc, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                DOT_PRECISION: tl.constexpr):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    start = tl.maximum(prefix - window, 0)
    end = prefix + num_t  # the window's prefix tokens and the draft tail are contiguous
    lo, hi = _chunk(tl.cdiv(end - start, BLOCK_N), chunk, n_chunks)
    for it in range(lo, hi):
        pos = start + it * BLOCK_N + offs_n
        in_seq = pos < end
        shift = tl.minimum(tl.maximum(pos - prefix, 0), MAX_TREE_BIT).to(tl.int64)
        bit = (row_bits[:, None] >> shift[None, :]) & 1  # [M, N] tail entry is an ancestor
        visible = in_seq[None, :] & ((pos < prefix)[None, :] | (bit != 0))
        off = pos.to(tl.int64)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_base + off, mask=in_seq[:, None], other=0.0)
        v = tl.load(v_base + off, mask=in_seq[:, None], other=0.0)
        m_i, l_i, acc = _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def _fold(out, gate, l_i, acc):
    """``out + gate * acc / l``; an empty branch (``l == 0``) adds 0, never 0 / 0."""
    w = tl.where(l_i > 0.0, gate / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
    return out + acc * w[:, None]


@triton.jit
def _load_gate(gate_ptr, gate_off, m_ok, BRANCH: tl.constexpr, APPLY_GATES: tl.constexpr):
    if APPLY_GATES:
        return tl.load(gate_ptr + gate_off + BRANCH, mask=m_ok, other=0.0).to(tl.float32)
    else:
        return 1.0


@triton.jit
def nsa_fwd_kernel(
    q_ptr, k_ptr, v_ptr,  # [B, t, H, D], [B, Hkv, T_max, D] x 2
    ck_ptr, cv_ptr,  # [B, Hkv, NC_max, D] x 2
    gate_ptr, idx_ptr, tree_ptr, prefix_ptr,  # [B,t,H,3], [B,Hkv,t,TOP_N] i32, [B,t] i64, [B] i32
    o_ptr,  # [B, t, H, D] (single pass)
    part_acc_ptr, part_ml_ptr,  # [B*Hkv, tiles, slots, BLOCK_M, D], [.., 2, BLOCK_M] fp32 (split)
    stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh,
    stride_kb, stride_kh, stride_kt, stride_cb, stride_ch, stride_ct,
    num_t, nc_max, window, comp_block, comp_stride, qk_scale,
    c_splits, s_splits, w_splits, slot_base, num_slots,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_N_SEL: tl.constexpr, TOP_N: tl.constexpr, TOP_N_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HAS_COMP: tl.constexpr, HAS_SEL: tl.constexpr,
    HAS_WIN: tl.constexpr, SPLIT: tl.constexpr, APPLY_GATES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * Hkv, row tiles, programs per tile)``. Single pass (``SPLIT=False``, one
    program per tile): every enabled branch in turn, each gated into ``out`` as it finishes, one
    softmax state live at a time, and ``o`` written. Split: program ``pid`` runs one slice of one
    branch (``c_splits`` compressed, then ``s_splits`` selected, then ``w_splits`` window
    programs) and writes its state to slot ``slot_base + pid``."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 keys per tile")
    tl.static_assert(BLOCK_N_SEL >= 16, "tl.dot needs at least 16 keys per tile")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs a head dim of at least 16")
    tl.static_assert(GROUP <= GROUP_PAD, "GROUP_PAD pads the head group")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    tl.static_assert(BLOCK_SIZE % BLOCK_N_SEL == 0, "selected sub-tiles tile a block exactly")
    tl.static_assert(TOP_N <= TOP_N_PAD, "TOP_N_PAD pads an index row")
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    NUM_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP

    bh = tl.program_id(0)
    tile = tl.program_id(1)
    pid = tl.program_id(2)
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = (bh % NUM_KV_HEADS).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row = tile * ROWS + offs_m // GROUP_PAD  # [M] draft row of each MMA row
    g = offs_m % GROUP_PAD
    row_ok = row < num_t
    m_ok = row_ok & (g < GROUP)
    head = kvh * GROUP + g  # [M] int64
    q_off = b * stride_qb + row * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    prefix = tl.load(prefix_ptr + b)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_kb + kvh * stride_kh
    ck_base = ck_ptr + b * stride_cb + kvh * stride_ch
    cv_base = cv_ptr + b * stride_cb + kvh * stride_ch
    gate_off = ((b * num_t + row) * NUM_HEADS + head) * 3  # [M] int64

    if HAS_COMP:
        nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
        nc = tl.minimum(nc, nc_max)
    if HAS_SEL:
        offs_s = tl.arange(0, TOP_N_PAD)
        idx_off = ((b * NUM_KV_HEADS + kvh) * num_t + row) * TOP_N  # [M] int64
        idx_rows = tl.load(
            idx_ptr + idx_off[:, None] + offs_s[None, :],
            mask=row_ok[:, None] & (offs_s < TOP_N)[None, :],
            other=-1,
        )  # [M, TOP_N_PAD]: each MMA row's own block list
    if HAS_WIN:
        row_bits = tl.load(tree_ptr + b * num_t + row, mask=row_ok, other=0)  # [M] int64

    m_i = tl.full([BLOCK_M], NEG_SENTINEL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if SPLIT:
        if HAS_COMP:
            if pid < c_splits:
                m_i, l_i, acc = _comp_branch(q, ck_base, cv_base, stride_ct, nc, pid, c_splits,
                                             m_i, l_i, acc, qk_scale, HEAD_DIM, BLOCK_N,
                                             DOT_PRECISION)  # fmt: skip
        if HAS_SEL:
            if (pid >= c_splits) & (pid < c_splits + s_splits):
                m_i, l_i, acc = _sel_branch(q, k_base, v_base, stride_kt, prefix, idx_rows,
                                            pid - c_splits, s_splits, m_i, l_i, acc, qk_scale,
                                            BLOCK_SIZE, HEAD_DIM, BLOCK_N_SEL,
                                            DOT_PRECISION)  # fmt: skip
        if HAS_WIN:
            if pid >= c_splits + s_splits:
                m_i, l_i, acc = _win_branch(q, k_base, v_base, stride_kt, prefix, num_t, window,
                                            row_bits, pid - c_splits - s_splits, w_splits, m_i,
                                            l_i, acc, qk_scale, HEAD_DIM, BLOCK_N,
                                            DOT_PRECISION)  # fmt: skip
        slot = ((bh * tl.num_programs(1) + tile) * num_slots + slot_base + pid).to(tl.int64)
        tl.store(part_ml_ptr + slot * 2 * BLOCK_M + offs_m, m_i)
        tl.store(part_ml_ptr + slot * 2 * BLOCK_M + BLOCK_M + offs_m, l_i)
        acc_off = slot * BLOCK_M * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(part_acc_ptr + acc_off, acc)
    else:
        out = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        if HAS_COMP:
            mc, lc, ac = _comp_branch(q, ck_base, cv_base, stride_ct, nc, 0, 1, m_i, l_i, acc,
                                      qk_scale, HEAD_DIM, BLOCK_N, DOT_PRECISION)  # fmt: skip
            out = _fold(out, _load_gate(gate_ptr, gate_off, m_ok, 0, APPLY_GATES), lc, ac)
        if HAS_SEL:
            ms, ls, as_ = _sel_branch(q, k_base, v_base, stride_kt, prefix, idx_rows, 0, 1, m_i,
                                      l_i, acc, qk_scale, BLOCK_SIZE, HEAD_DIM, BLOCK_N_SEL,
                                      DOT_PRECISION)  # fmt: skip
            out = _fold(out, _load_gate(gate_ptr, gate_off, m_ok, 1, APPLY_GATES), ls, as_)
        if HAS_WIN:
            mw, lw, aw = _win_branch(q, k_base, v_base, stride_kt, prefix, num_t, window,
                                     row_bits, 0, 1, m_i, l_i, acc, qk_scale, HEAD_DIM, BLOCK_N,
                                     DOT_PRECISION)  # fmt: skip
            out = _fold(out, _load_gate(gate_ptr, gate_off, m_ok, 2, APPLY_GATES), lw, aw)
        o_off = b * stride_ob + row * stride_ot + head * stride_oh
        tl.store(o_ptr + o_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=m_ok[:, None])  # fmt: skip


@triton.jit
def _merge_branch(out, ml_base, acc_base, slot_lo, n_slots, gate, BLOCK_M: tl.constexpr,
                  HEAD_DIM: tl.constexpr):  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.full([BLOCK_M], NEG_SENTINEL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for s in range(slot_lo, slot_lo + n_slots):
        m_s = tl.load(ml_base + s * 2 * BLOCK_M + offs_m)
        l_s = tl.load(ml_base + s * 2 * BLOCK_M + BLOCK_M + offs_m)
        a_s = tl.load(acc_base + s * BLOCK_M * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d)
        m_new = tl.maximum(m_i, m_s)
        # Both maxima are finite (the sentinel at worst): no -inf - -inf here either.
        alpha = tl.exp2(m_i - m_new)
        beta = tl.exp2(m_s - m_new)
        l_i = l_i * alpha + l_s * beta
        acc = acc * alpha[:, None] + a_s * beta[:, None]
        m_i = m_new
    return _fold(out, gate, l_i, acc)


@triton.jit
def nsa_merge_kernel(
    part_acc_ptr, part_ml_ptr, gate_ptr, o_ptr,  # partials as in nsa_fwd_kernel, [B,t,H,3], o
    stride_ob, stride_ot, stride_oh, num_t, c_splits, s_splits, w_splits, num_slots,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, APPLY_GATES: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * Hkv, row tiles)``: merge each branch's slots on its own, then gate."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    NUM_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP
    bh = tl.program_id(0)
    tile = tl.program_id(1)
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = (bh % NUM_KV_HEADS).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row = tile * ROWS + offs_m // GROUP_PAD
    g = offs_m % GROUP_PAD
    m_ok = (row < num_t) & (g < GROUP)
    head = kvh * GROUP + g
    gate_off = ((b * num_t + row) * NUM_HEADS + head) * 3
    base = (bh * tl.num_programs(1) + tile).to(tl.int64) * num_slots
    ml_base = part_ml_ptr + base * 2 * BLOCK_M
    acc_base = part_acc_ptr + base * BLOCK_M * HEAD_DIM
    out = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    gate = _load_gate(gate_ptr, gate_off, m_ok, 0, APPLY_GATES)
    out = _merge_branch(out, ml_base, acc_base, 0, c_splits, gate, BLOCK_M, HEAD_DIM)
    gate = _load_gate(gate_ptr, gate_off, m_ok, 1, APPLY_GATES)
    out = _merge_branch(out, ml_base, acc_base, c_splits, s_splits, gate, BLOCK_M, HEAD_DIM)
    gate = _load_gate(gate_ptr, gate_off, m_ok, 2, APPLY_GATES)
    out = _merge_branch(out, ml_base, acc_base, c_splits + s_splits, w_splits, gate, BLOCK_M,
                        HEAD_DIM)  # fmt: skip
    o_off = b * stride_ob + row * stride_ot + head * stride_oh
    tl.store(o_ptr + o_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m_ok[:, None])  # fmt: skip


@triton.jit
def block_score_kernel(
    q_ptr, ck_ptr, part_ml_ptr, prefix_ptr,  # [B,t,H,D], [B,Hkv,NC_max,D], partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32
    stride_qb, stride_qt, stride_qh, stride_cb, stride_ch, stride_ct,
    num_t, nc_max, nb_max, comp_block, comp_stride, qk_scale, c_splits, num_slots,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_J: tl.constexpr, BLOCK_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * Hkv, row tiles, NB_max / BLOCK_J)``: NSA block importance. The compressed
    softmax normaliser comes from the compressed partials (slots ``[0, c_splits)``); each
    compressed token's probability, summed over the tile's query heads, is added to every
    selection block its window overlaps (a 0/1 overlap matrix built from indices, applied by
    ``tl.dot``)."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_C >= 16, "tl.dot needs at least 16 compressed tokens per tile")
    tl.static_assert(BLOCK_J >= 16, "tl.dot needs at least 16 selection blocks per tile")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    bh = tl.program_id(0)
    tile = tl.program_id(1)
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

    ml_base = part_ml_ptr + (bh * tl.num_programs(1) + tile).to(tl.int64) * num_slots * 2 * BLOCK_M
    m_c = tl.full([BLOCK_M], NEG_SENTINEL, dtype=tl.float32)
    l_c = tl.zeros([BLOCK_M], dtype=tl.float32)
    for sl in range(0, c_splits):
        m_s = tl.load(ml_base + sl * 2 * BLOCK_M + offs_m)
        l_s = tl.load(ml_base + sl * 2 * BLOCK_M + BLOCK_M + offs_m)
        m_new = tl.maximum(m_c, m_s)
        l_c = l_c * tl.exp2(m_c - m_new) + l_s * tl.exp2(m_s - m_new)
        m_c = m_new
    # Padding rows and rows with no compressed token contribute nothing (and no 0 / 0).
    inv_l = tl.where(m_ok & (l_c > 0.0), 1.0 / tl.where(l_c > 0.0, l_c, 1.0), 0.0)

    prefix = tl.load(prefix_ptr + b)
    nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
    nc = tl.minimum(nc, nc_max)
    # Tokens i whose window [i * stride, i * stride + comp_block) overlaps blocks [j0, j0 +
    # BLOCK_J) are i in [c_lo, c_hi) (c_lo written without negative integer division).
    j0 = tl.program_id(2) * BLOCK_J
    first_tok = j0 * BLOCK_SIZE - comp_block + 1
    c_lo = tl.where(first_tok > 0, (first_tok + comp_stride - 1) // comp_stride, 0)
    c_hi = tl.minimum(nc, ((j0 + BLOCK_J) * BLOCK_SIZE - 1) // comp_stride + 1)
    offs_j = j0 + tl.arange(0, BLOCK_J)
    c_base = ck_ptr + b * stride_cb + kvh * stride_ch
    imp = tl.zeros([BLOCK_M, BLOCK_J], dtype=tl.float32)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        valid = c < c_hi
        k = tl.load(c_base + c.to(tl.int64)[:, None] * stride_ct + offs_d[None, :],
                    mask=valid[:, None], other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.where(valid[None, :], tl.exp2(s - m_c[:, None]), 0.0) * inv_l[:, None]
        start = c * comp_stride
        overlap = (start[:, None] < (offs_j[None, :] + 1) * BLOCK_SIZE) & (
            start[:, None] + comp_block > offs_j[None, :] * BLOCK_SIZE
        )  # [BLOCK_C, BLOCK_J]
        # fp32 "ieee": tf32 would round the probabilities and flip near-tied selections.
        imp += tl.dot(p, overlap.to(tl.float32), input_precision="ieee")
    imp = tl.sum(tl.reshape(imp, [ROWS, GROUP_PAD, BLOCK_J]), 1)  # sum over the query heads
    rows = tile * ROWS + tl.arange(0, ROWS)
    out_off = ((b * NUM_KV_HEADS + kvh) * num_t + rows)[:, None] * nb_max + offs_j[None, :]
    tl.store(score_ptr + out_off, imp, mask=(rows < num_t)[:, None] & (offs_j < nb_max)[None, :])
