"""Run each verification op a few times at one configuration, for Nsight Compute to time its
kernels one by one (per-kernel durations show which launch of a wrapper costs what).

    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        python benchmarks/kernel_profile.py

Configs: dense_verify at 32K (t = 16) and 64K (t = 64), batch 1; sparse_verify per_query and
union C = 4 at 64K, t = 16, top_n = 32, gamma = 0.7, batch 16; nsa_verify fused reuse and the
unfused baseline at 64K, t = 16, batch 1.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import benchmark as kb
from kernels.dense_verify import dense_verify
from kernels.sparse_verify import sparse_verify

REPS = 3


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rng = np.random.default_rng(0)
    for ctx, t in ((32 * 1024, 16), (64 * 1024, 64)):
        args = kb.attention_inputs(1, t, ctx + t, [ctx], gen)
        for _ in range(REPS):
            dense_verify(*args, validate=False)
    ctx, t, bsz = 64 * 1024, 16, 16
    q, k, v, lens, mask = kb.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    idx = torch.from_numpy(kb.overlap_block_idx([ctx // 64] * bsz, t, 32, 0.7, rng)).to("cuda")
    for mode, c in (("per_query", 1), ("union", 4)):
        for _ in range(REPS):
            sparse_verify(
                q, k, v, lens, mask, idx, mode=mode, group_size=c, block_size=64, validate=False
            )
    import kernels.nsa_verify as nsa

    args = kb._nsa_inputs(nsa, 1, 16, [ctx], ctx + 16, gen)
    _, bidx = nsa.nsa_verify(*args, **kb.NSA_KW, validate=False)
    for fn in (nsa.nsa_verify, nsa.nsa_verify_unfused):
        for _ in range(REPS):
            fn(*args, block_idx=bidx, **kb.NSA_KW, validate=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
