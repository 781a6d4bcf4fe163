"""NSA verification under both values of one tiling knob of ``NsaVerifyConfig`` across the draft
rows t, against the call's floor: the row tiles' plan, the compressed branch's tiles, the block
scoring's map, a forward program's launch knobs, or how a call's launches run (``--knob``, one
of ``KNOBS``; ``run_case`` says what each compares).

    python -m ssvkit.validation.nsa_tile_plans --out build/nsa-tile-plans.json \\
        --resume build/nsa-tile-plans.jsonl [--knob context_tiles] [--stop-after 540] \\
        [--contexts 131072 ...]

Llama-3.1-8B attention (``--geometry``: another of ``calibration.kernel_inputs.GEOMETRIES``) at
NSA's published geometry with ``validation.nsa_stages``' inputs, over
``CONTEXTS`` x ``BATCHES`` x ``DRAFT_ROWS`` and the knob's row schedules: each value's calls
(``knob_calls``) are checked against the first value's (``check``), then timed (CUDA graphs, L2
flushed per sample, median, ``kernels.timing``). Each row's floor is ``max(unique bytes / copy
bandwidth, FLOPs / GEMM rate)``, both ceilings measured in the same run (``call_flops``).
"""

from __future__ import annotations

import functools
import json
import time

import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import nsa_verify as nv
from ssvkit.kernels import timing as tm
from ssvkit.kernels.nsa_verify import NsaVerifyConfig
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.validation.bench import RunCache
from ssvkit.validation.nsa_stages import KW, OVERLAP, TIMING, floor_bytes, input_sets

GEOMETRY = "llama-3.1-8b"
CONTEXTS = (32768, 65536, 131072)
DRAFT_ROWS = (1, 8, 9, 16, 17, 24, 32, 33)
BATCHES = (1, 4, 16)
# The comparisons: the config field, its two values (the first the baseline) and the row
# schedules.
KNOBS = {
    "tile_plan": ("tile_plan", ("fixed", "fit"), (0, 1, 4)),
    "fit_slots": ("tile_plan", ("fixed", "fit_slots"), (0, 1, 4)),
    "context_tiles": ("context_tiles", ("per_tile", "shared"), (1, 4)),
    "paired": ("context_tiles", ("shared", "paired"), (1, 4)),
    "score_map": ("score_map", ("matrix", "band"), (0, 1, 4)),
    "num_warps": ("num_warps", (4, 8), (0, 1, 4)),
    "num_stages": ("num_stages", (3, 4), (0, 1, 4)),
    "block_n": ("block_n", (64, 32), (0, 1, 4)),
    "comp_block_n": ("comp_block_n", (64, 128), (0, 1, 4)),
    "branch_streams": ("branch_streams", (False, True), (0, 1, 4)),
    "pdl": ("pdl", (False, True), (0, 1, 4)),
    "ctas_per_sm": ("ctas_per_sm", (1, 2), (0, 1, 4)),
    "compressed_ctas": ("compressed_ctas", (1, 2), (0, 1, 4)),
    "warpgroup_rows": ("warpgroup_rows_from", (33, 17), (0,)),
    "wide_tile_elems": ("wide_tile_elems", (0, 4096), (0,)),
}
CALLS = ("reuse", "reuse_unfused", "refresh", "refresh_unfused")
# The calls a knob changes, where not all of them: only refresh calls score blocks, and only
# the unfused baseline has branches to run side by side.
KNOB_CALLS = {
    "score_map": ("refresh", "refresh_unfused"),
    "branch_streams": ("reuse_unfused", "refresh_unfused"),
}


def knob_calls(knob: str) -> tuple[str, ...]:
    """The calls timed under ``knob``'s two values."""
    return KNOB_CALLS.get(knob, CALLS)


ATOL = RTOL = 2e-2
SELECT_AGREEMENT = 0.97


