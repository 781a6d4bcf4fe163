"""The block selection's two launches (``kernels.select_blocks``) with each of its picks: the
whole-row threshold pick (the scores alone, then ``kernels.top_blocks`` on whole rows) and the
tile pick (the scores with their tiles' maxima, then the tile pick at each warp count), across
batches, contexts, draft rows, methods and pick rules: the measurements that decide the pick.

    python -m ssvkit.validation.select_picks --out validation/data/select-picks-h200.json

Llama-3.1-8B attention (32 query / 8 KV heads, D = 128), 64-token blocks, bf16 queries and keys
from a seeded generator, each sequence's prefix the context (the first 37 tokens short). Rule
``prefix``: one sink and one local block (the kernel sweep's); ``relative``: the rows at the
prefix's last positions, a 512-token window (the engine's sparse refresh layer). Enough input
sets to defeat the L2 (``kernels.timing.num_rotations``: fresh queries, copies of the
metadata). Each case first checks that the tile pick at every warp count,
``select_blocks(tile_pick=True)`` and the whole-row pick pick the same blocks (poisoned
outputs), then times the whole-row path and the tile path at each warp count in interleaved
CUDA-graph replays (L2 flushed per sample, median), then profiles the whole-row path and
``select_blocks(tile_pick=True)`` for each launch's device time (the scoring, the pick).
``floor_s``: the metadata, query and picked-id bytes over the copy bandwidth measured in the
same run (``calibration.kernel_ops.select_unique_bytes``).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import torch
from ssvkit.calibration.kernel_inputs import metadata_rotations
from ssvkit.calibration.kernel_ops import select_unique_bytes
from ssvkit.kernels import select_blocks as sb
from ssvkit.kernels import timing as tm
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.block_scores import block_scores, scores_and_tile_max
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.top_blocks import relative_slots, top_blocks
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation.bench_documents import write_benchmark
from ssvkit.validation.launch_times import launch_times

BLOCK_SIZE = 64
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
WINDOW = 512
RULES = ("prefix", "relative")
TIMING = tm.TimingConfig(warmup=3, graph_launches=20, graph_reps=10, max_total_s=0.3)
CALLS_PROFILED = 20


@dataclasses.dataclass(frozen=True)
class Case:
    method: str
    batch: int
    context_len: int
    t: int
    rule: str
    top_n: int

    def pick_kwargs(self, positions: torch.Tensor) -> dict:
        """``top_blocks``' keyword arguments of the case's rule and top_n."""
        kw = dict(top_n=self.top_n)
        if self.rule == "relative":
            kw.update(num_local=0, positions=positions, window=WINDOW)
        return kw


def _inputs(c: Case) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Rotation sets of (queries, metadata), the prefix lengths and the rows' positions."""
    gen = torch.Generator(device="cuda").manual_seed(c.batch * 1009 + c.context_len + c.t)
    shape = (c.batch, c.t, NUM_Q_HEADS, HEAD_DIM)
    q = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    kv = (c.batch, NUM_KV_HEADS, c.context_len + BLOCK_SIZE, HEAD_DIM)
    k = torch.randn(kv, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((c.batch,), c.context_len, dtype=torch.int32, device="cuda")
    lens[0] -= 37
    meta = BlockMetadata.build(k, lens, BLOCK_SIZE, kinds=(c.method,))
    del k
    positions = (lens.long()[:, None] - c.t + torch.arange(c.t, device="cuda")[None, :]).clamp(0)
    tensors = [getattr(meta, f.name) for f in dataclasses.fields(meta)]
    nbytes = sum(x.numel() * x.element_size() for x in tensors if torch.is_tensor(x))
    sets = metadata_rotations(q, meta, tm.num_rotations(nbytes), gen)
    return sets, lens, positions.contiguous()


def whole_rows(q, meta, lens, c: Case, positions) -> torch.Tensor:
    """The scores alone, then the pick on whole rows."""
    scores = block_scores(q, meta, lens, method=c.method)
    return top_blocks(scores, lens, block_size=BLOCK_SIZE, **c.pick_kwargs(positions))


def tile_pick(q, meta, lens, c: Case, positions, warps: int) -> torch.Tensor:
    """The scores with their tiles' maxima, then the tile pick at ``warps``."""
    scores, tile_max = scores_and_tile_max(q, meta, lens, method=c.method)
    kw = c.pick_kwargs(positions)
    return top_blocks(scores, lens, block_size=BLOCK_SIZE, tile_max=tile_max, num_warps=warps, **kw)


def run_case(c: Case, warps: list[int], copy_bps: float) -> dict:
    """One case: the tile pick at every warp count and ``select_blocks`` checked against the
    whole-row pick, then all timed together, then both paths' launches profiled."""
    sets, lens, positions = _inputs(c)
    sel_kw = dict(method=c.method, tile_pick=True, **c.pick_kwargs(positions))
    with tm.poisoned_allocations():
        want = whole_rows(*sets[0], lens, c, positions)
        got = {"select_blocks": sb.select_blocks(*sets[0], lens, **sel_kw)}
        for w in warps:
            got[f"tile pick at {w} warps"] = tile_pick(*sets[0], lens, c, positions, w)
        for name, x in got.items():
            if not torch.equal(x, want):
                raise AssertionError(f"select_picks: {name} differs from whole rows at {c}")
    fns = [lambda i: whole_rows(*sets[i], lens, c, positions)]
    for w in warps:
        fns.append(lambda i, w=w: tile_pick(*sets[i], lens, c, positions, w))
    timings = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
    profiled = {
        "whole_rows": launch_times(fns[0], CALLS_PROFILED, len(sets)),
        "tile": launch_times(
            lambda i: sb.select_blocks(*sets[i], lens, **sel_kw), CALLS_PROFILED, len(sets)
        ),
    }
    heads = (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM)
    nbytes = select_unique_bytes(c.batch, c.t, c.context_len, c.top_n, c.method, BLOCK_SIZE, *heads)
    if c.rule == "relative":  # the window's block ids after each row's picks
        nbytes += c.batch * NUM_KV_HEADS * c.t * relative_slots(WINDOW, BLOCK_SIZE) * 4
    return dict(
        **dataclasses.asdict(c),
        floor_s=nbytes / copy_bps,
        graph_s=dict(
            whole_rows=timings[0].median_s,
            tile={str(w): t.median_s for w, t in zip(warps, timings[1:], strict=True)},
        ),
        launches=profiled,
    )


def _us(x: float) -> str:
    return f"{x * 1e6:7.1f}"


def print_table(rows: list[dict]) -> None:
    """One line a case: the floor, the whole-row path, the tile path at each warp count, the
    best tile time over the whole-row time, and each path's launches' device times (scoring +
    pick; the tile path's at ``select_blocks``' warps) from the profiler."""
    warps = list(rows[0]["graph_s"]["tile"])
    head = f"{'method':>6} {'rule':>8} {'b':>3} {'ctx':>7} {'t':>3} {'floor':>7} {'whole':>7} "
    head += " ".join(f"{'t' + w + 'w':>8}" for w in warps)
    print(head + " best/whole  whole: launches    tile: launches")
    for r in rows:
        tile = r["graph_s"]["tile"]
        cells = [_us(tile[w]) + " " for w in warps]
        ratio = min(tile.values()) / r["graph_s"]["whole_rows"]
        two = "+".join(f"{x['median_s'] * 1e6:.1f}" for x in r["launches"]["whole_rows"])
        cnd = "+".join(f"{x['median_s'] * 1e6:.1f}" for x in r["launches"]["tile"])
        print(
            f"{r['method']:>6} {r['rule']:>8} {r['batch']:>3} {r['context_len']:>7} {r['t']:>3} "
            f"{_us(r['floor_s'])} {_us(r['graph_s']['whole_rows'])} {' '.join(cells)}"
            f"  {ratio:8.3f}  {two:>16}  {cnd:>16}"
        )
    print("(us, CUDA graph, L2 flushed; launches: profiler device times)")


def _ints(p: OneLineParser, flag: str, values: list[int], lo: int) -> None:
    for v in values:
        if v < lo:
            p.exit(2, f"select_picks: {flag} {v} is below {lo}\n")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--methods", nargs="+", default=["mean", "quest"], choices=["mean", "quest"])
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--top-n", type=int, default=16)
    p.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args(argv)
    _ints(p, "--batches", args.batches, 1)
    _ints(p, "--tokens", args.tokens, 1)
    _ints(p, "--top-n", [args.top_n], 3)
    _ints(p, "--contexts", args.contexts, WINDOW + BLOCK_SIZE * args.top_n)
    for w in args.warps:
        if w < 1 or w & (w - 1):
            p.exit(2, f"select_picks: --warps {w} is not a power of two\n")
    if not torch.cuda.is_available():
        p.exit(2, "select_picks: needs a CUDA GPU\n")
    copy_bps = tm.copy_bytes_per_s()
    cases = [
        Case(m, b, ctx, t, rule, args.top_n)
        for m, rule, b, ctx, t in itertools.product(
            args.methods, args.rules, args.batches, args.contexts, args.tokens
        )
    ]
    rows = []
    for i, c in enumerate(cases):
        rows.append(run_case(c, args.warps, copy_bps))
        print(f"[{i + 1}/{len(cases)}] {c}", flush=True)
    write_benchmark(
        args.out,
        "select_picks",
        rows,
        block_size=BLOCK_SIZE,
        heads=[NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM],
        window=WINDOW,
        num_sms=num_sms(torch.device("cuda")),
        copy_bytes_per_s=copy_bps,
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
