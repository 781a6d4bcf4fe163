"""Top-n block pick per score row, in one Triton launch: the last step of both block
selections (:mod:`kernels.select_blocks` from block metadata, the NSA refresh path of
:mod:`kernels.nsa_verify` from compressed attention).

One program per ``[B, Hkv, t]`` row of ``[.., NB_max]`` fp32 scores picks the row's ``top_n``
best blocks of its prefix's ``ceil(prefix / block_size)`` live blocks, the first ``num_sink``
and last ``num_local`` forced in, ties to the lower block, and writes them ascending with ``-1``
padding when fewer blocks are live. No sort and no host synchronisation: the rounds of the
kernel (one max-reduction per pick) replace ``torch.topk`` + ``torch.sort`` and the five masks
and copies around them. ``kernels.select_blocks.topn_from_scores`` is the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.device import num_sms

# Larger than any block id: "no block" in the top-n selection.
NO_BLOCK = tl.constexpr(2**30)
# Above every top-n key (``_block_keys``): the "previous pick" before the first round.
NO_KEY = tl.constexpr(2**63 - 1)
# Blocks of one row the kernel holds in registers at once.
TOPK_CHUNK = 4096


def top_blocks(
    scores: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    block_size: int,
    top_n: int,
    num_sink: int = 1,
    num_local: int = 1,
) -> torch.Tensor:
    """``[B, Hkv, t, NB_max]`` fp32 scores -> ``[B, Hkv, t, top_n]`` int32 block ids, ascending,
    ``-1`` padded; ``prefix_lens`` ``[B]`` int32 sets each sequence's live blocks."""
    if scores.dim() != 4 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be [B, Hkv, t, NB] float32, got {tuple(scores.shape)}")
    if top_n < 1 or top_n >= 2**30:
        raise ValueError(f"top_n must be in [1, 2^30), got {top_n}")
    check_forced(num_sink, num_local, top_n)
    b, hkv, t, nb_max = scores.shape
    if prefix_lens.shape != (b,) or prefix_lens.dtype != torch.int32:
        raise ValueError(f"prefix_lens must be [B={b}] int32, got {tuple(prefix_lens.shape)}")
    scores = scores.contiguous()
    out = torch.empty((b, hkv, t, top_n), dtype=torch.int32, device=scores.device)
    if out.numel() == 0:
        return out
    chunk, tail, num_chunks = _row_layout(nb_max)
    topk_blocks_kernel[(b * hkv * t,)](
        scores,
        prefix_lens,
        out,
        t,
        nb_max,
        num_sink,
        num_local,
        NUM_KV_HEADS=hkv,
        BLOCK_SIZE=block_size,
        TOP_N=top_n,
        TOP_N_PAD=max(16, triton.next_power_of_2(top_n)),
        CHUNK=chunk,
        TAIL=tail,
        NUM_CHUNKS=num_chunks,
        num_warps=_warps(b * hkv * t, chunk + tail, scores.device),
    )
    return out


def check_forced(num_sink: int, num_local: int, top_n: int) -> None:
    """The forced first and last blocks must be non-negative counts that fit in ``top_n``."""
    if num_sink < 0 or num_local < 0 or num_sink + num_local > top_n:
        raise ValueError(
            f"num_sink={num_sink} and num_local={num_local} must be >= 0 and fit in top_n={top_n}"
        )


def _row_layout(nb_max: int) -> tuple[int, int, int]:
    """``(CHUNK, TAIL, NUM_CHUNKS)`` of a row of ``nb_max`` blocks. A row that fits in one
    power-of-two chunk of at most ``TOPK_CHUNK`` plus a smaller power-of-two tail stays in
    registers (``NUM_CHUNKS`` 1): 2049 blocks are 2048 + 16 keys, not 4096. A longer row is
    walked in ``TOPK_CHUNK`` chunks every round."""
    nb_max = max(nb_max, 1)
    chunk = min(1 << (nb_max.bit_length() - 1), TOPK_CHUNK)
    rest = nb_max - chunk
    if rest == 0:
        return chunk, 0, 1
    if rest <= chunk:
        return chunk, min(chunk, max(16, triton.next_power_of_2(rest))), 1
    return TOPK_CHUNK, 0, triton.cdiv(nb_max, TOPK_CHUNK)


def _warps(rows: int, chunk: int, device: torch.device) -> int:
    """Warps of one row's program. Up to one row per SM, 4 (8 for 4096-block chunks) split
    each round's max-reduction; beyond, rows run side by side and the fewest warps that hold
    a chunk's int64 keys in registers (1 up to 2048) avoid the rounds' cross-warp barriers
    (H200, 128K at batch 16, top_n 64: 163 us at 1 warp, 198 at 4)."""
    if rows <= num_sms(device):
        return 4 if chunk <= 2048 else 8
    return max(1, chunk // 2048)


@triton.jit
def topk_blocks_kernel(
    score_ptr,
    prefix_ptr,
    out_ptr,  # [B, Hkv, t, NB_max] fp32, [B] i32, [B, Hkv, t, TOP_N] i32
    num_t,
    nb_max,
    num_sink,
    num_local,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOP_N: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    TAIL: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    """Grid ``(B * Hkv * t,)``: one row's ``TOP_N`` best blocks of its prefix's ``nb`` blocks,
    the first ``num_sink`` and last ``num_local`` forced, ascending, ``-1`` padded.

    Each block gets one int64 key ordered by (score, then lower block): the score's bits made
    order-preserving as an integer, above the complemented block id. ``TOP_N`` rounds each take
    the largest key below the previous pick (one max-reduction), so ties resolve to the lower
    block and nothing is written between rounds; a row of at most ``CHUNK + TAIL`` blocks
    (``NUM_CHUNKS`` 1) stays in registers throughout, a longer one is walked in chunks up to
    its prefix's last block."""
    r = tl.program_id(0)
    b = r // (NUM_KV_HEADS * num_t)
    prefix = tl.load(prefix_ptr + b)
    nb = tl.minimum((prefix + BLOCK_SIZE - 1) // BLOCK_SIZE, nb_max)
    base = score_ptr + r.to(tl.int64) * nb_max
    offs = tl.arange(0, CHUNK)
    slots = tl.arange(0, TOP_N_PAD)
    chosen = tl.full([TOP_N_PAD], NO_BLOCK, dtype=tl.int32)
    prev = tl.full([], NO_KEY, dtype=tl.int64) + 0
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
    # Ascending order: each pick's rank among the picks (ties only among NO_BLOCK, by slot).
    before = (chosen[None, :] < chosen[:, None]) | (
        (chosen[None, :] == chosen[:, None]) & (slots[None, :] < slots[:, None])
    )  # [TOP_N_PAD, TOP_N_PAD]: pick k comes before pick i
    rank = tl.sum(before.to(tl.int32), 1)
    ordered = tl.sum(tl.where(rank[:, None] == slots[None, :], chosen[:, None], 0), 0)
    ordered = tl.where(ordered == NO_BLOCK, -1, ordered)
    tl.store(out_ptr + r.to(tl.int64) * TOP_N + slots, ordered, mask=slots < TOP_N)


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
