"""Predict, Reuse, Repair (seed 004): the Holt EMA block-score predictor, its score-weighted
hit rate, per-prompt calibration and the critical path with repair (the speculation budget and
the serial path are in ``perfmodel.seed_formulas``).

The seed's equations (2)-(8) did not survive text extraction; they are Holt's damped-trend
exponential smoothing as the text describes it (level, trend; alpha, beta, phi):

    prediction   s_hat_t = l_{t-1} + phi b_{t-1}                         (eq. 2)
    update       l_t = alpha s_t + (1 - alpha)(l_{t-1} + phi b_{t-1})     (eq. 3)
                 b_t = beta (l_t - l_{t-1}) + (1 - beta) phi b_{t-1}

with l = s and b = 0 when a block first appears. The score-weighted hit rate (eq. 4) is
``sum_{j in P_t ∩ S_t} s_{t,j} / sum_{j in S_t} s_{t,j}`` averaged over steps, where S_t is the
true top-n set, P_t the predicted set and s the (non-negative) importance scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_GRID = (
    tuple(np.round(np.arange(0.1, 1.0, 0.1), 2)),  # alpha
    tuple(np.round(np.arange(0.0, 1.0, 0.1), 2)),  # beta
    tuple(np.round(np.arange(0.8, 1.01, 0.05), 2)),  # phi
)


@dataclass(frozen=True, slots=True)
class HoltParams:
    alpha: float
    beta: float
    phi: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "phi"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"HoltParams.{name} must lie in [0, 1], got {v!r}")


# Seed 004's reported share of the true top-n blocks its EMA predictor finds: the default of a
# fixed hit rate, labelled as the paper's wherever a result uses it.
PAPER_HIT_RATE = 0.98


def holt_predictions(scores, params: HoltParams) -> np.ndarray:
    """One-step-ahead predictions for a score trajectory ``[steps, blocks]``.

    ``scores[t, j]`` is NaN until block j exists. Row t of the result is the prediction made
    before step t's scores are known (NaN for a block on its first step and before).
    """
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2:
        raise ValueError(f"scores must be [steps, blocks], got shape {s.shape}")
    a, b_, phi = params.alpha, params.beta, params.phi
    level = np.full(s.shape[1], np.nan)
    trend = np.zeros(s.shape[1])
    pred = np.full(s.shape, np.nan)
    for t in range(s.shape[0]):
        pred[t] = level + phi * trend
        obs = s[t]
        seen = ~np.isnan(obs)
        new = seen & np.isnan(level)
        old = seen & ~new
        prev = level.copy()
        level = np.where(old, a * obs + (1 - a) * (prev + phi * trend), level)
        trend = np.where(old, b_ * (level - prev) + (1 - b_) * phi * trend, trend)
        level = np.where(new, obs, level)
        trend = np.where(new, 0.0, trend)
    return pred


def _top_sets(values, k) -> np.ndarray:
    """Boolean ``[steps, blocks]`` mask of each row's k largest finite values."""
    v = np.where(np.isnan(values), -np.inf, values)
    k = min(int(k), v.shape[1])
    idx = np.argpartition(-v, k - 1, axis=1)[:, :k] if k > 0 else np.zeros((v.shape[0], 0), int)
    mask = np.zeros(v.shape, dtype=bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask & np.isfinite(v)


def score_weighted_hit_rate(predicted_mask, true_mask, scores) -> float:
    """Seed 004 eq. 4: the share of the true top-n's score mass that the prediction covered,
    averaged over steps (steps whose true set has zero mass are skipped)."""
    s = np.nan_to_num(np.asarray(scores, dtype=float))
    if (s < 0).any():
        raise ValueError("importance scores must be non-negative (e.g. attention probabilities)")
    covered = (s * (predicted_mask & true_mask)).sum(1)
    total = (s * true_mask).sum(1)
    ok = total > 0
    return float((covered[ok] / total[ok]).mean()) if ok.any() else 0.0


def predictor_hit_rate(scores, top_n, budget_ratio=1.0, params: HoltParams | None = None):
    """Score-weighted hit rate of a speculative set of ``round(budget_ratio * top_n)`` blocks.

    ``params=None`` is the "reuse the previous step's top-n" baseline (the S1 stage of seed 004's
    ablation, ~68% overlap there); otherwise the Holt predictor. The first step has no history
    and is excluded.
    """
    s = np.asarray(scores, dtype=float)
    if budget_ratio <= 0:
        raise ValueError(f"budget_ratio must be > 0, got {budget_ratio}")
    size = max(1, int(round(budget_ratio * top_n)))
    if params is None:
        pred = np.vstack([np.full((1, s.shape[1]), np.nan), s[:-1]])
    else:
        pred = holt_predictions(s, params)
    return score_weighted_hit_rate(_top_sets(pred, size)[1:], _top_sets(s, top_n)[1:], s[1:])


def calibrate(scores, top_n, budget_ratio=1.0, grid=DEFAULT_GRID):
    """Grid search of (alpha, beta, phi) maximising the hit rate on a (prefill) trajectory
    (seed 004 §4.2, eq. 5). Returns ``(best HoltParams, its hit rate)``; ties keep the first."""
    best, best_h = None, -1.0
    for a in grid[0]:
        for b in grid[1]:
            for phi in grid[2]:
                p = HoltParams(float(a), float(b), float(phi))
                h = predictor_hit_rate(scores, top_n, budget_ratio, p)
                if h > best_h + 1e-12:
                    best, best_h = p, h
    return best, best_h


def critical_path_s(
    selection_s, speculative_attention_s, top_n, hit_rate, repair_block_s, repair_fixed_s=0.0
):
    """Per-layer selection-to-attention latency under PRR.

    ``max(T_sel, T_spec) + T_repair0 + c_block n (1 - h)``: speculative attention runs beside
    selection, then the repair kernel folds in the ``n (1 - h)`` missed blocks at ``c_block``
    each (seed 004 §4.3: repair work scales with the misses). Uses the block-count miss rate;
    the score-weighted hit rate is an upper bound on it for skewed scores.
    """
    miss = np.asarray(top_n, dtype=float) * (1.0 - np.asarray(hit_rate, dtype=float))
    return (
        np.maximum(selection_s, speculative_attention_s)
        + repair_fixed_s
        + miss * np.asarray(repair_block_s)
    )
