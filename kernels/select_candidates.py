"""The block selection's two-stage top-n pick (``select_blocks(..., candidates=True)``): each
score program keeps, per query row, the ``N`` best keys of its own block range
(``range_keys``, ``merge_top``) and writes those instead of the range's scores; one program
per row then cuts the row's ``top_n`` from its ranges' candidates (``candidate_pick_kernel``).

A row's ``k``-th best regular block lies among the ``k`` best of its own range, so the union of
every range's ``N >= k`` best holds the row's pick: the same blocks as ``kernels.top_blocks``
picks from the whole row, ties to the lower block (the keys are ``top_blocks_kernels``'). The
scores never reach memory: a row of ``NB`` blocks costs ``8 N`` bytes a range of ``R`` blocks
instead of ``4 NB``, written and read back, and its pick merges ``NB / R`` sorted runs of ``N``
keys instead of walking ``NB`` scores (after the GPU-wide scoring, the pick is latency-bound: a
short row shortens it). ``candidate_meta`` says which shapes the path serves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import pdl_gate
from ssvkit.kernels.top_blocks_kernels import (
    NOT_REGULAR,
    block_key,
    regular_scores,
    store_window,
    window_candidates,
)

# Score ranges of one row the candidate pick merges at most (a longer row is scored into memory
# and picked by ``kernels.top_blocks``).
MAX_RANGES = 256
# Larger than any block id: a candidate the pick does not keep.
NO_BLOCK = tl.constexpr(2**30)


def candidate_meta(num_ranges: int, block_nb: int, top_n: int) -> dict | None:
    """The constexprs of a two-stage pick (``CAND_N``: candidates a range keeps per row, the
    padded ``top_n``; ``RUNS``: a row's ``num_ranges`` runs of them padded to a power of two),
    or None where the path does not serve the shape: a score tile narrower than ``CAND_N``
    blocks (its best ``CAND_N`` would not be one slice of it), or more than ``MAX_RANGES``
    ranges a row."""
    cand_n = max(16, triton.next_power_of_2(top_n))
    runs = triton.next_power_of_2(max(num_ranges, 1))
    if block_nb < cand_n or runs > MAX_RANGES:
        return None
    return dict(CAND_N=cand_n, RUNS=runs)


def candidate_warps(rows: int, num_keys: int, device: torch.device) -> int:
    """Warps of one row's candidate pick of ``num_keys`` padded candidates: 4 while a row has
    an SM to itself, so more warps share its merges; beyond, rows share the SMs, and a row
    takes one warp for every 512 candidates (16 keys a lane) up to 4."""
    if rows <= num_sms(device):
        return 4
    return max(1, min(4, num_keys // 512))


@triton.jit
def row_candidates(prefix_len, pos, num_blocks, num_sink, num_local, window, BLOCK_SIZE, RELATIVE):
    """``(nb, lo, hi)`` of rows whose prefix holds ``prefix_len`` tokens (at positions ``pos``
    under the position-relative rule, ``RELATIVE``): their ``nb`` candidate blocks, of which
    ``[lo, hi)`` are the regular ones a pick ranks and the first ``lo`` and the last ``nb - hi``
    are forced in."""
    nb = tl.minimum((prefix_len + BLOCK_SIZE - 1) // BLOCK_SIZE, num_blocks)
    if RELATIVE:
        nb = window_candidates(nb, pos, window, BLOCK_SIZE)
    lo = tl.minimum(num_sink, nb)
    hi = tl.maximum(nb - num_local, lo)
    return nb, lo, hi


@triton.jit
def range_keys(s, blocks, lo, hi):
    """int64 keys (``top_blocks_kernels.block_key``: score, then the lower block) of the fp32
    score tile ``s`` ``[T_PAD, BLOCK_NB]`` of blocks ``blocks`` ``[BLOCK_NB]``, rows' regular
    ranges ``lo``, ``hi`` ``[T_PAD, 1]``; -1 for a block outside its row's range."""
    j = blocks[None, :]
    v = regular_scores(s, j, lo, hi)
    return tl.where(v > NOT_REGULAR, block_key(v, j), -1)


@triton.jit
def merge_top(run, keys, T_PAD: tl.constexpr, BLOCK_NB: tl.constexpr, CAND_N: tl.constexpr):
    """The ``CAND_N`` largest of each row of ``run`` ``[T_PAD, CAND_N]`` (ascending) and of the
    tile ``keys`` ``[T_PAD, BLOCK_NB]``, ascending. The tile's best ``CAND_N``, descending, are
    its sorted row's first slice (the largest of each column of its ``BLOCK_NB / CAND_N``
    slices); against ``run`` ascending, the larger of each pair holds the best ``CAND_N`` of
    both (a bitonic merge's first step), sorted again."""
    tl.static_assert(BLOCK_NB >= CAND_N)
    ranked = tl.sort(keys, descending=True)
    if BLOCK_NB > CAND_N:
        ranked = tl.max(tl.reshape(ranked, [T_PAD, BLOCK_NB // CAND_N, CAND_N]), 1)
    return tl.sort(tl.maximum(run, ranked))


@triton.jit
def top_of_runs(runs, RUNS: tl.constexpr, CAND_N: tl.constexpr):
    """The ``CAND_N`` largest keys, ascending, of ``RUNS`` ascending runs ``[RUNS, CAND_N]``
    (a power of two of them): runs merged pairwise, each pair to its best ``CAND_N`` (the
    larger of each key of one and the mirrored key of the other, sorted), ``log2 RUNS``
    rounds in all, each on half the keys of the last."""
    x = runs
    for _ in tl.static_range(RUNS.bit_length() - 1):
        a, b = tl.split(tl.permute(tl.reshape(x, [x.shape[0] // 2, 2, CAND_N]), [0, 2, 1]))
        x = tl.sort(tl.maximum(a, tl.flip(b, 1)))
    return tl.reshape(x, [CAND_N])


@triton.jit
def candidate_pick_kernel(
    cand_ptr,  # [B, Hkv, t, num_cand] i64, each range's best keys (-1: none)
    prefix_ptr,  # [B] i32
    out_ptr,  # [B, Hkv, t, TOP_N + LOCAL_SLOTS] i32
    pos_ptr,  # [B, t] i64 row positions (read where LOCAL_SLOTS > 0)
    num_t,
    nb_max,
    num_cand,
    num_sink,
    num_local,
    window,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    CAND_N: tl.constexpr,
    RUNS: tl.constexpr,
    LOCAL_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * t,)``: row ``program_id``'s pick from its candidates, written as
    ``kernels.top_blocks`` writes it (forced first blocks, the ``k`` best regular ones, forced
    last blocks, ascending, ``-1`` padded; the window's blocks after under ``LOCAL_SLOTS``).

    The row's ranges' runs merge into its ``CAND_N`` best keys (``top_of_runs``); the ``k``
    largest of them, as block ids, sorted ascending, are the regular picks."""
    r = tl.program_id(0)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    pos = 0
    if LOCAL_SLOTS > 0:
        pos = tl.load(pos_ptr + b.to(tl.int64) * num_t + r % num_t).to(tl.int64)
    nb, lo, hi = row_candidates(
        prefix, pos, nb_max, num_sink, num_local, window, BLOCK_SIZE, LOCAL_SLOTS > 0
    )
    k = TOP_N - lo - (nb - hi)  # regular picks; check_forced keeps it >= 0
    run = tl.arange(0, RUNS)[:, None] * CAND_N + tl.arange(0, CAND_N)[None, :]
    pdl_gate(PDL)
    keys = tl.load(cand_ptr + r.to(tl.int64) * num_cand + run, mask=run < num_cand, other=-1)
    best = top_of_runs(keys, RUNS, CAND_N)
    c = tl.arange(0, CAND_N)
    keep = (c >= CAND_N - k) & (best >= 0)  # the k largest live keys
    ids = tl.sort(tl.where(keep, (~best & 0x3FFFFFFF).to(tl.int32), NO_BLOCK))
    kept = tl.sum(keep.to(tl.int32), 0)
    out_row = out_ptr + r.to(tl.int64) * (TOP_N + LOCAL_SLOTS)
    tl.store(out_row + lo + c, ids, mask=c < kept)
    slots = c  # CAND_N: TOP_N padded
    blk = tl.where(slots < lo, slots, hi + slots - lo - kept)
    blk = tl.where(slots < lo + kept + nb - hi, blk, -1)
    tl.store(out_row + slots, blk, mask=((slots < lo) | (slots >= lo + kept)) & (slots < TOP_N))
    if LOCAL_SLOTS > 0:
        store_window(out_row + TOP_N, pos, prefix, window, BLOCK_SIZE, LOCAL_SLOTS)
