"""The kernel sweep: correctness first, then the timed sweep, one sealed row per config.

    python -m ssvkit.calibration.kernel_sweep --out calibration/profiles/h100-sxm [--quick] \\
        [--ops dense,sparse,repair,nsa,select,nsa_tiles] [--budget-s 540] [--json] \\
        [--geometry tiny]
    # the calibration design, shard 2 of 4 (one process per GPU), graph timings only, its
    # kernels compiled first by 8 host processes:
    python -m ssvkit.calibration.kernel_sweep --grid calibration --gpu h200 --shard 2/4 \\
        --out OUT/s2 --done-from calibration/profiles/h200/kernel_bench.jsonl --timings graph \\
        --compile-jobs 8
    # the test design (calls no calibration row times), for ``ssvkit validate --sets unseen``:
    python -m ssvkit.calibration.kernel_sweep --grid unseen --gpu h200 \\
        --out calibration/profiles/h200/unseen --timings graph
    # the same without a GPU: every shard's configs and estimated minutes
    python -m ssvkit.calibration.kernel_sweep --grid calibration --gpu h200 --shard 0/4 --plan ...

The rows go to ``OUT/kernel_bench.jsonl``, resumable; ``main`` lists the steps. Exit status: 0
when every config is in the file, 1 without a GPU, 2 on a correctness failure or a bad option,
``STOPPED_AT_BUDGET`` (3) when the budget left configs out (run it again).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path

import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops as ops
from ssvkit.calibration.kernel_grid import (
    FULL_SWEEP,
    QUICK_SWEEP,
    TINY_SWEEP,
    KernelConfig,
    Sweep,
)
from ssvkit.calibration.kernel_plan import (
    ShardPlan,
    measured_text,
    plan_shards,
    plan_text,
)
from ssvkit.calibration.kernel_summary import print_summary, summarise
from ssvkit.calibration.kernel_sweep_options import OUT_NAME, SweepOptions, parse_args
from ssvkit.calibration.kernel_warm import WarmRunner, precompile, warm_configs
from ssvkit.calibration.runner import (
    COPY_BYTES,
    STOPPED_AT_BUDGET,
    Runner,
    done_keys,
    read_rows,
)
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.rows import row_key

__all__ = ["FULL_SWEEP", "QUICK_SWEEP", "TINY_SWEEP", "Sweep", "main"]

SHOW = ("context_len", "num_query_tokens", "batch", "mode", "group_size", "overlap", "top_n")
SHOW += ("missed_fraction", "impl", "method", "rows_per_tile", "num_q_heads", "num_kv_heads")
SHOW += ("head_dim",)
# op -> (its correctness check, the op module the check and the timing take; None for a fixed
# one).
STEPS_RUN: dict[str, tuple] = {
    "dense": (lambda mod: checks.check_dense(), None),
    "sparse": (checks.check_sparse, "ssvkit.kernels.sparse_verify"),
    "repair": (lambda mod: checks.check_repair(), None),
    "nsa": (checks.check_nsa, "ssvkit.kernels.nsa_verify"),
    "select": (checks.check_select, "ssvkit.kernels.select_blocks"),
    "nsa_tiles": (checks.check_nsa_tiles, "ssvkit.kernels.nsa_verify"),
}


def new_runner(opts: SweepOptions) -> Runner:
    """The runner of the kernel rows: the chosen timings, integer work counts (a worker's of
    ``--warm``: its share of the configs, called once and not timed)."""
    kind, share = (Runner, {}) if opts.warm is None else (WarmRunner, {"shard": opts.warm})
    return kind(
        opts.out / OUT_NAME,
        opts.budget_s,
        config=tm.QUICK_TIMING if opts.quick else tm.DEFAULT_TIMING,
        timings=opts.timings,
        work_type=int,
        show=SHOW,
        done_from=opts.done_from,
        redo_ops=opts.redo,
        **share,
    )


def pending_against(done: set[str], timings: tuple[str, ...]):
    """``pending(cfg)``: the variants of a config with a timing whose row is not in ``done``."""

    def pending(cfg: KernelConfig):
        return [
            v for v in cfg.variants if any(row_key(v.op, t, v.params) not in done for t in timings)
        ]

    return pending


def shard_plan(opts: SweepOptions) -> tuple[list[KernelConfig], ShardPlan | None, object]:
    """The configs this run times (its shard's, in its order), the split, and ``pending``
    against the ``--done-from`` files, the split's basis (the same for every shard)."""
    pending = pending_against(done_keys(opts.done_from, opts.redo), opts.timings)
    configs = opts.configs()
    if opts.shard is None and not opts.plan:
        return configs, None, pending
    gpu = get_gpu(opts.gpu)
    todo = [c for c in configs if pending(c)]
    count = opts.shard.count if opts.shard is not None else 1
    plan = plan_shards(todo, count, gpu, opts.timings, opts.plan_costs(), pending)
    mine = list(plan.shards[opts.shard.index]) if opts.shard is not None else todo
    return mine, plan, pending


def write_ceilings(r: Runner) -> None:
    """Measure the run's ceilings and write them as rows: the empty Triton kernel per timing
    and each device-copy method (read + write bytes)."""
    rates = r.measure_ceilings()
    c = r.ceil
    empty = " / ".join(f"{c[t] * 1e6:.2f} us ({t})" for t in r.timings)
    print(
        f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"GEMM {c['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s, empty kernel {empty}"
    )
    print("  copy rates (TB/s): " + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in rates.items()))
    for timing in r.timings:
        t = tm.Timing(c[timing], c[timing], c[timing], timing, 1)
        r.write("empty_triton_kernel", ki.base_params(), t, 0, 0)
    for impl, rate in rates.items():
        secs = 2 * COPY_BYTES / rate
        timing = "launch" if impl.endswith("launch") else "graph"
        if timing in r.timings:  # the run's ceilings hold an empty kernel of its timings only
            params = ki.base_params(impl=impl, nbytes=COPY_BYTES)
            r.write(
                "device_copy", params, tm.Timing(secs, secs, secs, timing, 1), 2 * COPY_BYTES, 0
            )


