"""The work one repair call (``kernels.repair``) does, counted from the launch plan its wrapper
makes, without torch: the counts the calibrated ``repair/*`` classes are fitted on and priced
with (``RepairWork``).

The wrapper launches one program per (draft row, KV head, sequence), ``P = t Hkv B`` programs
of ``BLOCK_M = max(16, pow2(G))`` packed rows, and each program walks its row's ``M`` blocks
**one after another** (``BLOCK_N = min(64, block_size)``-token tiles, a K and a V tile a step,
3 pipeline stages, 4 warps), in ``waves`` of ``SMs x programs per SM`` (``programs_per_sm``).
The calibrated model prices that chain as a latency bound beside the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.dense_work import EXP_FLOPS, key_tile_weight

# kernels/repair.py's launch constants; tests/perfmodel/test_repair_work.py checks them.
BLOCK_N_MAX = 64
NUM_STAGES = 3
ELEM_BYTES = 2  # bf16 queries, K/V, outputs
F32 = 4
INDEX_BYTES = 4


def programs_per_sm(head_dim, block_size, smem_per_sm_bytes: int) -> np.ndarray:
    """Resident repair programs per SM as the K/V pipeline's shared memory allows (>= 1):
    ``3 x 2 x BLOCK_N x D x 2`` bytes a program, 96 KiB at D = 128 (2 in Hopper's 228 KiB)
    and 48 KiB at D = 64 (4)."""
    block_n = np.minimum(np.asarray(block_size, dtype=float), BLOCK_N_MAX)
    per_program = NUM_STAGES * 2 * block_n * np.asarray(head_dim, dtype=float) * ELEM_BYTES
    return np.maximum(1.0, np.floor(smem_per_sm_bytes / per_program))


def distinct_share(num_blocks, blocks, rows) -> np.ndarray:
    """The share of a call's requested blocks that are distinct when each of a (sequence, KV
    head)'s ``rows`` rows gathers ``blocks`` distinct blocks drawn uniformly from its
    ``num_blocks`` (the kernel sweep's construction): ``N (1 - (1 - w / N)^t) / (t w)``; 1
    where a row gathers none."""
    n, w, t = (np.asarray(x, dtype=float) for x in (num_blocks, blocks, rows))
    n = np.maximum(n, np.maximum(w, 1.0))
    on = (w > 0) & (t > 0)
    w1, t1 = np.where(on, w, 1.0), np.where(on, t, 1.0)
    return np.where(on, n * (1.0 - (1.0 - w1 / n) ** t1) / (t1 * w1), 1.0)


@dataclass(frozen=True, slots=True)
class RepairWork:
    """What one repair call executes, as arrays of one shape.

    - ``requested_bytes``: every program's blocks, its block ids, q, the state it reads and
      writes (as ``calibration.kernel_ops`` counts a timed call);
    - ``flops``: the padded rows' MMAs and exponentials over the blocks' keys
      (``dense_work.EXP_FLOPS``);
    - ``chain_tiles``: the tiles one program walks times the waves, weighted by
      ``dense_work.key_tile_weight`` (a tile's work at its head dimension over D = 128's);
    - ``waves``: each wave loads its programs' queries and states and writes them back.

    It ignores the spread of the missed blocks across programs (every row misses ``M``) and
    the partial last block.
    """

    requested_bytes: np.ndarray
    flops: np.ndarray
    chain_tiles: np.ndarray
    waves: np.ndarray


def repair_call_work(
    t, num_q_heads, num_kv_heads, head_dim, batch, blocks, block_size, num_sms, smem_per_sm_bytes
) -> RepairWork:
    """The work of one ``repair`` call of ``t`` draft rows over ``blocks`` blocks a row of
    ``block_size`` tokens, on ``num_sms`` SMs of ``smem_per_sm_bytes``; every argument but the
    GPU's broadcasts (vectorised over points)."""
    t, hq, hkv, d, b, m, bs = (
        np.asarray(x, dtype=float)
        for x in (t, num_q_heads, num_kv_heads, head_dim, batch, blocks, block_size)
    )
    programs = t * hkv * b
    slots = num_sms * programs_per_sm(d, bs, smem_per_sm_bytes)
    waves = np.ceil(programs / slots)
    group = np.maximum(hq / np.maximum(hkv, 1.0), 1.0)
    block_m = np.maximum(16.0, 2.0 ** np.ceil(np.log2(group)))
    keys = programs * m * bs
    state = b * t * hq * (3 * d * ELEM_BYTES + 2 * F32)  # q, o in, o out; lse in and out
    return RepairWork(
        requested_bytes=keys * 2 * d * ELEM_BYTES + programs * m * INDEX_BYTES + state,
        flops=keys * block_m * 4 * (d + EXP_FLOPS / 4),
        chain_tiles=waves * m * np.ceil(bs / BLOCK_N_MAX) * key_tile_weight(d),
        waves=waves,
    )
