"""Batched decoding of every baseline through ``ssvkit decode``: tokens/s, acceptance and step
times per (baseline, drafter, batch), written with their provenance as one JSON document.

    python -m ssvkit.validation.batched_decode --gpu h200 \\
        --out validation/data/batched-decode-h200.json --resume build/batched-decode.jsonl

Each run is ``ssvkit decode --model tiny --context C --batch B --strategy S --json`` (greedy,
CUDA graphs), a process of its own in the folder of the rankings: the speculative baselines
with the draft model and with the n-gram drafter, ``ssv_planned`` with ``--ranking`` (the
planner evaluation's space and profile ranked at batch B, ``ssvkit rank --evaluation FILE
--batch B``, named by its file name). A run that fails is recorded
with its one-line error, not skipped. ``--resume FILE`` appends each finished run and skips
those already there on a later call with the same settings and commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.validation.records import file_label, record_path

BASELINES = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv", "ssv_planned")
SPECULATIVE = ("sd_dense", "sd_sparse_naive", "ssv")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", default="16K", help="prompt tokens per sequence")
    p.add_argument("--batches", default="1,2,4,32", help="batch sizes")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument("--drafters", default="draft_model,ngram", help="of the speculative ones")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per sequence")
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation that ranks ssv_planned",
    )
    p.add_argument("--gpu", default="h200", help="GPU of the predictions beside the runs")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True, help="the JSON document")
    p.add_argument("--resume", default=None, metavar="FILE", help="finished runs (JSONL)")
    return p.parse_args(argv)


def run_ssvkit(argv: list[str], folder: Path) -> tuple[int, str, str]:
    """``ssvkit ARGV`` in a process of its own, in ``folder``: exit code, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "ssvkit.cli", *argv], cwd=folder, capture_output=True, text=True
    )
    return done.returncode, done.stdout, done.stderr


def plan(args) -> list[dict]:
    """Every run: baseline, drafter (None for the autoregressive ones and ssv_planned), batch."""
    batches = parse_count_list(args.batches, "--batches")
    names = [n for n in args.baselines.split(",") if n]
    bad = sorted(set(names) - set(BASELINES))
    if bad:
        raise ValueError(f"unknown baseline(s) {bad}; choose from {', '.join(BASELINES)}")
    drafters = [d for d in args.drafters.split(",") if d]
    runs = []
    for b in batches:
        for name in names:
            for d in drafters if name in SPECULATIVE else [None]:
                runs.append({"baseline": name, "drafter": d, "batch": b})
    return runs


def decode_argv(args, run: dict, ranking: str | None) -> list[str]:
    argv = [
        "decode",
        "--model",
        "tiny",
        "--context",
        args.context,
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
    if run["drafter"]:
        argv += ["--drafter-kind", run["drafter"]]
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
    from ssvkit.kernels.timing import provenance

    args = parse_args(argv)
    try:
        runs = plan(args)
    except ValueError as e:
        print(f"batched_decode: error: {e}", file=sys.stderr)
        return 2
    settings = {
        "context": args.context,
        "new_tokens": args.new_tokens,
        "planner": file_label(args.planner),
        "gpu": args.gpu,
        "device": args.device,
    }
    prov = provenance()
    done: dict[str, dict] = {}
    cache = Path(args.resume) if args.resume else None
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            if row.get("settings") == settings and row.get("commit") == prov["git_commit"]:
                done[row["key"]] = row
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            key = f"{run['baseline']}|{run['drafter']}|{run['batch']}"
            if key not in done:
                row = dict(
                    measure(args, run, Path(tmp)),
                    key=key,
                    settings=settings,
                    commit=prov["git_commit"],
                )
                if cache is not None:
                    with cache.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                done[key] = row
            rows.append(done[key])
            r = done[key]
            tps = r["report"]["tokens_per_s"]["value"] if "report" in r else None
            print(
                f"{key:34s} " + (f"{tps:10.1f} tok/s" if tps else f"failed: {r['error']}"),
                flush=True,
            )
    doc = {"provenance": prov, "settings": settings, "runs": rows}
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


def table(doc: dict) -> str:
    """Tokens/s per baseline (rows) and batch (columns), one block per drafter."""
    runs = doc["runs"]
    batches = sorted({r["batch"] for r in runs})
    lines = [f"tokens/s, {doc['provenance']['device_name']}, context {doc['settings']['context']}"]
    lines.append(f"{'baseline':16s} {'drafter':12s}" + "".join(f"{f'b={b}':>10s}" for b in batches))
    keys = dict.fromkeys((r["baseline"], r["drafter"]) for r in runs)
    for name, drafter in keys:
        cells = []
        for b in batches:
            r = next(
                (
                    x
                    for x in runs
                    if (x["baseline"], x["drafter"], x["batch"]) == (name, drafter, b)
                ),
                None,
            )
            ok = r is not None and "report" in r
            cells.append(f"{r['report']['tokens_per_s']['value']:10.1f}" if ok else f"{'-':>10s}")
        lines.append(f"{name:16s} {drafter or '':12s}" + "".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