def _stop_text(r: Runner, todo: list[KernelConfig]) -> str:
    """What a run stopped at the budget left: its configs with a row still pending, and how to
    resume them (the rows file is the resume state); empty for a run that finished."""
    if not r.stopped:
        return ""
    left = sum(1 for c in todo if any(r.pending(v.op, v.params) for v in c.variants))
    return (
        f" (stopped at the budget with {left} of {len(todo)} configs left: the same command "
        f"with the same --out resumes them)"
    )


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


class Checks:
    """Each step's correctness check, run before the step's first timed config, and the
    verification kernels' check at each other geometry before its first dense or sparse config
    (``CorrectnessError`` on a mismatch): a shard cut short by its budget skips the checks of
    steps it never reached, and nothing is timed that was not checked."""

    def __init__(self, mods: dict) -> None:
        self.mods = mods
        self.done: set[tuple[str, str]] = set()
        self.default = ki.current_geometry()

    def before(self, cfg: KernelConfig) -> None:
        """Run the checks ``cfg`` needs that have not run yet."""
        if ("step", cfg.step) not in self.done:
            STEPS_RUN[cfg.step][0](self.mods[cfg.step])
            print(f"correctness: {cfg.step} ok")
            self.done.add(("step", cfg.step))
        geometry = ("geometry", cfg.geometry)
        if cfg.step in ("dense", "sparse") and cfg.geometry != self.default:
            if geometry not in self.done:
                with ki.geometry(cfg.geometry):
                    checks.check_geometry(self.mods.get("sparse"))
                print(f"correctness: dense and sparse verification at {cfg.geometry} ok")
                self.done.add(geometry)


