"""Triton code of :mod:`kernels.select_blocks`' one-launch selection (``select_kernel``): the
block scores of :mod:`kernels.select_kernels`' ``score_range`` and the threshold pick of
:mod:`kernels.top_blocks_kernels` in one grid, each row's pick once its scores have arrived
(:mod:`kernels.arrivals`).
"""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import arrive, leave, take_ticket, wait_for
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.select_kernels import score_range
from ssvkit.kernels.top_blocks_kernels import threshold_pick


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
            pos_ptr,
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
            num_sink,
            num_local,
            window,
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
            0,
            False,
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
