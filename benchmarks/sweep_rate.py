"""End-to-end rate of an analytic ``ssvkit sweep``: grid points per second, output included.

    python benchmarks/sweep_rate.py [--workers N] [--format csv|parquet] [--repeat 3]

Runs a ~107,000-point grid (2 models x 8 contexts x 6 batches x 5 acceptances x 2 TP x 2
overlaps x 56 strategies: the five baselines with the sparse budget, group size and refresh
interval varied) the way ``ssvkit sweep --out`` does: partitioned, on local processes (one per
core by default), assembled, speedups and best-per-cell added, and the table encoded and written
to a temporary folder. Prints points/s for evaluation alone and end to end; the target is
100,000 points in <= 30 s on a 2-core CPU.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.sweep.grid import spec_from_doc
from ssvkit.sweep.runner import run_sweep
from ssvkit.sweep.table import encode

GRID = {
    "models": ["llama-3.1-8b", "qwen3-8b"],
    "context_len": ["4K", "8K", "16K", "24K", "32K", "48K", "64K", "128K"],
    "batch": [1, 2, 4, 8, 16, 32],
    "acceptance": [0.5, 0.6, 0.7, 0.8, 0.9],
    "tp": [1, 2],
    "overlap": [0.6, 0.8],
    "vary": {"top_n": [16, 32, 64], "group_size": [1, 2, 4, 8], "refresh_every": [1, 2, 4, 8]},
}


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    spec = spec_from_doc(GRID, "benchmark grid")
    print(f"grid: {spec.num_points:,} points ({spec.shape()})")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"sweep.{args.format}"
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = run_sweep(spec, workers=args.workers)
            t1 = time.perf_counter()
            atomic_write(out, encode(result.table, out, {"spec": spec.to_doc()}))
            t2 = time.perf_counter()
            runs.append((t1 - t0, t2 - t1, t2 - t0, out.stat().st_size))
    n = result.num_points
    best = min(runs, key=lambda r: r[2])
    print(f"executor: {result.facts['executor']}, {result.facts['partitions']} partitions")
    print(f"evaluate + assemble: {best[0]:.2f} s ({n / best[0]:,.0f} points/s)")
    print(f"encode + write {args.format}: {best[1]:.2f} s ({best[3] / 1e6:.1f} MB)")
    print(
        f"end to end: {best[2]:.2f} s, {n / best[2]:,.0f} points/s (best of {args.repeat}; "
        f"target: 100,000 points in <= 30 s)"
    )


if __name__ == "__main__":
    main()
