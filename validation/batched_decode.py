"""Batched decoding of every baseline through ``ssvkit decode``: tokens/s, acceptance and step
times per (context, baseline, drafter, batch), written with their provenance as one JSON document.

    python -m ssvkit.validation.batched_decode --gpu h200 --contexts 8K,16K,max --batches 1,8,32 \\
        --out validation/data/batched-decode-contexts-h200.json --resume build/batched-decode.jsonl

Each run is ``ssvkit decode --model tiny --context C --batch B --strategy S --json`` (greedy,
CUDA graphs), a process of its own (``measure``): the speculative baselines with the draft
model and with the n-gram drafter, ``ssv_planned`` with ``--ranking`` (the planner evaluation's
space and profile ranked at batch B, ``ranking_for``). A run that fails is recorded with its
one-line error, not skipped. ``--repeats N`` runs every (context, baseline, drafter, batch) N
times, interleaved (every run once, then every run again), so a slow spell of the machine
touches each baseline alike; ``table`` shows each one's median and the range of its runs.
``--metadata mean`` (or ``quest``) runs the sparse baselines with block-metadata selection in
place of their NSA importance (``ssvkit decode --metadata``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.loop_host import LOOPS
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.strategy import BASELINES as STRATEGIES
from ssvkit.perfmodel.strategy import METADATA
from ssvkit.validation.bench import RunCache
from ssvkit.validation.records import file_label, record_path

BASELINES = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv", "ssv_planned")
SPECULATIVE = ("sd_dense", "sd_sparse_naive", "ssv")


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--contexts",
        default="16K",
        help="prompt tokens per sequence; max: the longest the tiny pair's positions hold",
    )
    p.add_argument("--batches", default="1,2,4,32", help="batch sizes")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument("--drafters", default="draft_model,ngram", help="of the speculative ones")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per sequence")
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each, interleaved (table: median, range)"
    )
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation that ranks ssv_planned",
    )
    p.add_argument(
        "--metadata",
        default="nsa",
        choices=METADATA,
        help="block scores of the sparse baselines (nsa: their own; mean, quest: block metadata)",
    )
    p.add_argument(
        "--loops",
        default="pipelined",
        help="decode loops of each run, interleaved: pipelined (the engine's default where the "
        "strategy allows, engine.pipeline), serial (ssvkit decode --serial-loop), or both",
    )
    p.add_argument("--gpu", default="h200", help="GPU of the predictions beside the runs")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True, help="the JSON document")
    p.add_argument("--resume", default=None, metavar="FILE", help="finished runs (JSONL)")
    p.add_argument(
        "--stop-after", type=float, default=None, metavar="S", help="start no run after S seconds"
    )
    return p.parse_args(argv)


def run_ssvkit(argv: list[str], folder: Path) -> tuple[int, str, str]:
    """``ssvkit ARGV`` in a process of its own, in ``folder``: exit code, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "ssvkit.cli", *argv],
        cwd=folder,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    return done.returncode, done.stdout, done.stderr


