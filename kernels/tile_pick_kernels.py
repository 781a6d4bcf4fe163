"""Triton code of :mod:`kernels.top_blocks`' tile pick: the top-n block pick of a score row
whose scoring also wrote each tile's maximum (``kernels.block_scores`` with ``tile_max``), so
that the pick reads the maxima and the few tiles that can hold a pick instead of the whole row.
Keys and the exact cut are :mod:`kernels.top_blocks_kernels`'."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.top_blocks_kernels import (
    LIVE_KEY,
    NO_BLOCK,
    NO_KEY,
    NOT_REGULAR,
    key_of,
    kth_largest,
    packed_positions,
    regular_scores,
    store_ascending,
    store_window,
    window_candidates,
)


@triton.jit
def ordered_max(s, AXIS: tl.constexpr):
    """The maximum of fp32 scores ``s`` along ``AXIS`` as the int32 that orders like it
    (``regular_scores``' map before its clamp): what the tile pick reads."""
    bits = s.to(tl.int32, bitcast=True)
    return tl.max(bits ^ ((bits >> 31) & 0x7FFFFFFF), AXIS)


@triton.jit
def tile_pick_kernel(
    score_ptr,
    tmax_ptr,
    prefix_ptr,
    out_ptr,  # scores [B, Hkv, t, NB_max] fp32, tile maxima [B, Hkv, t, NT] i32, lens [B]
    scratch_ptr,  # i32, out [B, Hkv, t, TOP_N + LOCAL_SLOTS] i32, scratch [rows, S_CAP + CAP]
    pos_ptr,  # i32, row positions [B, t] i64
    num_t,
    nb_max,
    row_stride,
    tmax_stride,
    num_sink,
    num_local,
    window,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    W: tl.constexpr,
    NT_PAD: tl.constexpr,
    S_CAP: tl.constexpr,
    GROUPS: tl.constexpr,
    CAP: tl.constexpr,
    LOCAL_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * t,)``: row ``program_id``'s pick, the same as ``threshold_pick``'s.

    Block ``j`` lies in tile ``j // W``, whose maximum the scoring wrote. A tile inside the
    regular range ``[lo, hi)`` is pure; one that meets the range and a forced block is an edge.
    The ``K``-th largest pure maximum ``tau`` bounds the answer from below (at least ``K``
    regular scores reach it), and every block at or above it lies in a pure tile whose maximum
    reaches ``tau`` or in an edge: those tiles, at most ``S_CAP`` of them, are gathered as one
    ``[S_CAP, W]`` tile in block order, and ``cut_tile`` picks from it. More tiles reach
    ``tau`` only where maxima tie; the pick then takes rounds over the whole row
    (``rounds_over_row``)."""
    r = tl.program_id(0)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    nb = tl.minimum((prefix + BLOCK_SIZE - 1) // BLOCK_SIZE, nb_max)
    if LOCAL_SLOTS > 0:
        pos = tl.load(pos_ptr + b.to(tl.int64) * num_t + r % num_t).to(tl.int64)
        nb = window_candidates(nb, pos, window, BLOCK_SIZE)
    lo = tl.minimum(num_sink, nb)
    hi = tl.maximum(nb - num_local, lo)
    k = TOP_N - lo - (nb - hi)  # regular picks; check_forced keeps it >= 0
    base = score_ptr + r.to(tl.int64) * row_stride
    work = scratch_ptr + r.to(tl.int64) * (S_CAP + CAP)
    out_row = out_ptr + r.to(tl.int64) * (TOP_N + LOCAL_SLOTS)
    tile = tl.arange(0, NT_PAD)
    first = tile * W
    pdl_gate(PDL)
    tm = tl.load(tmax_ptr + r.to(tl.int64) * tmax_stride + tile, mask=first < hi, other=0)
    tm = tl.minimum(tl.maximum(tm, NOT_REGULAR + 1), 2147483646)
    pure = (first >= lo) & (first + W <= hi)
    edge = (first < hi) & (first + W > lo) & ~pure
    kth = kth_largest(tl.where(pure, tm, NOT_REGULAR), tl.minimum(tl.maximum(k, 1), NT_PAD))
    kth = tl.where(k <= NT_PAD, kth, NOT_REGULAR)
    # No candidate when no slot is left; every regular block one when fewer than k are pure.
    tau = tl.where(k > 0, tl.maximum(kth, NOT_REGULAR + 1), 2147483647)
    scan = (((pure & (tm >= tau)) | edge) & (k > 0)).to(tl.int32)
    num_scan = tl.sum(scan, 0)
    if num_scan <= S_CAP:
        tl.store(work + packed_positions(scan, False), tile, mask=scan > 0)
        tl.debug_barrier()
        row = tl.arange(0, S_CAP)
        ok = row < num_scan
        tid = tl.load(work + row, mask=ok, other=0, cache_modifier=".cg")
        j = tid[:, None] * W + tl.arange(0, W)[None, :]  # [S_CAP, W] blocks in order
        s = tl.load(base + j, mask=ok[:, None] & (j < hi), other=0.0)
        v = tl.where(ok[:, None], regular_scores(s, j, lo, hi), NOT_REGULAR)
        cut_tile(
            v, j, tau, k, lo, hi, nb, base, work + S_CAP, out_row, TOP_N, TOP_N_PAD, GROUPS, CAP
        )
    else:
        rounds_over_row(base, k, lo, hi, nb, out_row, S_CAP, W, TOP_N, TOP_N_PAD)
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)


@triton.jit
def cut_tile(
    v,
    j,
    tau,
    k,
    lo,
    hi,
    nb,
    base,
    work,
    out_row,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    GROUPS: tl.constexpr,
    CAP: tl.constexpr,
):
    """Write the row's pick from the tile ``v`` (ordered scores of blocks ``j``, in block
    order, ``NOT_REGULAR`` where not regular) that holds every regular block at or above
    ``tau``, the lower bound of its ``k``-th largest: the blocks at or above ``tau`` are
    packed into ``work`` and cut exactly at their ``k``-th largest key. Where more than
    ``CAP`` reach ``tau`` (short rows, whose few tiles bound the answer loosely), the bound
    rises to the ``k``-th largest maximum of the tile's ``GROUPS`` strided groups (the
    threshold pick's bound, ``GROUPS`` dividing the tile); more than ``CAP`` above that take
    ``k`` rounds over the tile. The forced blocks ``[0, lo)`` and ``[hi, nb)`` fill
    the other slots."""
    slots = tl.arange(0, TOP_N_PAD)
    cand = (v >= tau).to(tl.int32)
    num_cand = tl.sum(tl.sum(cand, 1), 0)
    if num_cand > CAP:
        # A tighter bound: the k-th largest maximum of GROUPS strided groups of the tile.
        gm = tl.max(tl.reshape(v, (v.shape[0] * v.shape[1] // GROUPS, GROUPS)), 0)
        kth = kth_largest(gm, tl.minimum(tl.maximum(k, 1), GROUPS))
        tau = tl.maximum(tau, tl.where(k <= GROUPS, kth, NOT_REGULAR))
        cand = (v >= tau).to(tl.int32)
        num_cand = tl.sum(tl.sum(cand, 1), 0)
    if num_cand <= CAP:
        tl.store(work + packed_positions(cand, True), j, mask=cand > 0)
        tl.debug_barrier()
        c = tl.arange(0, CAP)
        in_list = c < num_cand
        cj = tl.load(work + c, mask=in_list, other=0, cache_modifier=".cg")
        cs = tl.load(base + cj, mask=in_list, other=0.0)
        ckey = tl.where(in_list, key_of(regular_scores(cs, cj, lo, hi), cj), -1)
        cut = tl.maximum(kth_largest(ckey, tl.maximum(k, 1)), LIVE_KEY)
        keep = ((ckey >= cut) & (k > 0)).to(tl.int32)
        tl.store(out_row + lo + packed_positions(keep, False), cj, mask=keep > 0)
        kept = tl.sum(keep, 0)
        blk = tl.where(slots < lo, slots, hi + slots - lo - kept)
        blk = tl.where(slots < lo + kept + nb - hi, blk, -1)
        tl.store(out_row + slots, blk, mask=((slots < lo) | (slots >= lo + kept)) & (slots < TOP_N))
    else:
        keys = tl.where(v > NOT_REGULAR, key_of(v, j), -1)
        chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
        prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
        for i in range(k):
            best = tl.max(tl.max(tl.where(keys < prev, keys, -1), 1), 0)
            blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
            chosen = tl.where(slots == i, blk, chosen)
            prev = tl.where(best >= 0, best, prev)
        store_forced(chosen, slots, k, lo, hi, nb, out_row, TOP_N)


@triton.jit
def rounds_over_row(
    base,
    k,
    lo,
    hi,
    nb,
    out_row,
    ROWS: tl.constexpr,
    W: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
):
    """The row's pick as ``k`` rounds, each one max-reduction over the regular blocks walked
    in ``[ROWS, W]`` tiles: the tile pick's path where tied maxima leave too many tiles."""
    slots = tl.arange(0, TOP_N_PAD)
    offs = tl.arange(0, ROWS)[:, None] * W + tl.arange(0, W)[None, :]
    chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
    prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
    for i in range(k):
        best = tl.full([], -1, dtype=tl.int64) + 0
        for c in range(lo // (ROWS * W), tl.cdiv(hi, ROWS * W)):
            j = c * (ROWS * W) + offs
            v = regular_scores(tl.load(base + j, mask=j < hi, other=0.0), j, lo, hi)
            keys = tl.where(v > NOT_REGULAR, key_of(v, j), -1)
            best = tl.maximum(best, tl.max(tl.max(tl.where(keys < prev, keys, -1), 1), 0))
        blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
        chosen = tl.where(slots == i, blk, chosen)
        prev = tl.where(best >= 0, best, prev)
    store_forced(chosen, slots, k, lo, hi, nb, out_row, TOP_N)


@triton.jit
def store_forced(chosen, slots, k, lo, hi, nb, out_row, TOP_N: tl.constexpr):
    """Write the ``k`` regular picks ``chosen`` and the forced blocks ``[0, lo)`` and
    ``[hi, nb)`` after them, all ascending (``store_ascending``)."""
    forced = tl.where(slots - k < lo, slots - k, hi + slots - k - lo)
    chosen = tl.where((slots >= k) & (slots - k < lo + nb - hi), forced, chosen)
    store_ascending(chosen, slots, out_row, TOP_N)
