"""``ssvkit report``: the end-to-end validation report from the measurements of record only.

ssvkit report                          # writes docs/results/validation/REPORT.md and its PNGs
ssvkit report --out DIR --json         # elsewhere; the report as JSON on stdout
ssvkit report --check                  # exit 1 when a target is missed

``validation.report`` says what each section compares and which data file it reads.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from ssvkit.calibration.error_table import ape_text_lines
from ssvkit.perfmodel.files import check_folder, write_files

HELP = "end-to-end validation report (measured vs predicted) from committed data"


def add_arguments(p) -> None:
    p.add_argument("--gpu", default="h100-sxm", help="registry GPU of the kernel profile")
    p.add_argument(
        "--campaign", default=None, help="campaign JSON (default validation/data/campaign.json)"
    )
    p.add_argument(
        "--planner",
        default=None,
        help="planner evaluation (default validation/data/planner.json)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for REPORT.md and PNGs (default docs/results/validation)",
    )
    p.add_argument("--no-files", action="store_true", help="write nothing, print only")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a target is missed (verify-step median APE <= 8%%, tokens/s <= 10%%, "
        "speedup ratio <= 8%%)",
    )


def _error_summary(rep: dict) -> str:
    e = rep["e2e"]
    rows = [
        (name, e[key])
        for name, key in (
            ("verify step", "verify"),
            ("round time", "round"),
            ("tokens/s", "tokens_per_s"),
            ("speedup vs ar_dense", "speedup"),
            ("simulator vs measured", "simulator"),
        )
        if e.get(key) and e[key].get("n")
    ]
    lines = ape_text_lines("figure", rows, name_width=24, n_width=4, percent_widths=(8, 7, 7))
    for name, t in rep["targets"].items():
        lines.append(
            f"{name:28s} {100 * t['value']:6.1f}%  (<= {100 * t['threshold']:.0f}%)  "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


def run(args) -> int:
    from ssvkit.validation.report import build
    from ssvkit.validation.report_markdown import REPORT_DIR, markdown, plots

    if args.no_files and args.out:
        raise ValueError("--no-files writes nothing, but --out names a folder: drop one of them")
    # The checkout these packages are part of (a clone or an editable install).
    root = Path(str(files("ssvkit.validation"))).parent
    out = Path(args.out) if args.out else root / REPORT_DIR
    if not args.no_files and args.out is None and not out.is_dir():
        raise ValueError(
            f"the report goes to {REPORT_DIR} of a clone of the repository by default: run "
            "from a clone, or give --out DIR or --no-files"
        )
    if not args.no_files:
        check_folder(out, "--out")
    rep = build(args.gpu, args.campaign, args.planner)
    if not args.no_files:
        try:
            prefix = "../" * len(out.resolve().relative_to(root.resolve()).parts)
        except ValueError:
            prefix = str(root) + "/"
        files_out = [(out / name, data, "--out") for name, data in plots(rep).items()]
        write_files(files_out + [(out / "REPORT.md", markdown(rep, prefix), "--out")])
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(_error_summary(rep))
    if args.check and not all(t["met"] for t in rep["targets"].values()):
        return 1
    return 0
