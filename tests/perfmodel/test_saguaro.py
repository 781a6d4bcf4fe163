import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ssvkit.perfmodel.acceptance import (
    expected_tokens_per_round,
)
from ssvkit.perfmodel.saguaro import (
    cache_hit_probability,
    critical_batch_size,
    geometric_fanout,
    hit_rate_of_fanout,
    integer_fanout,
    ssd_round_time_s,
)
from ssvkit.perfmodel.seed_formulas import (
    saguaro_sampling,
    ssd_speedups,
)


@given(st.floats(1, 512), st.floats(0.05, 0.95), st.floats(0.1, 3.0), st.integers(0, 8))
def test_fanout_sums_to_budget(budget, a, r, k):
    f = geometric_fanout(budget, a, r, k)
    assert f.sum() == pytest.approx(budget)
    assert (f > 0).all()


def test_fanout_is_geometric_with_end_term():
    a, r, k = 0.6, 1.0, 4
    f = geometric_fanout(10.0, a, r, k)
    ratios = f[1:k] / f[: k - 1]
    np.testing.assert_allclose(ratios, a ** (1 / (1 + r)))
    assert f[k] / f[0] == pytest.approx(a ** (k / (1 + r)) * (1 - a) ** (-1 / (1 + r)))


def test_fanout_maximises_hit_probability():
    a, r, h1, k, budget = 0.7, 0.8, 0.4, 3, 12.0
    best = cache_hit_probability(geometric_fanout(budget, a, r, k), a, h1, r)
    rng = np.random.default_rng(0)
    for _ in range(200):
        w = rng.dirichlet(np.ones(k + 1)) * budget
        assert cache_hit_probability(w, a, h1, r) <= best + 1e-12


def test_integer_fanout_keeps_budget():
    f = integer_fanout(13, 0.7, 1.0, 4)
    assert f.sum() == 13 and f.dtype.kind == "i" and (f >= 1).all()


def test_hit_probability_hand_case():
    # K = 1, a = .5: outcomes k=0 (p .5) and k=1 (p .5); F = (1, 4), h1 = .5, r = 1
    h = cache_hit_probability([1, 4], 0.5, 0.5, 1.0)
    assert h == pytest.approx(0.5 * 0.5 + 0.5 * (1 - 0.5 / 4))
    assert hit_rate_of_fanout([0.0], 0.5, 1.0)[0] == 0.0


def test_saguaro_sampling_tradeoff():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(50) * 0.3)
    q = 0.5 * p + 0.5 * rng.dirichlet(np.ones(50) * 0.3)
    acc1, hit1 = saguaro_sampling(p, q, 5, 1.0)
    assert acc1 == pytest.approx(np.minimum(p, q).sum())
    accs, hits = zip(*(saguaro_sampling(p, q, 5, c) for c in (1.0, 0.7, 0.4, 0.1)), strict=False)
    assert all(h2 >= h1 - 1e-12 for h1, h2 in zip(hits, hits[1:], strict=False))
    assert hits[-1] > hits[0]
    assert accs[-1] < accs[0]


def test_ssd_beats_sd_when_it_hits():
    over_sd, over_ar = ssd_speedups(
        verify_s=10e-3,
        draft_step_s=1e-3,
        num_draft_tokens=4,
        acceptance=0.8,
        hit_rate=0.9,
        ar_step_s=9e-3,
    )
    # SD round 14 ms; SSD round 10 + 0.1 * 4 = 10.4 ms
    assert over_sd == pytest.approx(14 / 10.4)
    assert over_ar == pytest.approx(expected_tokens_per_round(0.8, 4) / 10.4e-3 * 9e-3)
    no_hit, _ = ssd_speedups(10e-3, 1e-3, 4, 0.8, 0.0, 9e-3)
    assert no_hit == pytest.approx(1.0)


def test_round_time_whole_batch_waits_for_a_miss():
    t = ssd_round_time_s(10.0, 5.0, 0.9, np.array([1, 10]))
    np.testing.assert_allclose(t, [10 + 0.1 * 5, 10 + (1 - 0.9**10) * 5])


def test_critical_batch_size_switches_where_throughputs_cross():
    b = np.arange(1, 129)
    b_star, tok_p, tok_b = critical_batch_size(
        b,
        verify_s=20e-3,
        hit_rate=0.95,
        acceptance=0.8,
        num_draft_tokens=4,
        primary_draft_s=8e-3,
        backup_draft_s=0.2e-3,
        backup_acceptance=0.3,
    )
    assert b_star is not None
    i = int(b_star) - 1
    assert tok_b[i] >= tok_p[i]
    assert (tok_b[:i] < tok_p[:i]).all()
    never, *_ = critical_batch_size(b, 20e-3, 1.0, 0.8, 4, 8e-3, 0.2e-3, 0.3)
    assert never is None
