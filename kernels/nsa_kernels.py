"""Triton code of :mod:`kernels.nsa_verify` (the wrappers, plan and docs live there).

``nsa_fwd_kernel`` runs the forward slots of a launch (:mod:`kernels.nsa_forward`'s
``forward_slot``, whose docstring has the row packing, the work units and the slots) and, as
configured, their merge on arrival counters; :mod:`kernels.nsa_merge_kernels` holds the split
and the merges (folded into this launch, or a launch of their own). ``nsa_gate_kernel`` is the
unfused baseline's gating launch.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import arrive, last_to_arrive, leave, take_ticket, wait_for
from ssvkit.kernels.nsa_forward import forward_slot
from ssvkit.kernels.nsa_merge_kernels import branch_units, merge_rows, merge_tile, split_slots
from ssvkit.kernels.pdl import pdl_gate


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
    s_ptr,  # [B*Hkv*tiles, ROWS * GROUP, NC_max] fp32 compressed scores (STORE_S only)
    gate_ptr,
    o_ptr,
    counter_ptr,  # [B, t, H, 3] gates, o, zeroed i32 counters (kernels.arrivals; MERGE only)
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_cb,
    stride_ch,
    stride_ct,
    stride_ob,
    stride_ot,
    stride_oh,
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
    launch_slots,
    merge_chunks,
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
    MERGE: tl.constexpr,
    APPLY_GATES: tl.constexpr,
    S_PAD: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    MERGE_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles, slots)`` (``(B * Hkv * tiles * (slots + merge_chunks),)`` with
    ``MERGE`` 2): slot ``s`` runs an equal slice of one branch's units
    and writes its state to slot ``slot_base + s``. The slots go to the enabled branches
    (``branches``) in proportion to the key tiles each has in this program -- compressed, then
    selected, then window (``split_slots``) -- so a union list longer or shorter than the host
    expected still spreads evenly. All branches share one software-pipelined loop over key tiles: a
    tile's address comes from its unit alone (the selected branch's from one union-list entry),
    so the loads of the next tiles are in flight while one is computed on.

    The selected branch walks the tile's union list (``kernels.sparse_verify``'s union plan:
    each block once, with the bits of the rows that chose it); ``ALL_MEMBERS`` marks a plan of
    one row per tile, whose list is the row's own ``block_idx`` (-1 pads load nothing). The
    window loop covers the window's prefix tokens; the last window slot then adds the draft
    tail (``T_PAD`` >= t entries) in one step under the ancestor bitmask, so the loop carries
    no tree mask. ``HAS_SEL``: the launch has selected slots (else the loop reads no list).
    ``STORE_S`` (a launch of compressed slots only: the refresh path's) also
    writes each real MMA row's log2-domain score of every compressed token to ``s_ptr``, which
    the block scoring reads instead of computing them again.

    ``MERGE``: whether and how the launch also merges slots ``[0, slot_base + slots)`` (slots
    below ``slot_base`` are compressed, written by an earlier launch), gates them
    (``APPLY_GATES``) and writes ``o``, on ``kernels.arrivals``' counters:

    - 0: it does not (the merge is a launch of its own, or the partials feed the selection);
    - 1: each program, its partial written, arrives on its row tile's counter, and the tile's
      last slot to arrive merges the whole tile (``merge_tile``);
    - 2: programs take tickets; the first ``B * Hkv * tiles * slots`` run the slots and arrive
      on their tile's counter (``1 + pid``), the others merge ``MERGE_ROWS`` MMA rows of one
      tile each (``merge_rows``, ``merge_chunks`` per tile) once all of its slots arrived, so
      a tile's merge is spread over programs.

    ``PDL`` (``kernels.pdl``): a forward program loads its queries before it waits for the
    previous launch; with ``MERGE`` 2 every program waits first (its ticket is a store)."""
    if MERGE == 2:
        pdl_gate(PDL)
        ticket = take_ticket(counter_ptr)
        tiles_all = tl.num_programs(0) // (launch_slots + merge_chunks)
        num_fwd = tiles_all * launch_slots
        if ticket < num_fwd:
            pid = ticket // launch_slots
            forward_slot(
                pid,
                ticket % launch_slots,
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
                NUM_KV_HEADS,
                GROUP,
                GROUP_PAD,
                HEAD_DIM,
                BLOCK_M,
                BLOCK_N,
                BLOCK_SIZE,
                ALL_MEMBERS,
                T_PAD,
                NUM_STAGES,
                DOT_PRECISION,
                STORE_S,
                HAS_SEL,
                False,
            )
            arrive(counter_ptr + 1 + pid)
        else:
            pid = (ticket - num_fwd) // merge_chunks
            wait_for(counter_ptr + 1 + pid, launch_slots)
            b = (pid // num_tiles // NUM_KV_HEADS).to(tl.int64)
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
            c_slots, s_slots = split_slots(branches, launch_slots, units_c, units_s, units_w)
            merge_rows(
                part_acc_ptr,
                part_ml_ptr,
                gate_ptr,
                o_ptr,
                pid,
                b,
                (pid // num_tiles % NUM_KV_HEADS).to(tl.int64),
                pid % num_tiles,
                num_t,
                num_slots,
                slot_base + launch_slots,
                slot_base + c_slots,
                slot_base + c_slots + s_slots,
                stride_ob,
                stride_ot,
                stride_oh,
                (ticket - num_fwd) % merge_chunks * MERGE_ROWS,
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
            leave(counter_ptr + 1 + pid, counter_ptr + 1 + tiles_all + pid, merge_chunks)
    else:
        pid = tl.program_id(0)
        c_slots, s_slots = forward_slot(
            pid,
            tl.program_id(1),
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
            NUM_KV_HEADS,
            GROUP,
            GROUP_PAD,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_N,
            BLOCK_SIZE,
            ALL_MEMBERS,
            T_PAD,
            NUM_STAGES,
            DOT_PRECISION,
            STORE_S,
            HAS_SEL,
            PDL,
        )
        if MERGE == 1:
            if last_to_arrive(counter_ptr + pid, launch_slots):
                bh = pid // num_tiles
                merge_tile(
                    part_acc_ptr,
                    part_ml_ptr,
                    gate_ptr,
                    o_ptr,
                    pid,
                    (bh // NUM_KV_HEADS).to(tl.int64),
                    (bh % NUM_KV_HEADS).to(tl.int64),
                    pid % num_tiles,
                    num_t,
                    num_slots,
                    slot_base + launch_slots,
                    slot_base + c_slots,
                    slot_base + c_slots + s_slots,
                    stride_ob,
                    stride_ot,
                    stride_oh,
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
def nsa_gate_kernel(
    branch_ptr,  # [3, rows, D]: the branches' normalised outputs (compressed, selected, window)
    gate_ptr,  # [rows, 3] fp32
    o_ptr,  # [rows, D]
    num_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Grid ``(cdiv(rows, BLOCK_R),)``: ``o = g_c * o_c + g_s * o_s + g_w * o_w`` per row
    (``rows`` = B * t * H), in fp32 with one rounding: the unfused baseline's gating in one
    launch."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < num_rows
    off = rows.to(tl.int64)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for x in tl.static_range(3):
        g = tl.load(gate_ptr + rows.to(tl.int64) * 3 + x, mask=ok, other=0.0).to(tl.float32)
        o_x = tl.load(branch_ptr + x * num_rows * HEAD_DIM + off, mask=ok[:, None], other=0.0)
        acc += g[:, None] * o_x.to(tl.float32)
    tl.store(o_ptr + off, acc.to(o_ptr.dtype.element_ty), mask=ok[:, None])
