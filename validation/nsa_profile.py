"""One NSA refresh call and one reuse call under Nsight Compute, for the profiler's view of each
kernel (duration, DRAM throughput, registers, occupancy, warp stalls).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section LaunchStats --section Occupancy --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python -m ssvkit.validation.nsa_profile --t 16 \\
        > validation/data/nsa-ncu-h200.txt

The inputs are ``validation.nsa_stages``' (NSA's published geometry, reuse indices with
adjacent-row overlap 0.7) at Llama-3.1-8B attention unless ``--geometry`` names another;
``--rows-per-tile`` runs a strategy's row schedule (4: ``ssv``'s, 1: ``sd_sparse_naive``'s),
``--impl unfused`` the unfused baseline's calls. After three warm-up rounds the profiled region
is one refresh call, then one reuse call (the fused one with its union plan passed in, as the
engine's reuse layers do). The provenance is printed first, so the report carries it.
"""

from __future__ import annotations

import json

import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import nsa_verify as nv
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation import nsa_stages as ns

# The calls ``--impl`` profiles: ``nsa_verify``'s or the unfused baseline's.
IMPLS = ("fused", "unfused")


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--t", type=int, default=16, help="draft rows")
    p.add_argument("--context", type=int, default=131072, help="prefix tokens")
    p.add_argument("--rows-per-tile", type=int, default=0, help="row schedule (0: packed)")
    p.add_argument("--impl", default="fused", choices=IMPLS, help="calls to profile")
    p.add_argument(
        "--geometry", default=ki.current_geometry(), choices=sorted(ki.GEOMETRIES), help="heads"
    )
    args = p.parse_args(argv)
    if min(args.batch, args.t, args.context) < 1 or args.rows_per_tile < 0:
        p.exit(2, f"nsa_profile: bad value in {vars(args)}\n")
    ki.use_geometry(args.geometry)
    print(json.dumps({"provenance": provenance(), "args": vars(args), "kwargs": ns.KW}))
    sets = ns.input_sets(args.batch, args.t, args.context, args.context + args.t, 1)
    qkv_args, idx = sets[0]
    kw = dict(ns.KW, validate=False, config=nv.NsaVerifyConfig(rows_per_tile=args.rows_per_tile))
    union = nv.nsa_union_plan(
        qkv_args[0], qkv_args[1], idx, block_size=ns.KW["block_size"], config=kw["config"]
    )
    if args.impl == "fused":
        calls = (
            lambda: nv.nsa_verify(*qkv_args, **kw),
            lambda: nv.nsa_verify(*qkv_args, block_idx=idx, union=union, **kw),
        )
    else:
        calls = (
            lambda: nv.nsa_verify_unfused(*qkv_args, **kw),
            lambda: nv.nsa_verify_unfused(*qkv_args, block_idx=idx, **kw),
        )
    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
