"""The kernel sweep: correctness first, then the timed sweep, one sealed row per config.

    python -m ssvkit.calibration.kernel_sweep --out calibration/profiles/h100-sxm [--quick] \
        [--ops dense,sparse,repair,nsa,select,nsa_tiles] [--budget-s 540] [--json] \
        [--geometry tiny]

1. Checks every selected op against its fp32 reference (:mod:`calibration.kernel_checks`); a
   mismatch or a NaN aborts the run (exit status 2).
2. Measures the ceilings of this run (:class:`calibration.runner.Runner`) and writes them as rows:
   device-to-device copy bandwidth (read + write bytes) and the empty Triton kernel.
3. Times the ``Sweep`` grid (Llama-3.1-8B attention: 32 query heads, 8 KV heads, d = 128, bf16;
   with ``--geometry tiny`` the engine's trained tiny pair, 8 query heads, 2 KV heads, d = 64,
   over ``TINY_SWEEP``: the shapes the validation campaign decodes with), each config by plain
   launch and by CUDA-graph replay (:mod:`calibration.kernel_ops`), one row per (config,
   timing) in ``OUT/kernel_bench.jsonl``; configs already in the file are skipped.
4. Prints a summary of every row in the file (:mod:`calibration.kernel_summary`).

Exit status: 0 when every config is in the file, 1 without a GPU, 2 on a correctness failure or
a bad option, ``STOPPED_AT_BUDGET`` (3) when the budget left configs out (run it again).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_nsa_tiles as tiles
from ssvkit.calibration import kernel_ops as ops
from ssvkit.calibration.kernel_summary import print_summary, summarise
from ssvkit.calibration.runner import COPY_BYTES, STOPPED_AT_BUDGET, Runner, read_rows
from ssvkit.kernels import timing as tm

OPS = ("dense", "sparse", "repair", "nsa", "select", "nsa_tiles")
OUT_NAME = "kernel_bench.jsonl"
K = 1024
SHOW = ("context_len", "num_query_tokens", "batch", "mode", "group_size", "overlap", "top_n")
SHOW += ("missed_fraction", "impl", "method", "rows_per_tile")


@dataclass(frozen=True, slots=True)
class Sweep:
    """The configs timed; ``QUICK_SWEEP`` is a subset."""

    # 48K, 96K and t = 12 are calibration's held-out values: timed, never fitted.
    dense_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    dense_tokens: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)
    dense_batches: tuple[int, ...] = (1, 16)
    sparse_contexts: tuple[int, ...] = (16 * K, 64 * K)
    sparse_tokens: int = 16  # two groups of C = 8
    top_ns: tuple[int, ...] = (16, 32, 64)
    overlaps: tuple[float, ...] = (0.5, 0.7, 0.9)
    group_sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    sparse_min_large_batch: int = 16  # raised until the working set reaches 200 MB
    repair_contexts: tuple[int, ...] = (16 * K, 64 * K)
    repair_batches: tuple[int, ...] = (1, 4, 16)
    repair_top_n: int = 64
    missed_fractions: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
    other_batches: tuple[int, ...] = (1, 16)  # repair, nsa and select
    nsa_contexts: tuple[int, ...] = (16 * K, 64 * K)
    nsa_tokens: tuple[int, ...] = (16,)
    select_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    select_batches: tuple[int, ...] = (1, 4, 16)
    select_top_ns: tuple[int, ...] = (16, 64)
    block_size: int = 64
    tokens: int = 16  # draft rows of the repair, nsa and select configs


FULL_SWEEP = Sweep()
QUICK_SWEEP = Sweep(
    dense_contexts=(8 * K, 64 * K),
    dense_tokens=(1, 16, 64),
    dense_batches=(1,),
    sparse_contexts=(64 * K,),
    top_ns=(32,),
    overlaps=(0.7,),
    group_sizes=(1, 4),
    missed_fractions=(0.0, 0.25, 0.5),
    other_batches=(1,),
    nsa_contexts=(64 * K,),
    select_contexts=(64 * K,),
    select_batches=(1,),
    select_top_ns=(32,),
    repair_contexts=(64 * K,),
    repair_batches=(1,),
)
# The tiny pair's verify shapes (engine/checkpoints, validation/data/campaign.json): contexts
# up to its 32K positions, the campaign's tree sizes (1, 3, 5, 17 rows), its NSA budget.
TINY_SWEEP = Sweep(
    dense_contexts=(2 * K, 4 * K, 8 * K, 16 * K, 30 * K),
    dense_tokens=(1, 2, 3, 4, 5, 8, 12, 16, 17, 32),
    dense_batches=(1,),
    nsa_contexts=(4 * K, 8 * K, 16 * K, 30 * K),
    nsa_tokens=(1, 3, 5, 12, 17),
    other_batches=(1,),
)
# op -> (its correctness check, its sweep, the op module both take, None for a fixed one).
STEPS: dict[str, tuple[Callable, Callable, str | None]] = {
    "dense": (lambda mod: checks.check_dense(), ops.dense_sweep, None),
    "sparse": (checks.check_sparse, ops.sparse_sweep, "ssvkit.kernels.sparse_verify"),
    "repair": (lambda mod: checks.check_repair(), ops.repair_sweep, None),
    "nsa": (checks.check_nsa, ops.nsa_sweep, "ssvkit.kernels.nsa_verify"),
    "select": (checks.check_select, ops.select_sweep, "ssvkit.kernels.select_blocks"),
    "nsa_tiles": (tiles.check_nsa_tiles, tiles.nsa_tile_sweep, "ssvkit.kernels.nsa_verify"),
}


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Command-line options (the CLI's help comes from the field metadata)."""

    out: Path = field(metadata={"help": "directory for kernel_bench.jsonl"})
    quick: bool = field(default=False, metadata={"help": "reduced sweep and sample counts"})
    ops: tuple[str, ...] = field(default=OPS, metadata={"help": "comma-separated ops to run"})
    budget_s: float = field(default=540.0, metadata={"help": "wall-clock limit of the run"})
    seed: int = field(default=0, metadata={"help": "seed of every input generator"})
    json: bool = field(default=False, metadata={"help": "print the summary as JSON"})
    summary_only: bool = field(
        default=False, metadata={"help": "print the summary of OUT's rows and exit (no GPU)"}
    )
    geometry: str = field(
        default="llama-3.1-8b",
        metadata={"help": "attention heads timed: llama-3.1-8b (full sweep) or tiny (TINY_SWEEP)"},
    )

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.geometry not in ki.GEOMETRIES:
            raise ValueError(
                f"geometry must be one of {', '.join(ki.GEOMETRIES)}, got {self.geometry!r}"
            )

    @property
    def sweep(self) -> Sweep:
        """The grid the options select."""
        if self.geometry == "tiny":
            return TINY_SWEEP
        return QUICK_SWEEP if self.quick else FULL_SWEEP


