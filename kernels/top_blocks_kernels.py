"""Triton code of :mod:`kernels.top_blocks`' top-n block pick: ``topk_blocks_kernel`` (one
max-reduction over the row per pick), ``threshold_blocks_kernel`` and its device function
``threshold_pick`` (the bound from strided group maxima, the candidates above it cut exactly),
which :mod:`kernels.select_kernels` and :mod:`kernels.nsa_folded_pick` also call inside their
one-launch selections. Keys: a block's score and id in one int64, ties to the lower block."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.pdl import pdl_gate

# Larger than any block id: "no block" in the top-n selection.
NO_BLOCK = tl.constexpr(2**30)
# Above every top-n key (``_block_keys``): the "previous pick" before the first round.
NO_KEY = tl.constexpr(2**63 - 1)
# The lowest key (``key_of``) of a live block in the threshold pick.
LIVE_KEY = tl.constexpr(2**30)
# The threshold pick's int32 score of a block it does not rank (``regular_scores``).
NOT_REGULAR = tl.constexpr(-(2**31))


@triton.jit
def topk_blocks_kernel(
    score_ptr,
    prefix_ptr,
    out_ptr,  # [B, Hkv, t, NB_max] fp32, [B] i32, [B, Hkv, t, TOP_N + LOCAL_SLOTS] i32
    pos_ptr,  # [B, t] i64 row positions (read where LOCAL_SLOTS > 0)
    num_t,
    nb_max,
    row_stride,
    num_sink,
    num_local,
    window,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    TAIL: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    LOCAL_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * t,)``: one row's ``TOP_N`` best blocks of its prefix's ``nb`` blocks,
    the first ``num_sink`` and last ``num_local`` forced, ascending, ``-1`` padded.

    Each block gets one int64 key ordered by (score, then lower block): the score's bits made
    order-preserving as an integer, above the complemented block id. ``TOP_N`` rounds each take
    the largest key below the previous pick (one max-reduction), so ties resolve to the lower
    block and nothing is written between rounds; a row of at most ``CHUNK + TAIL`` blocks
    (``NUM_CHUNKS`` 1) stays in registers throughout, a longer one is walked in chunks up to
    its prefix's last block. ``PDL``: the scores load after ``pdl_gate``. ``LOCAL_SLOTS`` > 0:
    the position-relative rule of ``window_candidates`` and ``store_window``."""
    r = tl.program_id(0)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    nb = tl.minimum((prefix + BLOCK_SIZE - 1) // BLOCK_SIZE, nb_max)
    if LOCAL_SLOTS > 0:
        pos = tl.load(pos_ptr + b.to(tl.int64) * num_t + r % num_t).to(tl.int64)
        nb = window_candidates(nb, pos, window, BLOCK_SIZE)
    base = score_ptr + r.to(tl.int64) * row_stride
    offs = tl.arange(0, CHUNK)
    slots = tl.arange(0, TOP_N_PAD)
    chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
    prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
    pdl_gate(PDL)
    if NUM_CHUNKS == 1:
        keys = _block_keys(base, offs, nb, num_sink, num_local)
        if TAIL > 0:
            keys_tail = _block_keys(base, CHUNK + tl.arange(0, TAIL), nb, num_sink, num_local)
    for i in range(TOP_N):
        if NUM_CHUNKS == 1:
            best = tl.max(tl.where(keys < prev, keys, -1))
            if TAIL > 0:
                best = tl.maximum(best, tl.max(tl.where(keys_tail < prev, keys_tail, -1)))
        else:
            best = tl.full([], -1, dtype=tl.int64) + 0
            for c in range(tl.cdiv(nb, CHUNK)):
                keys = _block_keys(base, c * CHUNK + offs, nb, num_sink, num_local)
                best = tl.maximum(best, tl.max(tl.where(keys < prev, keys, -1)))
        # A key's low 30 bits hold ~block; -1 (nothing left) maps to NO_BLOCK.
        blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
        chosen = tl.where(slots == i, blk, chosen)
        prev = tl.where(best >= 0, best, prev)
    out_row = out_ptr + r.to(tl.int64) * (TOP_N + LOCAL_SLOTS)
    store_ascending(chosen, slots, out_row, TOP_N)
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)


@triton.jit
def store_ascending(chosen, slots, out_row, TOP_N: tl.constexpr):
    """Write the picks ``chosen`` (``NO_BLOCK`` for none) ascending, ``-1`` padded."""
    # Each pick's rank among the picks (ties only among NO_BLOCK, by slot).
    before = (chosen[None, :] < chosen[:, None]) | (
        (chosen[None, :] == chosen[:, None]) & (slots[None, :] < slots[:, None])
    )  # [TOP_N_PAD, TOP_N_PAD]: pick k comes before pick i
    rank = tl.sum(before.to(tl.int32), 1)
    ordered = tl.sum(tl.where(rank[:, None] == slots[None, :], chosen[:, None], 0), 0)
    ordered = tl.where(ordered == NO_BLOCK, -1, ordered)
    tl.store(out_row + slots, ordered, mask=slots < TOP_N)


