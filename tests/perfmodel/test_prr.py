import numpy as np
import pytest
from ssvkit.perfmodel.prr import (
    HoltParams,
    calibrate,
    critical_path_s,
    holt_predictions,
    predictor_hit_rate,
    score_weighted_hit_rate,
)
from ssvkit.perfmodel.seed_formulas import (
    dsa_path_s,
    speculation_budget,
)


def test_holt_recursion_hand_computed():
    s = np.array([[1.0], [2.0], [4.0]])
    p = holt_predictions(s, HoltParams(alpha=0.5, beta=0.5, phi=1.0))
    # step 0: no history. init l=1, b=0. step 1: pred 1; l = .5*2 + .5*1 = 1.5, b = .5*.5 = .25
    # step 2: pred 1.5 + .25 = 1.75
    assert np.isnan(p[0, 0])
    assert p[1, 0] == pytest.approx(1.0)
    assert p[2, 0] == pytest.approx(1.75)


def test_new_blocks_start_without_trend():
    s = np.array([[1.0, np.nan], [1.0, 5.0], [1.0, 5.0]])
    p = holt_predictions(s, HoltParams(0.3, 0.3, 0.9))
    assert np.isnan(p[1, 1]) and p[2, 1] == pytest.approx(5.0)


def test_score_weighted_hit_rate():
    scores = np.array([[4.0, 3.0, 2.0, 1.0]])
    true = np.array([[True, True, False, False]])
    pred = np.array([[True, False, True, False]])
    assert score_weighted_hit_rate(pred, true, scores) == pytest.approx(4 / 7)
    with pytest.raises(ValueError, match="non-negative"):
        score_weighted_hit_rate(pred, true, -scores)


def _trending_scores(steps=60, blocks=40, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.random(blocks)
    slope = rng.normal(0, 0.02, blocks)
    t = np.arange(steps)[:, None]
    return np.clip(base + slope * t + rng.normal(0, 0.005, (steps, blocks)), 0, None)


def test_ema_beats_reuse_of_last_step_on_trends():
    s = _trending_scores()
    reuse = predictor_hit_rate(s, 8)
    params, ema = calibrate(s, 8)
    assert ema >= reuse
    assert ema == pytest.approx(predictor_hit_rate(s, 8, params=params))
    assert predictor_hit_rate(s, 8, budget_ratio=2.0, params=params) >= ema


def test_budget_and_critical_path():
    assert speculation_budget([0.5, 1.0, 1.5, 2.0], [1, 2, 3, 4], 3.0) == 1.5
    assert speculation_budget([1.0], [5.0], 3.0) is None
    # max(4, 3) + 0.5 + 16 * (1 - .75) * 0.2
    assert critical_path_s(4.0, 3.0, 16, 0.75, 0.2, 0.5) == pytest.approx(5.3)
    assert dsa_path_s(4.0, 3.0) == 7.0
