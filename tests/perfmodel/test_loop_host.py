"""The decode loop's host time per round (``perfmodel.loop_host``): its features, the check of
a shipped fit, and its op in the step model's round."""

import json

import numpy as np
import pytest
from ssvkit.perfmodel import loop_host, step
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.loop_host import (
    check_batches,
    check_coefficients,
    loop_host_features,
    loop_host_s,
)
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload


def test_features_count_rounds_sequences_and_an_ngram_drafters_kept_tokens():
    # drafter codes: 0 none, 1 draft model, 2 n-gram; an n-gram point drafting nothing is AR
    x = loop_host_features([0, 1, 2, 2], [1, 8, 8, 8], [0, 16, 16, 0], [1.0, 3.0, 2.5, 1.0])
    assert x.tolist() == [[1, 1, 0], [1, 8, 0], [1, 8, 20], [1, 8, 0]]
    coef = {"round": 7e-5, "sequence": 1e-6, "ngram_token": 2e-6}
    assert loop_host_s(coef, [2], [8], [4], [2.5])[0] == pytest.approx(7e-5 + 8e-6 + 40e-6)


def test_bad_coefficients_and_batch_ranges_are_refused_by_name():
    with pytest.raises(ValueError, match="x.sequence must be"):
        check_coefficients("x", {"round": 0.0, "sequence": -1.0, "ngram_token": 0.0})
    with pytest.raises(ValueError, match="x.round must be"):
        check_coefficients("x", {"round": float("nan"), "sequence": 0, "ngram_token": 0})
    with pytest.raises(ValueError, match="x.node is not one of"):
        check_coefficients("x", {"round": 0, "sequence": 0, "ngram_token": 0, "node": 1})
    for bad in ([4, 2], [0, 4], [1], "1-4", [1.0, 4]):
        with pytest.raises(ValueError, match="y must be"):
            check_batches("y", bad)
    assert check_batches("y", [1, 64]) == (1, 64)


def _predict(gpu, points):
    model = get_model("llama-3.1-8b")
    c = build_columns(model, points)
    return c, predict_columns(model, c, make_predictor(get_gpu(gpu), tp=c.tp))


def test_the_round_carries_the_shipped_loop_host_time_and_flags_batches_beyond_its_fit():
    fit = loop_host.shipped("h200")
    coef, (low, high) = fit.coefficients, fit.batches
    assert fit.label.startswith("fit:loop_host.json@") and low == 1
    s = Strategy(name="ng", tree="chain:4", drafter=DrafterSpec(kind="ngram"))
    pts = [(s, Workload(context_len=8192, batch=b, acceptance=0.6)) for b in (1, high, 4 * high)]
    c, p = _predict("h200", pts)
    want = loop_host_s(coef, c.drafter, c.batch, c.num_draft, c.expected_tokens)
    assert np.allclose(p.loop_s, want) and np.allclose(p.op_seconds["loop.host"], want)
    assert np.allclose(p.round_s, p.draft_s + p.verify_s + p.loop_s)
    assert np.allclose(p.tokens_per_s, c.batch * c.expected_tokens / p.round_s)
    assert p.loop_s[1] > p.loop_s[0] > 0
    assert not p.extrapolated[0] and p.extrapolated[2]  # a batch beyond the fitted range


def test_a_gpu_without_a_fit_prices_no_loop_host_time(tmp_path, monkeypatch):
    # A profile folder whose GPU ships no loop_host.json: no fit, and the round is the steps.
    (tmp_path / "h200").mkdir()
    with monkeypatch.context() as m:
        m.setattr(loop_host.hardware, "profiles_dir", lambda: tmp_path)
        assert loop_host.shipped("h200") is None
    monkeypatch.setattr(step, "shipped_loop_host", lambda gpu: None)
    _, p = _predict("h200", [(Strategy.from_name("ar_dense"), Workload(context_len=4096))])
    assert "loop.host" not in p.op_seconds and p.loop_s[0] == 0
    assert p.round_s[0] == pytest.approx(p.draft_s[0] + p.verify_s[0])


def test_a_shipped_file_with_a_bad_entry_is_refused_by_name(tmp_path, monkeypatch):
    doc = {"coefficients": {"round": 1e-4, "sequence": -1, "ngram_token": 0}, "fit": {}}
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "loop_host.json").write_text(json.dumps(doc))
    monkeypatch.setattr(loop_host.hardware, "profiles_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="loop_host.json: coefficients.sequence must be"):
        loop_host.shipped("h200")


def test_the_loop_host_fits_residuals_widen_the_round_as_one_more_family():
    """The fit's log residuals (its fit and test runs) give the loop's host time a column of
    its own in the round's spread: with them the round's interval is wider than without, and
    the draft step's host time (no residuals) adds none."""
    from ssvkit.perfmodel.intervals import HOST, bounds

    s = Strategy(name="ng", tree="chain:4", drafter=DrafterSpec(kind="ngram"))
    _, p = _predict("h200", [(s, Workload(context_len=8192, batch=16, acceptance=0.6))])
    res = loop_host.shipped("h200").residuals
    assert res is not None and res.n >= 20 and p.loop_residuals == res
    with_host = bounds(p.spread())
    axis = p.interval_source.axis
    assert HOST in axis and axis[HOST] == len(axis) - 2  # before the datasheet gap
    p.loop_residuals = None
    without = bounds(p.spread())
    assert with_host.up2[0] > without.up2[0] and with_host.down2[0] > without.down2[0]
    assert p.spread(keys=["draft.host"]).uncovered_s[0] == 0  # fitted apart, no width


def test_a_shipped_file_with_bad_residuals_is_refused_by_name(tmp_path, monkeypatch):
    doc = {
        "coefficients": {"round": 1e-4, "sequence": 0, "ngram_token": 0},
        "fit": {"batches": [1, 8]},
        "residuals": {"source": "x", "n": 10, "low": 0.5, "median": 0.1, "high": 0.9},
    }
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "loop_host.json").write_text(json.dumps(doc))
    monkeypatch.setattr(loop_host.hardware, "profiles_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="loop_host.json: residuals must be source, n, low"):
        loop_host.shipped("h200")
