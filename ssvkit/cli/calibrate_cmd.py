"""``ssvkit calibrate``: GPU sweeps (resumable, shardable), then the derived ceilings and fitted
profile.

ssvkit calibrate --gpu h200                     # one GPU: sweeps + fit (runs <= budget)
ssvkit calibrate --gpu h200 --plan --shards 4   # anywhere: each shard's configs and minutes
ssvkit calibrate --gpu h200 --shard 2/4 --out OUT/s2 --budget-s 450   # on GPU 2 of 4
ssvkit calibrate --gpu h200 --merge OUT/s0 OUT/s1 OUT/s2 OUT/s3       # shard rows -> profile
ssvkit calibrate --gpu h200 --fit-only          # anywhere: re-derive from committed rows

The sweeps are the op sweep (``validation.engine_op_sweep``) and the kernel sweep's calibration
design (``calibration.kernel_design``), CUDA-graph timings only (the fit reads no other), rows
into ``calibration/profiles/<gpu>/`` or, with ``--out``, into that folder, skipping the rows the
profile folder already has. The op sweep runs first, the kernel sweep in the budget left.
"""

from __future__ import annotations

import time
from pathlib import Path

from ssvkit.calibration.fit import fit_folder
from ssvkit.cli.options import finite
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.rows import check_redo

HELP = "run the calibration sweeps on a GPU and fit the profile (or --fit-only from rows)"
DEFAULT_BUDGET_S = 540.0
KERNEL_ROWS, OP_ROWS = "kernel_bench.jsonl", "op_sweep.jsonl"


def add_arguments(p) -> None:
    p.add_argument("--gpu", default="h100-sxm", help="registry GPU the rows belong to")
    p.add_argument(
        "--fit-only",
        action="store_true",
        help="skip the sweeps: derive ceilings.json and profile.json from the rows",
    )
    p.add_argument(
        "--budget-s",
        type=finite,
        help="wall-clock budget of the sweeps in this run, resumed by a rerun (default: 540)",
    )
    p.add_argument("--sweeps", help="ops (GEMM, element-wise), kernels (default: both)")
    p.add_argument("--shard", metavar="K/N", help="run shard K of N of the sweeps (GPU K of N)")
    p.add_argument("--out", help="folder of this run's rows (default: the profile folder)")
    p.add_argument(
        "--plan",
        action="store_true",
        help="print every shard's configs and estimated minutes, without a GPU",
    )
    p.add_argument("--shards", type=int, help="with --plan: the number of shards (default 1)")
    p.add_argument(
        "--compile-jobs",
        type=int,
        help="host processes that compile the kernel sweep's kernels before it times them "
        "(calibration.kernel_warm; default 1: each compiles at its first call)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="merge these shard folders' rows into the profile folder (no sweep, no fit)",
    )
    p.add_argument(
        "--redo",
        default="",
        help="comma-separated kernel rows to measure again although the profile folder has "
        "them (after their kernels changed; merge them with --replace): an op (nsa_verify) or "
        "an op and params its rows have (nsa_verify:mode=refresh:impl=fused)",
    )
    p.add_argument(
        "--replace",
        default="",
        help="with --merge: comma-separated row ops whose merged rows replace committed ones",
    )
    p.add_argument(
        "--retire",
        default="",
        help="with --merge: comma-separated row ops measured again in full: their committed "
        "rows of the timings merged that no merged row replaces are dropped (configs the "
        "sweep no longer makes)",
    )


def _check(args) -> list[str]:
    """The chosen sweeps; ``ValueError`` for options that do not go together."""
    sweeps = [s.strip() for s in (args.sweeps or "ops,kernels").split(",")]
    if not sweeps or not set(sweeps) <= {"ops", "kernels"}:
        raise ValueError(f"--sweeps {args.sweeps!r}: choose from ops, kernels")
    modes = [f for f in ("fit_only", "plan", "merge") if getattr(args, f)]
    if len(modes) > 1:
        raise ValueError(f"--{modes[0].replace('_', '-')} and --{modes[1]} exclude each other")
    if args.fit_only and (args.budget_s is not None or args.sweeps is not None):
        raise ValueError("--fit-only runs no sweep: drop --budget-s and --sweeps")
    if args.merge and (args.shard or args.out or args.budget_s is not None or args.sweeps):
        raise ValueError("--merge runs no sweep: drop --shard, --out, --budget-s and --sweeps")
    for name in ("replace", "retire"):
        if getattr(args, name) and not args.merge:
            raise ValueError(f"--{name} applies to --merge")
    if args.redo and (args.merge or args.fit_only):
        raise ValueError("--redo applies to the sweeps (merge their rows with --replace)")
    check_redo(x for x in args.redo.split(",") if x)
    if args.shards is not None and not args.plan:
        raise ValueError("--shards applies to --plan (a sweep takes --shard K/N)")
    if args.shards is not None and args.shards < 1:
        raise ValueError(f"--shards must be >= 1, got {args.shards}")
    if args.shard and not (args.out or args.plan):
        raise ValueError("--shard K/N writes its own rows: give --out DIR (one per shard)")
    if args.budget_s is not None and args.budget_s <= 0:
        raise ValueError(f"--budget-s must be > 0, got {args.budget_s}")
    if args.compile_jobs is not None and args.compile_jobs < 1:
        raise ValueError(f"--compile-jobs must be >= 1, got {args.compile_jobs}")
    if args.compile_jobs is not None and (modes or "kernels" not in sweeps):
        raise ValueError(
            "--compile-jobs applies to the kernel sweep (not --fit-only, --plan, --merge)"
        )
    return sweeps


