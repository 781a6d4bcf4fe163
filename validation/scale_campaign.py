"""The campaign at scale: random-weight registry geometries decoded by the engine with the oracle
drafter, at long contexts and batches up to what memory allows, beside perfmodel's prediction.

    python -m ssvkit.validation.scale_campaign --plan 4 --available-gib 124   # no decode
    CUDA_VISIBLE_DEVICES=K python -m ssvkit.validation.scale_campaign --gpu h200 \\
        --available-gib 124 --shard K/4 --out build/scale-K.json --resume build/scale-K.jsonl \\
        --stop-after 420                                                   # K = 0..3, in parallel
    python -m ssvkit.validation.scale_campaign --join build/scale-0.jsonl,...,build/scale-3.jsonl \\
        --out build/scale-all.jsonl    # each shard of a later call resumes from a copy of it
    python -m ssvkit.validation.scale_campaign --merge build/scale-0.json,...,build/scale-3.json \\
        --out validation/data/scale-campaign-h200.json

Cells (``validation.scale_cells``): model x context x batch x baseline x oracle acceptance, each
decoded greedily beside perfmodel's prediction (``validation.scale_measure``); options: docs/cli.md.
"""

from __future__ import annotations

import json
import sys
import time

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.validation.bench import RunCache
from ssvkit.validation.e2e_campaign import NAMES
from ssvkit.validation.records import file_label, record_path
from ssvkit.validation.scale_cells import MODELS, setup

# The settings a run cache is keyed by (with the provenance but its timestamp). A cell's value
# does not depend on the shard or the batch limit (its key names its batch), so the shards'
# caches may be joined into one that every shard resumes from.
CACHE_SETTINGS = ("new_tokens", "planner", "gpu", "dtype", "available_gib")


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="random:NAME geometries")
    p.add_argument("--contexts", default="32K,64K,128K", help="prompt tokens per sequence")
    p.add_argument("--batches", default="1,4,16,max", help="batch sizes; max: what memory allows")
    p.add_argument("--acceptances", default="0.6,0.8", help="oracle acceptance per draft")
    p.add_argument("--baselines", default=",".join(NAMES))
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence")
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation whose space ranks ssv_planned (default: the one of record)",
    )
    p.add_argument("--gpu", default="h200", help="GPU registry key of the predictions")
    p.add_argument("--device", default="auto", help="cuda | cpu")
    p.add_argument("--dtype", default="auto", help="bf16 | fp32 (default: bf16 on cuda)")
    p.add_argument("--max-batch-limit", type=int, default=512, help="largest batch 'max' tries")
    p.add_argument(
        "--available-gib",
        type=float,
        default=None,
        help="device memory the cells may plan with (default: what the device offers)",
    )
    p.add_argument("--shard", default=None, metavar="K/N", help="run shard K (0-based) of N")
    p.add_argument(
        "--plan",
        type=int,
        default=None,
        metavar="N",
        help="print the split over N shards with estimated seconds and the largest batches; "
        "no decode (--out: the plan as JSON; --resume: the cells there count as done)",
    )
    p.add_argument(
        "--merge",
        default=None,
        metavar="A.json,B.json,...",
        help="join shard documents into one campaign document (--out)",
    )
    p.add_argument(
        "--join",
        default=None,
        metavar="A.jsonl,B.jsonl,...",
        help="join the shards' run caches into one (--out) for every shard to resume from",
    )
    p.add_argument("--out", default=None, help="campaign JSON (required but with --plan)")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="start no cell after S seconds: the JSON holds the cells finished so far "
        "(complete: false), a later call with --resume goes on",
    )
    return p.parse_args(argv)


