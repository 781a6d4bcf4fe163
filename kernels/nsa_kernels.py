"""Triton code of :mod:`kernels.nsa_verify` (the wrappers, plan and docs live there).

Row packing shared by the kernels: a program owns one (sequence x KV head, row tile); MMA row
``m`` is draft row ``tile * ROWS + m // GROUP_PAD`` and query head ``kvh * GROUP + m %
GROUP_PAD`` (``GROUP_PAD`` = next power of two of ``G``, rows with ``m % GROUP_PAD >= G`` are
padding). Softmax states are in the log2 domain (scores pre-multiplied by ``sm_scale *
log2(e)``).

Work units: the compressed branch is ``ceil(nc / BLOCK_N)`` tiles of compressed tokens, the
selected branch ``BLOCK_SIZE / BLOCK_N`` tiles per entry of the tile's union list, the window
branch ``ceil((window + t) / BLOCK_N)`` tiles from ``prefix - window`` on. A forward program takes
an equal slice of one branch's units and writes its state to one slot: ``m``, ``l``
(``[2, BLOCK_M]``) and the unnormalised ``acc`` (``[BLOCK_M, D]``); slots ``[0, c)`` are
compressed, ``[c, c + s)`` selected, the rest window.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.tree import MAX_TREE_NODES

# Finite stand-in for -inf: masked scores and empty states stay finite, so no exp(-inf - -inf).
NEG_SENTINEL = tl.constexpr(-1.0e30)
# Larger than any block id: "no block" in the top-n selection.
NO_BLOCK = tl.constexpr(2**30)
# Above every top-n key (``_block_keys``): the "previous pick" before the first round.
NO_KEY = tl.constexpr(2**63 - 1)
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
    lo = tl.minimum(chunk * per, n)
    return lo, tl.minimum(lo + per, n)


@triton.jit
def _tail_update(
    q,
    k_base,
    v_base,
    stride_t,
    prefix,
    num_t,
    row_bits,
    m_i,
    l_i,
    acc,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    T_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold the draft tail (entries ``prefix + j``, ``j < num_t``) into the state: row ``i``
    sees entry ``j`` when bit ``j`` of its ancestor mask is set."""
    offs_j = tl.arange(0, T_PAD)
    tail_ok = offs_j < num_t
    pos = prefix + offs_j
    off = pos.to(tl.int64)[:, None] * stride_t + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_base + off, mask=tail_ok[:, None], other=0.0)
    v = tl.load(v_base + off, mask=tail_ok[:, None], other=0.0)
    shift = tl.minimum(offs_j, MAX_TREE_BIT).to(tl.int64)
    seen = ((row_bits[:, None] >> shift[None, :]) & 1) != 0
    return _online_update(q, k, v, seen & tail_ok[None, :], m_i, l_i, acc, qk_scale, DOT_PRECISION)


