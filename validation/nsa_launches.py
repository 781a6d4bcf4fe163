"""Each launch of an NSA call on the GPU beside the call's CUDA-graph time and byte floor: where
the time of a latency-bound call goes.

    python -m ssvkit.validation.nsa_launches --out validation/data/nsa-launches-h200.json \\
        [--cases 1:1:131072:0 ...] [--calls refresh ...] [--set default ctas_per_sm=2,num_warps=8]

Llama-3.1-8B attention, NSA's published geometry and ``validation.nsa_stages``' inputs (reuse
indices with adjacent-row overlap 0.7), at the engine's verify shapes (``CASES``; ``--cases``
takes others as ``batch:draft rows:context:rows_per_tile``). ``--set`` runs every case under
each of its settings, ``NsaVerifyConfig`` fields changed from the default (``default``: none),
which is how a knob's effect on each launch shows; each row records its changed fields
(``config``). Each case
first checks every call (``check``), then per call (fused and unfused refresh and reuse, with
the row schedule's config) times ``graph_s``, the call in a CUDA graph (``kernels.timing``, L2
flushed per sample, median), and ``launches``, each kernel launch of one eager call in the
order they start with its device time and whether it ran on a side stream
(``launch_times``). ``floor_s``: the call's unique bytes (``nsa_stages.floor_bytes``) over the
copy bandwidth measured in the same run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from ssvkit.kernels import nsa_verify as nv
from ssvkit.kernels import timing as tm
from ssvkit.kernels.nsa_config import DEFAULT_CONFIG, NsaVerifyConfig
from ssvkit.perfmodel.arguments import OneLineParser, dataclass_from_pairs
from ssvkit.validation import nsa_stages as ns
from ssvkit.validation.bench_documents import write_benchmark
from ssvkit.validation.launch_times import launch_times
from ssvkit.validation.nsa_launches_table import print_table

K = 1024
# (batch, draft rows, context, rows_per_tile): the engine verify step's shapes.
CASES = (
    (1, 1, 128 * K, 0),
    (1, 16, 128 * K, 4),
    (1, 16, 128 * K, 1),
    (16, 16, 64 * K, 4),
)
CALLS = ("refresh", "refresh_unfused", "reuse", "reuse_unfused")
CALLS_PROFILED = 9
NUM_SETS = 2


def parse_case(text: str) -> tuple[int, int, int, int]:
    """``batch:draft rows:context:rows_per_tile`` as a case of ``CASES``; ``ValueError`` in one
    line naming the bad case."""
    parts = text.split(":")
    try:
        case = tuple(int(x) for x in parts)
    except ValueError:
        case = ()
    if len(case) != 4 or min(case[:3]) < 1 or case[3] < 0:
        raise ValueError(
            f"--cases {text!r}: expected batch:draft rows:context:rows_per_tile, "
            "the first three >= 1 and the last >= 0"
        )
    return case


def _call(name: str, sets, unions, config, i: int):
    """Call ``name`` of ``CALLS`` on input set ``i``: ``(o, indices)``."""
    args, idx = sets[i]
    fn = nv.nsa_verify_unfused if name.endswith("_unfused") else nv.nsa_verify
    kw = dict(ns.KW, validate=False, config=config)
    if name.startswith("reuse"):
        kw["block_idx"] = idx
        if fn is nv.nsa_verify:
            kw["union"] = unions[i]
    return fn(*args, **kw)


def check(sets, unions, config, batch: int) -> None:
    """Every call's output on set 0 against the fp32 reference (batch 1; the reuse calls with
    the reference's indices) or, at larger batch, the unfused calls against the fused ones,
    which the CPU tests hold to the reference; ``SystemExit`` naming the call on a mismatch or
    NaN."""
    args, idx = sets[0]
    outs = {}
    with tm.poisoned_allocations():
        if batch == 1:
            ro, ridx = nv.reference_nsa_verify(*args, **ns.KW)
            ref_sets = [(args, ridx.int())]
            ref_unions = [
                nv.nsa_union_plan(
                    args[0], args[1], ridx.int(), block_size=ns.KW["block_size"], config=config
                )
            ]
        for name in CALLS:
            if batch == 1:
                o, _ = _call(name, ref_sets, ref_unions, config, 0)
                want = ro
            else:
                o, _ = _call(name, sets, unions, config, 0)
                want = outs.get(name.removesuffix("_unfused"))
            if torch.isnan(o).any():
                raise SystemExit(f"nsa_launches: {name}: NaN in the output")
            outs[name] = o
            if want is not None:
                try:
                    torch.testing.assert_close(o.float(), want.float(), atol=3e-2, rtol=3e-2)
                except AssertionError as e:
                    raise SystemExit(f"nsa_launches: {name} differs: {e}".splitlines()[0]) from None


def run_case(
    batch: int,
    t: int,
    ctx: int,
    rows_per_tile: int,
    copy_bps: float,
    calls: tuple[str, ...] = CALLS,
    base: NsaVerifyConfig = DEFAULT_CONFIG,
) -> dict:
    """One case of ``CASES``, checked (``check``), then per call of ``calls`` (``base`` with the
    row schedule) its CUDA-graph time (``graph_s``), its launches (``launch_times``) and their
    summed device time (``kernel_sum_s``), beside the case's floor (``floor_s``)."""
    config = dataclasses.replace(base, rows_per_tile=rows_per_tile)
    changed = changed_fields(base)
    sets = ns.input_sets(batch, t, ctx, ctx + t, NUM_SETS)
    unions = [
        nv.nsa_union_plan(a[0], a[1], idx, block_size=ns.KW["block_size"], config=config)
        for a, idx in sets
    ]
    check(sets, unions, config, batch)
    floor = ns.floor_bytes(batch, t, ctx, sets[0][1])
    row = dict(
        batch=batch,
        num_query_tokens=t,
        context_len=ctx,
        rows_per_tile=rows_per_tile,
        overlap=ns.OVERLAP,
        unique_bytes=floor,
        copy_bytes_per_s=copy_bps,
        floor_s=floor / copy_bps,
        config=changed,
        calls={},
    )
    for name in calls:

        def fn(i, name=name):
            return _call(name, sets, unions, config, i)

        graph = tm.bench(fn, "graph", num_inputs=NUM_SETS, config=ns.TIMING).median_s
        launches = launch_times(fn, CALLS_PROFILED, NUM_SETS)
        row["calls"][name] = dict(
            graph_s=graph,
            kernel_sum_s=sum(x["median_s"] for x in launches),
            launches=launches,
        )
    torch.cuda.empty_cache()
    return row