def parse_args(argv: list[str] | None = None) -> SweepOptions:
    """The options of the command line (``ValueError`` naming a bad one)."""
    fields = {f.name: f for f in dataclasses.fields(SweepOptions)}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help=fields["out"].metadata["help"])
    ap.add_argument("--quick", action="store_true", help=fields["quick"].metadata["help"])
    ap.add_argument("--ops", default=",".join(OPS), help=fields["ops"].metadata["help"])
    budget = fields["budget_s"]
    ap.add_argument("--budget-s", type=float, default=budget.default, help=budget.metadata["help"])
    ap.add_argument(
        "--seed", type=int, default=fields["seed"].default, help=fields["seed"].metadata["help"]
    )
    ap.add_argument("--json", action="store_true", help=fields["json"].metadata["help"])
    ap.add_argument(
        "--summary-only", action="store_true", help=fields["summary_only"].metadata["help"]
    )
    geometry = fields["geometry"]
    ap.add_argument("--geometry", default=geometry.default, help=geometry.metadata["help"])
    a = ap.parse_args(argv)
    return SweepOptions(
        out=a.out,
        quick=a.quick,
        ops=tuple(o.strip() for o in a.ops.split(",") if o.strip()),
        budget_s=a.budget_s,
        seed=a.seed,
        json=a.json,
        summary_only=a.summary_only,
        geometry=a.geometry,
    )


