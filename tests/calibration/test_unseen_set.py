"""The ``unseen`` set of ``ssvkit validate``: the test design's rows, predicted by the committed
profile, never fitted."""

import copy

from ssvkit.calibration import ceilings
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import unseen_design as ud
from ssvkit.calibration import unseen_set as us
from ssvkit.calibration.transfer_sets import fitted_rows, transfer_report
from ssvkit.calibration.validate import annotate
from ssvkit.perfmodel.profiles import Profile

from ssvkit.cli import main


def test_the_h200_rows_are_the_design_and_not_fit_rows():
    rows = us.unseen_rows("h200")
    fit = {r["checksum"] for r in ceilings.profile_rows("h200")}
    assert not fit & {r["checksum"] for r in rows}
    heads = {
        (r["params"].get("num_q_heads"), r["params"].get("num_kv_heads")) for r in fitted_rows(rows)
    }
    assert heads == {ki.GEOMETRIES[g][:2] for g in ud.GEOMETRIES}


def test_the_set_predicts_every_row_and_checks_the_intervals():
    s = us.unseen_set("h200")
    n = len(fitted_rows(us.unseen_rows("h200")))
    assert sum(c["n"] for c in s["classes"].values()) == n and not s["unpredicted"]
    cov = s["coverage"]
    assert cov["all"]["n"] == n == cov["in_range"]["n"] + cov["extrapolated"]["n"]
    assert 0 <= cov["all"]["inside"] <= n and 0.0 <= cov["all"]["p"] <= 1.0
    assert "rows inside their 90% interval" in us.coverage_text(cov)


def test_a_gpu_without_the_design_rows_has_no_set():
    assert us.unseen_set("h100-sxm") is None
    assert "unseen" not in transfer_report("h100-sxm", ("unseen",))


def test_a_call_past_its_class_range_is_not_in_range():
    profile = Profile.load(ceilings.PROFILES / "h200" / "profile.json", gpu="h200")
    rows = fitted_rows(us.unseen_rows("h200"))
    row = next(r for r in rows if r["op"] == "dense_verify" and r["params"]["head_dim"] == 128)
    far = copy.deepcopy(row)
    far["params"]["context_len"] *= 64
    far["params"]["batch"] *= 64
    near, past = annotate([row, far], profile)
    assert near["in_range"] and not past["in_range"]


def test_validate_prints_the_set(capsys):
    assert main(["validate", "--gpu", "h200", "--sets", "unseen"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("unseen: calls of head geometries") and "prediction intervals:" in out
