"""``ssvkit validate``: measured-vs-predicted error of the committed profile, from data only.

ssvkit validate                       # tables, held-out and fit rows apart, then the transfer sets
ssvkit validate --sets interp,head    # the interpolation split and leave-one-head-geometry-out
ssvkit validate --json --plot out/    # machine-readable; PNGs
ssvkit validate --check               # exit 1 when an interpolation target is missed
ssvkit validate --check-transfer      # exit 1 when a transfer target is missed
ssvkit validate --model physical      # the same sets for the physical attention model
"""

from __future__ import annotations

import io
import json

from ssvkit.calibration.error_table import ape_text_lines
from ssvkit.perfmodel.files import check_folder, write_files

HELP = "measured-vs-predicted error of the calibrated profile (per op, ratios, worst rows)"


def add_arguments(p) -> None:
    p.add_argument("--gpu", default="h100-sxm", help="registry GPU whose profile to check")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="DIR", help="write predicted-vs-measured and error PNGs")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the README's summary table (the README embeds this output)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a held-out target is missed (median APE <= 5%%, p90 <= 10%%, "
        "ratio median <= 5%%)",
    )
    p.add_argument(
        "--sets",
        help="comma-separated test sets: interp (the held-out split), head, group, context "
        "(leave one head geometry, group size, context length out), gpu (cross-GPU), unseen "
        "(the test design's calls, where the GPU has them), or all (default: all; with "
        "--markdown: interp, the README's table)",
    )
    p.add_argument(
        "--check-transfer",
        action="store_true",
        help="exit 1 when a chosen transfer set misses its target for some op class "
        "(leave-one-out: median APE <= 6%%, p90 <= 15%%; cross-GPU: median <= 8%%, p90 <= 15%%)",
    )

    p.add_argument(
        "--model",
        choices=MODELS,
        default="classes",
        help="classes: the committed profile's per-class fits; physical: the dense and sparse "
        "verification families priced from their launch plans by GPU-level constants, "
        "refitted per set (perfmodel.physical)",
    )


MODELS = ("classes", "physical")


def _ape_lines(rows) -> list[str]:
    return ape_text_lines("", rows, name_width=30, n_width=5, percent_widths=(7, 7, 7))


