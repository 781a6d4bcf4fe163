"""The residual sets of the committed profile (``calibration.intervals``) hold their stated
coverage on held-out rows they were not derived from (``python -m ssvkit.calibration.intervals
--check`` in CI checks that they are those of the committed rows)."""

import copy
import json

import numpy as np
import pytest
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import measured_by_class
from ssvkit.calibration.interval_coverage import (
    coverage_check,
    half,
    heldout_coverage,
    row_coverage,
    source_of,
)
from ssvkit.calibration.intervals import differences, measured_differences
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


def test_interval_differences_name_what_moved():
    """``python -m ssvkit.calibration.intervals --check`` compares recomputed intervals with
    the stored ones by ``differences``: equal documents pass, a figure moved beyond the
    tolerance, a missing family and other row counts are each named."""
    stored = json.loads((ceilings.PROFILES / "h100-sxm" / "profile.json").read_text())
    want = stored["intervals"]
    assert differences(copy.deepcopy(want), want) == []
    got = copy.deepcopy(want)
    fam = next(f for f in got["sets"]["heldout"] if f != "*")
    got["sets"]["heldout"][fam]["high"] *= 1 + 1e-12  # a refit's last bits
    assert differences(got, want) == []
    got["sets"]["heldout"][fam]["high"] *= 1 + 1e-6
    got["rows"] = {**got["rows"], "heldout": got["rows"]["heldout"] + 1}
    del got["sets"]["cross_gpu"]["*"]
    diffs = differences(got, want)
    assert any(d.startswith(f"heldout/{fam} high: ") for d in diffs)
    assert "cross_gpu/*: missing" in diffs
    assert any(d.startswith("rows: ") for d in diffs)
    assert len(diffs) == 3


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_each_class_keeps_the_span_of_its_rows(gpu):
    """The committed profile stores beside each fit the head dimensions of its class's rows
    (the attention and selection classes at 64 and 128 at least) and the most serial steps
    any of them ran (the split classes), those no row has nowhere; ``--check`` names a class
    whose stored ones differ."""
    stored = json.loads((ceilings.PROFILES / gpu / "profile.json").read_text())
    measured = measured_by_class(ceilings.profile_rows(gpu), gpu)
    assert measured_differences(stored, measured) == []
    assert {64, 128} <= set(measured["dense_verify"]["head_dims"])
    assert measured["dense_verify"]["steps_max"] >= 1
    assert "gemm" not in measured and "head_dims" not in stored["classes"]["gemm"]
    assert "steps_max" not in stored["classes"]["gemm"]
    moved = copy.deepcopy(stored)
    moved["classes"]["dense_verify"]["head_dims"] = [128]
    moved["classes"]["dense_verify"]["steps_max"] = 99.0
    dims, steps = measured["dense_verify"]["head_dims"], measured["dense_verify"]["steps_max"]
    assert measured_differences(moved, measured) == [
        f"dense_verify head_dims: {dims}, stored [128]",
        f"dense_verify steps_max: {steps}, stored 99.0",
    ]