@triton.jit
def window_candidates(nb, pos, window, BLOCK_SIZE: tl.constexpr):
    """The candidate blocks of a row at position ``pos`` under the position-relative rule: the
    first ``nb`` live blocks that end before its window ``[pos - window, pos)`` begins."""
    lo = tl.maximum(pos - window, 0) // BLOCK_SIZE
    return tl.minimum(nb, lo.to(tl.int32))


@triton.jit
def store_window(out, pos, prefix, window, BLOCK_SIZE: tl.constexpr, LOCAL_SLOTS: tl.constexpr):
    """Write the ``LOCAL_SLOTS`` blocks from the one holding ``pos - window`` on, each that
    begins before ``pos`` and inside the prefix, ``-1`` for the others: the blocks a row at
    ``pos`` attends besides its picks."""
    lo = tl.maximum(pos - window, 0) // BLOCK_SIZE
    hi = tl.where(pos > 0, (tl.maximum(pos, 1) - 1) // BLOCK_SIZE, -1)
    live = (prefix.to(tl.int64) + BLOCK_SIZE - 1) // BLOCK_SIZE
    for s in tl.static_range(LOCAL_SLOTS):
        blk = lo + s
        tl.store(out + s, tl.where((blk <= hi) & (blk < live), blk, -1).to(tl.int32))


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
def threshold_blocks_kernel(
    score_ptr,
    prefix_ptr,
    out_ptr,
    scratch_ptr,  # scores [B, Hkv, t, NB_max] fp32, lens [B] i32, out [B, Hkv, t, TOP_N +
    pos_ptr,  # LOCAL_SLOTS] i32, scratch [rows, CAP] i64, row positions [B, t] i64
    num_t,
    nb_max,
    row_stride,
    num_sink,
    num_local,
    window,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
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
    """Grid ``(B * Hkv * t,)``: ``threshold_pick`` of row ``program_id``."""
    threshold_pick(
        tl.program_id(0),
        score_ptr,
        prefix_ptr,
        out_ptr,
        scratch_ptr,
        pos_ptr,
        num_t,
        nb_max,
        row_stride,
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
        "",
        PDL,
    )


@triton.jit
def threshold_pick(
    r,
    score_ptr,
    prefix_ptr,
    out_ptr,
    scratch_ptr,
    pos_ptr,
    num_t,
    nb_max,
    row_stride,
    num_sink,
    num_local,
    window,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    TAIL: tl.constexpr,
    GROUPS: tl.constexpr,
    TAIL_ROWS: tl.constexpr,
    CAP: tl.constexpr,
    LOCAL_SLOTS: tl.constexpr,
    CACHE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``r``'s pick, the same as ``topk_blocks_kernel``'s (the ``TOP_N`` largest keys of
    the row), with work linear in the row instead of ``TOP_N`` passes over it. ``CACHE``: the
    cache modifier of the score loads (``".cg"`` where other programs of the launch wrote
    them). ``PDL``: the scores load after ``pdl_gate``. ``LOCAL_SLOTS`` > 0: the
    position-relative rule (``window_candidates``; ``store_window`` after the picks).

    The forced blocks, the first ``lo`` and the last ``nb - hi`` live ones, are written as they
    are; the pick ranks the regular blocks ``[lo, hi)`` alone for the ``K`` slots left. Block
    ``j`` falls into group ``j % GROUPS`` (strided, so a run of neighbouring high scores spreads
    over groups). The ``K``-th largest group maximum ``tau`` bounds the answer from below: at
    least ``K`` scores reach it. The blocks at or above ``tau`` (about ``1.4 K`` of random
    scores with ``GROUPS = 2 TOP_N_PAD``) are compacted in block order into scratch memory;
    the ``K``-th largest of their keys (score, then lower block) is the exact cut, and the
    blocks at or above it are written in that order: ascending. Scores are held as 32-bit
    order-preserving integers; only the ``CAP`` candidates get 64-bit keys. More than ``CAP``
    candidates (scores that defeat the strided groups) fall back to rounds as
    ``topk_blocks_kernel``'s, on the regular blocks."""
    tl.static_assert(CHUNK % GROUPS == 0)
    tl.static_assert(GROUPS >= TOP_N_PAD)
    tl.static_assert(CAP >= TOP_N_PAD)
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
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, CHUNK // GROUPS)[:, None] * GROUPS + g[None, :]  # [SPAN, GROUPS]
    pdl_gate(PDL)
    # The main tile lies inside the row (CHUNK <= nb_max): loaded whole, with no mask, so its
    # loads issue together and what lies outside [lo, hi) is discarded after. The tail joins
    # the groups as a tile of at least two rows; its blocks past nb_max are never live. Both
    # loads are issued before either is reduced.
    v = regular_scores(tl.load(base + j, cache_modifier=CACHE), j, lo, hi)
    if TAIL > 0:
        jt = CHUNK + tl.arange(0, TAIL_ROWS)[:, None] * GROUPS + g[None, :]
        st = tl.load(base + jt, mask=jt < hi, other=0.0, cache_modifier=CACHE)
        vt = regular_scores(st, jt, lo, hi)
    gv = tl.max(v, 0)
    if TAIL > 0:
        gv = tl.maximum(gv, tl.max(vt, 0))
    # No candidate when no slot is left; every regular block one when fewer than k are.
    tau = tl.where(k > 0, tl.maximum(kth_largest(gv, k), NOT_REGULAR + 1), 2147483647)
    cand = (v >= tau).to(tl.int32)
    num_main = tl.sum(tl.sum(cand, 1), 0)
    num_cand = num_main
    if TAIL > 0:
        cand_t = (vt >= tau).to(tl.int32)
        num_cand += tl.sum(tl.sum(cand_t, 1), 0)
    out_row = out_ptr + r.to(tl.int64) * (TOP_N + LOCAL_SLOTS)
    slots = tl.arange(0, TOP_N_PAD)
    if num_cand <= CAP:
        # Candidates' blocks in block order: row-major over the main tile, then the tail.
        work = scratch_ptr.to(tl.pointer_type(tl.int32)) + r.to(tl.int64) * (2 * CAP)
        tl.store(work + packed_positions(cand, True), j, mask=cand > 0)
        if TAIL > 0:
            tl.store(work + num_main + packed_positions(cand_t, True), jt, mask=cand_t > 0)
        tl.debug_barrier()
        c = tl.arange(0, CAP)
        in_list = c < num_cand
        cj = tl.load(work + c, mask=in_list, other=0, cache_modifier=".cg")
        cs = tl.load(base + cj, mask=in_list, other=0.0, cache_modifier=CACHE)
        ckey = tl.where(in_list, key_of(regular_scores(cs, cj, lo, hi), cj), -1)
        cut = tl.maximum(kth_largest(ckey, tl.maximum(k, 1)), LIVE_KEY)
        keep = ((ckey >= cut) & (k > 0)).to(tl.int32)
        tl.store(out_row + lo + packed_positions(keep, False), cj, mask=keep > 0)
        kept = tl.sum(keep, 0)
        blk = tl.where(slots < lo, slots, hi + slots - lo - kept)
        blk = tl.where(slots < lo + kept + nb - hi, blk, -1)
        tl.store(out_row + slots, blk, mask=((slots < lo) | (slots >= lo + kept)) & (slots < TOP_N))
    else:
        chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
        prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
        keys = tl.where(v > NOT_REGULAR, key_of(v, j), -1)
        if TAIL > 0:
            keys_t = tl.where(vt > NOT_REGULAR, key_of(vt, jt), -1)
        for i in range(k):
            best = tl.max(tl.max(tl.where(keys < prev, keys, -1), 1), 0)
            if TAIL > 0:
                below = tl.where(keys_t < prev, keys_t, -1)
                best = tl.maximum(best, tl.max(tl.max(below, 1), 0))
            blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
            chosen = tl.where(slots == i, blk, chosen)
            prev = tl.where(best >= 0, best, prev)
        forced = tl.where(slots - k < lo, slots - k, hi + slots - k - lo)
        chosen = tl.where((slots >= k) & (slots - k < lo + nb - hi), forced, chosen)
        store_ascending(chosen, slots, out_row, TOP_N)
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)


@triton.jit
def packed_positions(flag, WIDE: tl.constexpr):
    """Exclusive prefix count of the int32 ``flag`` (a 2-D tile if ``WIDE``, else a vector)
    in row-major order: where each flagged element goes when the flagged ones are packed."""
    if WIDE:
        per_row = tl.sum(flag, 1)
        return (tl.cumsum(per_row, 0) - per_row)[:, None] + tl.cumsum(flag, 1) - flag
    else:
        return tl.cumsum(flag, 0) - flag


@triton.jit
def regular_scores(s, j, lo, hi):
    """fp32 scores ``s`` of blocks ``j`` as int32 in the same order, in ``(NOT_REGULAR,
    2^31 - 1)``; ``NOT_REGULAR`` for blocks outside the regular range ``[lo, hi)``."""
    bits = s.to(tl.int32, bitcast=True)
    # A negative float's magnitude bits flipped: its order as a signed integer.
    v = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    v = tl.minimum(tl.maximum(v, NOT_REGULAR + 1), 2147483646)
    return tl.where((j >= lo) & (j < hi), v, NOT_REGULAR)


@triton.jit
def key_of(v, j):
    """Non-negative int64 keys ordered by (score, lower block) of ordered scores ``v`` of
    blocks ``j``; live blocks from ``2^30`` up, blocks past the prefix below."""
    return ((v.to(tl.int64) + 2147483648) << 30) | (~j & 0x3FFFFFFF).to(tl.int64)


@triton.jit
def kth_largest(x, k):
    """The ``k``-th largest element of the 1-D integer tensor ``x`` (``1 <= k <=`` its
    length)."""
    ranked = tl.sort(x, descending=True)
    return tl.sum(tl.where(tl.arange(0, x.shape[0]) == k - 1, ranked, 0), 0)
