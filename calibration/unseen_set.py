"""The ``unseen`` test set of ``ssvkit validate``: kernel calls of the test design
(``calibration.unseen_design``: head geometries and parameter values no calibration row has),
timed on a GPU and predicted with that GPU's committed profile as ``ssvkit predict`` prices
them, with no refit: the error a user planning for such a model meets.

Beside each class's errors, the set checks the profile's prediction intervals on these rows: a
call inside its class's measured range takes the held-out interval, one outside it the widened
interval of an extrapolated figure (``perfmodel.intervals.IntervalSource.residuals``), and the
count inside is tested against the stated coverage (``interval_coverage.coverage_check``).
"""

from __future__ import annotations

from collections import Counter

from ssvkit.calibration import ceilings
from ssvkit.calibration.error_table import ape_markdown_row, markdown_header
from ssvkit.calibration.fit import op_class
from ssvkit.calibration.interval_coverage import coverage_check, row_coverage
from ssvkit.calibration.transfer_sets import TARGETS, by_geometry, fitted_rows, summarize
from ssvkit.calibration.validate import annotate
from ssvkit.perfmodel.profiles import Profile

FOLDER = "unseen"  # under calibration/profiles/<gpu>/, beside the fit rows
TITLE = (
    "calls of head geometries and parameter values no calibration row has, predicted by the "
    "committed profile"
)


def unseen_rows(gpu: str) -> list[dict]:
    """The test design's rows of ``gpu`` (none when it has no such folder)."""
    folder = ceilings.PROFILES / gpu / FOLDER
    if not any(folder.glob("*.jsonl")):
        return []
    return ceilings.profile_rows(gpu, folder)


def unseen_set(gpu: str) -> dict | None:
    """The set for ``gpu``, summarized as the transfer sets are (``transfer_sets.summarize``),
    with the intervals' coverage (``coverage``: overall, and per ``in_range`` and extrapolated
    call); None when ``gpu`` has no rows of the test design or no committed profile."""
    rows = fitted_rows(unseen_rows(gpu))
    path = ceilings.PROFILES / gpu / "profile.json"
    if not rows or not path.is_file():
        return None
    profile = Profile.load(path, gpu=gpu)
    annotated = [{**r, "from": r["class"]} for r in annotate(rows, profile)]
    missing = Counter(op_class(r) for r in rows if op_class(r) not in profile.classes)
    out = summarize(annotated, dict(missing), TARGETS["leave_one_out"])
    out["title"] = TITLE
    out["geometries"] = by_geometry(annotated)
    src = profile.interval_source()
    if src is not None:
        inside = [r for r in annotated if r["in_range"]]
        outside = [r for r in annotated if not r["in_range"]]
        got = [row_coverage(src, inside), row_coverage(src, outside, extrapolated=True)]
        out["coverage"] = {
            "coverage": src.table.coverage,
            "all": coverage_check(got[0][0] + got[1][0], got[0][1] + got[1][1], src.table.coverage),
            "in_range": coverage_check(*got[0], src.table.coverage),
            "extrapolated": coverage_check(*got[1], src.table.coverage),
        }
    return out


def geometry_lines(geometries: dict[str, dict]) -> list[str]:
    """The per-geometry errors as markdown table lines."""
    lines = markdown_header(
        ("head geometry", "n", "median APE", "p90 APE", "max APE", "median error")
    )
    for g, st in geometries.items():
        lines.append(ape_markdown_row(f"`{g}`", st, f"{100 * st['median_error']:+.1f}%"))
    return lines


def coverage_text(cov: dict) -> str:
    """One line: the rows inside their predicted interval, overall (with the one-sided binomial
    p-value of so few at the stated coverage), in range and extrapolated."""
    a, level = cov["all"], f"{100 * cov['coverage']:.0f}%"
    parts = [
        f"{c['inside']} of {c['n']} {name}"
        for name, c in (("in range", cov["in_range"]), ("extrapolated", cov["extrapolated"]))
    ]
    return (
        f"{a['inside']} of {a['n']} rows inside their {level} interval "
        f"({100 * a['coverage']:.0f}%; p = {a['p']:.2g} of so few at {level}): " + ", ".join(parts)
    )
