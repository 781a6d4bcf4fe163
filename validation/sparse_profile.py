"""One sparse verification call under Nsight Compute, for the profiler's view of its kernels
(duration, DRAM throughput, registers, occupancy, warp stalls, and the source lines they stall
on).

    ncu --clock-control none --profile-from-start off --import-source yes \\
        --section SpeedOfLight --section LaunchStats --section Occupancy \\
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \\
        python -m ssvkit.validation.sparse_profile --mode union --group-size 4 \\
        > validation/data/sparse-ncu-union-b1-h200.txt

The kernel sweep's inputs (``calibration.kernel_inputs``: random bf16 q/K/V at the current
geometry's heads, a binary draft tree, block selections whose adjacent rows share ``overlap``
of their blocks) at one (batch, t, context, top_n) point. After three warm-up calls the
profiled region is one call with its group plan built beforehand, as the engine's reuse layers
call it: the attention kernel, and the merge of its splits where it has more than one. The
provenance is printed first, so the report carries it.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.sparse_verify import MODES, sparse_verify
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser

BLOCK_SIZE = 64


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--t", type=int, default=16, help="draft rows")
    p.add_argument("--context", type=int, default=131072, help="prefix tokens")
    p.add_argument("--mode", default="union", choices=MODES)
    p.add_argument("--group-size", type=int, default=4, help="C, rows a group")
    p.add_argument("--top-n", type=int, default=16, help="blocks a row selects")
    p.add_argument("--overlap", type=float, default=0.7, help="adjacent rows' shared share")
    p.add_argument(
        "--geometry", default=ki.current_geometry(), choices=sorted(ki.GEOMETRIES), help="heads"
    )
    args = p.parse_args(argv)
    if min(args.batch, args.t, args.context, args.group_size, args.top_n) < 1:
        p.exit(2, f"sparse_profile: bad value in {vars(args)}\n")
    if not 0.0 <= args.overlap <= 1.0:
        p.exit(2, f"sparse_profile: --overlap {args.overlap} is outside [0, 1]\n")
    if args.context < 2 * args.top_n * BLOCK_SIZE:
        p.exit(2, f"sparse_profile: --context {args.context} is too short for --top-n\n")
    if not torch.cuda.is_available():
        p.exit(2, "sparse_profile: needs a CUDA GPU\n")
    ki.use_geometry(args.geometry)
    print(json.dumps({"provenance": provenance(), "args": vars(args)}))
    b, t = args.batch, args.t
    gen = ki.generator(0)
    q, k, v, lens, mask = ki.attention_inputs(b, t, args.context + t, [args.context] * b, gen)
    nb = [args.context // BLOCK_SIZE] * b
    idx = ki.overlap_block_idx(nb, t, args.top_n, args.overlap, np.random.default_rng(0))
    idx = torch.from_numpy(idx).to(q.device)
    c = 1 if args.mode == "per_query" else args.group_size
    plan = build_group_plan(idx, None, c, args.mode)
    kw = dict(mode=args.mode, group_size=c, block_size=BLOCK_SIZE, validate=False, plan=plan)
    for _ in range(3):
        sparse_verify(q, k, v, lens, mask, idx, **kw)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    sparse_verify(q, k, v, lens, mask, idx, **kw)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
