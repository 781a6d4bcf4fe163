"""Fit the decode loop's host overhead per round (``perfmodel.host_overhead``) on measured
rounds: non-negative least squares of each run's residual (its measured round wall time minus
the step model's round time) on ``overhead_features``.

The planner evaluation (``validation.profile_runs``) fits one set of coefficients per context
regime on the profile's runs and stores them in the planner's profile; ``host_overhead_s``
prices a round from them.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls
from ssvkit.perfmodel.host_overhead import OVERHEAD_TERMS, overhead_features
from ssvkit.perfmodel.strategy import Strategy


def fit_overhead(
    strategies: list[Strategy], residual_s: list[float], round_s: list[float] | None = None
) -> tuple[dict[str, float], dict]:
    """Least squares of the per-round residual (measured round wall time minus the step model's
    round time) on ``overhead_features``: the coefficients and the fit's figures (rows, rms and
    max absolute error, seconds; rms relative error when weighted; the autoregressive rows).

    Every coefficient is non-negative except ``speculative`` when autoregressive rows are
    among the runs (``round + speculative``, a drafting round's intercept, is non-negative): it
    is then the difference between a drafting round's residual and an autoregressive one's,
    whose sign is the step model's (it may price a drafting round's GPU work above what it
    takes). Held at 0 or above, that difference leaks into ``round`` -- the whole of an
    autoregressive round's overhead -- and moves autoregressive decoding's prediction at 32K by
    9% between two evaluations of one code. Without autoregressive rows the two terms are one
    column and ``speculative`` stays non-negative.

    With ``round_s`` (the measured round times) each row is weighted by 1 / its round time, so
    the fit minimises relative round-time error -- what tokens/s and speedup errors are: an
    unweighted fit lets the 2-4 ms rounds of tree strategies outvote the ~0.7 ms
    autoregressive rounds, whose overhead it then misses by 10% and more (every speedup divides
    by an autoregressive baseline)."""
    if len(strategies) != len(residual_s) or not strategies:
        raise ValueError("fit_overhead needs one residual per strategy, and at least one")
    x = np.stack([overhead_features(s) for s in strategies])
    y = np.asarray(residual_s, dtype=float)
    w = np.ones_like(y)
    if round_s is not None:
        r = np.asarray(round_s, dtype=float)
        if r.shape != y.shape or not (r > 0).all():
            raise ValueError("fit_overhead: round_s needs one positive round time per strategy")
        w = 1.0 / r
    i, j = OVERHEAD_TERMS.index("round"), OVERHEAD_TERMS.index("speculative")
    ar = x[:, j] == 0
    if ar.any() and not ar.all():
        # Solved for an autoregressive round's intercept and a drafting round's, both >= 0
        # (what ``perfmodel.host_overhead.check_overhead`` checks: ``round`` and ``round +
        # speculative``); then ``speculative`` is their difference.
        xr = x.copy()
        xr[:, i], xr[:, j] = ar, ~ar
        coef, _ = nnls(xr * w[:, None], y * w)
        coef[j] -= coef[i]
    else:
        coef, _ = nnls(x * w[:, None], y * w)
    err = x @ coef - y
    fit = {
        "rows": len(y),
        "autoregressive_rows": int(ar.sum()),
        "rms_s": float(np.sqrt(np.mean(err**2))),
        "max_abs_s": float(np.max(np.abs(err))),
    }
    if round_s is not None:
        fit["rms_rel"] = float(np.sqrt(np.mean((err * w) ** 2)))
    return dict(zip(OVERHEAD_TERMS, map(float, coef), strict=True)), fit
