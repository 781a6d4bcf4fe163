"""Sparse verification (``kernels.sparse_verify``) at each gathered K/V tile width
(``SparseVerifyConfig.tile_blocks``): listed blocks a program loads and scores as one tile.

    python -m ssvkit.validation.sparse_tiles --out validation/data/sparse-tiles-h200.json

The kernel sweep's inputs (``calibration.kernel_inputs``: random bf16 q/K/V at the current
geometry's heads, a binary draft tree of ``t`` rows, block selections whose adjacent rows share
``OVERLAP`` of their blocks) at each (batch, context, top_n) of ``--batches``, ``--contexts``,
``--top-ns``, for ``per_query`` and for ``union`` and ``shared`` groups of ``GROUP`` rows. The
selections are drawn again for each input set, enough sets to defeat the L2
(``kernels.timing.num_rotations`` of the selected K/V bytes), the group plans built beforehand
as the engine's reuse layers have them. Each width is first checked against one block a tile
(the GPU tests hold that against the fp32 reference), then all widths of a case are timed in
interleaved CUDA-graph replays (L2 flushed per sample, median). ``floor_s``: the distinct K/V
blocks the call reads over each (sequence, KV head) (``distinct_blocks``), queries and outputs,
over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import timing as tm
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.sparse_launch import SparseVerifyConfig
from ssvkit.kernels.sparse_verify import sparse_verify
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation.bench_documents import write_benchmark

BLOCK_SIZE = 64
OVERLAP = 0.7
GROUP = 4
MODES = (("per_query", 1), ("union", GROUP), ("shared", GROUP))
TIMING = tm.TimingConfig(warmup=3, graph_launches=8, graph_reps=10, max_total_s=0.3)


def _selections(b: int, t: int, ctx: int, top_n: int, mode: str, c: int, seed: int):
    rng = np.random.default_rng(seed)
    idx_np = ki.overlap_block_idx([ctx // BLOCK_SIZE] * b, t, top_n, OVERLAP, rng)
    idx = torch.from_numpy(idx_np).to("cuda")
    return idx, build_group_plan(idx, None, c, mode), idx_np


def distinct_blocks(idx_np: np.ndarray, step: int) -> int:
    """Distinct blocks a call reads, summed over (sequence, KV head): those of every ``step``-th
    row (``shared`` reads its groups' first rows' lists), -1 pads left out."""
    rows = idx_np[:, :, ::step]
    return sum(
        int(np.unique(rows[b, h][rows[b, h] >= 0]).size)
        for b in range(rows.shape[0])
        for h in range(rows.shape[1])
    )


def run_case(b, t, ctx, top_n, mode, c, widths, copy_bps) -> dict:
    """One case: every width checked against one block a tile, then all timed together."""
    q, k, v, lens, mask = ki.attention_inputs(b, t, ctx + t, [ctx] * b, ki.generator(b + t))
    idx, plan, idx_np = _selections(b, t, ctx, top_n, mode, c, seed=0)
    kv_bytes = distinct_blocks(idx_np, c if mode == "shared" else 1) * BLOCK_SIZE * q.shape[3] * 4
    sets = [(idx, plan)] + [
        _selections(b, t, ctx, top_n, mode, c, seed=i)[:2]
        for i in range(1, tm.num_rotations(kv_bytes))
    ]

    def call(i: int, width: int):
        cfg = SparseVerifyConfig(tile_blocks=width)
        kw = dict(mode=mode, group_size=c, block_size=BLOCK_SIZE, validate=False, config=cfg)
        return sparse_verify(q, k, v, lens, mask, sets[i][0], plan=sets[i][1], **kw)

    want = call(0, 1)
    for w in widths:
        o, lse = call(0, w)
        if not (torch.isfinite(o).all() and torch.allclose(o.float(), want[0].float(), 2e-2, 2e-2)):
            raise AssertionError(f"sparse_tiles: tile_blocks {w} differs from 1 at {mode} b{b}")
    fns = [lambda i, w=w: call(i, w) for w in widths]
    timings = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
    qo_bytes = 2 * q.numel() * q.element_size()
    return dict(
        batch=b,
        t=t,
        context_len=ctx,
        top_n=top_n,
        mode=mode,
        group_size=c,
        overlap=OVERLAP,
        floor_s=(kv_bytes + qo_bytes) / copy_bps,
        graph_s={str(w): s.median_s for w, s in zip(widths, timings, strict=True)},
    )


def print_table(rows: list[dict]) -> None:
    widths = list(rows[0]["graph_s"])
    head = " ".join(f"{w + ' blocks':>10}" for w in widths)
    print(f"{'mode':>9} {'C':>2} {'B':>3} {'ctx':>7} {'top_n':>5} {head}  floor")
    for r in rows:
        us = " ".join(f"{r['graph_s'][w] * 1e6:10.1f}" for w in widths)
        print(
            f"{r['mode']:>9} {r['group_size']:>2} {r['batch']:>3} {r['context_len']:>7}"
            f" {r['top_n']:>5} {us}  {r['floor_s'] * 1e6:.1f}"
        )
    print("(us, CUDA graph, L2 flushed)")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    p.add_argument("--top-ns", type=int, nargs="+", default=[16, 64])
    p.add_argument("--t", type=int, default=16, help="draft rows")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args(argv)
    for w in args.widths:
        if w < 1 or w & (w - 1):
            p.exit(2, f"sparse_tiles: --widths {w} is not a power of two\n")
    for ctx in args.contexts:
        for top_n in args.top_ns:
            if ctx < 2 * top_n * BLOCK_SIZE:
                p.exit(2, f"sparse_tiles: --contexts {ctx} is too short for top_n {top_n}\n")
    if min(args.batches) < 1 or not 1 <= args.t <= 64:
        p.exit(2, f"sparse_tiles: bad --batches or --t in {vars(args)}\n")
    if not torch.cuda.is_available():
        p.exit(2, "sparse_tiles: needs a CUDA GPU\n")
    copy_bps = tm.copy_bytes_per_s()
    rows = []
    for ctx in args.contexts:
        for b in args.batches:
            for top_n in args.top_ns:
                for mode, c in MODES:
                    rows.append(run_case(b, args.t, ctx, top_n, mode, c, args.widths, copy_bps))
                    torch.cuda.empty_cache()
    write_benchmark(
        args.out,
        "sparse_tiles",
        rows,
        geometry=ki.current_geometry(),
        block_size=BLOCK_SIZE,
        copy_bytes_per_s=copy_bps,
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
