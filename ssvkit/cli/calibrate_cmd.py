"""``ssvkit calibrate``: GPU sweeps (resumable), then the derived ceilings and fitted profile.

ssvkit calibrate --gpu h100-sxm                 # on the GPU: sweeps + fit (runs <= budget)
ssvkit calibrate --gpu h100-sxm --fit-only      # anywhere: re-derive from committed rows
"""

from __future__ import annotations

from ssvkit.calibration.fit import fit_folder
from ssvkit.cli.options import finite
from ssvkit.perfmodel.hardware import get_gpu

HELP = "run the calibration sweeps on a GPU and fit the profile (or --fit-only from rows)"


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


def run(args) -> int:
    get_gpu(args.gpu, measured=False)  # validates the name
    if args.fit_only and (args.budget_s is not None or args.sweeps is not None):
        raise ValueError("--fit-only runs no sweep: drop --budget-s and --sweeps")
    budget_s = 540.0 if args.budget_s is None else args.budget_s
    if budget_s <= 0:
        raise ValueError(f"--budget-s must be > 0, got {budget_s}")
    sweeps = [s.strip() for s in (args.sweeps or "ops,kernels").split(",")]
    if not sweeps or not set(sweeps) <= {"ops", "kernels"}:
        raise ValueError(f"--sweeps {args.sweeps!r}: choose from ops, kernels")
    if not args.fit_only:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("the calibration sweeps need a CUDA GPU (use --fit-only to refit)")
        from ssvkit.calibration import ceilings, kernel_sweep
        from ssvkit.validation import engine_op_sweep

        out = ceilings.PROFILES / args.gpu
        if "ops" in sweeps:
            engine_op_sweep.main(["--out", str(out), "--budget-s", str(budget_s / 2)])
        if "kernels" in sweeps:
            kernel_sweep.main(["--out", str(out), "--budget-s", str(budget_s / 2)])
    profile = fit_folder(args.gpu)
    print(
        f"profile {profile['profile_id']}: {len(profile['classes'])} op classes from "
        f"{profile['rows']['graph']} graph rows"
    )
    return 0
