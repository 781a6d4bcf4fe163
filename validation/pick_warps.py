"""The top-n block pick (``kernels.top_blocks``) at each warp count a row's program can take,
across row counts and row lengths: the measurements behind ``threshold_warps``' rule.

    python -m ssvkit.validation.pick_warps --out validation/data/pick-warps-h200.json

Scores are fresh standard-normal fp32 rows of ``blocks`` blocks, every block live, ``rows``
rows (``[1, 8, rows / 8, blocks]``), top_n 16 with the first and last block forced; enough
input sets to defeat the L2 (``kernels.timing.num_rotations``). Each case first checks that
every warp count picks the same blocks as the default and as the fp32 torch reference
(``select_reference.topn_from_scores``), then times each in a CUDA graph (L2 flushed per sample,
median). ``floor_s``: the score bytes read over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from ssvkit.kernels import timing as tm
from ssvkit.kernels import top_blocks as tb
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.select_reference import topn_from_scores
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation.bench_documents import write_benchmark

BLOCK_SIZE = 64
TOP_N = 16
KV_HEADS = 8
TIMING = tm.TimingConfig(warmup=3, graph_launches=20, graph_reps=10, max_total_s=0.3)


def _inputs(
    rows: int, blocks: int, gen: torch.Generator
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Rotation sets of ``[1, KV_HEADS, rows / KV_HEADS, blocks]`` aligned score rows, and the
    length that makes every block live."""
    sets = []
    for _ in range(tm.num_rotations(rows * blocks * 4)):
        s = tb.empty_scores(1, KV_HEADS, rows // KV_HEADS, blocks, torch.device("cuda"))
        s.copy_(torch.randn(s.shape, generator=gen, device="cuda"))
        sets.append(s)
    lens = torch.tensor([blocks * BLOCK_SIZE], dtype=torch.int32, device="cuda")
    return sets, lens


def run_case(rows: int, blocks: int, warps: list[int], copy_bps: float) -> dict:
    """One (rows, blocks) case: checked, then every warp count timed."""
    sets, lens = _inputs(rows, blocks, torch.Generator(device="cuda").manual_seed(rows + blocks))
    kw = dict(block_size=BLOCK_SIZE, top_n=TOP_N)
    want = topn_from_scores(sets[0], lens, BLOCK_SIZE, top_n=TOP_N)
    default = tb.threshold_warps(rows, tb._row_layout(blocks)[0], sets[0].device)
    times = {}
    for w in warps:
        got = tb.top_blocks(sets[0], lens, num_warps=w, **kw)
        if not torch.equal(got, want):
            raise AssertionError(f"pick_warps: {w} warps pick other blocks at {rows}x{blocks}")
        fn = lambda i, w=w: tb.top_blocks(sets[i], lens, num_warps=w, **kw)  # noqa: E731
        times[str(w)] = tm.bench(fn, "graph", num_inputs=len(sets), config=TIMING).median_s
    return dict(
        rows=rows,
        blocks=blocks,
        default_warps=default,
        floor_s=rows * blocks * 4 / copy_bps,
        graph_s=times,
    )


def print_table(rows: list[dict]) -> None:
    warps = list(rows[0]["graph_s"])
    print(
        f"{'blocks':>7} {'rows':>6} " + " ".join(f"{w + ' warps':>9}" for w in warps) + "  default"
    )
    for r in rows:
        us = " ".join(f"{r['graph_s'][w] * 1e6:9.1f}" for w in warps)
        print(f"{r['blocks']:>7} {r['rows']:>6} {us}  {r['default_warps']:>7}")
    print("(us, CUDA graph, L2 flushed)")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 128, 512, 2048, 4096])
    p.add_argument("--blocks", type=int, nargs="+", default=[129, 513, 1025, 2049, 4097])
    p.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args(argv)
    for r in args.rows:
        if r < KV_HEADS or r % KV_HEADS:
            p.exit(2, f"pick_warps: --rows {r} is not a positive multiple of {KV_HEADS}\n")
    for b in args.blocks:
        if b < TOP_N or tb.threshold_meta(b, TOP_N) is None:
            p.exit(2, f"pick_warps: --blocks {b} is outside the threshold pick's rows\n")
    for w in args.warps:
        if w < 1 or w & (w - 1):
            p.exit(2, f"pick_warps: --warps {w} is not a power of two\n")
    if not torch.cuda.is_available():
        p.exit(2, "pick_warps: needs a CUDA GPU\n")
    copy_bps = tm.copy_bytes_per_s()
    rows = [run_case(r, b, args.warps, copy_bps) for b in args.blocks for r in args.rows]
    write_benchmark(
        args.out,
        "pick_warps",
        rows,
        top_n=TOP_N,
        block_size=BLOCK_SIZE,
        num_sms=num_sms(torch.device("cuda")),
        copy_bytes_per_s=copy_bps,
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
