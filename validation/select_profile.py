"""One block selection under Nsight Compute, as a sparse refresh layer of the engine runs it
(``select_blocks`` under the position-relative rule, then the group plan of its union), for the
profiler's view of each launch (duration, DRAM throughput, occupancy, issue rate, warp stalls).

    ncu --clock-control none --profile-from-start off \\
        --section SpeedOfLight --section LaunchStats --section Occupancy \\
        --section WarpStateStats --section SchedulerStats \\
        python -m ssvkit.validation.select_profile --t 16 \\
        > validation/data/select-ncu-b1-h200.txt

The kernel sweep's inputs (``calibration.kernel_inputs``: random bf16 q and K at the current
geometry's heads) at one (batch, t, context) point: block metadata of the prefix, the draft
rows at the positions after it, the engine's selection parameters (top_n, one sink block, a
window, no forced local block). After three warm-up calls the profiled region is one call of
each launch the refresh layer makes before its attention: the block scores, the top-n pick,
and (``--group-size`` above 1) the union plan. The provenance is printed first, so the report
carries it.
"""

from __future__ import annotations

import json

import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels.block_metadata import KINDS, BlockMetadata
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.select_blocks import select_blocks
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser

BLOCK_SIZE = 64


def _parser() -> OneLineParser:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--t", type=int, default=16, help="draft rows")
    p.add_argument("--context", type=int, default=131072, help="prefix tokens")
    p.add_argument("--method", default="mean", choices=KINDS, help="block metadata")
    p.add_argument("--top-n", type=int, default=16, help="blocks a row selects")
    p.add_argument("--window", type=int, default=512, help="local window in tokens")
    p.add_argument("--group-size", type=int, default=4, help="union group of rows (1: none)")
    p.add_argument("--fused", action="store_true", help="scores and pick in one launch")
    p.add_argument(
        "--tile-pick", action="store_true", help="the scoring's tile maxima and the tile pick"
    )
    p.add_argument(
        "--geometry", default=ki.current_geometry(), choices=sorted(ki.GEOMETRIES), help="heads"
    )
    return p


def main(argv=None) -> None:
    p = _parser()
    args = p.parse_args(argv)
    if min(args.batch, args.t, args.context, args.group_size, args.top_n) < 1:
        p.exit(2, f"select_profile: bad value in {vars(args)}\n")
    if args.window < 0:
        p.exit(2, f"select_profile: --window {args.window} is negative\n")
    if args.context < 2 * args.top_n * BLOCK_SIZE + args.window:
        p.exit(2, f"select_profile: --context {args.context} is too short for --top-n\n")
    if not torch.cuda.is_available():
        p.exit(2, "select_profile: needs a CUDA GPU\n")
    ki.use_geometry(args.geometry)
    print(json.dumps({"provenance": provenance(), "args": vars(args)}))
    b, t, ctx = args.batch, args.t, args.context
    q, k, _, lens, _ = ki.attention_inputs(b, t, ctx + t, [ctx] * b, ki.generator(0))
    meta = BlockMetadata.build(k, lens, BLOCK_SIZE, kinds=(args.method,))
    positions = ctx + torch.arange(t, device=q.device, dtype=torch.int64).expand(b, t)
    kw = dict(
        top_n=args.top_n,
        method=args.method,
        num_sink=1,
        num_local=0,
        positions=positions.contiguous(),
        window=args.window,
        fused=args.fused,
        tile_pick=args.tile_pick,
    )

    def refresh() -> None:
        idx = select_blocks(q, meta, lens, **kw)
        if args.group_size > 1:
            build_group_plan(idx, None, args.group_size, "union")

    for _ in range(3):
        refresh()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    refresh()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
