"""The NSA refresh path's block importance and top-n pick in one launch
(``NsaVerifyConfig(pick="folded")``, :mod:`kernels.nsa_selection`): the score programs of
:mod:`kernels.nsa_select_kernels` (or :mod:`kernels.nsa_stored_scores`) and the threshold pick
of :mod:`kernels.top_blocks` on one grid, ordered by :mod:`kernels.arrivals`' tickets."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.arrivals import arrive, leave, take_ticket, wait_for
from ssvkit.kernels.nsa_select_kernels import computed_importance
from ssvkit.kernels.nsa_stored_scores import stored_importance
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.top_blocks_kernels import threshold_pick


@triton.jit
def refresh_select_kernel(
    q_ptr,
    ck_ptr,
    s_ptr,
    part_ml_ptr,
    prefix_ptr,  # as block_score_kernel (s_ptr: stored_block_score_kernel's, STORED only)
    score_ptr,  # [B, Hkv, t, NB_max] fp32 scratch, rows score_stride apart
    out_ptr,  # [B, Hkv, t, TOP_N] i32
    scratch_ptr,  # [B * Hkv * t, CAP] i64
    counter_ptr,  # 1 + 2 * B * Hkv zeroed i32 counters (kernels.arrivals)
    stride_qb,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ch,
    stride_ct,
    num_t,
    num_tiles,
    nc_max,
    nb_max,
    score_stride,
    comp_block,
    comp_stride,
    qk_scale,
    c_splits,
    num_slots,
    num_sink,
    num_local,
    grid_j,
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
    C_PAD: tl.constexpr,
    W_PAD: tl.constexpr,
    STORED: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    TAIL: tl.constexpr,
    GROUPS: tl.constexpr,
    TAIL_ROWS: tl.constexpr,
    CAP: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * (score programs + t),)``: the refresh path's block importance and
    top-n pick in one launch, on ``kernels.arrivals``' tickets (counter 0). Tickets below ``B *
    Hkv *`` score programs run one program of ``stored_block_score_kernel`` (``STORED``) or
    ``block_score_kernel``'s grid for one (sequence x KV head) and arrive on its counter (``1 +
    pair``); each later ticket picks one draft row (``kernels.top_blocks_kernels.threshold_pick``,
    importance read from L2) once its pair's score programs have all arrived, and counts itself
    out (counters ``1 + B * Hkv + pair``). With ``PDL`` every program waits
    (``pdl_gate``) before its ticket."""
    pdl_gate(PDL)
    ROWS: tl.constexpr = BLOCK_M // GROUP_PAD
    per_pair = num_tiles * grid_j * (ROWS if STORED else 1)
    num_pairs = tl.num_programs(0) // (per_pair + num_t)
    arrive_ptr = counter_ptr + 1
    done_ptr = counter_ptr + 1 + num_pairs
    ticket = take_ticket(counter_ptr)
    num_scoring = num_pairs * per_pair
    if ticket < num_scoring:
        pair = ticket // per_pair
        rest = ticket % per_pair
        if STORED:
            stored_importance(
                pair * num_tiles + rest // (ROWS * grid_j),
                (rest // grid_j) % ROWS,
                rest % grid_j,
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
                False,
            )
        else:
            computed_importance(
                pair,
                rest // grid_j,
                rest % grid_j,
                num_tiles,
                q_ptr,
                ck_ptr,
                part_ml_ptr,
                prefix_ptr,
                score_ptr,
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
                NUM_KV_HEADS,
                GROUP,
                GROUP_PAD,
                HEAD_DIM,
                BLOCK_M,
                BLOCK_C,
                BLOCK_J,
                BLOCK_SIZE,
                DOT_PRECISION,
                OVERLAP_SPLIT,
                C_PAD,
                False,
            )
        arrive(arrive_ptr + pair)
    else:
        row = ticket - num_scoring  # (b * Hkv + h) * t + i
        pair = row // num_t
        wait_for(arrive_ptr + pair, per_pair)
        threshold_pick(
            row,
            score_ptr,
            prefix_ptr,
            out_ptr,
            scratch_ptr,
            prefix_ptr,  # no row positions: the prefix rule
            num_t,
            nb_max,
            score_stride,
            num_sink,
            num_local,
            0,
            NUM_KV_HEADS,
            BLOCK_SIZE,
            TOP_N,
            TOP_N_PAD,
            CHUNK,
            TAIL,
            GROUPS,
            TAIL_ROWS,
            CAP,
            0,
            ".cg",
            False,
        )
        leave(arrive_ptr + pair, done_ptr + pair, num_t)
