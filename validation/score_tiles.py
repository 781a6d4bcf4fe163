"""Block scoring (``kernels.block_scores``) at each tile width and warp count, across head
dimensions, methods and query rows: the measurements behind ``score_block_nb``'s rule.

    python -m ssvkit.validation.score_tiles --out validation/data/score-tiles-h200.json

Llama-3.1-8B's head counts (32 query / 8 KV heads) at head dimensions 64, 128 and 256, mean and
quest metadata of 64-token blocks over a 32K context at batch 8 (and 64K at batch 1, 16 rows),
bf16 queries and keys from a seeded generator; enough input sets to defeat the L2
(``kernels.timing.num_rotations``). Each shape (16 or 32 blocks a tile, 2, 4 or 8 warps, the
most pipeline stages of 3, 2, 1 that fit) is compiled (its registers, spilled registers and
shared memory recorded), checked against the fp32 reference scores, then timed with the case's
other shapes in interleaved CUDA-graph replays (L2 flushed per sample, median). ``floor_s``:
the metadata, query and score bytes over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from ssvkit.kernels import block_scores as bs
from ssvkit.kernels import timing as tm
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.select_reference import reference_block_scores
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation.bench_documents import write_benchmark
from triton.runtime.errors import OutOfResources

BLOCK_SIZE = 64
NUM_Q_HEADS, NUM_KV_HEADS = 32, 8
# (batch, context, draft rows) of the cases at every head dimension and method.
CASES = [(8, 32768, t) for t in (6, 20, 40)] + [(1, 65536, 16)]
TIMING = tm.TimingConfig(warmup=3, graph_launches=20, graph_reps=10, max_total_s=0.3)
TOL = 1e-3


def _inputs(b: int, ctx: int, t: int, d: int, method: str, seed: int):
    """Queries, metadata, lengths (the first sequence 37 tokens short) and the keys."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((b, t, NUM_Q_HEADS, d), device="cuda", dtype=torch.bfloat16, generator=gen)
    shape = (b, NUM_KV_HEADS, ctx + t + BLOCK_SIZE, d)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((b,), ctx + t, dtype=torch.int32, device="cuda")
    lens[0] -= 37
    return q, BlockMetadata.build(k, lens, BLOCK_SIZE, kinds=(method,)), lens, k


def _shapes(t: int, warps: list[int]) -> list[tuple[int, int]]:
    """(blocks a tile, warps) tried: 32-block tiles up to 32 rows, 16-block tiles always."""
    t_pad = max(16, 1 << (t - 1).bit_length())
    widths = [32, 16] if t_pad <= 32 else [16]
    return [(nb, w) for nb in widths for w in warps]


def _fitted(q, meta, lens, method: str, block_nb: int, warps: int):
    """The scores and compiled kernel at the most stages that fit, or None."""
    for stages in (3, 2, 1):
        try:
            kw = dict(method=method, block_nb=block_nb, stages=stages, num_warps=warps)
            return stages, *bs.score_at(q, meta, lens, **kw)
        except OutOfResources:
            continue
    return None


def run_case(b: int, ctx: int, t: int, d: int, method: str, warps: list[int], copy_bps: float):
    """One case: every shape compiled and checked, then the shapes that fit timed together."""
    kinds = 2 if method == "quest" else 1
    nb = -(-(ctx + t) // BLOCK_SIZE)
    meta_bytes = b * NUM_KV_HEADS * nb * d * 4 * kinds
    first = _inputs(b, ctx, t, d, method, seed=d + t + b)
    ref = reference_block_scores(first[0], first[3], first[2], BLOCK_SIZE, method=method)
    sets = [first[:3]] + [
        _inputs(b, ctx, t, d, method, seed=1000 * i + d + t)[:3]
        for i in range(1, tm.num_rotations(meta_bytes))
    ]
    t_pad = max(16, 1 << (t - 1).bit_length())
    shapes, fns = [], []
    for block_nb, w in _shapes(t, warps):
        got = _fitted(*sets[0], method, block_nb, w)
        if got is None:
            shapes.append(dict(block_nb=block_nb, warps=w, fits=False))
            continue
        stages, scores, compiled = got
        torch.testing.assert_close(scores, ref, atol=TOL, rtol=TOL)
        shapes.append(
            dict(
                block_nb=block_nb,
                warps=w,
                stages=stages,
                fits=True,
                registers=compiled.n_regs,
                spilled=compiled.n_spills,
                shared_bytes=compiled.metadata.shared,
            )
        )
        kw = dict(method=method, block_nb=block_nb, stages=stages, num_warps=w)
        fns.append(lambda i, kw=kw: bs.score_at(*sets[i], **kw))
    timings = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
    for shape, timing in zip([s for s in shapes if s["fits"]], timings, strict=True):
        shape["graph_s"] = timing.median_s
    nbytes = meta_bytes + q_bytes(b, t, d) + b * NUM_KV_HEADS * t * nb * 4
    return dict(
        batch=b,
        context_len=ctx,
        t=t,
        head_dim=d,
        method=method,
        rule=dict(
            block_nb=bs.score_block_nb(t_pad, d, method), warps=bs.score_warps(t_pad, method)
        ),
        floor_s=nbytes / copy_bps,
        shapes=shapes,
    )


def q_bytes(b: int, t: int, d: int) -> int:
    return b * t * NUM_Q_HEADS * d * 2


def print_table(rows: list[dict]) -> None:
    print(f"{'D':>4} {'method':>6} {'B':>2} {'t':>3} {'rule':>6} | shape: us (spilled registers)")
    for r in rows:
        rule = f"{r['rule']['block_nb']}x{r['rule']['warps']}w"
        cells = [
            f"{s['block_nb']}x{s['warps']}w {s['graph_s'] * 1e6:.1f} ({s['spilled']})"
            for s in r["shapes"]
            if s["fits"]
        ]
        head = f"{r['head_dim']:>4} {r['method']:>6} {r['batch']:>2} {r['t']:>3} {rule:>6}"
        print(f"{head} | " + "  ".join(cells) + f"  floor {r['floor_s'] * 1e6:.1f}")
    print("(us, CUDA graph, L2 flushed)")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    args = p.parse_args(argv)
    for d in args.head_dims:
        if d < 16 or d > 256 or d & (d - 1):
            p.exit(2, f"score_tiles: --head-dims {d} is not a power of two in [16, 256]\n")
    for w in args.warps:
        if w < 1 or w & (w - 1):
            p.exit(2, f"score_tiles: --warps {w} is not a power of two\n")
    if not torch.cuda.is_available():
        p.exit(2, "score_tiles: needs a CUDA GPU\n")
    copy_bps = tm.copy_bytes_per_s()
    rows = []
    for d in args.head_dims:
        for method in ("mean", "quest"):
            for b, ctx, t in CASES:
                rows.append(run_case(b, ctx, t, d, method, args.warps, copy_bps))
                torch.cuda.empty_cache()
    write_benchmark(
        args.out,
        "score_tiles",
        rows,
        num_q_heads=NUM_Q_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        block_size=BLOCK_SIZE,
        num_sms=num_sms(torch.device("cuda")),
        copy_bytes_per_s=copy_bps,
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
