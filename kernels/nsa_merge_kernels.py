"""The slots of :mod:`kernels.nsa_kernels`'s forward and their merge (gating included): folded
into the forward launch (``merge_rows``: a chunk of a row tile's rows, run by the tile's last
program to finish for the whole tile, ``merge_tile``, or by merge programs of the launch, one
chunk each) or a launch of its own (``nsa_merge_kernel``).

A (sequence x KV head, row tile) program ``pid`` of the forward writes one partial state per
slot: ``m``, ``l`` (``[2, BLOCK_M]``, log2 domain) and the unnormalised ``acc`` (``[BLOCK_M,
D]``), fp32, slot ``s`` at ``pid * num_slots + s``. The slots of one launch go to the enabled
branches in proportion to the key tiles each has in that program (``split_slots``, integer
arithmetic, so every merge reproduces the forward's split): compressed first, then selected,
then window. Each branch is its own softmax: its slots merge on their own, and the three
normalised outputs are gated, ``o = g_c o_c + g_s o_s + g_w o_w``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.pdl import pdl_gate

# Finite stand-in for -inf: masked scores and empty states stay finite, so no exp(-inf - -inf).
NEG_SENTINEL = tl.constexpr(-1.0e30)


@triton.jit
def branch_units(
    prefix, n_list, nc_max, window, comp_block, comp_stride, BLOCK_N: tl.constexpr, SUBS
):
    """Key tiles of each branch of one (sequence x KV head, row tile) -- compressed,
    selected (``n_list`` union entries of ``SUBS`` tiles), window -- and the compressed tokens
    ``nc`` and the window's first token."""
    nc = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
    nc = tl.minimum(nc, nc_max)
    win_start = tl.maximum(prefix - window, 0)
    units_c = tl.cdiv(nc, BLOCK_N)
    units_w = tl.cdiv(prefix - win_start, BLOCK_N)
    return units_c, n_list * SUBS, units_w, nc, win_start


