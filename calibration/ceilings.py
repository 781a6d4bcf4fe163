"""Measured ceilings of a GPU, derived from its committed measurement rows, as the overlay that
``perfmodel.hardware.get_gpu`` applies over the datasheet.

    # rewrites profiles/h100-sxm/ceilings.json
    python -m ssvkit.calibration.ceilings --gpu h100-sxm

Every row carries the ceilings measured in its own run (``copy_bytes_per_s``,
``gemm_flops_per_s``, ``launch_s``). The overlay takes, over all runs, the best copy rate (read +
write bytes) as the memory ceiling, the best bf16 GEMM rate as the tensor ceiling, and the median
empty-kernel time under CUDA-graph replay as the per-launch overhead. The file is derived, never
edited: ``tests/calibration`` regenerates it from the rows and compares.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.rows import load_rows

PROFILES = Path(__file__).resolve().parent / "profiles"
# What torch.cuda.get_device_name() reports for each registry GPU we have measured.
DEVICE_NAMES = {
    "h100-sxm": ("NVIDIA H100 80GB HBM3",),
    "h200": ("NVIDIA H200",),
}


def profile_rows(gpu: str, folder: Path | None = None) -> list[dict]:
    """All sealed rows of ``profiles/<gpu>/*.jsonl``; refuses rows from another device."""
    folder = folder or PROFILES / gpu
    if gpu not in DEVICE_NAMES:
        raise ValueError(f"no measured device name is known for GPU {gpu!r}")
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for r in load_rows(path):
            if r["device_name"] not in DEVICE_NAMES[gpu]:
                raise ValueError(
                    f"{path}: a row measured on {r['device_name']!r} is filed under {gpu!r}"
                )
            rows.append(r)
    if not rows:
        raise ValueError(f"no measurement rows under {folder}")
    return rows


# A profile folder's rows of the current kernels that its profile of record does not fit yet
# (validation/data/INDEX.md says why for each GPU that has them).
UNFITTED = "unfitted"
# Ops whose rows measure the ceilings, not a kernel family.
CEILING_OPS = ("device_copy", "empty_triton_kernel")


def has_unfitted(gpu: str) -> bool:
    """Whether ``gpu``'s profile folder holds rows its profile of record does not fit."""
    return any((PROFILES / gpu / UNFITTED).glob("*.jsonl"))


def current_kernel_rows(gpu: str) -> list[dict]:
    """``gpu``'s rows of the current kernels: its profile's rows, with the rows of each kernel
    op its ``unfitted/`` folder holds in place of the profile's rows of that op, and that
    folder's ceiling rows added to the profile's (each run measures its own ceilings). The
    profile's rows when the folder has none."""
    rows = profile_rows(gpu)
    if not has_unfitted(gpu):
        return rows
    newer = profile_rows(gpu, PROFILES / gpu / UNFITTED)
    ops = {r["op"] for r in newer} - set(CEILING_OPS)
    return [r for r in rows if r["op"] not in ops] + newer


def derive(gpu: str, rows: list[dict]) -> dict:
    """The overlay dict for ``GpuSpec.with_measured``."""
    launch = [
        r["median_s"] for r in rows if r["op"] == "empty_triton_kernel" and r["timing"] == "graph"
    ]
    launch = launch or [r["launch_s"] for r in rows if r["timing"] == "graph"]
    commits = sorted({r["git_commit"] for r in rows})
    latest = max(r["timestamp"] for r in rows)
    return {
        "gpu": gpu,
        "profile_id": f"{gpu}-ceilings-{latest[:10]}-{len(rows)}rows",
        "device_name": rows[0]["device_name"],
        "ceilings": {
            "hbm_bytes_per_s": max(r["copy_bytes_per_s"] for r in rows),
            "bf16_flops_per_s": max(r["gemm_flops_per_s"] for r in rows),
            "launch_overhead_s": statistics.median(launch),
        },
        "derived_from": {"rows": len(rows), "commits": commits, "latest": latest},
    }


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100-sxm")
    args = ap.parse_args(argv)
    overlay = derive(args.gpu, profile_rows(args.gpu))
    path = PROFILES / args.gpu / "ceilings.json"
    path.write_text(json.dumps(overlay, indent=2, sort_keys=True) + "\n")
    c = overlay["ceilings"]
    print(
        f"{path}: copy {c['hbm_bytes_per_s'] / 1e12:.2f} TB/s, bf16 "
        f"{c['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s, launch {c['launch_overhead_s'] * 1e6:.2f} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
