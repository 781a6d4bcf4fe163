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
# The lowest key (``_key``) of a live block in the threshold pick.
LIVE_KEY = tl.constexpr(2**30)


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
    _store_ascending(chosen, slots, out_row, TOP_N)
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)


@triton.jit
def _store_ascending(chosen, slots, out_row, TOP_N: tl.constexpr):
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

    Block ``j`` falls into group ``j % GROUPS`` (strided, so a run of neighbouring high scores
    spreads over groups). The ``TOP_N``-th largest group maximum ``tau`` bounds the answer from
    below: at least ``TOP_N`` keys reach it. The keys at or above ``tau`` (about ``1.4 TOP_N``
    of random scores with ``GROUPS = 2 TOP_N_PAD``) are compacted in block order into scratch
    memory; the ``TOP_N``-th largest of them is the exact cut, and the keys at or above it are
    written in that order: ascending. Scores are held as 32-bit order-preserving integers; a
    key is (score, lower block) in 64 bits only for the ``GROUPS`` maxima and the ``CAP``
    candidates. More than ``CAP`` candidates (scores that defeat the strided groups) fall back
    to the rounds of ``topk_blocks_kernel``."""
    tl.static_assert(CHUNK % GROUPS == 0)
    tl.static_assert(GROUPS >= TOP_N_PAD)
    tl.static_assert(CAP >= TOP_N_PAD)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    nb = tl.minimum((prefix + BLOCK_SIZE - 1) // BLOCK_SIZE, nb_max)
    if LOCAL_SLOTS > 0:
        pos = tl.load(pos_ptr + b.to(tl.int64) * num_t + r % num_t).to(tl.int64)
        nb = window_candidates(nb, pos, window, BLOCK_SIZE)
    base = score_ptr + r.to(tl.int64) * row_stride
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, CHUNK // GROUPS)[:, None] * GROUPS + g[None, :]  # [SPAN, GROUPS]
    pdl_gate(PDL)
    # The main tile lies inside the row (CHUNK <= nb_max): loaded whole, so the loads are
    # 16-byte vectors issued together, not scalar loads each waited on behind its mask. The
    # tail joins the groups as a tile of at least two rows; its blocks past nb_max are never
    # live. Both loads are issued before either is reduced.
    v = _ordered_scores(base, j, nb, num_sink, num_local, CACHE, False)
    if TAIL > 0:
        jt = CHUNK + tl.arange(0, TAIL_ROWS)[:, None] * GROUPS + g[None, :]
        vt = _ordered_scores(base, jt, nb, num_sink, num_local, CACHE, True)
    gv = tl.max(v, 0)
    if TAIL > 0:
        gv = tl.maximum(gv, tl.max(vt, 0))
    # Each group's key: its best score and, among ties, its lowest block.
    gj = tl.min(tl.where(v == gv[None, :], j, 2**30), 0)
    if TAIL > 0:
        gj = tl.minimum(gj, tl.min(tl.where(vt == gv[None, :], jt, 2**30), 0))
    tau = _kth_largest(_key(gv, gj), TOP_N)
    # Below the lowest live key: fewer than TOP_N live blocks, every live block a candidate.
    tau = tl.maximum(tau, LIVE_KEY)
    cand = (_key_at_least(v, j, tau) & (j < nb)).to(tl.int32)
    num_main = tl.sum(tl.sum(cand, 1), 0)
    num_cand = num_main
    if TAIL > 0:
        cand_t = (_key_at_least(vt, jt, tau) & (jt < nb)).to(tl.int32)
        num_cand += tl.sum(tl.sum(cand_t, 1), 0)
    out_row = out_ptr + r.to(tl.int64) * (TOP_N + LOCAL_SLOTS)
    slots = tl.arange(0, TOP_N_PAD)
    if num_cand <= CAP:
        # Candidates in block order: row-major over the main tile, then the tail.
        work = scratch_ptr + r.to(tl.int64) * CAP
        tl.store(work + _positions(cand, True), _key(v, j), mask=cand > 0)
        if TAIL > 0:
            pos_t = num_main + _positions(cand_t, True)
            tl.store(work + pos_t, _key(vt, jt), mask=cand_t > 0)
        tl.debug_barrier()
        c = tl.arange(0, CAP)
        ckey = tl.load(work + c, mask=c < num_cand, other=-1, cache_modifier=".cg")
        cut = tl.maximum(_kth_largest(ckey, TOP_N), LIVE_KEY)
        keep = (ckey >= cut).to(tl.int32)
        tl.store(out_row + _positions(keep, False), (~ckey & 0x3FFFFFFF).to(tl.int32), keep > 0)
        num_kept = tl.sum(keep, 0)
        tl.store(out_row + slots, -1, mask=(slots >= num_kept) & (slots < TOP_N))
    else:
        chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
        prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
        keys = tl.where(j < nb, _key(v, j), -1)
        if TAIL > 0:
            keys_t = tl.where(jt < nb, _key(vt, jt), -1)
        for i in range(TOP_N):
            best = tl.max(tl.max(tl.where(keys < prev, keys, -1), 1), 0)
            if TAIL > 0:
                below = tl.where(keys_t < prev, keys_t, -1)
                best = tl.maximum(best, tl.max(tl.max(below, 1), 0))
            blk = tl.where(best >= 0, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK)
            chosen = tl.where(slots == i, blk, chosen)
            prev = tl.where(best >= 0, best, prev)
        _store_ascending(chosen, slots, out_row, TOP_N)
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)


@triton.jit
def _positions(flag, WIDE: tl.constexpr):
    """Exclusive prefix count of the int32 ``flag`` (a 2-D tile if ``WIDE``, else a vector)
    in row-major order: where each flagged element goes when the flagged ones are packed."""
    if WIDE:
        per_row = tl.sum(flag, 1)
        return (tl.cumsum(per_row, 0) - per_row)[:, None] + tl.cumsum(flag, 1) - flag
    else:
        return tl.cumsum(flag, 0) - flag


@triton.jit
def _ordered_scores(base, j, nb, num_sink, num_local, CACHE: tl.constexpr, MASKED: tl.constexpr):
    """Scores of blocks ``j`` as int32 in the same order (forced blocks above every score),
    ``-2^31`` for blocks past the prefix. ``MASKED``: only blocks before ``nb`` are read; else
    every ``j`` must lie inside the row's allocation (what lies past ``nb`` is discarded)."""
    if MASKED:
        s = tl.load(base + j, mask=j < nb, other=0.0, cache_modifier=CACHE)
    else:
        s = tl.load(base + j, cache_modifier=CACHE)
    bits = s.to(tl.int32, bitcast=True)
    # Flip all bits of negatives, the sign bit of the rest: unsigned order; then the sign bit
    # again for signed order. -2^31 stays free for "not live".
    v = tl.where(bits < 0, ~bits, bits | -2147483648) ^ -2147483648
    v = tl.maximum(v, -2147483647)
    forced = (j < num_sink) | (j >= nb - num_local)
    v = tl.where(forced, 2147483647, v)
    return tl.where(j < nb, v, -2147483648)


@triton.jit
def _key(v, j):
    """Non-negative int64 keys ordered by (score, lower block) of ordered scores ``v`` of
    blocks ``j``; live blocks from ``2^30`` up, blocks past the prefix below."""
    return ((v.to(tl.int64) + 2147483648) << 30) | (~j & 0x3FFFFFFF).to(tl.int64)


@triton.jit
def _key_at_least(v, j, key):
    """Whether (``v``, block ``j``) has a key at or above ``key``, without forming it."""
    kv = ((key >> 30) - 2147483648).to(tl.int32)
    kj = (~key & 0x3FFFFFFF).to(tl.int32)
    return (v > kv) | ((v == kv) & (j <= kj))


@triton.jit
def _kth_largest(x, K: tl.constexpr):
    """The ``K``-th largest element of the 1-D tensor ``x`` (``K`` <= its length)."""
    ranked = tl.sort(x, descending=True)
    return tl.max(tl.where(tl.arange(0, x.shape[0]) == K - 1, ranked, -(2**62)), 0)
