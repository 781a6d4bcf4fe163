"""How the prediction intervals hold up on rows they were not derived from
(``perfmodel.intervals``, ``calibration.intervals``), the checks the tests and the calibration
results page run:

- ``heldout_coverage``: intervals derived from one half of the held-out rows (``half``), checked
  on the other half's rows and on the held-out ratio pairs (``calibration.validate.ratio_pairs``)
  whose held-out rows all lie in it, by the speedup rule, both ways round;
- ``leave_one_out_coverage``: the widened intervals of extrapolated calls (the hull of the
  held-out and leave-one-out residuals), the leave-one-out residuals taken from two of the three
  leave-one-out sets and checked on the third.

Each check counts the rows inside and gives the one-sided binomial p-value of so few if the
coverage were the stated one (``coverage_check``).
"""

from __future__ import annotations

import hashlib

import numpy as np
from scipy.stats import binomtest
from ssvkit.calibration.error_table import markdown_header, markdown_row
from ssvkit.calibration.intervals import residual_table
from ssvkit.calibration.transfer_sets import LEAVE_ONE_OUT, committed_leave_one_out_rows
from ssvkit.calibration.validate import ratio_pairs
from ssvkit.perfmodel.intervals import (
    COVERAGE,
    POOLED,
    SETS,
    IntervalSource,
    IntervalTable,
    Spread,
    bounds,
    interval,
    kernel_family,
)
from ssvkit.perfmodel.rows import canonical


def half(row: dict) -> int:
    """0 or 1: a fixed split of the rows in two halves, by hash bits other than the held-out
    rule's, for checking intervals on rows they were not derived from."""
    key = canonical({"op": row["op"], "params": row["params"], "timing": row["timing"]})
    return int(hashlib.sha1(key.encode()).hexdigest()[8:16], 16) % 2


def source_of(sets: dict[str, list[dict]], coverage: float = COVERAGE) -> IntervalSource:
    """The interval source (as ``ssvkit predict`` reads a profile's) of the residual sets of
    annotated ``sets`` rows."""
    return IntervalSource(
        IntervalTable.from_json({"coverage": coverage, "sets": residual_table(sets, coverage)})
    )


def row_coverage(src: IntervalSource, annotated: list[dict], extrapolated: bool = False):
    """How many of ``annotated`` rows measured inside the interval ``src`` gives their
    prediction (an op of their family; ``extrapolated``: outside its measured range); and how
    many rows."""
    inside = 0
    for r in annotated:
        res = src.residuals(kernel_family(r["class"]), extrapolated)
        inside += res.low <= float(np.log(r["median_s"] / r["predicted_s"])) <= res.high
    return inside, len(annotated)


def ratio_coverage(src: IntervalSource, pairs: list[dict]) -> tuple[int, int]:
    """How many ratio pairs measured inside the interval ``perfmodel.intervals.interval`` gives
    their predicted ratio, each side one op with its family's residuals from ``src``; and how
    many pairs."""
    inside = 0
    for p in pairs:
        sides = []
        for row in p["rows"]:
            sp = Spread.zeros(1, 1)
            sp.add_op(
                np.array([row["predicted_s"]]), 0, src.residuals(kernel_family(row["class"]), False)
            )
            sides.append(bounds(sp))
        lo, hi = interval(np.array([p["predicted"]]), over=sides[0], under=sides[1])[0]
        inside += lo <= p["measured"] <= hi
    return inside, len(pairs)


def coverage_check(inside: int, n: int, coverage: float = COVERAGE) -> dict:
    """The observed coverage and the one-sided binomial p-value of seeing at most ``inside`` of
    ``n`` if the true coverage were ``coverage``: a small p says the intervals cover less."""
    p = binomtest(inside, n, coverage, alternative="less").pvalue if n else float("nan")
    inside, n = int(inside), int(n)
    return {"inside": inside, "n": n, "coverage": inside / n if n else float("nan"), "p": float(p)}


def heldout_coverage(annotated: list[dict], coverage: float = COVERAGE) -> list[dict]:
    """The held-out split's intervals derived from one half of the held-out rows and checked on
    the other half's rows and ratio pairs, both ways round (module docstring)."""
    held = [r for r in annotated if r["split"] == "heldout"]
    pairs = [p for p in ratio_pairs(annotated) if p["heldout"]]
    out = []
    for h in (0, 1):
        src = source_of({"heldout": [r for r in held if half(r) == h]}, coverage)
        rows = [r for r in held if half(r) != h]
        mine = [p for p in pairs if all(half(r) != h for r in p["rows"] if r["split"] == "heldout")]
        for what, got in (("rows", row_coverage(src, rows)), ("ratios", ratio_coverage(src, mine))):
            out.append(
                {
                    "from": f"heldout, half {h}",
                    "checked_on": f"held-out {what} of half {1 - h}",
                    **coverage_check(*got, coverage),
                }
            )
    return out


def leave_one_out_coverage(gpu: str, annotated: list[dict]) -> list[dict]:
    """The extrapolated calls' intervals, the leave-one-out residuals taken from two of the
    committed leave-one-out sets, checked on the third's rows (module docstring)."""
    held = [r for r in annotated if r["split"] == "heldout"]
    sets = {n: committed_leave_one_out_rows(gpu, n)[0] for n in LEAVE_ONE_OUT}
    out = []
    for name in LEAVE_ONE_OUT:
        others = [r for n in LEAVE_ONE_OUT if n != name for r in sets[n]]
        src = source_of({"heldout": held, "leave_one_out": others})
        got = row_coverage(src, sets[name], extrapolated=True)
        out.append(
            {
                "from": "heldout + leave_one_out: "
                + ", ".join(n for n in LEAVE_ONE_OUT if n != name),
                "checked_on": f"leave one {name} out",
                **coverage_check(*got),
            }
        )
    return out


def _pct(log_ratio: float) -> str:
    return f"{100 * np.expm1(log_ratio):+.1f}%"


def intervals_markdown(gpu: str, profile, annotated: list[dict]) -> str:
    """The calibration results page's block: the committed profile's residuals per set and
    family (as measured / predicted - 1), then every coverage check of this module."""
    table = profile.intervals
    lines = [
        f"Profile `{profile.profile_id}`, {100 * table.coverage:.0f}% intervals "
        "(`python -m ssvkit.calibration.intervals --gpu " + gpu + "` regenerates them):",
        "",
        *markdown_header(("set", "family", "rows", "low", "median", "high")),
    ]
    for name in SETS:
        fams = table.sets.get(name, {})
        for fam, r in sorted(fams.items(), key=lambda x: (x[0] == POOLED, x[0])):
            label = "all families" if fam == POOLED else f"`{fam}`"
            cells = (name, label, str(r.n), _pct(r.low), _pct(r.median), _pct(r.high))
            lines.append(markdown_row(cells))
    checks = heldout_coverage(annotated) + leave_one_out_coverage(gpu, annotated)
    below = f"p (coverage < {100 * COVERAGE:.0f}%)"
    lines += [
        "",
        *markdown_header(("intervals from", "checked on", "rows", "inside", "coverage", below)),
    ]
    for c in checks:
        cells = (c["from"], c["checked_on"], str(c["n"]), str(c["inside"]))
        lines.append(markdown_row((*cells, f"{100 * c['coverage']:.1f}%", f"{c['p']:.2g}")))
    return "\n".join(lines) + "\n"
