"""Block selection (``kernels.select_blocks``) by its two launches and by the two-stage candidate
pick (``candidates=True``) at each of the pick's warp counts, across batches, contexts, draft
rows, methods and pick rules: the measurements that decide the selection's default path.

    python -m ssvkit.validation.select_paths --out validation/data/select-paths-h200.json

Llama-3.1-8B attention (32 query / 8 KV heads, D = 128), 64-token blocks, bf16 queries and keys
from a seeded generator, each sequence's prefix the context (the first 37 tokens short). Rule
``prefix``: one sink and one local block (the kernel sweep's); ``relative``: the rows at the
prefix's last positions, a 512-token window (the engine's sparse refresh layer). Enough input
sets to defeat the L2 (``kernels.timing.num_rotations``: fresh queries, copies of the
metadata). Each case first checks that the candidate path at every warp count picks the blocks
the two launches pick (poisoned outputs), then times the two launches and the candidate path at
each warp count in interleaved CUDA-graph replays (L2 flushed per sample, median), then profiles
both paths at their own warps for each launch's device time (the scoring, the pick).
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
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.select_candidates import candidate_meta, candidate_warps
from ssvkit.kernels.top_blocks import relative_slots
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.select_work import SelectShape, score_tile, score_tiles
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

    def kwargs(self, positions: torch.Tensor) -> dict:
        """``select_blocks``' keyword arguments of the case's rule and top_n."""
        kw = dict(top_n=self.top_n, method=self.method)
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


def rule_warps(c: Case, sms: int) -> int | None:
    """The candidate pick's warps by its rule at the case's shape, or None where the candidate
    path does not serve it (it runs the two launches)."""
    s = SelectShape(c.batch, c.t, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, c.context_len, c.top_n)
    t_pad, block_nb, _ = score_tile(c.t, 2 if c.method == "quest" else 1, HEAD_DIM)
    nb_tiles = -(-s.num_blocks // block_nb)
    pairs = c.batch * NUM_KV_HEADS
    ranges = -(-s.num_blocks // (block_nb * score_tiles(nb_tiles * pairs, sms)))
    cand = candidate_meta(ranges, block_nb, c.top_n)
    if cand is None:
        return None
    return candidate_warps(pairs * c.t, cand["RUNS"] * cand["CAND_N"], torch.device("cuda"))


def run_case(c: Case, warps: list[int], copy_bps: float) -> dict:
    """One case: every candidate warp count checked against the two launches, then all timed
    together, then each path's launches profiled."""
    sets, lens, positions = _inputs(c)
    kw = c.kwargs(positions)
    with tm.poisoned_allocations():
        want = sb.select_blocks(*sets[0], lens, **kw)
        for w in warps:
            got = sb.select_blocks(*sets[0], lens, candidates=True, pick_warps=w, **kw)
            if not torch.equal(got, want):
                raise AssertionError(f"select_paths: candidates at {w} warps differ at {c}")
    fns = [lambda i: sb.select_blocks(*sets[i], lens, **kw)]
    for w in warps:
        fns.append(
            lambda i, w=w: sb.select_blocks(*sets[i], lens, candidates=True, pick_warps=w, **kw)
        )
    timings = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
    profiled = {
        "two_launch": launch_times(fns[0], CALLS_PROFILED, len(sets)),
        "candidates": launch_times(
            lambda i: sb.select_blocks(*sets[i], lens, candidates=True, **kw),
            CALLS_PROFILED,
            len(sets),
        ),
    }
    heads = (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM)
    nbytes = select_unique_bytes(c.batch, c.t, c.context_len, c.top_n, c.method, BLOCK_SIZE, *heads)
    if c.rule == "relative":  # the window's block ids after each row's picks
        nbytes += c.batch * NUM_KV_HEADS * c.t * relative_slots(WINDOW, BLOCK_SIZE) * 4
    return dict(
        **dataclasses.asdict(c),
        rule_warps=rule_warps(c, num_sms(torch.device("cuda"))),
        floor_s=nbytes / copy_bps,
        graph_s=dict(
            two_launch=timings[0].median_s,
            candidates={str(w): t.median_s for w, t in zip(warps, timings[1:], strict=True)},
        ),
        launches=profiled,
    )


def _us(x: float) -> str:
    return f"{x * 1e6:7.1f}"


def print_table(rows: list[dict]) -> None:
    """One line a case: the floor, the two launches, the candidate path at each warp count
    (``*``: its rule's), the best candidate time over the two launches', and each path's
    launches' device times (scoring + pick) from the profiler."""
    warps = list(rows[0]["graph_s"]["candidates"])
    head = f"{'method':>6} {'rule':>8} {'b':>3} {'ctx':>7} {'t':>3} {'floor':>7} {'two':>7} "
    head += " ".join(f"{'c' + w + 'w':>8}" for w in warps)
    print(head + "  best/two  two: launches       cand: launches")
    for r in rows:
        cand = r["graph_s"]["candidates"]
        cells = []
        for w in warps:
            mark = "*" if r["rule_warps"] is not None and str(r["rule_warps"]) == w else " "
            cells.append(_us(cand[w]) + mark)
        ratio = min(cand.values()) / r["graph_s"]["two_launch"]
        two = "+".join(f"{x['median_s'] * 1e6:.1f}" for x in r["launches"]["two_launch"])
        cnd = "+".join(f"{x['median_s'] * 1e6:.1f}" for x in r["launches"]["candidates"])
        print(
            f"{r['method']:>6} {r['rule']:>8} {r['batch']:>3} {r['context_len']:>7} {r['t']:>3} "
            f"{_us(r['floor_s'])} {_us(r['graph_s']['two_launch'])} {' '.join(cells)}"
            f"  {ratio:8.3f}  {two:>16}  {cnd:>16}"
        )
    print("(us, CUDA graph, L2 flushed; launches: profiler device times)")


def _ints(p: OneLineParser, flag: str, values: list[int], lo: int) -> None:
    for v in values:
        if v < lo:
            p.exit(2, f"select_paths: {flag} {v} is below {lo}\n")


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
            p.exit(2, f"select_paths: --warps {w} is not a power of two\n")
    if not torch.cuda.is_available():
        p.exit(2, "select_paths: needs a CUDA GPU\n")
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
        "select_paths",
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
