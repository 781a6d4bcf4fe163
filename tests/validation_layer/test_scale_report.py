"""The report over a scale campaign, on a campaign the CPU decodes in the test (the tiny random
geometry of ``test_scale_campaign``, context 1100 so that the sparse baselines are predicted):
its groups, errors and speedup pairs recomputed from the rows, the skipped cells, the
synthetic-acceptance label, ``--json``, ``--plot``, ``--check`` and bad input."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from ssvkit.validation import scale_campaign, scale_report
from ssvkit.validation.scale_report import SPEEDUP_PAIRS, build_scale, is_scale_campaign

from ssvkit.cli import main
from tests.validation_layer.test_scale_campaign import CONFIG, ONE_MIB_GIB

BASELINES = "ar_dense,ar_sparse,sd_dense,ssv"


def _campaign(tmp, name: str, batches: str, *extra: str) -> dict:
    out = tmp / f"{name}.json"
    argv = [
        "--models", f"random:{tmp / 'config.json'}",
        "--contexts", "1100",
        "--batches", batches,
        "--baselines", BASELINES,
        "--acceptances", "0.8",
        "--new-tokens", "4",
        "--device", "cpu",
        "--out", str(out),
        *extra,
    ]  # fmt: skip
    assert scale_campaign.main(argv) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    """Batch 1 decoded; batch 2 with 1 MiB of memory, every cell skipped by the memory plan."""
    tmp = tmp_path_factory.mktemp("scale")
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    measured = _campaign(tmp, "measured", "1")
    skipped = _campaign(tmp, "skipped", "2", "--available-gib", ONE_MIB_GIB)
    return {**measured, "rows": measured["rows"] + skipped["rows"]}


@pytest.fixture
def path(doc, tmp_path):
    p = tmp_path / "scale.json"
    p.write_text(json.dumps(doc))
    return p


def _tokens_per_s(r: dict) -> float:
    m = r["measured"]
    return m["full_batch"]["tokens_per_s"] if "full_batch" in m else m["tokens_per_s"]


def _ape(pred, meas) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1)


def test_errors_and_speedups_follow_the_rows(doc):
    rep = build_scale(doc, "scale.json")
    rows = {r["baseline"]: r for r in doc["rows"] if r["status"] == "measured"}
    assert set(rows) == set(BASELINES.split(","))
    assert all("tokens_per_s" in r["prediction"] for r in rows.values())
    # Measured: the full-batch rounds' figures the row recorded, where it has them.
    tps = _ape(
        [r["prediction"]["tokens_per_s"] for r in rows.values()],
        [_tokens_per_s(r) for r in rows.values()],
    )
    verify = _ape(
        [r["prediction"]["verify_forward_s"] for r in rows.values()],
        [r["measured"]["steps_s"]["verify"] for r in rows.values()],
    )
    o = rep["overall"]
    assert o["tokens_per_s"]["n"] == 4 and o["tokens_per_s"]["median_ape"] == np.median(tps)
    assert o["verify"]["p90_ape"] == pytest.approx(np.percentile(verify, 90))
    # The verify step is the forward the engine times: the prediction less sampling/accept.
    assert all(
        r["prediction"]["verify_forward_s"] < r["prediction"]["verify_s"] for r in rows.values()
    )
    pairs = {(x["baseline"], x["over"]): x for x in rep["speedups"]}
    expected = {p for p in SPEEDUP_PAIRS if set(p) <= set(rows)}
    assert set(pairs) == expected and ("ssv", "ar_sparse") in pairs and ("ssv", "sd_dense") in pairs
    ssv, ar = rows["ssv"], rows["ar_sparse"]
    x = pairs[("ssv", "ar_sparse")]
    assert x["acceptance"] == 0.8
    assert x["measured"] == _tokens_per_s(ssv) / _tokens_per_s(ar)
    assert x["predicted"] == ssv["prediction"]["tokens_per_s"] / ar["prediction"]["tokens_per_s"]
    assert set(o["speedups"]) == {f"{b}/{over}" for b, over in expected}
    assert o["acceptance"] == ["measured", "synthetic:oracle"]


def test_groups_skipped_cells_and_intervals(doc):
    rep = build_scale(doc, "scale.json")
    g = rep["groups"]
    assert [(x["batch"], x["context"]) for x in g["context"]] == [(1, 1100), (2, 1100)]
    b1, b2 = g["batch"]
    assert b1["tokens_per_s"]["n"] == 4 and b1["skipped"] == 0
    assert b2["tokens_per_s"] == {"n": 0} and b2["skipped"] == 4
    assert g["model"][0]["tokens_per_s"] == rep["overall"]["tokens_per_s"]
    assert len(rep["skipped"]) == 4
    for s in rep["skipped"]:
        assert s["reason"].startswith("batch 2 at context 1100 needs ")
        assert s["memory"]["need_bytes"] > s["memory"]["available_bytes"] == 1 << 20
    # Every prediction carries its interval; the report counts the measurements inside them.
    cells = [r for r in doc["rows"] if r["status"] == "measured"]
    iv = rep["intervals"]
    assert iv["drawn"] and iv["inside"]["tokens_per_s"]["n"] == len(cells) == 4
    want = sum(
        lo <= _tokens_per_s(r) <= hi
        for r in cells
        for lo, hi in [r["prediction"]["intervals"]["tokens_per_s"]]
    )
    assert iv["inside"]["tokens_per_s"]["inside"] == want
    assert iv["inside"]["speedup"]["n"] == len(rep["speedups"])
    for x in rep["speedups"]:
        lo, hi = x["interval"]
        assert 0 < lo < hi


def _stored(monkeypatch):
    """Report each row with the prediction the campaign stored (not one made now)."""
    monkeypatch.setattr(scale_report, "predict_row", lambda doc, r: r["prediction"])


def test_the_report_predicts_each_row_now(doc, monkeypatch):
    """The report's prediction is made when it runs: a stored prediction that is off does not
    reach it, and the row's recorded acceptance does."""
    off = copy.deepcopy(doc)
    rows = [r for r in off["rows"] if r["status"] == "measured"]
    for r in rows:
        r["prediction"]["tokens_per_s"] *= 10
    rep = build_scale(off, "scale.json")
    want = {r["baseline"]: r["prediction"]["tokens_per_s"] / 10 for r in rows}
    got = {c["baseline"]: c["predicted"]["tokens_per_s"] for c in rep["cells"]}
    assert got == pytest.approx(want)
    sd = next(r for r in rows if r["baseline"] == "sd_dense")
    sd["measured_acceptance"]["fitted_alpha"] = 0.99
    faster = build_scale(off, "scale.json")
    at = {c["baseline"]: c["predicted"]["tokens_per_s"] for c in faster["cells"]}
    assert at["sd_dense"] > got["sd_dense"] and at["ar_dense"] == got["ar_dense"]