def changed_fields(config: NsaVerifyConfig) -> dict:
    """The fields of ``config`` that differ from the default's."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(DEFAULT_CONFIG, f.name)
    }


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="B:T:CTX:R",
        help="batch:draft rows:context:rows_per_tile (default: the engine's verify shapes)",
    )
    p.add_argument("--calls", nargs="+", choices=CALLS, default=list(CALLS))
    p.add_argument(
        "--set",
        nargs="+",
        default=["default"],
        metavar="NAME=VALUE,...",
        help="settings to run every case under, each NsaVerifyConfig fields changed from the "
        "default ('default': none), e.g. default ctas_per_sm=2,num_warps=8",
    )
    args = p.parse_args(argv)
    try:
        cases = [parse_case(c) for c in args.cases] if args.cases else list(CASES)
        bases = [
            dataclass_from_pairs(NsaVerifyConfig, "" if x == "default" else x, "--set")
            for x in args.set
        ]
    except ValueError as e:
        p.exit(2, f"nsa_launches: {e}\n")
    if not torch.cuda.is_available():
        p.exit(2, "nsa_launches: needs a CUDA GPU (device-side launch times)\n")
    copy_bps = tm.copy_bytes_per_s()
    calls = tuple(args.calls)
    rows = [run_case(*case, copy_bps, calls, base) for base in bases for case in cases]
    write_benchmark(
        args.out,
        "nsa_launches",
        rows,
        kwargs=ns.KW,
        calls_profiled=CALLS_PROFILED,
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