def call_flops(bsz: int, t: int, ctx: int) -> float:
    """A call's FLOPs for its floor: the real rows' ``4 D`` per query head and visible key
    (compressed, selected, window, tail)."""
    keys = (ctx - KW["comp_block"]) // KW["comp_stride"] + 1
    keys += KW["top_n"] * KW["block_size"] + KW["window"] + t
    return 4.0 * ki.HEAD_DIM * bsz * t * ki.NUM_Q_HEADS * keys


def _call(name: str, sets, unions, config, i: int):
    args, idx = sets[i]
    kw = dict(KW, validate=False, config=config)
    fn = nv.nsa_verify_unfused if name.endswith("unfused") else nv.nsa_verify
    if name.startswith("reuse"):
        kw["block_idx"] = idx
        if fn is nv.nsa_verify and unions is not None:
            kw["union"] = unions[i]
    return fn(*args, **kw)


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if torch.isnan(a).any() or torch.isnan(b).any():
        raise RuntimeError(f"{what}: NaN in the output")
    torch.testing.assert_close(a.float(), b.float(), atol=ATOL, rtol=RTOL, msg=what)


def check(sets, configs: dict, label: str) -> None:
    """The second value's calls against the first's (``configs`` in that order), on set 0; a
    mismatch or NaN raises. Its reuse outputs (fused and unfused) within bf16 tolerance
    (``ATOL`` / ``RTOL``: the values cut the keys into different slots, so the fp32 sums round
    in another order and the outputs are not bitwise equal); its refresh indices against the
    first's (``SELECT_AGREEMENT`` of the selections: near-ties of the block scores may flip),
    and its refresh output against the first value's fused reuse call given the second's own
    indices, within the same tolerance."""
    args, idx = sets[0]
    fixed, fit = configs.values()
    for name in ("reuse", "reuse_unfused"):
        want = _call(name, sets, None, fixed, 0)[0]
        _close(_call(name, sets, None, fit, 0)[0], want, f"{label} {name}")
    for name in ("refresh", "refresh_unfused"):
        o_fit, idx_fit = _call(name, sets, None, fit, 0)
        _, idx_fixed = _call(name, sets, None, fixed, 0)
        same = (idx_fit == idx_fixed).float().mean().item()
        if same < SELECT_AGREEMENT:
            raise RuntimeError(f"{label} {name}: {same:.3f} of the selections agree")
        o_ref, _ = nv.nsa_verify(*args, **dict(KW, validate=False, config=fixed), block_idx=idx_fit)
        _close(o_fit, o_ref, f"{label} {name}")


