"""Triton code of :mod:`kernels.sparse_verify`: one program serves one (sequence, KV head,
query group, split), its group's C x G query-head rows packed into the MMA rows, streaming the
group's block list (per row masked by the membership bits under ``union``) and, on the last
split, the draft tail under the tree mask; it writes the fp32 partial output and log-sum-exp,
which the last of the group's split programs to finish combines in the same launch
(``MERGE``), or ``kernels.merge.merge_partials`` in a launch of its own."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import last_to_arrive


@triton.jit
def _fold(s, v, keep, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Fold the log2-domain scores ``s`` [M, N] of values ``v`` [N, D] into the online-softmax
    state where ``keep`` [M, N] holds: hidden scores are -inf, and the running maximum starts
    at a finite floor, so a row that sees nothing keeps weight 0."""
    s = tl.where(keep, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def sparse_verify_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    prefix_ptr,
    tree_ptr,
    order_ptr,
    list_ptr,
    mask_ptr,
    count_ptr,
    o_ptr,
    lse_ptr,
    out_ptr,
    out_lse_ptr,
    arrive_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_xb,
    stride_xh,
    stride_xr,
    stride_os,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_ls,
    stride_lb,
    stride_lh,
    stride_lt,
    stride_yb,
    stride_yt,
    stride_yh,
    stride_zb,
    stride_zh,
    stride_zt,
    qk_scale,
    num_rows,
    list_len,
    num_groups,
    num_splits,
    G: tl.constexpr,
    C: tl.constexpr,
    M_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    T_PAD: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    GROUP_LISTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
    TILE_BLOCKS: tl.constexpr = 1,
    MERGE: tl.constexpr = False,
    MERGE_CHUNK: tl.constexpr = 1,  # splits whose partials the merge loads at once
):
    tl.static_assert(M_PAD >= 16)  # MMA rows
    tl.static_assert(M_PAD >= C * G)
    tl.static_assert(BLOCK_N >= 16)
    tl.static_assert(T_PAD >= 16)
    NEG_BIG: tl.constexpr = -1.0e30  # finite running-max floor: never exp(-inf - -inf)
    LN2: tl.constexpr = 0.6931471805599453

    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    g = pid // num_splits
    split = pid % num_splits
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)

    # Packed rows: r = c * G + hh  ->  query row order[g * C + c], query head h * G + hh.
    offs_r = tl.arange(0, M_PAD)
    member = offs_r // G
    head = h * G + offs_r % G
    slot = g * C + member
    row_ok = (member < C) & (slot < num_rows)
    if HAS_ORDER:
        qrow = tl.load(order_ptr + b64 * num_rows + slot, mask=row_ok, other=0)
    else:
        qrow = slot
    qrow = tl.where(row_ok, qrow, 0)
    offs_d = tl.arange(0, D)
    q_offs = b64 * stride_qb + qrow.to(tl.int64)[:, None] * stride_qt
    q_offs += head.to(tl.int64)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)  # [M_PAD, D]

    # The list this group streams: its own (union) or its first member's row of block_idx.
    if GROUP_LISTS:
        list_row = g
    else:
        list_row = g * C
        if HAS_ORDER:
            list_row = tl.load(order_ptr + b64 * num_rows + list_row)
    list_base = b64 * stride_xb + h64 * stride_xh + list_row.to(tl.int64) * stride_xr
    if GROUP_LISTS:
        n_list = tl.load(count_ptr + (b64 * tl.num_programs(1) + h64) * num_groups + g)
    else:
        n_list = list_len
    per_split = (n_list + num_splits - 1) // num_splits
    start = split * per_split
    end = tl.minimum(start + per_split, n_list)

    prefix_len = tl.load(prefix_ptr + b).to(tl.int64)
    kv_base = b64 * stride_kb + h64 * stride_kh
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([M_PAD], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([M_PAD], dtype=tl.float32)
    acc = tl.zeros([M_PAD, D], dtype=tl.float32)
    if TILE_BLOCKS > 1:
        # TILE_BLOCKS listed blocks gathered into one [TILE_BLOCKS * BLOCK_N, D] K/V tile (entries
        # past end and -1 pads masked out): one score tile, softmax update and value product
        # for several blocks, so a short walk takes fewer dependent steps.
        offs_b = tl.arange(0, TILE_BLOCKS)
        for u in range(start, end, TILE_BLOCKS):
            live = u + offs_b < end
            blk = tl.load(list_ptr + list_base + u + offs_b, mask=live, other=-1).to(tl.int64)
            pos = tl.reshape(blk[:, None] * BLOCK_N + offs_n[None, :], [TILE_BLOCKS * BLOCK_N])
            col_ok = (pos >= 0) & (pos < prefix_len)
            kv_offs = kv_base + pos[:, None] * stride_kt + offs_d[None, :]
            k = tl.load(k_ptr + kv_offs, mask=col_ok[:, None], other=0.0)
            v = tl.load(v_ptr + kv_offs, mask=col_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            if GROUP_LISTS:
                bits = tl.load(mask_ptr + list_base + u + offs_b, mask=live, other=0)
                bits = tl.reshape(bits[:, None] + 0 * offs_n[None, :], [TILE_BLOCKS * BLOCK_N])
                sel = ((bits[None, :] >> tl.minimum(member, C - 1)[:, None]) & 1) != 0
                keep = sel & col_ok[None, :]
            else:
                keep = row_ok[:, None] & col_ok[None, :]
            m_i, l_i, acc = _fold(s, v, keep, m_i, l_i, acc, DOT_PRECISION)
    else:
        for u in range(start, end):
            blk = tl.load(list_ptr + list_base + u).to(tl.int64)
            pos = blk * BLOCK_N + offs_n  # [BLOCK_N]
            col_ok = (pos >= 0) & (pos < prefix_len)  # a -1 pad is all negative positions
            kv_offs = kv_base + pos[:, None] * stride_kt + offs_d[None, :]
            k = tl.load(k_ptr + kv_offs, mask=col_ok[:, None], other=0.0)  # [BLOCK_N, D]
            v = tl.load(v_ptr + kv_offs, mask=col_ok[:, None], other=0.0)
            # [M_PAD, BLOCK_N], log2 domain
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            if GROUP_LISTS:
                bits = tl.load(mask_ptr + list_base + u)
                # [M_PAD]: did this row's query pick the block (shift clamped: >= 32 is undefined)
                sel = ((bits >> tl.minimum(member, C - 1)) & 1) != 0
                keep = sel[:, None] & col_ok[None, :]
            else:
                keep = row_ok[:, None] & col_ok[None, :]
            m_i, l_i, acc = _fold(s, v, keep, m_i, l_i, acc, DOT_PRECISION)

    if split == num_splits - 1:
        # Draft tail: entries prefix_len + j, visible to a row when bit j of its tree mask is set.
        offs_j = tl.arange(0, T_PAD)
        tail_ok = offs_j < num_rows
        pos = prefix_len + offs_j
        kv_offs = kv_base + pos[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=tail_ok[:, None], other=0.0)  # [T_PAD, D]
        v = tl.load(v_ptr + kv_offs, mask=tail_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M_PAD, T_PAD]
        tree = tl.load(tree_ptr + b64 * num_rows + qrow, mask=row_ok, other=0)  # [M_PAD] int64
        seen = ((tree[:, None] >> offs_j.to(tl.int64)[None, :]) & 1) != 0
        m_i, l_i, acc = _fold(s, v, seen & tail_ok[None, :], m_i, l_i, acc, DOT_PRECISION)

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * LN2, -float("inf"))
    split64 = split.to(tl.int64)
    o_offs = split64 * stride_os + b64 * stride_ob + qrow.to(tl.int64)[:, None] * stride_ot
    o_offs += head.to(tl.int64)[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr + o_offs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse_offs = split64 * stride_ls + b64 * stride_lb + head.to(tl.int64) * stride_lh
    lse_offs += qrow.to(tl.int64) * stride_lt
    tl.store(lse_ptr + lse_offs, lse, mask=row_ok)

    if MERGE:
        # The last of the group's split programs to finish merges the group's rows: no second
        # launch, and the partials it reads are still in L2.
        group = (b64 * tl.num_programs(1) + h64) * num_groups + g
        if last_to_arrive(arrive_ptr + group, num_splits):
            o_offs -= split64 * stride_os
            lse_offs -= split64 * stride_ls
            _merge_splits(
                o_ptr + o_offs,
                lse_ptr + lse_offs,
                out_ptr
                + b64 * stride_yb
                + qrow.to(tl.int64)[:, None] * stride_yt
                + head.to(tl.int64)[:, None] * stride_yh
                + offs_d[None, :],
                out_lse_ptr
                + b64 * stride_zb
                + head.to(tl.int64) * stride_zh
                + qrow.to(tl.int64) * stride_zt,
                row_ok,
                num_splits,
                stride_os,
                stride_ls,
                M_PAD,
                D,
                MERGE_CHUNK,
            )


@triton.jit
def _merge_splits(
    o_parts,
    lse_parts,
    out,
    out_lse,
    row_ok,
    num_splits,
    stride_os,
    stride_ls,
    M_PAD: tl.constexpr,
    D: tl.constexpr,
    S_CHUNK: tl.constexpr,
):
    """Combine the rows' ``num_splits`` partials (``o_parts`` [M_PAD, D] and ``lse_parts``
    [M_PAD] pointers of split 0, natural-log LSEs) by their log-sum-exp weights, as
    ``kernels.merge`` does, ``S_CHUNK`` splits a load (their partials and LSEs together, so a
    merge of at most ``S_CHUNK`` splits is one L2 round trip on the launch's critical path),
    rescaling the running sum by each chunk's maximum; store the output in ``out``'s dtype and
    its LSE. A split that saw nothing (LSE -inf) weighs 0, whatever its partial holds."""
    offs_c = tl.arange(0, S_CHUNK)
    m = tl.full([M_PAD], -float("inf"), dtype=tl.float32)
    l_sum = tl.zeros([M_PAD], dtype=tl.float32)
    acc = tl.zeros([M_PAD, D], dtype=tl.float32)
    for s0 in range(0, num_splits, S_CHUNK):
        on = row_ok[:, None] & (s0 + offs_c[None, :] < num_splits)  # [M_PAD, S_CHUNK]
        lse_c = tl.load(
            lse_parts[:, None] + (s0 + offs_c[None, :]) * stride_ls,
            mask=on,
            other=-float("inf"),
            cache_modifier=".cg",
        )
        o_c = tl.load(
            o_parts[:, None, :] + (s0 + offs_c)[None, :, None] * stride_os,
            mask=on[:, :, None],
            other=0.0,
            cache_modifier=".cg",
        )  # [M_PAD, S_CHUNK, D]
        m_new = tl.maximum(m, tl.max(lse_c, axis=1))
        # A finite stand-in where no split so far saw anything: never -inf - -inf.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse_c - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(w, axis=1)
        # A zero weight must not let a garbage partial (NaN) through: 0 * NaN = NaN.
        part = tl.sum(tl.where(w[:, :, None] > 0, w[:, :, None] * o_c, 0.0), axis=1)
        acc = acc * alpha[:, None] + part
        m = m_new
    seen = l_sum > 0
    l_safe = tl.where(seen, l_sum, 1.0)
    tl.store(out, (acc / l_safe[:, None]).to(out.dtype.element_ty), mask=row_ok[:, None])
    tl.store(out_lse, tl.where(seen, m + tl.log(l_safe), -float("inf")), mask=row_ok)