def _error_report(rep: dict, pid: str) -> str:
    lines = [f"profile {pid}: absolute percentage error of predicted vs measured time", ""]
    for split in ("heldout", "fit"):
        rows = [(cls, d[split]) for cls, d in rep["classes"].items()]
        lines += [f"{split} rows", *_ape_lines([*rows, ("ALL", rep["overall"][split])]), ""]
    for split in ("heldout", "fit"):
        rows = [(kind, d[split]) for kind, d in rep["ratios"].items()]
        lines += [f"ratio error, {split}", *_ape_lines(rows), ""]
    lines.append("worst held-out rows")
    for w in rep["worst"]["heldout"]:
        short = {
            k: v
            for k, v in w["params"].items()
            if k
            in (
                "context_len",
                "num_query_tokens",
                "batch",
                "group_size",
                "overlap",
                "top_n",
                "m",
                "n",
                "k",
                "d",
                "f",
                "vocab",
                "missed_blocks",
            )
        }
        lines.append(
            f"  {w['class']:28s} {100 * w['ape']:6.1f}%  measured "
            f"{w['measured_s'] * 1e6:9.2f} us  predicted {w['predicted_s'] * 1e6:9.2f} us"
            f"  {json.dumps(short)}"
        )
    lines.append("")
    for k, t in rep["targets"].items():
        lines.append(
            f"target {k}: {100 * t['value']:.1f}% (<= {100 * t['threshold']:.0f}%) "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


def _transfer_report(transfer: dict) -> str:
    from ssvkit.calibration.transfer_markdown import target_text
    from ssvkit.calibration.transfer_sets import worst_left_out
    from ssvkit.calibration.unseen_set import coverage_text

    lines = []
    for key, s in transfer.items():
        met = sum(c["met"] for c in s["classes"].values())
        lines += [
            f"{key}: {s['title']}",
            f"target {target_text(s['target'])}: {met} of {len(s['classes'])} classes met",
            "per op family",
            *_ape_lines(list(s["families"].items())),
        ]
        table = _ape_lines(list(s["classes"].items()))
        lines.append(table[0] + "  target   predicted by")
        for line, (cls, st) in zip(table[1:], s["classes"].items(), strict=True):
            by = ", ".join(k for k in st["from"] if k != cls)
            lines.append(f"{line}  {'met' if st['met'] else 'MISSED':8s} {by}".rstrip())
            worst = worst_left_out(st) if not st["met"] else None
            if worst is not None:
                v, w = worst
                lines.append(
                    f"    worst left out: {v}, {w['beyond_p90_target']} of {w['n']} rows beyond "
                    f"the p90 target: median {100 * w['median_ape']:.1f}%, p90 "
                    f"{100 * w['p90_ape']:.1f}%, median error {100 * w['median_error']:+.1f}%"
                )
        for cls, n in s["unpredicted"].items():
            lines.append(f"  no fit predicts {cls} ({n} rows)")
        for cls, n in s.get("other_kernels", {}).items():
            lines.append(f"  not compared: {cls} ({n} rows) time other kernels than the fit's")
        if s.get("geometries"):
            lines.append("per head geometry")
            lines += _ape_lines(list(s["geometries"].items()))
        if s.get("coverage"):
            lines.append(f"  prediction intervals: {coverage_text(s['coverage'])}")
        lines.append("")
    return "\n".join(lines)


def _plots(annotated: list[dict], rep: dict) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for split, marker in (("fit", "."), ("heldout", "x")):
        sub = [r for r in annotated if r["split"] == split]
        ax.loglog(
            [r["median_s"] * 1e6 for r in sub],
            [r["predicted_s"] * 1e6 for r in sub],
            marker,
            label=f"{split} ({len(sub)})",
            alpha=0.6,
        )
    lo = min(r["median_s"] for r in annotated) * 1e6 / 2
    hi = max(r["median_s"] for r in annotated) * 1e6 * 2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.set_xlabel("measured (us)")
    ax.set_ylabel("predicted (us)")
    ax.legend()
    ax.set_title("calibrated profile: predicted vs measured")
    out["predicted_vs_measured.png"] = fig
    classes = list(rep["classes"])
    fig2, ax2 = plt.subplots(figsize=(8, max(5.0, 0.9 + 0.17 * len(classes))))
    for i, split in enumerate(("fit", "heldout")):
        vals = [100 * rep["classes"][c][split].get("median_ape", float("nan")) for c in classes]
        ax2.barh([j + 0.4 * i for j in range(len(classes))], vals, height=0.4, label=split)
    ax2.set_yticks([j + 0.2 for j in range(len(classes))], classes, fontsize=7)
    ax2.set_ylim(-0.5, len(classes))
    ax2.set_xlabel("median APE (%); no bar: no rows of that split")
    ax2.set_title("calibrated profile: median error per op class")
    ax2.legend()
    fig2.tight_layout()
    out["error_by_op.png"] = fig2
    data = {}
    for name, f in out.items():
        buf = io.BytesIO()
        f.savefig(buf, format="png", dpi=110)
        plt.close(f)
        data[name] = buf.getvalue()
    return data


def run(args) -> int:
    from ssvkit.calibration.transfer_markdown import transfer_markdown as transfer_md
    from ssvkit.calibration.transfer_sets import TARGETS, parse_sets, transfer_report
    from ssvkit.calibration.validate import committed_report, summary_markdown

    sets = parse_sets(args.sets or ("interp" if args.markdown else "all"))
    if args.model == "physical":
        return _run_physical(args, sets)
    folder = check_folder(args.plot, "--plot") if args.plot else None
    profile, annotated, rep = committed_report(args.gpu)
    transfer = transfer_report(args.gpu, sets) if set(sets) - {"interp"} else {}
    if folder is not None:
        write_files(
            (folder / name, data, "--plot") for name, data in _plots(annotated, rep).items()
        )
    interp = "interp" in sets
    if args.markdown:
        parts = [summary_markdown(rep, profile.profile_id) + "\n"] if interp else []
        print("\n".join([*parts, transfer_md(transfer)]).rstrip("\n"))
    elif args.json:
        doc = {k: v for k, v in rep.items() if k != "pairs"}
        print(json.dumps({**doc, "transfer_targets": TARGETS, "transfer": transfer}, indent=1))
    else:
        if interp:
            print(_error_report(rep, profile.profile_id) + ("\n" if transfer else ""))
        print(_transfer_report(transfer), end="")
    if args.check and not all(t["met"] for t in rep["targets"].values()):
        return 1
    if args.check_transfer and not all(s["met"] for s in transfer.values()):
        return 1
    return 0


def _run_physical(args, sets) -> int:
    """``--model physical``: every chosen set, ``interp`` included, for the physical model."""
    from ssvkit.calibration.physical_sets import physical_report
    from ssvkit.calibration.transfer_markdown import transfer_markdown as transfer_md
    from ssvkit.calibration.transfer_sets import TARGETS

    for flag in ("plot", "check"):
        if getattr(args, flag):
            raise ValueError(f"--{flag} applies to --model classes, not {args.model!r}")
    report = physical_report(args.gpu, sets)
    if args.markdown:
        print(transfer_md(report).rstrip("\n"))
    elif args.json:
        print(json.dumps({"model": args.model, "targets": TARGETS, "sets": report}, indent=1))
    else:
        print(_transfer_report(report), end="")
    if args.check_transfer and not all(s["met"] for s in report.values()):
        return 1
    return 0
