"""``ssvkit report``: the end-to-end validation report from the measurements of record only,
or the report over a scale campaign.

ssvkit report                          # writes docs/results/validation/REPORT.md and its PNGs
ssvkit report --out DIR --json         # elsewhere; the report as JSON on stdout
ssvkit report --check                  # exit 1 when a target is missed
ssvkit report --campaign scale.json --plot tps.png   # a scale campaign: printed, one plot

``validation.report`` says what each section compares and which data file it reads;
``validation.scale_report`` does for a scale campaign (recognised by its ``benchmark`` field).
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from ssvkit.calibration.error_table import ape_text_lines
from ssvkit.cli.predict_cmd import PLOT_SUFFIXES
from ssvkit.perfmodel.files import atomic_write, check_folder, check_output, read_json, write_files

HELP = "end-to-end validation report (measured vs predicted) from committed data"


def add_arguments(p) -> None:
    p.add_argument(
        "--gpu",
        default=None,
        help="registry GPU of the kernel profile (default h100-sxm; not for a scale campaign)",
    )
    p.add_argument(
        "--campaign",
        default=None,
        help="campaign JSON: the end-to-end one (default validation/data/campaign.json) or a "
        "scale campaign (validation.scale_campaign)",
    )
    p.add_argument(
        "--planner",
        default=None,
        help="planner evaluation (default validation/data/planner.json; not for a scale campaign)",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="a scale campaign's measured against predicted tokens/s (.png, .pdf or .svg)",
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
        "speedup ratio <= 8%%; a scale campaign: each median <= 8%%, p90 <= 15%%)",
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


def _run_scale(args, doc: dict) -> int:
    """The report over a scale campaign: printed (or as JSON), its plot when asked for."""
    from ssvkit.validation.e2e_campaign import NAMES
    from ssvkit.validation.scale_report import build_scale, plot_points
    from ssvkit.validation.scale_report_text import text
    from ssvkit.validation.scatter import scatter

    for given, option in ((args.gpu, "--gpu"), (args.planner, "--planner"), (args.out, "--out")):
        if given is not None:
            raise ValueError(
                f"{option} is for the end-to-end report; a scale campaign's report is printed "
                "(--json) and plotted (--plot FILE)"
            )
    plot = check_output(args.plot, "--plot", PLOT_SUFFIXES) if args.plot else None
    rep = build_scale(doc, args.campaign)
    if plot is not None:
        points = plot_points(rep)
        if not points:
            raise ValueError(f"--plot: no cell of {args.campaign!r} has a prediction to draw")
        data = scatter(
            "tokens/s",
            points,
            NAMES,
            fmt=plot.suffix.lower().removeprefix("."),
            log=True,
            note=rep["intervals"]["note"],
        )
        atomic_write(plot, data, "--plot")
    print(json.dumps(rep, indent=1) if args.json else text(rep))
    if args.check and not all(t["met"] for t in rep["targets"].values()):
        return 1
    return 0


def run(args) -> int:
    from ssvkit.validation.report import build
    from ssvkit.validation.report_markdown import REPORT_DIR, markdown, plots
    from ssvkit.validation.scale_report import is_scale_campaign

    if args.campaign is not None:
        doc = read_json(args.campaign, "campaign")
        if is_scale_campaign(doc):
            return _run_scale(args, doc)
        if "benchmark" in doc:
            raise ValueError(
                f"campaign {args.campaign!r} is a {doc['benchmark']!r} document: the report "
                "reads the end-to-end campaign or a scale campaign"
            )
    if args.plot is not None:
        raise ValueError(
            "--plot draws a scale campaign's report; the end-to-end report writes its PNGs to --out"
        )
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
    rep = build(args.gpu or "h100-sxm", args.campaign, args.planner)
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
