"""The host-time fits of the decode loop (``calibration.loop_host_fit``) and the draft step
(``calibration.draft_host_fit``): they recover known coefficients, hold what their rows cannot
identify at 0, and the shipped files are what their commands fit on the committed runs."""

import json
from pathlib import Path

import numpy as np
import pytest
from ssvkit.calibration import draft_host_fit, loop_host_fit
from ssvkit.calibration.loop_host_fit import LoopRow, errors, fit
from ssvkit.perfmodel.loop_host import LOOP_HOST_TERMS, loop_host_features

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data"


def _rows(truth, batches=(1, 4, 16, 64), noise=0.0, rng=None):
    rows = []
    for b in batches:
        for drafter, k, tokens in ((0, 0, 1.0), (1, 16, 3.0), (2, 16, 2.5), (2, 8, 1.8)):
            host = float(loop_host_features([drafter], [b], [k], [tokens])[0] @ truth)
            if rng is not None:
                host *= 1 + noise * rng.standard_normal()
            wall = 5e-4 + 2e-5 * b + host
            rows.append(LoopRow("t", f"{drafter}|{b}", drafter, b, k, tokens, wall, host))
    return rows


def test_loop_host_fit_recovers_known_coefficients():
    truth = np.array([7e-5, 1e-6, 2.5e-6])
    coef, figures = fit(_rows(truth))
    assert np.allclose([coef[t] for t in LOOP_HOST_TERMS], truth, rtol=1e-6, atol=1e-12)
    assert figures["batches"] == [1, 64] and figures["not_identified"] == []
    e = errors(_rows(truth), coef)
    assert set(e) == {"none", "draft_model", "ngram"}
    assert all(x["abs_error_p90_s"] < 1e-12 for x in e.values())
    # noisy rows: close, not exact
    noisy, _ = fit(_rows(truth, noise=0.05, rng=np.random.default_rng(0)))
    assert noisy["round"] == pytest.approx(truth[0], rel=0.2)


def test_loop_host_fit_holds_what_one_batch_size_cannot_tell_apart():
    truth = np.array([8e-5, 0.0, 1e-6])
    coef, figures = fit(_rows(truth, batches=(1,)))
    assert figures["not_identified"] == ["sequence"] and coef["sequence"] == 0
    assert coef["round"] == pytest.approx(8e-5) and coef["ngram_token"] == pytest.approx(1e-6)
    ar_only = [r for r in _rows(truth) if r.drafter == 0]
    coef, figures = fit(ar_only)
    assert figures["not_identified"] == ["ngram_token"] and coef["ngram_token"] == 0
    with pytest.raises(ValueError, match="has no rows"):
        fit([])


@pytest.mark.parametrize("gpu", ["h200", "h100-sxm"])
def test_shipped_loop_and_draft_host_fits_are_their_commands_output(gpu):
    for module, name, key in (
        (loop_host_fit, "loop_host.json", "errors"),
        (draft_host_fit, "draft_host.json", "draft_step_ape"),
    ):
        shipped = json.loads((ROOT / "calibration" / "profiles" / gpu / name).read_text())
        again = module.run(DATA, gpu)
        for term, value in shipped["coefficients"].items():
            assert again["coefficients"][term] == pytest.approx(value, rel=1e-9, abs=1e-15)
        assert set(again[key]) == set(shipped[key])


def test_loop_host_fit_cli_refuses_a_gpu_without_runs(capsys):
    assert loop_host_fit.main(["--gpu", "a100"]) == 2
    assert "no committed engine runs name the loop host of 'a100'" in capsys.readouterr().err
    assert draft_host_fit.main(["--gpu", "a100"]) == 2
    assert "no committed engine runs time the draft step on 'a100'" in capsys.readouterr().err