def run_case(bsz: int, t: int, ctx: int, ceilings: dict, knob: str = "tile_plan") -> dict:
    """Every schedule and value of ``knob`` of one (batch, t, context): checked, then timed.

    Parameters
    ----------
    bsz, t, ctx : int
        The batch, the draft rows and the context of the case.
    ceilings : dict
        ``copy_bytes_per_s`` and ``gemm_flops_per_s`` measured in the same run: the floor is
        ``max(unique bytes / copy bandwidth, FLOPs / GEMM rate)`` (``call_flops``).
    knob : str
        The comparison, one of ``KNOBS`` (first value the baseline): ``tile_plan`` "fixed" /
        "fit" (the row tiles and their slots); ``fit_slots`` "fixed" / "fit_slots" (the same
        row tiles, their slots sized for one wave or by the launch's makespan);
        ``context_tiles`` "per_tile" / "shared" (the compressed branch on the schedule's row
        tiles or on one tile of all rows; row schedules
        1 and 4 only, as for ``paired``: the knob leaves a packed call as it is);
        ``paired``: ``context_tiles`` "shared" / "paired" (a reuse call's two forward steps on
        shared compressed tiles as two launches or one); ``score_map`` "matrix" / "band" (how
        the refresh path's block scoring maps the compressed tokens onto the blocks; refresh
        calls only); a forward program's launch knobs against their defaults: ``num_warps`` 4
        / 8, ``num_stages`` 3 / 4, ``block_n`` 64 / 32 (keys a tile), ``comp_block_n`` 64 /
        128 (keys a tile of a launch of the compressed branch alone), ``ctas_per_sm`` 1 / 2
        (the programs an SM is sized for: twice the slots where one wave holds them),
        ``compressed_ctas`` 1 / 2 (a launch of the compressed branch alone sized for two
        programs an SM where one would leave each row tile a single slot),
        ``warpgroup_rows`` (``warpgroup_rows_from`` 33 / 17: a 32-row tile as it is or padded
        to a 64-row ``wgmma`` tile; the packed schedule only, at the draft rows whose tiles
        hold 17-32 rows); ``wide_tile_elems`` 0 / 4096 (above a head dim of 128, row tiles
        as large as at 128 or capped at 4096 MMA rows x head dim: 16 rows at 256; the packed
        schedule only, the one whose tiles the cap changes); or how a call's
        launches run: ``branch_streams`` off / on (the unfused baseline's branches on one
        stream or side by side; unfused calls only), ``pdl`` off / on (each launch of a call
        after its first a programmatic dependent of the one before).

    Returns
    -------
    dict
        The row: the case, its floor and, per row schedule ``r``, value and call of
        ``knob_calls``, the median time of the call in a CUDA graph (``times_s``).
    """
    field, values, schedules = KNOBS[knob]
    num_sets = 2 if bsz * ctx > 1 << 20 else 4
    sets = input_sets(bsz, t, ctx, ctx + t, num_sets)
    floor_b = floor_bytes(bsz, t, ctx, sets[0][1])
    flops = call_flops(bsz, t, ctx)
    floor_s = max(floor_b / ceilings["copy_bytes_per_s"], flops / ceilings["gemm_flops_per_s"])
    row = dict(
        batch=bsz, num_query_tokens=t, context_len=ctx, overlap=OVERLAP, unique_bytes=floor_b,
        flops=flops, floor_s=floor_s, **ceilings, times_s={},
    )  # fmt: skip
    for r in schedules:
        configs = {p: NsaVerifyConfig(rows_per_tile=r, **{field: p}) for p in values}
        check(sets, configs, f"b{bsz} t{t} {ctx} r{r}")
        for plan, cfg in configs.items():
            unions = [
                nv.nsa_union_plan(a[0], a[1], idx, block_size=KW["block_size"], config=cfg)
                for a, idx in sets
            ]
            for name in knob_calls(knob):
                fn = functools.partial(_call, name, sets, unions, cfg)
                timing = tm.bench(fn, "graph", num_inputs=num_sets, config=TIMING)
                row["times_s"][f"r{r}_{plan}_{name}"] = timing.median_s
    torch.cuda.empty_cache()
    print_row(row, knob)
    return row


def print_row(row: dict, knob: str = "tile_plan") -> None:
    field, values, schedules = KNOBS[knob]
    floor_us = row["floor_s"] * 1e6
    head = f"b{row['batch']:<2d} t{row['num_query_tokens']:<2d} {row['context_len'] // 1024:>3d}K"
    for r in schedules:
        cells = []
        for name in knob_calls(knob):
            a, b = (row["times_s"][f"r{r}_{p}_{name}"] * 1e6 for p in values)
            cells.append(f"{name} {a:7.1f}/{b:7.1f} us ({a / floor_us:4.1f}x/{b / floor_us:4.1f}x)")
        pair = "/".join(map(str, values))
        print(f"{head} r{r} floor {floor_us:6.1f} us  {pair}: " + "  ".join(cells), flush=True)


def print_summary(rows: list[dict], knob: str = "tile_plan") -> None:
    """Per case and schedule: the reuse and refresh time of each value over the floor, of the
    fused calls (the unfused ones where the knob times only those)."""
    field, values, schedules = KNOBS[knob]
    timed = knob_calls(knob)
    reuse, refresh = (next((n for n in timed if n.startswith(k)), k) for k in ("reuse", "refresh"))
    pair = "/".join(map(str, values))
    print(f"\n{'case':>14s} {'r':>2s} {'floor':>7s}  {reuse} {pair} (x floor)  {refresh} {pair}")
    for row in rows:
        case = f"b{row['batch']} t{row['num_query_tokens']} {row['context_len'] // 1024}K"
        for r in schedules:
            ts = [_over_floor(row, f"r{r}_{p}_{n}") for n in (reuse, refresh) for p in values]
            print(f"{case:>14s} {r:>2d} {row['floor_s'] * 1e6:7.1f}  {ts[0]} / {ts[1]}"
                  f"               {ts[2]} / {ts[3]}")  # fmt: skip