def main(argv: list[str] | None = None) -> int:
    """Run the command (the module docstring); returns its exit status.

    0. With ``--compile-jobs N``, N worker processes first call the pending configs' ops once
       each, untimed, so that their kernels compile side by side
       (:mod:`calibration.kernel_warm`); the run's budget counts their time.
    1. Checks each op against its fp32 reference (:mod:`calibration.kernel_checks`) before its
       first timed config, and the verification kernels at each other head geometry before
       their first config there; a mismatch or a NaN ends the run (exit status 2), with nothing
       of that op timed.
    2. Measures the ceilings of this run (:class:`calibration.runner.Runner`) and writes them as
       rows: device-to-device copy bandwidth (read + write bytes) and the empty Triton kernel.
    3. Times the configs (``calibration.kernel_grid``): the ``Sweep`` lines at one geometry
       (Llama-3.1-8B attention by default: 32 query heads, 8 KV heads, d = 128, bf16; with
       ``--geometry tiny`` the engine's trained tiny pair over ``TINY_SWEEP``), or with
       ``--grid calibration`` the calibration design across geometries
       (``calibration.kernel_design``). Each row goes to ``OUT/kernel_bench.jsonl``; a row
       already there or in a ``--done-from`` file is skipped. ``--shard K/N`` times shard K of
       the configs pending against the ``--done-from`` files, split by estimated time
       (``calibration.kernel_plan``); ``--plan`` prints the split.
    4. Prints a summary of every row in the file (:mod:`calibration.kernel_summary`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_args(argv)
        if opts.summary_only:
            _print_summary(opts.out / OUT_NAME, opts.json)
            return 0
        configs, plan, pending = shard_plan(opts)
    except ValueError as e:
        print(f"kernel_sweep: {e}", file=sys.stderr)
        return 2
    if opts.plan:
        print(plan_text(plan, pending, get_gpu(opts.gpu), opts.shard))
        rows = [r for p in (*opts.done_from, opts.out / OUT_NAME) for r in read_rows(Path(p))]
        measured = measured_text(rows, opts.plan_costs())
        print(measured or "no earlier run recorded its rows' wall and first-call seconds")
        return 0
    if not torch.cuda.is_available():
        print("ssvkit.calibration.kernel_sweep needs a CUDA GPU", file=sys.stderr)
        return 1
    if opts.compile_jobs > 1 and opts.warm is None:
        spent = precompile(argv, opts.out / OUT_NAME, opts.compile_jobs)
        opts = dataclasses.replace(opts, budget_s=max(opts.budget_s - spent, 1.0))
    r = new_runner(opts)
    print(
        f"{r.prov['device_name']}  torch {r.prov['torch_version']}  triton "
        f"{r.prov['triton_version']}  commit {r.prov['git_commit']}  -> {r.path}"
        + (f"  shard {opts.shard}: {len(configs)} configs" if opts.shard else "")
    )
    mods = {op: _op_module(STEPS_RUN[op][1]) for op in opts.ops}
    configs = [c for c in configs if STEPS_RUN[c.step][1] is None or mods[c.step] is not None]
    if opts.warm is not None:
        return warm_configs(r, configs, opts.seed, mods)
    gate = Checks(mods)
    write_ceilings(r)
    todo = [c for c in configs if any(r.pending(v.op, v.params) for v in c.variants)]
    for cfg in todo:
        if r.out_of_time():
            break
        try:
            gate.before(cfg)
        except checks.CorrectnessError as e:
            print(f"\nCORRECTNESS FAILURE, {cfg.step} not timed: {e}", file=sys.stderr)
            return 2
        ops.run_config(r, cfg, opts.seed, mods[cfg.step])
        if r.stopped:
            break
    print(f"\n{r.num_written} rows written in {r.elapsed_s():.0f} s" + _stop_text(r, todo))
    _print_summary(r.path, opts.json)
    return STOPPED_AT_BUDGET if r.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
