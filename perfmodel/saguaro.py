"""Speculative speculative decoding (Saguaro, seed 002): speculation cache, geometric fan-out,
the backup-speculator fallback threshold b* and the SSD round time the simulator uses (Saguaro
sampling and the closed-form speedups are in ``perfmodel.seed_formulas``).

Notation: K drafts per round, a_p the draft's per-token acceptance, a verification *outcome* is
(k accepted, bonus token). The draft pre-speculates F_k continuations (bonus-token guesses) for
outcome k; the cache budget is B = sum_k F_k. The probability that outcome k's bonus token is
among F guesses is modelled as the power law ``h(F) = 1 - (1 - h_1) F^(-r)`` with h_1 the hit
rate of a single guess and r the exponent (seed 002, Theorem 12's assumption, which is what
makes the optimal allocation geometric).
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.acceptance import expected_tokens_per_round, outcome_probabilities


def _check(name, x, lo, hi, lo_open=False, hi_open=False):
    a = np.asarray(x, dtype=float)
    bad = (a <= lo if lo_open else a < lo) | (a >= hi if hi_open else a > hi)
    if np.isnan(a).any() or bad.any():
        raise ValueError(
            f"{name} must lie in {'(' if lo_open else '['}{lo}, {hi}"
            f"{')' if hi_open else ']'}, got {x!r}"
        )


def geometric_fanout(budget, acceptance, exponent, num_draft_tokens):
    """Optimal fan-out F_0..F_K for a cache budget (seed 002, geometric fan-out).

    ``F_k = F_0 a_p^(k / (1 + r))`` for k < K and ``F_K = F_0 a_p^(K / (1 + r)) (1 - a_p)^(-1 /
    (1 + r))``, with F_0 set so that ``sum_k F_k = budget``. Derivation: maximise
    ``sum_k P(k) h(F_k)`` subject to the budget with ``P(k) = a_p^k (1 - a_p)`` (k < K),
    ``a_p^K`` (k = K); the Lagrange condition gives ``F_k ∝ P(k)^(1/(1+r))``. Real-valued;
    see ``integer_fanout`` for whole speculations.
    """
    _check("budget", budget, 0, np.inf, lo_open=True)
    _check("acceptance", acceptance, 0, 1, lo_open=True, hi_open=True)
    _check("exponent", exponent, 0, np.inf, lo_open=True)
    if num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
    a, r = float(acceptance), float(exponent)
    k = np.arange(num_draft_tokens + 1, dtype=float)
    w = a ** (k / (1 + r))
    w[-1] *= (1 - a) ** (-1 / (1 + r))
    return float(budget) * w / w.sum()


def integer_fanout(budget: int, acceptance, exponent, num_draft_tokens) -> np.ndarray:
    """``geometric_fanout`` rounded to integers that still sum to the budget (largest
    remainder; every outcome keeps at least one guess when the budget allows)."""
    f = geometric_fanout(budget, acceptance, exponent, num_draft_tokens)
    n = len(f)
    base = np.floor(f).astype(int)
    if budget >= n:
        base = np.maximum(base, 1)
    while base.sum() > budget:
        base[np.argmax(base - f)] -= 1
    rem = f - base
    for i in np.argsort(-rem, kind="stable")[: budget - base.sum()]:
        base[i] += 1
    return base


def hit_rate_of_fanout(fanout, hit_at_one, exponent) -> np.ndarray:
    """Per-outcome hit rate ``h(F_k) = 1 - (1 - h_1) F_k^(-r)`` (0 for F_k = 0), in [0, 1]."""
    _check("hit_at_one", hit_at_one, 0, 1)
    f = np.asarray(fanout, dtype=float)
    h = 1.0 - (1.0 - hit_at_one) * np.power(np.maximum(f, 1e-300), -exponent)
    return np.clip(np.where(f > 0, h, 0.0), 0.0, 1.0)


def cache_hit_probability(fanout, acceptance, hit_at_one, exponent) -> float:
    """Probability that one sequence's verification outcome is in the speculation cache:
    ``sum_k P(k) h(F_k)`` (seed 002)."""
    f = np.asarray(fanout, dtype=float)
    p = outcome_probabilities(float(acceptance), len(f) - 1)
    return float((p * hit_rate_of_fanout(f, hit_at_one, exponent)).sum())


def ssd_round_time_s(verify_s, fallback_s, hit_rate, batch_size, speculate_s=0.0):
    """Expected time of one SSD round for a batch: ``max(T_v, T_spec) + (1 - h^b) T_fb``.

    The draft device speculates (T_spec) while the target verifies (T_v); if any of the b
    sequences misses the cache the whole batch waits for the fallback speculator (T_fb).
    Assumes independent misses across sequences and free outcome communication.
    """
    b = np.asarray(batch_size, dtype=float)
    all_hit = np.asarray(hit_rate, dtype=float) ** b
    return np.maximum(verify_s, speculate_s) + (1 - all_hit) * np.asarray(fallback_s)


def sd_round_time_s(verify_s, draft_s):
    """Ordinary SD: draft then verify, ``T_d + T_v``."""
    return np.asarray(draft_s) + np.asarray(verify_s)


def critical_batch_size(
    batch_sizes,
    verify_s,
    hit_rate,
    acceptance,
    num_draft_tokens,
    primary_draft_s,
    backup_draft_s,
    backup_acceptance,
    speculate_s=0.0,
):
    """b*: the smallest batch at which falling back to the backup speculator beats the primary.

    Per sequence and round, a hit yields the cached speculation (primary quality, E(a_p)
    tokens); a miss yields a fresh speculation from the fallback: the primary (E(a_p) tokens,
    T_fb = the primary's drafting time) or the backup (E(a_backup) tokens, its own short time).
    Throughput = tokens / ``ssd_round_time_s``. All time arguments broadcast over
    ``batch_sizes``. Returns ``(b_star, primary_tokens_per_s, backup_tokens_per_s)``; b_star is
    None when the backup never wins in the grid (seed 002, batch-size-aware fallback).
    """
    b = np.asarray(batch_sizes, dtype=float)
    e_p = expected_tokens_per_round(acceptance, num_draft_tokens)
    e_b = expected_tokens_per_round(backup_acceptance, num_draft_tokens)
    t_p = ssd_round_time_s(verify_s, primary_draft_s, hit_rate, b, speculate_s)
    t_b = ssd_round_time_s(verify_s, backup_draft_s, hit_rate, b, speculate_s)
    tok_p = b * e_p / t_p
    tok_b = b * (hit_rate * e_p + (1 - hit_rate) * e_b) / t_b
    wins = np.nonzero(tok_b > tok_p)[0]  # ties keep the primary
    b_star = float(b[wins[0]]) if wins.size else None
    return b_star, tok_p, tok_b