@triton.jit
def nsa_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,  # [B, t, H, D], [B, Hkv, T_max, D] x 2
    ck_ptr,
    cv_ptr,  # [B, Hkv, NC_max, D] x 2
    list_ptr,
    bits_ptr,
    count_ptr,  # union plan: [B, Hkv, tiles, LIST] i32 x 2, [B, Hkv, tiles]
    tree_ptr,
    prefix_ptr,  # [B, t] i64, [B] i32
    part_acc_ptr,
    part_ml_ptr,  # [B*Hkv*tiles, slots, BLOCK_M, D], [.., slots, 2, BLOCK_M] fp32
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    num_tiles,
    nc_max,
    window,
    comp_block,
    comp_stride,
    qk_scale,
    list_len,
    c_slots,
    s_slots,
    slot_base,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ALL_MEMBERS: tl.constexpr,
    T_PAD: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles, slots)``: slot ``s`` runs an equal slice of one branch's units
    (``c_slots`` compressed, then ``s_slots`` selected, then window) and writes its state to
    slot ``slot_base + s``. All branches share one software-pipelined loop over key tiles: a
    tile's address comes from its unit alone (the selected branch's from one union-list entry),
    so the loads of the next tiles are in flight while one is computed on.

    The selected branch walks the tile's union list (``kernels.sparse_verify``'s union plan:
    each block once, with the bits of the rows that chose it); ``ALL_MEMBERS`` marks a plan of
    one row per tile, whose list is the row's own ``block_idx`` (-1 pads load nothing). The
    window loop covers the window's prefix tokens; the last window slot then adds the draft
    tail (``T_PAD`` >= t entries) in one step under the ancestor bitmask, so the loop carries
    no tree mask."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 keys per tile")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs a head dim of at least 16")
    tl.static_assert(GROUP <= GROUP_PAD, "GROUP_PAD pads the head group")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    tl.static_assert(BLOCK_SIZE % BLOCK_N == 0, "key tiles tile a selection block exactly")
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    SUBS: tl.constexpr = BLOCK_SIZE // BLOCK_N

    pid = tl.program_id(0)
    slot = tl.program_id(1)
    bh = pid // num_tiles
    tile = pid % num_tiles
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = (bh % NUM_KV_HEADS).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in_tile = offs_m // GROUP_PAD
    row = tile * ROWS + row_in_tile  # [M] draft row of each MMA row
    g = offs_m % GROUP_PAD
    row_ok = row < num_t
    m_ok = row_ok & (g < GROUP)
    head = kvh * GROUP + g  # [M] int64
    q_off = b * stride_qb + row * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    prefix = tl.load(prefix_ptr + b)
    row_bits = tl.load(tree_ptr + b * num_t + row, mask=row_ok, other=0)  # [M] int64
    list_base = pid.to(tl.int64) * list_len

    # The branch of this slot: its units, its key source and the end of its keys.
    is_comp = slot < c_slots
    is_sel = (slot >= c_slots) & (slot < c_slots + s_slots)
    is_win = slot >= c_slots + s_slots
    nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
    nc = tl.minimum(nc, nc_max)
    if ALL_MEMBERS:
        n_list = list_len
    else:
        n_list = tl.load(count_ptr + pid, mask=is_sel, other=0)
    win_start = tl.maximum(prefix - window, 0)
    n_units = tl.where(
        is_comp,
        tl.cdiv(nc, BLOCK_N),
        tl.where(is_sel, n_list * SUBS, tl.cdiv(prefix - win_start, BLOCK_N)),
    )
    first_slot = tl.where(is_comp, 0, tl.where(is_sel, c_slots, c_slots + s_slots))
    branch_slots = tl.where(
        is_comp, c_slots, tl.where(is_sel, s_slots, tl.num_programs(1) - c_slots - s_slots)
    )
    lo, hi = _chunk(n_units, slot - first_slot, branch_slots)
    first_tok = tl.where(is_win, win_start, 0).to(tl.int64)
    key_end = tl.where(is_comp, nc, prefix)
    stride_t = tl.where(is_comp, stride_ct, stride_kt).to(tl.int64)
    if is_comp:
        k_base = ck_ptr + b * stride_cb + kvh * stride_ch
        v_base = cv_ptr + b * stride_cb + kvh * stride_ch
    else:
        k_base = k_ptr + b * stride_kb + kvh * stride_kh
        v_base = v_ptr + b * stride_kb + kvh * stride_kh

    m_i = tl.full([BLOCK_M], NEG_SENTINEL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for u in tl.range(lo, hi, num_stages=NUM_STAGES):
        entry = u // SUBS
        blk = tl.load(list_ptr + list_base + entry, mask=is_sel, other=0).to(tl.int64)
        if ALL_MEMBERS:
            bits = -1
        else:
            bits = tl.load(bits_ptr + list_base + entry, mask=is_sel, other=-1)
        tok0 = tl.where(
            is_sel, blk * BLOCK_SIZE + (u - entry * SUBS) * BLOCK_N, first_tok + u * BLOCK_N
        )
        pos = tok0 + offs_n  # [N]; a -1 pad of the list gives negative positions
        key_ok = (pos >= 0) & (pos < key_end)
        off = pos[:, None] * stride_t + offs_d[None, :]
        k = tl.load(k_base + off, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_base + off, mask=key_ok[:, None], other=0.0)
        member = ((bits >> row_in_tile) & 1) != 0  # [M] rows that chose the block
        visible = member[:, None] & key_ok[None, :]
        m_i, l_i, acc = _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION)
    if slot == tl.num_programs(1) - 1:
        if is_win:  # the draft tail, under the ancestor bitmask
            m_i, l_i, acc = _tail_update(
                q,
                k_base,
                v_base,
                stride_t,
                prefix,
                num_t,
                row_bits,
                m_i,
                l_i,
                acc,
                qk_scale,
                HEAD_DIM,
                T_PAD,
                DOT_PRECISION,
            )

    out_slot = pid.to(tl.int64) * num_slots + slot_base + slot
    tl.store(part_ml_ptr + out_slot * 2 * BLOCK_M + offs_m, m_i)
    tl.store(part_ml_ptr + out_slot * 2 * BLOCK_M + BLOCK_M + offs_m, l_i)
    acc_off = out_slot * BLOCK_M * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(part_acc_ptr + acc_off, acc)


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
def _merge_branch(
    out,
    ml_base,
    acc_base,
    rows,
    m_all,
    slot_ids,
    slot_lo,
    n_slots,
    gate,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Merge the states of slots ``[slot_lo, slot_lo + n_slots)`` for MMA rows ``rows`` and fold
    the result, gated, into ``out``. The branch maximum comes from ``m_all`` (every slot's
    ``m``, ``[S_PAD, rows]``, loaded at once), so the weighted sum of the ``acc`` partials has
    no loop-carried rescaling and its loads pipeline."""
    offs_d = tl.arange(0, HEAD_DIM)
    mine = (slot_ids >= slot_lo) & (slot_ids < slot_lo + n_slots)
    m_i = tl.max(tl.where(mine[:, None], m_all, NEG_SENTINEL), 0)
    l_i = tl.zeros(rows.shape, dtype=tl.float32)
    acc = tl.zeros([rows.shape[0], HEAD_DIM], dtype=tl.float32)
    for s in tl.range(slot_lo, slot_lo + n_slots, num_stages=NUM_STAGES):
        # Both values are finite (the sentinel at worst): no -inf - -inf here either.
        w = tl.exp2(tl.load(ml_base + s * 2 * BLOCK_M + rows) - m_i)
        l_i += w * tl.load(ml_base + s * 2 * BLOCK_M + BLOCK_M + rows)
        a_s = tl.load(acc_base + s * BLOCK_M * HEAD_DIM + rows[:, None] * HEAD_DIM + offs_d)
        acc += a_s * w[:, None]
    return _fold(out, gate, l_i, acc)


@triton.jit
def nsa_merge_kernel(
    part_acc_ptr,
    part_ml_ptr,
    gate_ptr,
    o_ptr,  # partials as in nsa_fwd_kernel, [B,t,H,3], o
    stride_ob,
    stride_ot,
    stride_oh,
    num_t,
    num_tiles,
    c_slots,
    s_slots,
    w_slots,
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MERGE_M: tl.constexpr,
    S_PAD: tl.constexpr,
    APPLY_GATES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles, BLOCK_M / MERGE_M)``: merge each branch's slots on its own for
    ``MERGE_M`` MMA rows, gate, write ``o``. ``S_PAD`` >= the slots of the launch."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    NUM_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP
    pid = tl.program_id(0)
    bh = pid // num_tiles
    tile = pid % num_tiles
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = (bh % NUM_KV_HEADS).to(tl.int64)
    offs_m = tl.program_id(1) * MERGE_M + tl.arange(0, MERGE_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row = tile * ROWS + offs_m // GROUP_PAD
    g = offs_m % GROUP_PAD
    m_ok = (row < num_t) & (g < GROUP)
    head = kvh * GROUP + g
    gate_off = ((b * num_t + row) * NUM_HEADS + head) * 3
    base = pid.to(tl.int64) * num_slots
    ml_base = part_ml_ptr + base * 2 * BLOCK_M
    acc_base = part_acc_ptr + base * BLOCK_M * HEAD_DIM
    slot_ids = tl.arange(0, S_PAD)
    m_all = tl.load(
        ml_base + slot_ids[:, None] * 2 * BLOCK_M + offs_m[None, :],
        mask=(slot_ids < num_slots)[:, None],
        other=NEG_SENTINEL,
    )  # [S_PAD, MERGE_M]
    out = tl.zeros([MERGE_M, HEAD_DIM], dtype=tl.float32)
    lo = 0
    for branch in tl.static_range(3):
        n = c_slots if branch == 0 else (s_slots if branch == 1 else w_slots)
        gate = _load_gate(gate_ptr, gate_off, m_ok, branch, APPLY_GATES)
        out = _merge_branch(
            out,
            ml_base,
            acc_base,
            offs_m,
            m_all,
            slot_ids,
            lo,
            n,
            gate,
            BLOCK_M,
            HEAD_DIM,
            NUM_STAGES,
        )
        lo += n
    o_off = b * stride_ob + row * stride_ot + head * stride_oh
    tl.store(
        o_ptr + o_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None]
    )


@triton.jit
def block_score_kernel(
    q_ptr,
    ck_ptr,
    part_ml_ptr,
    prefix_ptr,  # [B,t,H,D], [B,Hkv,NC_max,D], partials, [B] i32
    score_ptr,  # [B, Hkv, t, NB_max] fp32
    stride_qb,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    nc_max,
    nb_max,
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
):
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
        k = tl.load(
            c_base + c.to(tl.int64)[:, None] * stride_ct + offs_d[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.where(valid[None, :], tl.exp2(s - m_c[:, None]), 0.0) * inv_l[:, None]
        start = c * comp_stride
        overlap = (start[:, None] < (offs_j[None, :] + 1) * BLOCK_SIZE) & (
            start[:, None] + comp_block > offs_j[None, :] * BLOCK_SIZE
        )  # [BLOCK_C, BLOCK_J]
        ov = overlap.to(tl.float32)
        if OVERLAP_SPLIT:
            # One tf32 pass would round the probabilities and flip near-tied selections: split
            # p into its tf32 head and the rest (the 0/1 overlap is exact in tf32), two passes.
            hi = (p.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            imp += tl.dot(hi, ov, input_precision="tf32")
            imp += tl.dot(p - hi, ov, input_precision="tf32")
        else:
            imp += tl.dot(p, ov, input_precision="ieee")
    imp = tl.sum(tl.reshape(imp, [ROWS, GROUP_PAD, BLOCK_J]), 1)  # sum over the query heads
    rows = tile * ROWS + tl.arange(0, ROWS)
    out_off = ((b * NUM_KV_HEADS + kvh) * num_t + rows)[:, None] * nb_max + offs_j[None, :]
    tl.store(score_ptr + out_off, imp, mask=(rows < num_t)[:, None] & (offs_j < nb_max)[None, :])


@triton.jit
def topk_blocks_kernel(
    score_ptr,
    prefix_ptr,
    out_ptr,  # [B, Hkv, t, NB_max] fp32, [B] i32, [B, Hkv, t, TOP_N] i32
    num_t,
    nb_max,
    num_sink,
    num_local,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    """Grid ``(B * Hkv * t,)``: one row's ``TOP_N`` best blocks of its prefix's ``nb`` blocks,
    the first ``num_sink`` and last ``num_local`` forced, ascending, ``-1`` padded.

    Each block gets one int64 key ordered by (score, then lower block): the score's bits made
    order-preserving as an integer, above the complemented block id. ``TOP_N`` rounds each take
    the largest key below the previous pick (one max-reduction), so ties resolve to the lower
    block and nothing is written between rounds; a row of at most ``CHUNK`` blocks stays in
    registers throughout."""
    r = tl.program_id(0)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    nb = (prefix + BLOCK_SIZE - 1) // BLOCK_SIZE
    base = score_ptr + r.to(tl.int64) * nb_max
    offs = tl.arange(0, CHUNK)
    slots = tl.arange(0, TOP_N_PAD)
    chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
    prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
    if NUM_CHUNKS == 1:
        keys = _block_keys(base, offs, nb, num_sink, num_local)
    for i in range(TOP_N):
        best = tl.full([], -1, dtype=tl.int64) + 0
        for c in range(NUM_CHUNKS):
            if NUM_CHUNKS > 1:
                keys = _block_keys(base, c * CHUNK + offs, nb, num_sink, num_local)
            best = tl.maximum(best, tl.max(tl.where(keys < prev, keys, -1)))
        # A key's low 30 bits hold ~block; -1 (nothing left) maps to NO_BLOCK.
        blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
        chosen = tl.where(slots == i, blk, chosen)
        prev = tl.where(best >= 0, best, prev)
    # Ascending order: each pick's rank among the picks (ties only among NO_BLOCK, by slot).
    before = (chosen[None, :] < chosen[:, None]) | (
        (chosen[None, :] == chosen[:, None]) & (slots[None, :] < slots[:, None])
    )  # [TOP_N_PAD, TOP_N_PAD]: pick k comes before pick i
    rank = tl.sum(before.to(tl.int32), 1)
    ordered = tl.sum(tl.where(rank[:, None] == slots[None, :], chosen[:, None], 0), 0)
    ordered = tl.where(ordered == NO_BLOCK, -1, ordered)
    tl.store(out_ptr + r.to(tl.int64) * TOP_N + slots, ordered, mask=slots < TOP_N)


@triton.jit
def _block_keys(base, j, nb, num_sink, num_local):
    """Non-negative int64 keys of blocks ``j`` ordered by (score, lower block): forced blocks
    above every score, blocks past the prefix -1 (never picked, never read)."""
    s = tl.load(base + j, mask=j < nb, other=0.0)
    bits = s.to(tl.int32, bitcast=True)
    # Order-preserving map of a float's bits onto [0, 2^32): flip all bits of negatives, the
    # sign bit of the rest.
    ordered = tl.where(bits < 0, ~bits, bits | -2147483648).to(tl.int64) & 0xFFFFFFFF
    forced = (j < num_sink) | (j >= nb - num_local)
    ordered = tl.where(forced, 0xFFFFFFFF + 1, ordered)  # above every finite score
    key = (ordered << 30) | (~j & 0x3FFFFFFF).to(tl.int64)
    return tl.where(j < nb, key, -1)


@triton.jit
def union_plan_kernel(
    idx_ptr,
    bitmap_ptr,
    list_ptr,
    bits_ptr,
    count_ptr,
    num_t,
    nb_max,
    top_n,
    list_len,
    ROWS: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles,)``: the union of the ``ROWS`` rows' blocks of one tile,
    ascending, with each block's member bits (bit ``r``: row ``tile * ROWS + r`` chose it).

    A per-tile bitmap of the ``nb_max`` blocks in global scratch (``bitmap_ptr``, any content
    on entry) is cleared, each row ORs its bit into its blocks' words (atomics, all rows at
    once), and a scan compacts the non-zero words into the list. Barriers order the three
    phases within the program."""
    pid = tl.program_id(0)
    tile = pid % tl.cdiv(num_t, ROWS)
    bh = pid // tl.cdiv(num_t, ROWS)
    bm = bitmap_ptr + pid.to(tl.int64) * nb_max
    offs = tl.arange(0, CHUNK)
    for j0 in range(0, nb_max, CHUNK):
        tl.store(bm + j0 + offs, tl.zeros([CHUNK], dtype=tl.int32), mask=j0 + offs < nb_max)
    tl.debug_barrier()
    r = tl.arange(0, ROWS)
    n = tl.arange(0, TOP_N_PAD)
    row = tile * ROWS + r
    ok = (row < num_t)[:, None] & (n < top_n)[None, :]
    idx_off = (bh.to(tl.int64) * num_t + row)[:, None] * top_n + n[None, :]
    idx = tl.load(idx_ptr + idx_off, mask=ok, other=-1)  # [ROWS, TOP_N_PAD]
    bit = tl.broadcast_to((1 << r)[:, None], [ROWS, TOP_N_PAD])
    tl.atomic_or(bm + tl.maximum(idx, 0), bit, mask=ok & (idx >= 0))
    tl.debug_barrier()
    out = pid.to(tl.int64) * list_len
    total = tl.full([], 0, dtype=tl.int32) + 0
    for j0 in range(0, nb_max, CHUNK):
        j = j0 + offs
        w = tl.load(bm + j, mask=j < nb_max, other=0)
        used = w != 0
        dest = total + tl.cumsum(used.to(tl.int32), 0) - 1
        tl.store(list_ptr + out + dest, j, mask=used)
        tl.store(bits_ptr + out + dest, w, mask=used)
        total += tl.sum(used.to(tl.int32), 0)
    tl.store(count_ptr + pid, total)
