"""Triton code of the NSA selected branch's schedule (:mod:`kernels.nsa_verify`): per row tile,
the ascending union of its draft rows' picked blocks and each block's member bits
(``union_plan_kernel``; ``kernels.nsa_steps.union_plan`` launches it)."""

from __future__ import annotations

import triton
import triton.language as tl
from ssvkit.kernels.pdl import pdl_gate


@triton.jit
def union_plan_kernel(
    idx_ptr,
    bitmap_ptr,
    list_ptr,
    bits_ptr,
    count_ptr,
    num_t,
    nb_max,
    top_n,
    list_len,
    ROWS: tl.constexpr,
    TOP_N_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid ``(B * Hkv * tiles,)``: the union of the ``ROWS`` rows' blocks of one tile,
    ascending, with each block's member bits (bit ``r``: row ``tile * ROWS + r`` chose it).

    A per-tile bitmap of the ``nb_max`` blocks in global scratch (``bitmap_ptr``, any content
    on entry) is cleared, each row ORs its bit into its blocks' words (atomics, all rows at
    once), and a scan compacts the non-zero words into the list. Barriers order the three
    phases within the program. ``PDL``: it waits (``pdl_gate``) before its first store."""
    pid = tl.program_id(0)
    tile = pid % tl.cdiv(num_t, ROWS)
    bh = pid // tl.cdiv(num_t, ROWS)
    bm = bitmap_ptr + pid.to(tl.int64) * nb_max
    offs = tl.arange(0, CHUNK)
    pdl_gate(PDL)
    for j0 in range(0, nb_max, CHUNK):
        tl.store(bm + j0 + offs, tl.zeros([CHUNK], dtype=tl.int32), mask=j0 + offs < nb_max)
    tl.debug_barrier()
    r = tl.arange(0, ROWS)
    n = tl.arange(0, TOP_N_PAD)
    row = tile * ROWS + r
    ok = (row < num_t)[:, None] & (n < top_n)[None, :]
    idx_off = (bh.to(tl.int64) * num_t + row)[:, None] * top_n + n[None, :]
    idx = tl.load(idx_ptr + idx_off, mask=ok, other=-1)  # [ROWS, TOP_N_PAD]
    bit = tl.broadcast_to((1 << r)[:, None], [ROWS, TOP_N_PAD])
    tl.atomic_or(bm + tl.maximum(idx, 0), bit, mask=ok & (idx >= 0))
    tl.debug_barrier()
    out = pid.to(tl.int64) * list_len
    total = tl.full([], 0, dtype=tl.int32) + 0
    for j0 in range(0, nb_max, CHUNK):
        j = j0 + offs
        w = tl.load(bm + j, mask=j < nb_max, other=0)
        used = w != 0
        dest = total + tl.cumsum(used.to(tl.int32), 0) - 1
        tl.store(list_ptr + out + dest, j, mask=used)
        tl.store(bits_ptr + out + dest, w, mask=used)
        total += tl.sum(used.to(tl.int32), 0)
    tl.store(count_ptr + pid, total)