def _over_floor(row: dict, key: str) -> str:
    """A call's time over the row's floor, or "-" where the knob left the call untimed."""
    t = row["times_s"].get(key)
    return "    -" if t is None else f"{t / row['floor_s']:5.1f}"


def cases(contexts, draft_rows, batches):
    return [(b, t, c) for c in contexts for b in batches for t in draft_rows]


def measure(
    todo, cache: RunCache | None, stop_at: float, knob: str = "tile_plan"
) -> tuple[list[dict], bool]:
    """The rows of ``todo``'s cases in order: cached ones from ``cache``, the others measured
    until ``stop_at``; past it the cached ones still count, and the document is incomplete."""
    ceilings = None
    rows = []
    complete = True
    for case in todo:
        key = "b{}-t{}-{}".format(*case)
        if cache is not None and key in cache.runs:
            rows.append(cache.runs[key])
            continue
        if time.perf_counter() >= stop_at:
            complete = False
            continue
        ceilings = ceilings or dict(
            copy_bytes_per_s=tm.copy_bytes_per_s(), gemm_flops_per_s=tm.gemm_flops_per_s()
        )
        run = functools.partial(run_case, *case, ceilings, knob)
        rows.append(run() if cache is None else cache.get(key, run))
    return rows, complete


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the JSON document here")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    stop_help = "start no case after S seconds; a later call with --resume goes on"
    p.add_argument("--stop-after", type=float, default=None, metavar="S", help=stop_help)
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    p.add_argument("--draft-rows", type=int, nargs="+", default=list(DRAFT_ROWS))
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--knob", choices=list(KNOBS), default="tile_plan", help="what is compared")
    p.add_argument(
        "--geometry", choices=ki.GEOMETRIES, default=GEOMETRY, help="the attention's heads"
    )
    args = p.parse_args(argv)
    ki.use_geometry(args.geometry)
    field, values, _ = KNOBS[args.knob]
    for name in ("contexts", "draft_rows", "batches"):
        bad = [v for v in getattr(args, name) if v < 1 or (name == "draft_rows" and v > 64)]
        if bad:
            p.exit(2, f"nsa_tile_plans: --{name.replace('_', '-')} has a bad value {bad[0]}\n")
    t0 = time.perf_counter()
    cache = None
    if args.resume:
        prov = {k: v for k, v in tm.provenance().items() if k != "timestamp"}
        settings = dict(knob=args.knob, kwargs=KW, plans=list(values), timing=str(TIMING), **prov)
        if args.geometry != GEOMETRY:
            settings["geometry"] = args.geometry
        try:
            cache = RunCache(args.resume, settings)
        except ValueError as e:
            p.exit(2, f"nsa_tile_plans: {e}\n")
    stop_at = t0 + args.stop_after if args.stop_after is not None else float("inf")
    todo = cases(args.contexts, args.draft_rows, args.batches)
    rows, complete = measure(todo, cache, stop_at, args.knob)
    doc = {
        "benchmark": "nsa_tile_plans",
        "knob": args.knob,
        "geometry": args.geometry,
        "complete": complete,
        "kwargs": KW,
        "configs": {p: str(NsaVerifyConfig(**{field: p})) for p in values},
        "provenance": tm.provenance(),
        "rows": rows,
    }
    if args.out:
        atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print_summary(rows, args.knob)
    if not complete:
        left = f"{len(rows)} of {len(todo)} cases"
        print(f"stopped by --stop-after after {left}: run again with --resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
