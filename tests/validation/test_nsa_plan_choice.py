"""ssvkit.validation.nsa_plan_choice: the calibrated model's pick of an NSA tile plan per call,
scored against the measured faster plan of a committed nsa_tile_plans document."""

import json

import pytest
from ssvkit.validation import nsa_plan_choice as npc


def _doc(n_rows: int) -> dict:
    doc = json.loads(npc.DATA.read_text())
    return {**doc, "rows": doc["rows"][:n_rows]}


def test_the_pick_is_the_plan_priced_faster_and_scored_against_the_measured_best():
    rep = npc.choice_report(_doc(12), "h200")
    calls = rep["modes"]["reuse"]["calls"]
    assert len(calls) == 12
    for c in calls:
        assert c["pick"] == min(("fixed", "fit"), key=lambda k: c[f"{k}_predicted_s"])
        best = min(c["fixed_measured_s"], c["fit_measured_s"])
        assert c["loss"]["pick"] == pytest.approx(c[f"{c['pick']}_measured_s"] / best - 1)
        assert min(c["loss"]["fixed"], c["loss"]["fit"]) == 0.0
    loss = rep["modes"]["reuse"]["loss"]
    assert loss["pick"]["mean"] == pytest.approx(sum(c["loss"]["pick"] for c in calls) / 12)
    assert rep["data"]["git_commit"]


def test_the_fit_rows_are_priced_from_the_fit_plans_work():
    """The same call under the two plans gets two predictions where the plans' launches
    differ (17 rows: one 128-row tile against 16 + 1), as the work counts them."""
    rep = npc.choice_report(_doc(31), "h200")
    by_t = {(c["batch"], c["t"], c["context_len"]): c for c in rep["modes"]["reuse"]["calls"]}
    c = by_t[(1, 17, 131072)]
    assert c["fit_predicted_s"] < 0.9 * c["fixed_predicted_s"]


def test_a_bad_document_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "plans.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as e:
        npc.main(["--data", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--data" in err and "\n" not in err