def new_runner(opts: SweepOptions) -> Runner:
    """The runner of the kernel rows: both timings, integer work counts."""
    return Runner(
        opts.out / OUT_NAME,
        opts.budget_s,
        config=tm.QUICK_TIMING if opts.quick else tm.DEFAULT_TIMING,
        work_type=int,
        show=SHOW,
    )


def write_ceilings(r: Runner) -> None:
    """Measure the run's ceilings and write them as rows: the empty Triton kernel per timing
    and each device-copy method (read + write bytes)."""
    rates = r.measure_ceilings()
    c = r.ceil
    print(
        f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"GEMM {c['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s, empty kernel "
        f"{c['launch'] * 1e6:.1f} us (launch) / {c['graph'] * 1e6:.2f} us (graph)"
    )
    print("  copy rates (TB/s): " + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in rates.items()))
    for timing in r.timings:
        t = tm.Timing(c[timing], c[timing], c[timing], timing, 1)
        r.write("empty_triton_kernel", ki.base_params(), t, 0, 0)
    for impl, rate in rates.items():
        secs = 2 * COPY_BYTES / rate
        t = tm.Timing(secs, secs, secs, "launch" if impl.endswith("launch") else "graph", 1)
        params = ki.base_params(impl=impl, nbytes=COPY_BYTES)
        r.write("device_copy", params, t, 2 * COPY_BYTES, 0)


def _op_module(name: str | None):
    """The op module a step takes (None for a fixed one, or, with a note, a missing one)."""
    if name is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError as e:
        print(f"  skipping {name}: {e}")
        return None


def _print_summary(path: Path, as_json: bool) -> None:
    summary = summarise(read_rows(path))
    if as_json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)


def main(argv: list[str] | None = None) -> int:
    """Run the command (the module docstring); returns its exit status."""
    try:
        opts = parse_args(argv)
    except ValueError as e:
        print(f"kernel_sweep: {e}", file=sys.stderr)
        return 2
    if opts.summary_only:
        _print_summary(opts.out / OUT_NAME, opts.json)
        return 0
    if not torch.cuda.is_available():
        print("ssvkit.calibration.kernel_sweep needs a CUDA GPU", file=sys.stderr)
        return 1
    ki.use_geometry(opts.geometry)
    r = new_runner(opts)
    print(
        f"{r.prov['device_name']}  torch {r.prov['torch_version']}  triton "
        f"{r.prov['triton_version']}  commit {r.prov['git_commit']}  -> {r.path}"
    )
    mods = {op: _op_module(STEPS[op][2]) for op in opts.ops}
    todo = [op for op in opts.ops if STEPS[op][2] is None or mods[op] is not None]
    try:
        for op in todo:
            STEPS[op][0](mods[op])
            print(f"correctness: {op} ok")
    except checks.CorrectnessError as e:
        print(f"\nCORRECTNESS FAILURE, nothing timed: {e}", file=sys.stderr)
        return 2
    torch.cuda.synchronize()
    write_ceilings(r)
    for op in todo:
        STEPS[op][1](r, opts.sweep, opts.seed, mods[op])
        if r.stopped:
            break
    print(
        f"\n{r.num_written} rows written in {r.elapsed_s():.0f} s"
        + (" (stopped at the budget; rerun to resume)" if r.stopped else "")
    )
    _print_summary(r.path, opts.json)
    return STOPPED_AT_BUDGET if r.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
