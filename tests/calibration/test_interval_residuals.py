"""The residual sets of the committed profile (``calibration.intervals``) hold their stated
coverage on held-out rows they were not derived from (``test_fit_validate.py`` checks that they
are those of the committed rows)."""

import numpy as np
import pytest
from ssvkit.calibration.interval_coverage import (
    coverage_check,
    half,
    heldout_coverage,
    row_coverage,
    source_of,
)
from ssvkit.calibration.validate import committed_report
from ssvkit.perfmodel.intervals import COVERAGE

# A check fails when the binomial p-value of seeing so few rows inside, were the coverage
# what it is stated to be, falls below this.
P_MIN = 0.01


@pytest.fixture(scope="module")
def annotated():
    return committed_report("h100-sxm")[1]


def test_heldout_intervals_hold_their_coverage_on_the_other_half(annotated):
    """Intervals derived from half of the held-out rows cover the other half's rows, and the
    held-out ratios (a grouped mode over per-query loads, t = 16 over 1, ...) by the speedup
    rule, at the stated coverage: no binomial evidence of less."""
    checks = heldout_coverage(annotated)
    assert len(checks) == 4 and {c["checked_on"].split()[1] for c in checks} == {"rows", "ratios"}
    for c in checks:
        assert c["n"] > 100 and c["p"] > P_MIN, c


def test_the_coverage_check_fails_intervals_narrower_than_stated(annotated):
    """The same check on intervals derived at 50% but claimed at 90% fails on both halves: it
    can tell."""
    held = [r for r in annotated if r["split"] == "heldout"]
    for h in (0, 1):
        src = source_of({"heldout": [r for r in held if half(r) == h]}, coverage=0.5)
        inside, n = row_coverage(src, [r for r in held if half(r) != h])
        assert coverage_check(inside, n, COVERAGE)["p"] < P_MIN
        assert 0.4 < inside / n < 0.6


def test_halves_split_the_heldout_rows_apart_from_the_heldout_rule(annotated):
    held = [r for r in annotated if r["split"] == "heldout"]
    sides = np.array([half(r) for r in held])
    assert 0.4 < sides.mean() < 0.6
    fit = np.array([half(r) for r in annotated if r["split"] == "fit"])
    assert 0.4 < fit.mean() < 0.6  # not the held-out rule's bits
