"""Launch geometry of the repair kernel (``kernels.repair``), without torch.

The wrapper launches one program per (draft row, KV head, sequence), ``t * Hkv * B`` programs,
and each program walks its row's missed blocks **one after another** (``BLOCK_N = min(64,
block_size)``-token tiles, a K and a V tile per step, 3 pipeline stages, 4 warps). When the grid
is smaller than the GPU's resident-program slots, the call's time is that chain, not its bytes:
at 8 q / 2 KV heads and batch 1 (32 programs on 132 SMs) a call over 32 missed blocks takes
24.6 us for 17 MB (0.7 TB/s), and its time grows linearly with the blocks
(``calibration/profiles/h100-sxm/kernel_bench.jsonl``).

``chain_tiles`` counts the tiles the busiest SM slot walks in series: the waves of the grid over
``SMs x programs per SM`` slots times one program's tiles. A slot's programs per SM come from
the shared memory one program's pipeline holds (``3 x 2 x BLOCK_N x D x 2`` bytes: 96 KB at
D = 128, so 2 per SM; 48 KB at D = 64, so 4); registers and warps are assumed not to bind. The
calibrated model prices it as a latency bound beside the roofline (``perfmodel.class_fit``'s
``t_k``). It ignores the spread of the missed blocks across programs (every row is taken to
miss the same number) and the partial last block.
"""

from __future__ import annotations

import numpy as np

# _repair launch constants (kernels/repair.py); tests/perfmodel/test_repair_plan.py checks them.
BLOCK_N_MAX = 64
NUM_STAGES = 3
ELEM_BYTES = 2  # bf16 K/V tiles


def programs_per_sm(head_dim, block_size, smem_per_sm_bytes: int) -> np.ndarray:
    """Resident repair programs per SM as the K/V pipeline's shared memory allows (>= 1)."""
    block_n = np.minimum(np.asarray(block_size, dtype=float), BLOCK_N_MAX)
    per_program = NUM_STAGES * 2 * block_n * np.asarray(head_dim, dtype=float) * ELEM_BYTES
    return np.maximum(1.0, np.floor(smem_per_sm_bytes / per_program))


def chain_tiles(
    t, num_kv_heads, batch, blocks, block_size, head_dim, num_sms: int, smem_per_sm_bytes: int
) -> np.ndarray:
    """KV tiles walked in series by one SM slot of a repair call over ``blocks`` blocks per
    row: ``ceil(t Hkv B / (SMs x programs per SM)) x blocks x ceil(block_size / BLOCK_N)``."""
    programs = (
        np.asarray(t, dtype=float)
        * np.asarray(num_kv_heads, dtype=float)
        * np.asarray(batch, dtype=float)
    )
    slots = num_sms * programs_per_sm(head_dim, block_size, smem_per_sm_bytes)
    waves = np.ceil(programs / slots)
    tiles = np.ceil(np.asarray(block_size, dtype=float) / BLOCK_N_MAX)
    return waves * np.asarray(blocks, dtype=float) * tiles