@triton.jit
def split_slots(branches, n, units_c, units_s, units_w):
    """``n`` slots split between the enabled branches (bits 1, 2, 4 of ``branches``:
    compressed, selected, window) in proportion to their key tiles, at least one each; the
    last enabled branch takes the rest. Integer arithmetic, so the forward and the merge get
    the same split. Returns the compressed and selected slot counts."""
    on_c = (branches & 1) != 0
    on_s = (branches & 2) != 0
    on_w = (branches & 4) != 0
    total = tl.maximum(
        tl.where(on_c, units_c, 0) + tl.where(on_s, units_s, 0) + tl.where(on_w, units_w, 0), 1
    )
    later = on_s.to(tl.int32) + on_w.to(tl.int32)
    share_c = tl.minimum(tl.maximum((2 * n * units_c + total) // (2 * total), 1), n - later)
    c_n = tl.where(on_c, tl.where(later > 0, share_c, n), 0)
    share_s = tl.minimum(tl.maximum((2 * n * units_s + total) // (2 * total), 1), n - c_n - 1)
    s_n = tl.where(on_s, tl.where(on_w, share_s, n - c_n), 0)
    return c_n, s_n


@triton.jit
def _branch_scale(m_all, l_all, mine, gate):
    """Of the slots ``mine`` (``[S, R]`` with ``m_all``, ``l_all``): the branch's maximum
    ``[R]`` and the factor ``gate / l`` (0 where the branch saw nothing) that turns a slot's
    ``2^(m_s - max) acc_s`` into its gated share of the output."""
    m_x = tl.max(tl.where(mine, m_all, NEG_SENTINEL), 0)
    w = tl.where(mine, tl.exp2(tl.where(mine, m_all, m_x[None, :]) - m_x[None, :]), 0.0)
    l_x = tl.sum(w * l_all, 0)
    return m_x, tl.where(l_x > 0.0, gate / tl.where(l_x > 0.0, l_x, 1.0), 0.0)


@triton.jit
def merge_tile(
    part_acc_ptr,
    part_ml_ptr,
    gate_ptr,
    o_ptr,
    pid,
    b,
    kvh,
    tile,
    num_t,
    num_slots,
    used_slots,
    c_end,
    s_end,
    stride_ob,
    stride_ot,
    stride_oh,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    S_PAD: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    MERGE_SLOTS: tl.constexpr,
    APPLY_GATES: tl.constexpr,
):
    """``merge_rows`` of every chunk of ``MERGE_ROWS`` MMA rows of program ``pid``'s tile, one
    after another: the merge of a tile's last program to finish."""
    for r0 in range(0, BLOCK_M, MERGE_ROWS):
        merge_rows(
            part_acc_ptr,
            part_ml_ptr,
            gate_ptr,
            o_ptr,
            pid,
            b,
            kvh,
            tile,
            num_t,
            num_slots,
            used_slots,
            c_end,
            s_end,
            stride_ob,
            stride_ot,
            stride_oh,
            r0,
            NUM_KV_HEADS,
            GROUP,
            GROUP_PAD,
            HEAD_DIM,
            BLOCK_M,
            S_PAD,
            MERGE_ROWS,
            MERGE_SLOTS,
            APPLY_GATES,
        )


@triton.jit
def merge_rows(
    part_acc_ptr,
    part_ml_ptr,
    gate_ptr,
    o_ptr,
    pid,
    b,
    kvh,
    tile,
    num_t,
    num_slots,
    used_slots,
    c_end,
    s_end,
    stride_ob,
    stride_ot,
    stride_oh,
    r0,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    S_PAD: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    MERGE_SLOTS: tl.constexpr,
    APPLY_GATES: tl.constexpr,
):
    """Merge MMA rows ``[r0, r0 + MERGE_ROWS)`` of program ``pid``'s slots ``[0, used_slots)``
    -- ``[0, c_end)`` compressed, ``[c_end, s_end)`` selected, the rest window -- gate them
    (``APPLY_GATES``, else every gate is 1) and write their rows of ``o``; nothing when the
    chunk starts past the last draft row. The merge folded into the forward launch.

    First every slot's ``(m, l)`` (``[S_PAD, MERGE_ROWS]``) gives each branch's maximum and
    gated ``1 / l``, then the slots' ``acc`` are summed with their weights ``MERGE_SLOTS`` slots
    per load, in slot order (the result does not depend on which program merges). Loads go to
    L2 (``.cg``): the partials were written by other programs. A chunk of head-slot padding
    alone (it starts at a slot ``>= GROUP`` of its draft row; chunks and ``GROUP_PAD`` are
    powers of two) is skipped too."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    NUM_Q_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP
    if (tile * ROWS + r0 // GROUP_PAD < num_t) & (r0 % GROUP_PAD < GROUP):
        sl = tl.arange(0, S_PAD)
        sl_ok = sl < used_slots
        sl_branch = (sl >= c_end).to(tl.int32) + (sl >= s_end).to(tl.int32)
        base = pid.to(tl.int64) * num_slots
        offs_d = tl.arange(0, HEAD_DIM)
        m_idx = r0 + tl.arange(0, MERGE_ROWS)
        row = tile * ROWS + m_idx // GROUP_PAD
        g = m_idx % GROUP_PAD
        ok = (row < num_t) & (g < GROUP)
        head = kvh * GROUP + g  # [R] int64
        ml_off = (base + sl)[:, None] * 2 * BLOCK_M + m_idx[None, :]  # [S_PAD, R]
        ml_ok = sl_ok[:, None] & ok[None, :]
        m_all = tl.load(part_ml_ptr + ml_off, mask=ml_ok, other=NEG_SENTINEL, cache_modifier=".cg")
        l_all = tl.load(part_ml_ptr + ml_off + BLOCK_M, mask=ml_ok, other=0.0, cache_modifier=".cg")
        gate_off = ((b * num_t + row) * NUM_Q_HEADS + head) * 3
        if APPLY_GATES:
            g_c = tl.load(gate_ptr + gate_off, mask=ok, other=0.0).to(tl.float32)
            g_s = tl.load(gate_ptr + gate_off + 1, mask=ok, other=0.0).to(tl.float32)
            g_w = tl.load(gate_ptr + gate_off + 2, mask=ok, other=0.0).to(tl.float32)
        else:
            g_c = tl.full([MERGE_ROWS], 1.0, dtype=tl.float32)
            g_s = g_c
            g_w = g_c
        m_c, f_c = _branch_scale(m_all, l_all, ml_ok & (sl_branch == 0)[:, None], g_c)
        m_s, f_s = _branch_scale(m_all, l_all, ml_ok & (sl_branch == 1)[:, None], g_s)
        m_w, f_w = _branch_scale(m_all, l_all, ml_ok & (sl_branch == 2)[:, None], g_w)
        out = tl.zeros([MERGE_ROWS, HEAD_DIM], dtype=tl.float32)
        for s0 in range(0, used_slots, MERGE_SLOTS):
            s = s0 + tl.arange(0, MERGE_SLOTS)
            s_ok = (s < used_slots)[:, None] & ok[None, :]  # [SC, R]
            br = ((s >= c_end).to(tl.int32) + (s >= s_end).to(tl.int32))[:, None]
            m_b = tl.where(br == 0, m_c[None, :], tl.where(br == 1, m_s[None, :], m_w[None, :]))
            f_b = tl.where(br == 0, f_c[None, :], tl.where(br == 1, f_s[None, :], f_w[None, :]))
            slot_row = (base + s)[:, None] * BLOCK_M + m_idx[None, :]  # [SC, R]
            m_slot = tl.load(
                part_ml_ptr + (base + s)[:, None] * 2 * BLOCK_M + m_idx[None, :],
                mask=s_ok,
                other=NEG_SENTINEL,
                cache_modifier=".cg",
            )
            # m_slot <= m_b for every slot of its branch: the weight is finite, at most f_b.
            w = tl.where(s_ok, tl.exp2(tl.minimum(m_slot - m_b, 0.0)) * f_b, 0.0)
            acc = tl.load(
                part_acc_ptr + slot_row[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                mask=s_ok[:, :, None],
                other=0.0,
                cache_modifier=".cg",
            )  # [SC, R, D]
            out += tl.sum(w[:, :, None] * acc, 0)
        o_off = b * stride_ob + row * stride_ot + head * stride_oh
        o_ptrs = o_ptr + o_off[:, None] + offs_d[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _merge_branch(out, m_all, l_all, acc_all, mine, gate):
    """Merge the slots ``mine`` (``[S_PAD]``) of one branch from every slot's ``m``, ``l``
    (``[S_PAD]``) and ``acc`` (``[S_PAD, D]``), all in registers, and fold the result, gated,
    into ``out`` (``[D]``). Slots outside the branch weigh 0; both exponents are finite (the
    sentinel at worst), so no -inf - -inf."""
    m_i = tl.max(tl.where(mine, m_all, NEG_SENTINEL), 0)
    w = tl.where(mine, tl.exp2(tl.where(mine, m_all, m_i) - m_i), 0.0)
    l_i = tl.sum(w * l_all, 0)
    acc = tl.sum(w[:, None] * acc_all, 0)
    return out + acc * tl.where(l_i > 0.0, gate / tl.where(l_i > 0.0, l_i, 1.0), 0.0)


@triton.jit
def _branch_weights(m_all, l_all, mine, gate):
    """Each slot's weight ``gate 2^(m_s - max) / l`` in the gated output, for the slots
    ``mine`` (``[S_PAD]``) of one branch; 0 elsewhere and where the branch saw nothing."""
    m_i = tl.max(tl.where(mine, m_all, NEG_SENTINEL), 0)
    w = tl.where(mine, tl.exp2(tl.where(mine, m_all, m_i) - m_i), 0.0)
    l_i = tl.sum(w * l_all, 0)
    return w * tl.where(l_i > 0.0, gate / tl.where(l_i > 0.0, l_i, 1.0), 0.0)


@triton.jit
def nsa_merge_kernel(
    part_acc_ptr,
    part_ml_ptr,
    gate_ptr,
    o_ptr,  # partials as in nsa_fwd_kernel, [B,t,H,3], o
    comp_acc_ptr,
    comp_ml_ptr,  # SHARED_COMP: the compressed launch's partials, on row tiles of its own
    prefix_ptr,
    count_ptr,  # [B] i32, the union plan's [B, Hkv, tiles] counts
    stride_ob,
    stride_ot,
    stride_oh,
    num_t,
    num_tiles,
    nc_max,
    window,
    comp_block,
    comp_stride,
    list_len,
    comp_fixed,
    branches,
    used_slots,
    num_slots,
    comp_tiles,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ALL_MEMBERS: tl.constexpr,
    S_PAD: tl.constexpr,
    APPLY_GATES: tl.constexpr,
    SHARED_COMP: tl.constexpr,
    COMP_GROUP_PAD: tl.constexpr,
    COMP_BLOCK_M: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles, BLOCK_M)``: merge each branch's slots on its own for one MMA
    row, gate, write ``o``: the merge as a launch of its own. ``S_PAD`` >= the slots of the
    launch. Slots ``[0, comp_fixed)`` are compressed (a launch of their own); the other
    ``used_slots - comp_fixed`` are split between ``branches`` as the forward split them
    (``split_slots`` of the same key tiles). ``SHARED_COMP``: the compressed slots are
    ``comp_fixed`` slots of the ``comp_*`` partials, written over ``comp_tiles`` row tiles of
    ``COMP_BLOCK_M`` MMA rows (``COMP_GROUP_PAD`` head slots a draft row) per (sequence, KV
    head), and the other slots start at slot 0 of ``part``. The row's partials of every slot
    are loaded at once, ``[S_PAD, D]``: one round trip to memory, no chain of dependent loads.
    From one buffer, each branch's slots then sum on their own (three passes); from two
    (``SHARED_COMP``), one pass sums every slot with its gated weight: on the H200 each form
    ran faster than the other in its own case. The gates, the length and the union count
    come first: with ``PDL`` (``kernels.pdl``) they load while the forward launch drains, the
    partials after it."""
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    NUM_Q_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP
    pid = tl.program_id(0)
    m = tl.program_id(1)
    row = (pid % num_tiles) * ROWS + m // GROUP_PAD
    g = m % GROUP_PAD
    if (row < num_t) & (g < GROUP):
        bh = pid // num_tiles
        b = (bh // NUM_KV_HEADS).to(tl.int64)
        head = (bh % NUM_KV_HEADS).to(tl.int64) * GROUP + g
        gate_off = ((b * num_t + row) * NUM_Q_HEADS + head) * 3
        offs_d = tl.arange(0, HEAD_DIM)
        slot_ids = tl.arange(0, S_PAD)
        # The compressed launch's slots are not in part when it ran on row tiles of its own.
        comp_off = comp_fixed if SHARED_COMP else 0
        in_comp = slot_ids < comp_off
        slot_ok = (slot_ids < used_slots) & ~in_comp
        base = pid.to(tl.int64) * num_slots + slot_ids - comp_off  # [S_PAD]
        if APPLY_GATES:
            g_c = tl.load(gate_ptr + gate_off).to(tl.float32)
            g_s = tl.load(gate_ptr + gate_off + 1).to(tl.float32)
            g_w = tl.load(gate_ptr + gate_off + 2).to(tl.float32)
        else:
            g_c = 1.0
            g_s = 1.0
            g_w = 1.0
        if ALL_MEMBERS:
            n_list = list_len
        else:
            n_list = tl.load(count_ptr + pid, mask=(branches & 2) != 0, other=0)
        units_c, units_s, units_w, _, _ = branch_units(
            tl.load(prefix_ptr + b),
            n_list,
            nc_max,
            window,
            comp_block,
            comp_stride,
            BLOCK_N,
            BLOCK_SIZE // BLOCK_N,
        )
        c_n, s_n = split_slots(branches, used_slots - comp_fixed, units_c, units_s, units_w)
        c_slots = comp_fixed + c_n
        pdl_gate(PDL)
        if SHARED_COMP:
            # Two buffers: each slot's row pointer picks its own, one load for all of them,
            # then one pass over the rows with each slot's gated weight.
            comp_rows: tl.constexpr = COMP_BLOCK_M // COMP_GROUP_PAD
            comp_pid = bh * comp_tiles + row // comp_rows
            cm = (row % comp_rows) * COMP_GROUP_PAD + g
            c_base = comp_pid.to(tl.int64) * comp_fixed + slot_ids
            ok = slot_ok | in_comp
            ml_ptrs = tl.where(
                in_comp,
                comp_ml_ptr + c_base * 2 * COMP_BLOCK_M + cm,
                part_ml_ptr + base * 2 * BLOCK_M + m,
            )
            ml_step = tl.where(in_comp, COMP_BLOCK_M, BLOCK_M)
            m_all = tl.load(ml_ptrs, mask=ok, other=NEG_SENTINEL)
            l_all = tl.load(ml_ptrs + ml_step, mask=ok, other=0.0)
            acc_rows = tl.where(
                in_comp,
                comp_acc_ptr + (c_base * COMP_BLOCK_M + cm) * HEAD_DIM,
                part_acc_ptr + (base * BLOCK_M + m) * HEAD_DIM,
            )
            acc_all = tl.load(acc_rows[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
            branch_of = (slot_ids >= c_slots).to(tl.int32) + (slot_ids >= c_slots + s_n).to(
                tl.int32
            )
            weight = tl.zeros([S_PAD], dtype=tl.float32)
            for branch in tl.static_range(3):
                gate = g_c if branch == 0 else (g_s if branch == 1 else g_w)
                mine = ok & (branch_of == branch)
                weight += _branch_weights(m_all, l_all, mine, gate)
            out = tl.sum(weight[:, None] * acc_all, 0)
        else:
            m_all = tl.load(part_ml_ptr + base * 2 * BLOCK_M + m, mask=slot_ok, other=NEG_SENTINEL)
            l_all = tl.load(part_ml_ptr + base * 2 * BLOCK_M + BLOCK_M + m, mask=slot_ok, other=0.0)
            acc_off = (base * BLOCK_M + m)[:, None] * HEAD_DIM + offs_d[None, :]
            acc_all = tl.load(part_acc_ptr + acc_off, mask=slot_ok[:, None], other=0.0)
            out = tl.zeros([HEAD_DIM], dtype=tl.float32)
            lo = 0
            for branch in tl.static_range(3):
                n = c_slots if branch == 0 else (s_n if branch == 1 else used_slots - c_slots - s_n)
                gate = g_c if branch == 0 else (g_s if branch == 1 else g_w)
                mine = (slot_ids >= lo) & (slot_ids < lo + n)
                out = _merge_branch(out, m_all, l_all, acc_all, mine, gate)
                lo += n
        o_off = b * stride_ob + row * stride_ot + head * stride_oh
        tl.store(o_ptr + o_off + offs_d, out.to(o_ptr.dtype.element_ty))