def _line(row: dict) -> str:
    head = (
        f"{row['model']:22s} ctx {row['context']:6d} b {row['batch']:3d} "
        f"{row['baseline']:16s} a {row['acceptance'] or '-':>4}"
    )
    if row["status"] != "measured":
        return f"{head}  skipped: {row['reason']}"
    m, p = row["measured"], row["prediction"]
    pred = f"{p['tokens_per_s']:10.1f}" if "tokens_per_s" in p else "       n/a"
    prefill = "reused" if row["prefill"]["reused"] else f"{row['prefill']['forward_s']:.2f} s"
    # The figures the prediction is of: the full-batch rounds' (``validation.full_batch``).
    full = m.get("full_batch") or {
        "tokens_per_s": m["tokens_per_s"],
        "tokens_per_round": m["mean_accepted"] + 1,
    }
    return (
        f"{head} {full['tokens_per_s']:10.1f} tok/s (predicted {pred}; whole run "
        f"{m['tokens_per_s']:.1f}), {full['tokens_per_round']:.2f} tokens/round, verify "
        f"{m['steps_s']['verify'] * 1e3:.3f} ms, prefill {prefill}, {row['wall_s']:.1f} s"
    )


def _run_cache(args, st) -> RunCache:
    from ssvkit.kernels.timing import provenance

    prov = {k: v for k, v in provenance().items() if k != "timestamp"}
    settings = {
        **{k: getattr(args, k) for k in CACHE_SETTINGS},
        "planner": file_label(args.planner),
        "device": st.device,
        **prov,
    }
    return RunCache(args.resume, settings)


def _plan(args, st) -> int:
    from pathlib import Path

    from ssvkit.validation.bench import read_runs
    from ssvkit.validation.scale_plan import plan, plan_text

    if args.plan < 1:
        raise ValueError(f"--plan takes the number of shards (>= 1), got {args.plan}")
    done = set()
    if args.resume and Path(args.resume).exists():  # read from anywhere: no settings check
        done = set(read_runs(Path(args.resume).read_text().splitlines(), args.resume))
    p = plan(st, args.plan, done)
    print(plan_text(p))
    if args.out:
        atomic_write(args.out, json.dumps(p, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    """Decode the cells of ``--shard`` (or the whole campaign), or ``--plan``, ``--join`` or
    ``--merge`` without decoding.

    ``--resume FILE`` appends each finished cell and skips it on a later call with the same
    settings, device and commit. The JSON document is written whole (atomically) after every
    cell, ``complete`` false until every cell of the shard is in; ``--merge`` joins the shards'
    documents into the campaign's (``validation.scale_document``), which ``ssvkit report
    --campaign`` reads (``validation.scale_report``). Exit status 0; 2 on bad input (one line).
    """
    from ssvkit.validation.scale_document import document, join_caches, merge_files
    from ssvkit.validation.scale_measure import measure_rows
    from ssvkit.validation.scale_plan import parse_shard, shard_cells

    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    try:
        if args.merge is not None or args.join is not None:
            if not args.out:
                raise ValueError("--merge and --join need --out")
            if args.merge is not None:
                print(merge_files(args.merge.split(","), args.out, argv))
            else:
                print(join_caches(args.join.split(","), args.out))
            return 0
        if args.plan is None and not args.out:
            raise ValueError("--out is required (but with --plan)")
        st = setup(args, plan=args.plan is not None)
        if args.plan is not None:
            return _plan(args, st)
        index, count = parse_shard(args.shard)
        cache = _run_cache(args, st) if args.resume else None
        cells, mine = shard_cells(st, index, count, set(cache.runs) if cache else set())
    except ValueError as e:
        print(f"scale_campaign: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    stop_at = t0 + args.stop_after if args.stop_after is not None else float("inf")
    order = {c.slot: i for i, c in enumerate(cells)}
    rows: dict[str, dict] = {}

    def write(complete: bool) -> None:
        done = [rows[s] for s in sorted(rows, key=order.__getitem__)]
        doc = document(st, args, argv, cells, (index, count, mine), done, complete, cache, t0)
        atomic_write(args.out, json.dumps(doc) + "\n")

    def finished(cell, row: dict) -> None:
        rows[cell.slot] = row
        print(_line(row), flush=True)
        write(False)

    complete = measure_rows(st, mine, cache, stop_at, finished)
    write(complete)
    left = "" if complete else " (stopped by --stop-after: run again with --resume)"
    shard = f" of shard {index}/{count}" if count > 1 else ""
    print(f"\n({time.perf_counter() - t0:.0f} s) {len(rows)} cells{shard} -> {args.out}{left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
