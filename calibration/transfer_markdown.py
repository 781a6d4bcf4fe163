"""The transfer sets of ``calibration.transfer_sets`` as text: a set's target in words, and
every set of a report as markdown paragraphs and tables (``ssvkit validate --markdown``,
``docs/results/calibration.md``)."""

from __future__ import annotations

from ssvkit.calibration.error_table import ape_markdown_row, markdown_header


def target_text(target: dict) -> str:
    return ", ".join(f"{k.removesuffix('_ape')} APE <= {100 * v:.0f}%" for k, v in target.items())


def set_markdown(key: str, s: dict) -> list[str]:
    """One set as a markdown paragraph and table: a row per class, then the rows no fit
    predicts."""
    met = sum(c["met"] for c in s["classes"].values())
    lines = [
        f"**{key}**: {s['title']}; target {target_text(s['target'])}; "
        f"{met} of {len(s['classes'])} classes meet it.",
        "",
        *markdown_header(
            ("class", "n", "median APE", "p90 APE", "max APE", "predicted by", "target")
        ),
    ]
    for c, st in s["classes"].items():
        by = ", ".join(f"`{k}`" for k in st["from"])
        lines.append(ape_markdown_row(f"`{c}`", st, by, "met" if st["met"] else "missed"))
    if s["unpredicted"]:
        no_fit = ", ".join(f"`{c}` ({n} rows)" for c, n in s["unpredicted"].items())
        lines += ["", f"No fit predicts: {no_fit}."]
    if s.get("other_kernels"):
        other = ", ".join(f"`{c}` ({n} rows)" for c, n in s["other_kernels"].items())
        lines += ["", f"Not compared, the rows time other kernels than the fit's: {other}."]
    if s.get("geometries"):
        from ssvkit.calibration.unseen_set import coverage_text, geometry_lines

        lines += [
            "",
            "Per head geometry, every family together:",
            "",
            *geometry_lines(s["geometries"]),
        ]
    if s.get("coverage"):
        lines += ["", f"Prediction intervals: {coverage_text(s['coverage'])}."]
    return lines


def transfer_markdown(report: dict) -> str:
    """Every set of ``report`` in markdown (``docs/results/calibration.md`` embeds it)."""
    lines: list[str] = []
    for key, s in report.items():
        lines += [*set_markdown(key, s), ""]
    return "\n".join(lines)
