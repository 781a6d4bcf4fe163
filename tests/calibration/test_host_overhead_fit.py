"""The host-overhead fit (``calibration.host_overhead_fit.fit_overhead``): it recovers known
coefficients, weights rows by their round time, keeps a drafting round's intercept >= 0 and
lets ``speculative`` take the sign autoregressive rows give it."""

import dataclasses

import numpy as np
import pytest
from ssvkit.calibration.host_overhead_fit import fit_overhead
from ssvkit.perfmodel.host_overhead import OVERHEAD_TERMS, check_overhead, overhead_features
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy


def test_fit_recovers_weights_and_signs_the_overhead_coefficients():
    ng = DrafterSpec(kind="ngram")
    dense = Strategy(tree="chain:4", drafter=ng)
    sparse = dataclasses.replace(
        dense,
        attention="sparse",
        mode="union",
        group_size=4,
        refresh_every=2,
        fusion="refresh_reuse",
    )
    # The fit recovers known non-negative coefficients from noiseless residuals.
    dm = DrafterSpec(kind="draft_model", model="x")
    strategies = [
        dataclasses.replace(s, tree=t, drafter=d)
        for s in (dense, sparse)
        for t in ("chain:0", "chain:2", "chain:7", "best:16:6")
        for d in (ng, dm)
    ]
    truth = np.array([2e-4, 3e-4, 1e-4, 2e-5, 5e-5, 1.5e-4, 3e-5])
    y = [float(overhead_features(s) @ truth) for s in strategies]
    coef, fit = fit_overhead(strategies, y)
    assert list(coef) == list(OVERHEAD_TERMS) and fit["rows"] == len(strategies)
    assert np.allclose([coef[t] for t in OVERHEAD_TERMS], truth, atol=1e-9)
    assert fit["rms_s"] < 1e-9
    with pytest.raises(ValueError, match="one residual per strategy"):
        fit_overhead(strategies, y[:-1])
    # Weighted by 1 / round time: exact data is still recovered; on data the terms cannot fit
    # (dense AR rounds 0.1 ms cheaper than the terms say, sparse ones not) the relative error
    # is the smaller one.
    rounds = [0.7e-3 if s.tree == "chain:0" else 3e-3 for s in strategies]
    coef_w, _ = fit_overhead(strategies, y, rounds)
    assert np.allclose([coef_w[t] for t in OVERHEAD_TERMS], truth, atol=1e-9)
    y_off = [
        v - 1e-4 * (s.tree == "chain:0" and not s.is_sparse)
        for v, s in zip(y, strategies, strict=True)
    ]
    rel = {}
    for name, r in (("plain", None), ("weighted", rounds)):
        c, fit = fit_overhead(strategies, y_off, r)
        pred = np.array([overhead_features(s) @ [c[t] for t in OVERHEAD_TERMS] for s in strategies])
        rel[name] = np.sqrt(np.mean(((pred - np.array(y_off)) / np.array(rounds)) ** 2))
    assert rel["weighted"] < rel["plain"] and fit["rms_rel"] == pytest.approx(rel["weighted"])
    with pytest.raises(ValueError, match="positive round time"):
        fit_overhead(strategies, y, [0.0] * len(y))
    # A drafting round whose residual is below an autoregressive one's (the step model prices
    # its GPU work high): with autoregressive rows, ``speculative`` takes the sign and
    # ``round`` stays what the autoregressive rounds say; held at 0 or above (as without
    # autoregressive rows, where the two terms are one column), ``round`` absorbs it.
    signed = truth.copy()
    signed[OVERHEAD_TERMS.index("speculative")] = -5e-5
    y_neg = [float(overhead_features(s) @ signed) for s in strategies]
    coef, fit = fit_overhead(strategies, y_neg, rounds)
    assert np.allclose([coef[t] for t in OVERHEAD_TERMS], signed, atol=1e-9)
    assert fit["autoregressive_rows"] == 4 and fit["rms_s"] < 1e-9
    drafting = [s for s in strategies if s.tree != "chain:0"]
    y_d = [float(overhead_features(s) @ signed) for s in drafting]
    coef, fit = fit_overhead(drafting, y_d)
    assert fit["autoregressive_rows"] == 0 and coef["speculative"] >= 0
    assert coef["round"] + coef["speculative"] == pytest.approx(signed[0] + signed[1], abs=1e-9)
    # A drafting round's intercept never goes below 0 (what a profile's loader checks): data
    # asking for round + speculative < 0 is fitted at 0 there, and the check accepts the fit.
    below = truth.copy()
    below[OVERHEAD_TERMS.index("speculative")] = -2.0 * truth[OVERHEAD_TERMS.index("round")]
    y_below = [float(overhead_features(s) @ below) for s in strategies]
    coef, _ = fit_overhead(strategies, y_below, rounds)
    assert coef["round"] >= 0 and coef["round"] + coef["speculative"] >= -1e-12
    check_overhead("16K.overhead", coef)


def test_fit_is_the_weighted_least_squares_solution_on_noisy_rounds():
    """Where the unconstrained weighted least squares of noisy residuals has every coefficient
    positive, the constrained fit is that solution, and its figures are its errors."""
    rng = np.random.default_rng(3)
    strategies = [
        Strategy(tree=t, drafter=d, attention=a)
        for t in ("chain:0", "chain:1", "chain:3", "chain:7", "full:2x2", "best:16:6")
        for d in (DrafterSpec(kind="ngram"), DrafterSpec(kind="draft_model", model="x"))
        for a in ("dense", "sparse")
    ]
    truth = np.array([2e-4, 1e-4, 1e-4, 2e-5, 5e-5, 1.5e-4, 3e-5])
    x = np.stack([overhead_features(s) for s in strategies])
    y = x @ truth + rng.normal(0.0, 2e-6, len(strategies))
    rounds = 1e-3 + x @ truth
    coef, fit = fit_overhead(strategies, y.tolist(), rounds.tolist())
    w = 1.0 / rounds
    want, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    assert (want > 0).all()
    got = np.array([coef[t] for t in OVERHEAD_TERMS])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    err = x @ got - y
    assert fit["rows"] == len(strategies) and fit["autoregressive_rows"] == 4
    assert fit["rms_s"] == pytest.approx(np.sqrt(np.mean(err**2)))
    assert fit["max_abs_s"] == pytest.approx(np.max(np.abs(err)))
    assert fit["rms_rel"] == pytest.approx(np.sqrt(np.mean((err * w) ** 2)))