def child_env() -> dict[str, str]:
    """This process's environment with the folder that holds the imported ``ssvkit`` first on
    ``PYTHONPATH``, so that a child started in another folder imports the same package, from a
    clone that was never installed too."""
    import ssvkit

    root = str(Path(ssvkit.__file__).resolve().parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def longest_context(new_tokens: int) -> int:
    """The longest prompt of ``ssvkit decode --model tiny`` with ``new_tokens`` and the largest
    verify tail (``ssvkit.cli.decode_cmd``'s positions check): ``ssv_planned``'s controller may
    switch to any tree, so every run leaves room for the largest."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.kernels.tree import MAX_TREE_NODES

    limit = resolve_source("tiny").config.max_position_embeddings
    return limit - new_tokens - MAX_TREE_NODES - 1


def parse_contexts(text: str, new_tokens: int) -> list[int]:
    """``--contexts`` as prompt lengths (``max``: ``longest_context``)."""
    parts = [c for c in text.split(",") if c]
    counts = parse_count_list(",".join(c for c in parts if c != "max") or "1", "--contexts")
    it = iter(counts)
    return [longest_context(new_tokens) if c == "max" else next(it) for c in parts]


def plan(args) -> list[dict]:
    """Every run: context, baseline, drafter (None for the autoregressive ones and
    ssv_planned), batch, and with ``--repeats`` > 1 its ``repeat`` (0, 1, ...: every run of
    one repeat before the next repeat's)."""
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    contexts = parse_contexts(args.contexts, args.new_tokens)
    batches = parse_count_list(args.batches, "--batches")
    names = [n for n in args.baselines.split(",") if n]
    bad = sorted(set(names) - set(BASELINES))
    if bad:
        raise ValueError(f"unknown baseline(s) {bad}; choose from {', '.join(BASELINES)}")
    if args.metadata != "nsa" and "ssv_planned" in names:
        raise ValueError(
            f"--metadata {args.metadata} does not apply to ssv_planned (its ranking sets it)"
        )
    drafters = [d for d in args.drafters.split(",") if d]
    loops = [x for x in args.loops.split(",") if x]
    bad = sorted(set(loops) - set(LOOPS)) or ([] if loops else ["(none)"])
    if bad:
        raise ValueError(f"unknown loop(s) {bad}; choose from {', '.join(LOOPS)}")
    runs = []
    for ctx in contexts:
        for b in batches:
            for name in names:
                for d in drafters if name in SPECULATIVE else [None]:
                    for loop in loops:
                        run = {"context": ctx, "baseline": name, "drafter": d, "batch": b}
                        runs.append(run if loop == "pipelined" else dict(run, loop=loop))
    if args.repeats == 1:
        return runs
    return [dict(r, repeat=k) for k in range(args.repeats) for r in runs]


def run_key(run: dict) -> str:
    """A run's key in the run cache and the document (repeat 0 keyed as a single run)."""
    key = f"{run['context']}|{run['baseline']}|{run['drafter']}|{run['batch']}"
    key += "|serial" if run.get("loop") == "serial" else ""
    return f"{key}|{run['repeat']}" if run.get("repeat") else key


def decode_argv(args, run: dict, ranking: str | None) -> list[str]:
    argv = [
        "decode",
        "--model",
        "tiny",
        "--context",
        str(run["context"]),
        "--batch",
        str(run["batch"]),
        "--max-new-tokens",
        str(args.new_tokens),
        "--device",
        args.device,
        "--gpu",
        args.gpu,
        "--json",
    ]
    if run["baseline"] == "ssv_planned":
        return argv + ["--ranking", ranking]
    argv += ["--strategy", run["baseline"]]
    if args.metadata != "nsa" and STRATEGIES[run["baseline"]].is_sparse:
        argv += ["--metadata", args.metadata]
    if run["drafter"]:
        argv += ["--drafter-kind", run["drafter"]]
    if run.get("loop") == "serial":
        argv.append("--serial-loop")
    return argv


def ranking_for(args, batch: int, folder: Path) -> str:
    """The file name, in ``folder``, of the evaluation's ranking at ``batch``."""
    name = f"ranking-b{batch}.json"
    if not (folder / name).exists():
        planner = str(Path(args.planner).resolve())
        code, _, err = run_ssvkit(
            ["rank", "--evaluation", planner, "--batch", str(batch), "--out", name], folder
        )
        if code:
            raise ValueError(f"ranking at batch {batch} failed: {err.strip()}")
    return name


def measure(args, run: dict, folder: Path) -> dict:
    ranking = ranking_for(args, run["batch"], folder) if run["baseline"] == "ssv_planned" else None
    argv = decode_argv(args, run, ranking)
    t0 = time.perf_counter()
    code, out, err = run_ssvkit(argv, folder)
    row = dict(run, argv=argv, wall_s=time.perf_counter() - t0, exit_code=code)
    if code:
        row["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        return row
    rep = json.loads(out)
    rep["argv"] = argv
    row["report"] = rep
    return row


def main(argv=None) -> int:
    """Run every planned run in turn and write ``--out`` after each; print the table last.

    With ``--resume FILE`` each finished run is appended to FILE, and a later call with the same
    settings and commit skips the runs already there. ``--stop-after S`` starts no run after S
    seconds; the document then says ``complete: false``. Exit status 0 when every run decoded,
    1 when one failed (recorded with its one-line error), 2 on bad input.
    """
    from ssvkit.kernels.timing import provenance

    args = parse_args(argv)
    prov = provenance()
    settings = {
        "new_tokens": args.new_tokens,
        "planner": file_label(args.planner),
        "metadata": args.metadata,
        "gpu": args.gpu,
        "device": args.device,
        "loops": args.loops,
    }
    try:
        runs = plan(args)
        cache = None
        if args.resume:
            cache = RunCache(args.resume, {**settings, "commit": prov["git_commit"]})
    except ValueError as e:
        print(f"batched_decode: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    stop_at = t0 + args.stop_after if args.stop_after is not None else float("inf")
    contexts = list(dict.fromkeys(r["context"] for r in runs))
    rows: list[dict] = []

    def write(complete: bool) -> dict:
        doc = {
            "provenance": prov,
            "settings": {**settings, "contexts": contexts, "repeats": args.repeats},
            "complete": complete,
            "runs": rows,
        }
        atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
        return doc

    complete = True
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            key = run_key(run)
            if (cache is None or key not in cache.runs) and time.perf_counter() > stop_at:
                complete = False
                break
            call = lambda run=run, key=key: dict(measure(args, run, Path(tmp)), key=key)  # noqa: E731
            r = call() if cache is None else cache.get(key, call)
            rows.append(r)
            tps = r["report"]["tokens_per_s"]["value"] if "report" in r else None
            print(
                f"{key:40s} " + (f"{tps:10.1f} tok/s" if tps else f"failed: {r['error']}"),
                flush=True,
            )
            write(False)
    doc = write(complete)
    print(table(doc))
    if not complete:
        print(f"stopped by --stop-after after {len(rows)} of {len(runs)} runs: run again")
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


def table(doc: dict) -> str:
    """Tokens/s per baseline (rows) and batch (columns), one block per context and drafter (a
    document of one context names it in its settings); of repeated runs the median, and a line
    per baseline of their range."""
    runs = doc["runs"]
    batches = sorted({r["batch"] for r in runs})
    one = doc["settings"].get("context")
    contexts = list(dict.fromkeys(r.get("context", one) for r in runs))
    lines = []
    for ctx in contexts:
        here = [r for r in runs if r.get("context", one) == ctx]
        metadata = doc["settings"].get("metadata", "nsa")
        lines.append(
            f"tokens/s, {doc['provenance']['device_name']}, context {ctx}, "
            f"sparse block scores: {metadata}"
        )
        lines.append(
            f"{'baseline':16s} {'drafter':12s}" + "".join(f"{f'b={b}':>10s}" for b in batches)
        )
        spread = []
        for name, drafter, loop in dict.fromkeys(_row_key(r) for r in here):
            cells = []
            label = name + (" (serial)" if loop else "")
            for b in batches:
                values = [
                    x["report"]["tokens_per_s"]["value"]
                    for x in here
                    if _row_key(x) == (name, drafter, loop) and x["batch"] == b and "report" in x
                ]
                cells.append(f"{statistics.median(values):10.1f}" if values else f"{'-':>10s}")
                if len(values) > 1:
                    spread.append(
                        f"  {label} {drafter or ''} b={b}: {len(values)} runs, "
                        f"{min(values):.1f} to {max(values):.1f}"
                    )
            lines.append(f"{label:16s} {drafter or '':12s}" + "".join(cells))
        if spread:
            lines += ["median of the runs; their range:", *spread]
        lines += _full_batch_lines(here, batches)
    return "\n".join(lines)


def _row_key(run: dict) -> tuple:
    """A table row: the run's baseline, drafter and whether it asked for a serial loop."""
    return run["baseline"], run["drafter"], run.get("loop") == "serial"


def _full_batch_lines(runs: list[dict], batches: list[int]) -> list[str]:
    """Per baseline and batch, the median tokens/s of its runs' full-batch rounds (every
    sequence decoding, ``ssvkit decode``'s ``full_batch``) beside the prediction, which prices
    such rounds; nothing where no run has them (batch 1, documents measured before them)."""
    lines = []
    for name, drafter, loop in dict.fromkeys(_row_key(r) for r in runs):
        label = name + (" (serial)" if loop else "")
        for b in batches:
            reps = [
                x["report"]
                for x in runs
                if _row_key(x) == (name, drafter, loop)
                and x["batch"] == b
                and x.get("report", {}).get("full_batch")
            ]
            if not reps:
                continue
            full = statistics.median(r["full_batch"]["tokens_per_s"]["value"] for r in reps)
            pred = reps[0]["prediction"].get("tokens_per_s")
            lines.append(
                f"  {label} {drafter or ''} b={b}: {full:.1f}"
                + (f", predicted {pred:.1f}" if pred is not None else "")
            )
    if not lines:
        return []
    return ["full-batch rounds' tokens/s (median of the runs) and the prediction:", *lines]


if __name__ == "__main__":
    sys.exit(main())
