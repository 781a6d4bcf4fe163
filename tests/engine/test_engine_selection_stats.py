"""The PRR hit rates of ``engine.stats.SelectionStats`` against a float64 reference of seed 004's
eq. 4 and Holt's recursion (``perfmodel.prr``), over rounds of random block importance with
blocks that are not candidates (NaN) and rows with no candidate at all."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ssvkit.engine.stats import DEFAULT_HOLT, SelectionStats


def _top(values: np.ndarray, k: int) -> np.ndarray:
    v = np.where(np.isnan(values), -np.inf, values)
    order = np.argsort(-v, axis=-1, kind="stable")[..., : min(k, v.shape[-1])]
    mask = np.zeros(v.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask & np.isfinite(v)


def _hit(pred: np.ndarray, true: np.ndarray, imp: np.ndarray) -> np.ndarray:
    """[L, B, Hkv, NB] -> [B, L]: covered share of the true top-n's importance, mean over KV
    heads that have one."""
    s = np.nan_to_num(imp)
    covered, total = (s * (pred & true)).sum(-1), (s * true).sum(-1)
    ratio = np.full(total.shape, np.nan)
    np.divide(covered, total, out=ratio, where=total > 0)
    out = np.full(total.shape[:2], np.nan)
    ok = ~np.isnan(ratio).all(-1)
    out[ok] = np.nanmean(ratio[ok], axis=-1)
    return out.T


def _reference(rounds: list[np.ndarray], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    a, beta, phi = DEFAULT_HOLT.alpha, DEFAULT_HOLT.beta, DEFAULT_HOLT.phi
    level = trend = prev_true = None
    out = []
    for obs in rounds:
        true = _top(obs, k)
        if level is None:
            nan = np.full(obs.shape[:2][::-1], np.nan)
            out.append((nan, nan))
            level, trend = obs.copy(), np.zeros_like(obs)
        else:
            pred = _top(level + phi * trend, k)
            out.append((_hit(pred, true, obs), _hit(prev_true, true, obs)))
            seen = ~np.isnan(obs)
            new, old = seen & np.isnan(level), seen & ~np.isnan(level)
            nxt = np.where(old, a * obs + (1 - a) * (level + phi * trend), level)
            trend = np.where(old, beta * (nxt - level) + (1 - beta) * phi * trend, trend)
            level = np.where(new, obs, nxt)
            trend = np.where(new, 0.0, trend)
        prev_true = true
    return out


@pytest.mark.parametrize("shape", [(3, 2, 2, 37), (2, 1, 4, 16), (1, 3, 1, 5)])
def test_prr_hit_rates_match_the_reference(shape):
    rng = np.random.default_rng(sum(shape))
    k = 4
    rounds = []
    drift = rng.random(shape)
    for r in range(5):
        obs = drift + 0.3 * rng.random(shape)
        obs[rng.random(shape) < 0.2] = np.nan  # blocks that are not candidates
        if r == 0:
            obs[..., : max(1, shape[-1] // 8)] = np.nan  # candidates from round 1 on
        if shape[1] > 1:
            obs[:, 1, 0] = np.nan  # a (sequence, KV head) with no candidate block this round
        rounds.append(obs)
    stats = SelectionStats(type("Cfg", (), {"top_n": k})(), shape[0], backend="torch")
    want = _reference([o.astype(np.float32).astype(np.float64) for o in rounds], k)
    for obs, (w_pred, w_reuse) in zip(rounds, want, strict=True):
        pred, reuse = stats._prr(torch.tensor(obs, dtype=torch.float32))
        assert pred.shape == reuse.shape == (shape[1], shape[0])
        for got, ref in ((pred, w_pred), (reuse, w_reuse)):
            assert np.array_equal(np.isnan(got), np.isnan(ref))
            assert np.allclose(got[~np.isnan(got)], ref[~np.isnan(ref)], rtol=1e-5, atol=1e-6)
            assert ((got[~np.isnan(got)] >= 0) & (got[~np.isnan(got)] <= 1 + 1e-6)).all()
    assert not np.isnan(want[1][0]).all()  # the later rounds score something