def run(args) -> int:
    from ssvkit.calibration import ceilings

    get_gpu(args.gpu, measured=False)  # validates the name
    sweeps = _check(args)
    profile_dir = ceilings.PROFILES / args.gpu
    if args.merge:
        return _merge(args, profile_dir)
    if args.plan:
        return _plan(args, profile_dir, sweeps)
    if not args.fit_only:
        code = _sweeps(args, profile_dir, sweeps)
        if code == 2 or args.shard or args.out:
            if code in (0, 3):
                print("rows written; merge the shards (--merge) and fit (--fit-only)")
            return code
    else:
        code = 0
    profile = fit_folder(args.gpu)
    print(
        f"profile {profile['profile_id']}: {len(profile['classes'])} op classes from "
        f"{profile['rows']['graph']} graph rows"
    )
    return code


def _kernel_argv(args, out: Path, profile_dir: Path, budget_s: float) -> list[str]:
    argv = ["--out", str(out), "--grid", "calibration", "--gpu", args.gpu, "--timings", "graph"]
    argv += ["--budget-s", str(budget_s)]
    if out.resolve() != profile_dir.resolve():
        argv += ["--done-from", str(profile_dir / KERNEL_ROWS)]
    elif args.redo:
        raise ValueError("--redo writes new rows beside the committed ones: give --out DIR")
    argv += ["--redo", args.redo] if args.redo else []
    argv += ["--compile-jobs", str(args.compile_jobs)] if args.compile_jobs else []
    return argv + (["--shard", args.shard] if args.shard else [])


def _op_argv(args, out: Path, profile_dir: Path, budget_s: float) -> list[str]:
    argv = ["--out", str(out), "--budget-s", str(budget_s)]
    if out.resolve() != profile_dir.resolve():
        argv += ["--done-from", str(profile_dir / OP_ROWS)]
    return argv + (["--shard", args.shard] if args.shard else [])


def _sweeps(args, profile_dir: Path, sweeps: list[str]) -> int:
    """The op sweep, then the kernel sweep in the budget left; the worst exit status (2 before
    3 before 0)."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("the calibration sweeps need a CUDA GPU (use --fit-only to refit)")
    from ssvkit.calibration import kernel_sweep
    from ssvkit.validation import engine_op_sweep

    out = Path(args.out) if args.out else profile_dir
    budget_s = DEFAULT_BUDGET_S if args.budget_s is None else args.budget_s
    start = time.monotonic()
    codes = []
    if "ops" in sweeps:
        codes.append(engine_op_sweep.main(_op_argv(args, out, profile_dir, budget_s)))
    if "kernels" in sweeps:
        left = budget_s - (time.monotonic() - start)
        if left > 0:
            codes.append(kernel_sweep.main(_kernel_argv(args, out, profile_dir, left)))
        else:
            codes.append(3)
    return 2 if 2 in codes else 3 if any(codes) else 0


def _plan(args, profile_dir: Path, sweeps: list[str]) -> int:
    """Both sweeps' split into shards and estimated minutes, against the profile folder's rows
    (the split every ``--shard K/N`` run computes)."""
    from ssvkit.calibration import kernel_sweep, sweep
    from ssvkit.calibration.runner import done_keys

    shard = args.shard or f"0/{args.shards or 1}"
    count = int(shard.partition("/")[2]) if shard.partition("/")[2].isdigit() else 0
    if "ops" in sweeps:
        print(sweep.plan_text(max(count, 1), done_keys([profile_dir / OP_ROWS])))
    if "kernels" in sweeps:
        out = Path(args.out or "shard-rows")
        argv = ["--out", str(out), "--grid", "calibration", "--gpu", args.gpu, "--timings"]
        argv += ["graph", "--done-from", str(profile_dir / KERNEL_ROWS), "--shard", shard]
        argv += ["--redo", args.redo] if args.redo else []
        return kernel_sweep.main([*argv, "--plan"])
    return 0


def _merge(args, profile_dir: Path) -> int:
    from ssvkit.calibration.merge_rows import merge

    replace, retire = (
        tuple(o.strip() for o in v.split(",") if o.strip()) for v in (args.replace, args.retire)
    )
    report = merge(args.gpu, [Path(d) for d in args.merge], profile_dir, replace, retire)
    for name, c in report.items():
        cut = f", {c['cut']} cut-short lines left out" if c["cut"] else ""
        retired = f", {c['retired']} retired" if c["retired"] else ""
        print(
            f"{profile_dir / name}: {c['added']} rows added, {c['replaced']} replaced, "
            f"{c['skipped']} already there{retired}{cut}"
        )
    print(f"next: ssvkit calibrate --gpu {args.gpu} --fit-only")
    return 0