def test_a_campaign_predicted_without_intervals_says_so(doc, monkeypatch):
    _stored(monkeypatch)
    bare = copy.deepcopy(doc)
    for r in bare["rows"]:
        if r["status"] == "measured":
            r["prediction"].pop("intervals")
            r["prediction"].pop("round_log_bounds")
    rep = build_scale(bare, "scale.json")
    assert not rep["intervals"]["drawn"] and "no prediction intervals" in rep["intervals"]["note"]
    assert all(x["interval"] is None for x in rep["speedups"])


def test_cli_prints_json_and_plots(path, doc, tmp_path, capsys):
    plot = tmp_path / "tps.png"
    assert main(["report", "--campaign", str(path), "--json", "--plot", str(plot)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep == json.loads(json.dumps(build_scale(doc, str(path))))
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["report", "--campaign", str(path)]) == 0
    out = capsys.readouterr().out
    assert "90% prediction intervals" in out and "speedup ssv/ar_sparse" in out
    assert "batch 2 at context 1100 needs " in out and "synthetic:oracle" in out


def test_check_follows_the_targets(doc, tmp_path, capsys, monkeypatch):
    """CPU timings against H200 predictions miss every target (exit 1); the same cells with
    each prediction replaced by its measurement meet them all (exit 0)."""
    p = tmp_path / "scale.json"
    p.write_text(json.dumps(doc))
    assert main(["report", "--campaign", str(p), "--check"]) == 1
    _stored(monkeypatch)
    same = copy.deepcopy(doc)
    for r in same["rows"]:
        if r["status"] == "measured":
            m = r["measured"]
            full = m.get("full_batch", {"round_s": m["wall_s"] / m["rounds"]})
            r["prediction"].update(
                tokens_per_s=_tokens_per_s(r),
                verify_forward_s=m["steps_s"]["verify"],
                round_s=full["round_s"],
            )
    p.write_text(json.dumps(same))
    assert main(["report", "--campaign", str(p), "--check"]) == 0
    capsys.readouterr()


def test_a_document_without_the_field_is_recognised_by_its_schema(doc):
    bare = {k: v for k, v in doc.items() if k != "benchmark"}
    assert is_scale_campaign(doc) and is_scale_campaign(bare)
    assert not is_scale_campaign({"version": 1, "rows": []})
    assert not is_scale_campaign({**doc, "benchmark": "nsa_stages"})


def _bad(argv, needle, capsys, written=None):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and needle in err, err
    assert written is None or not written.exists()


def test_bad_input_is_one_line_and_exit_2(path, doc, tmp_path, capsys):
    empty, other = tmp_path / "empty.json", tmp_path / "other.json"
    empty.write_text(json.dumps({**doc, "rows": []}))
    other.write_text(json.dumps({"benchmark": "nsa_stages", "rows": []}))
    plot = tmp_path / "p.png"
    _bad(["report", "--campaign", str(tmp_path / "no.json")], "does not exist", capsys)
    _bad(["report", "--campaign", str(empty), "--plot", str(plot)], "holds no cells", capsys, plot)
    _bad(["report", "--campaign", str(other)], "is a 'nsa_stages' document", capsys)
    _bad(["report", "--campaign", str(path), "--gpu", "h200"], "--gpu is for the end-to", capsys)
    _bad(["report", "--campaign", str(path), "--plot", "p.txt"], "must end in .png", capsys)
    _bad(["report", "--no-files", "--plot", str(plot)], "--plot draws a scale", capsys, plot)
    broken = copy.deepcopy(doc)
    del broken["rows"][0]["measured"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    _bad(
        ["report", "--campaign", str(tmp_path / "broken.json"), "--plot", str(plot)],
        "is malformed (KeyError",
        capsys,
        plot,
    )


def test_the_simulator_replays_every_cell_that_recorded_rounds(doc, capsys):
    rep = build_scale(doc, "scale.json")
    replayed = [c for c in rep["cells"] if c["simulated"]]
    assert replayed and len(replayed) == sum(
        bool(r["measured"].get("rounds_trace")) for r in doc["rows"] if r["status"] == "measured"
    )
    assert all(c["simulated"]["tokens_per_s"] > 0 for c in replayed)
    assert rep["overall"]["simulated_tokens_per_s"]["n"] == len(replayed)
    from ssvkit.validation.scale_report_text import text

    assert "simulator tokens/s (whole run)" in text(rep)
