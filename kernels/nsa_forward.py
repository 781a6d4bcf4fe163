"""The forward program of :mod:`kernels.nsa_verify`'s launches (``forward_slot``: one slot's slice
of one branch's key tiles), which ``kernels.nsa_kernels.nsa_fwd_kernel`` and
``kernels.nsa_pair.nsa_pair_fwd_kernel`` run.

A program owns one (sequence x KV head, row tile), its MMA rows the tile's draft rows times the
KV head's query heads; it runs an equal slice of one branch's key tiles (compressed, selected or
window) and writes the slice's log2-domain softmax state to one slot of the partials, which
:mod:`kernels.nsa_merge_kernels` merges. ``forward_slot``'s docstring has the row packing, the
work units and the slots.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.nsa_merge_kernels import NEG_SENTINEL, branch_units, split_slots
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.tree import MAX_TREE_NODES

MAX_TREE_BIT = tl.constexpr(MAX_TREE_NODES - 1)


@triton.jit
def _visible_bias(visible):
    """0 where ``visible``, -inf elsewhere: the additive mask ``_online_update`` takes."""
    return tl.where(visible, 0.0, float("-inf"))


@triton.jit
def _online_update_masked(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """``_online_update`` under a boolean ``visible`` (broadcastable to [M, N]) instead of a
    bias: the selected branch's form. Its compare and selects cost more instructions, but
    with the bias Triton's pipeliner streams the union list through shared memory and keeps
    one key tile fewer in flight, which measured slower on the H200."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, N]
    s = tl.where(visible, s, NEG_SENTINEL)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    # Guard as well as the sentinel: a row with nothing visible has s == m_new == sentinel.
    p = tl.where(visible, tl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc, s


@triton.jit
def _online_update(q, k, v, bias, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """Fold keys ``k`` / values ``v`` [N, D] into the state of ``q`` [M, D]; ``bias`` (0 for a
    visible key, -inf for a hidden one, broadcastable to [M, N]) is added to the scores, one
    fused multiply-add with the scale instead of a compare and two selects per score. ``m_i``
    starts at the finite sentinel, so ``m_new`` stays finite and a hidden key's weight is
    ``exp2(-inf) = 0``, also in a row that sees nothing. Also returns the log2-domain scores
    [M, N] (-inf where hidden)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale + bias  # [M, N]
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc, s


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
    m_i, l_i, acc, _ = _online_update(
        q, k, v, _visible_bias(seen & tail_ok[None, :]), m_i, l_i, acc, qk_scale, DOT_PRECISION
    )
    return m_i, l_i, acc


@triton.jit
def forward_slot(
    pid,
    slot,
    launch_slots,
    q_ptr,
    k_ptr,
    v_ptr,
    ck_ptr,
    cv_ptr,
    list_ptr,
    bits_ptr,
    count_ptr,
    tree_ptr,
    prefix_ptr,
    part_acc_ptr,
    part_ml_ptr,
    s_ptr,
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
    branches,
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
    STORE_S: tl.constexpr,
    HAS_SEL: tl.constexpr,
    PDL: tl.constexpr,
):
    """Slot ``slot`` (of ``launch_slots``) of (sequence x KV head, row tile) ``pid``: an equal
    slice of one branch's key tiles, its state written to slot ``slot_base + slot`` of the
    partials (see ``nsa_fwd_kernel``). Returns the launch's compressed and selected slot counts
    of this program (``split_slots``). ``PDL``: the queries, the length and the tree mask are
    loaded before ``pdl_gate`` (the union plan, the previous launch's, after).

    Row packing, shared by the kernels: MMA row ``m`` is draft row
    ``tile * ROWS + m // GROUP_PAD`` and query head ``kvh * GROUP + m % GROUP_PAD``
    (``GROUP_PAD``: a power of two >= ``G``, ``kernels.nsa_launch``; rows with
    ``m % GROUP_PAD >= G`` are padding). Softmax states are in the log2 domain (scores
    pre-multiplied by ``sm_scale * log2(e)``).

    Work units (``branch_units``): the compressed branch is ``ceil(nc / BLOCK_N)`` tiles of
    compressed tokens, the selected branch ``BLOCK_SIZE / BLOCK_N`` tiles per entry of the
    tile's union list, the window branch ``ceil(min(window, prefix) / BLOCK_N)`` tiles of prefix
    tokens from ``max(prefix - window, 0)`` on, to which the launch's last slot, a window slot,
    adds the draft tail. The slot takes an equal slice of one branch's units and writes its
    state: ``m``, ``l`` (``[2, BLOCK_M]``) and the unnormalised ``acc`` (``[BLOCK_M, D]``);
    slots ``[0, c)`` are compressed, ``[c, c + s)`` selected, the rest window
    (``kernels.nsa_merge_kernels``' split).
    """
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 keys per tile")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs a head dim of at least 16")
    tl.static_assert(GROUP <= GROUP_PAD, "GROUP_PAD pads the head group")
    tl.static_assert(BLOCK_M % GROUP_PAD == 0, "a row tile holds whole head groups")
    tl.static_assert(
        not HAS_SEL or BLOCK_SIZE % BLOCK_N == 0, "key tiles tile a selection block exactly"
    )
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    SUBS: tl.constexpr = BLOCK_SIZE // BLOCK_N

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
    pdl_gate(PDL)

    # The branch of this slot: its units, its key source and the end of its keys.
    if ALL_MEMBERS:
        n_list = list_len
    else:
        n_list = tl.load(count_ptr + pid, mask=(branches & 2) != 0, other=0)
    units_c, units_s, units_w, nc, win_start = branch_units(
        prefix, n_list, nc_max, window, comp_block, comp_stride, BLOCK_N, SUBS
    )
    c_slots, s_slots = split_slots(branches, launch_slots, units_c, units_s, units_w)
    is_comp = slot < c_slots
    is_sel = (slot >= c_slots) & (slot < c_slots + s_slots)
    is_win = slot >= c_slots + s_slots
    n_units = tl.where(is_comp, units_c, tl.where(is_sel, units_s, units_w))
    first_slot = tl.where(is_comp, 0, tl.where(is_sel, c_slots, c_slots + s_slots))
    branch_slots = tl.where(
        is_comp, c_slots, tl.where(is_sel, s_slots, launch_slots - c_slots - s_slots)
    )
    lo, hi = _chunk(n_units, slot - first_slot, branch_slots)
    first_tok = tl.where(is_win, win_start, 0)  # positions fit int32; offsets are int64
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
        if HAS_SEL:  # a key tile's address comes from the union list
            entry = u // SUBS
            blk = tl.load(list_ptr + list_base + entry, mask=is_sel, other=0)
            if ALL_MEMBERS:
                bits = -1
            else:
                bits = tl.load(bits_ptr + list_base + entry, mask=is_sel, other=-1)
            tok0 = tl.where(
                is_sel, blk * BLOCK_SIZE + (u - entry * SUBS) * BLOCK_N, first_tok + u * BLOCK_N
            )
        else:  # from the loop index alone: no dependent load in the pipeline
            bits = -1
            tok0 = first_tok + u * BLOCK_N
        pos = tok0 + offs_n  # [N]; a -1 pad of the list gives negative positions
        key_ok = (pos >= 0) & (pos < key_end)
        # Unmasked loads of a position clamped into [0, key_end): a hidden key reads a real
        # (finite) row, which its -inf bias weighs 0, and no load carries a predicate.
        pos_ld = tl.maximum(tl.minimum(pos, key_end - 1), 0).to(tl.int64)
        off = pos_ld[:, None] * stride_t + offs_d[None, :]
        k = tl.load(k_base + off)
        v = tl.load(v_base + off)
        if HAS_SEL:
            member = ((bits >> row_in_tile) & 1) != 0  # [M] rows that chose the block
            visible = member[:, None] & key_ok[None, :]
            m_i, l_i, acc, s = _online_update_masked(
                q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION
            )
        else:
            bias = _visible_bias(key_ok)[None, :]
            m_i, l_i, acc, s = _online_update(q, k, v, bias, m_i, l_i, acc, qk_scale, DOT_PRECISION)
        if STORE_S:
            s_row = (pid.to(tl.int64) * ROWS + row_in_tile) * GROUP + g
            s_off = s_row[:, None] * nc_max + pos[None, :]
            tl.store(s_ptr + s_off, s, mask=m_ok[:, None] & key_ok[None, :])
    if slot == launch_slots - 1:
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
    return c_slots, s_slots
