"""The online controller's parts on their own: its estimators (``planner.estimators``), the
shadow-walk tracker (``planner.shadow``) and the candidate book (``planner.candidates``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from ssvkit.engine.controller import ShadowAcceptance
from ssvkit.perfmodel.acceptance import expected_tokens_per_round, outcome_probabilities
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens
from ssvkit.planner.candidates import CandidateBook
from ssvkit.planner.estimators import (
    AcceptanceEma,
    ChainRounds,
    CollapseTest,
    SwitchCosts,
    switch_kind,
)
from ssvkit.planner.profile import RegimeProfile
from ssvkit.planner.rank import rank
from ssvkit.planner.shadow import SHADOW_MIN_POSITIONS, ShadowTracker
from ssvkit.planner.space import SpaceSpec, strategy_id

M, G = get_model("llama-3.1-8b"), get_gpu("h100-sxm")


def test_ema_restarts_decays_and_spreads_by_its_effective_rounds():
    ema = AcceptanceEma(0.25)
    ema.add("chain:4", 3.0, restart=True)
    assert (ema.tokens, ema.sq, ema.w2) == (3.0, 9.0, 1.0)
    assert ema.spread("chain:4", 1.645) == (ema.alpha, ema.alpha)  # one round: no variance
    for t in (1.0, 5.0) * 200:  # alternating: variance 4 about the mean 3
        ema.add("chain:4", t, restart=False)
    assert ema.tokens == pytest.approx(3.0, abs=0.3)
    assert ema.w2 == pytest.approx(0.25 / (2 - 0.25))  # sum of squared EMA weights
    assert ema.alpha == alpha_from_tokens("chain:4", ema.tokens)
    lo, hi = ema.spread("chain:4", 2.0)
    half = 2.0 * math.sqrt((ema.sq - ema.tokens**2) * ema.w2)
    assert half == pytest.approx(2.0 * math.sqrt(4.0 * 0.25 / 1.75), rel=0.1)
    assert (lo, hi) == (
        alpha_from_tokens("chain:4", ema.tokens - half),
        alpha_from_tokens("chain:4", ema.tokens + half),
    )
    assert lo < ema.alpha < hi
    assert ema.spread("chain:4", 0.0) == ()
    ema.add("chain:4", 2.0, restart=True)
    assert (ema.tokens, ema.w2) == (2.0, 1.0)


def test_collapse_test_is_walds_ratio_and_resets():
    test = CollapseTest()
    llr = test.observe((0, 4, 1), 4, ref=0.6, epsilon=0.1)
    hits, misses = 0 + 4 + 1, 2  # accepted drafts; rounds stopped by a rejection
    a0, a1 = 0.5, 0.15
    assert (test.hits, test.misses) == (hits, misses)
    assert llr == pytest.approx(hits * math.log(a1 / a0) + misses * math.log((1 - a1) / (1 - a0)))
    # Nothing accepted round after round: past ln 100 within a few rounds.
    test.reset()
    rounds = next(i for i in range(1, 50) if test.observe((0,), 4, 0.6, 0.05) > math.log(100))
    assert rounds <= 8
    # Every draft accepted: the ratio only falls.
    test.reset()
    assert all(test.observe((4,), 4, 0.6, 0.05) < 0 for _ in range(20))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.72, 1.0])
@pytest.mark.parametrize("chain", [1, 4, 7])
def test_chain_prior_is_perfmodels_acceptance(alpha, chain):
    """The prior's distribution of accepted drafts is ``outcome_probabilities``, and its
    tokens per round for every shorter chain perfmodel's ``expected_tokens_per_round``."""
    rounds = ChainRounds("s", chain, 1.0)
    rounds.prior(alpha, 16)
    p = outcome_probabilities(alpha, chain)
    j = np.arange(chain + 1)
    assert rounds.w == rounds.w2 == 16
    assert rounds.m / rounds.w == pytest.approx((j * p).sum(), abs=1e-12)
    assert rounds.mm / rounds.w == pytest.approx((j * j * p).sum(), abs=1e-12)
    for k in range(chain + 1):
        assert rounds.tokens(k) == pytest.approx(expected_tokens_per_round(alpha, k), abs=1e-12)
    # One formula: the prior's sums are the outcome probabilities' own, to the last bit.
    q = p.tolist()
    assert rounds.m == 16 * sum(i * x for i, x in enumerate(q))
    assert rounds.mm == 16 * sum(i * i * x for i, x in enumerate(q))
    for k in range(1, chain):
        assert rounds.x[k - 1] == 16 * sum(min(i, k) * x for i, x in enumerate(q))


def test_chain_rounds_decay_and_truncate():
    rounds = ChainRounds("s", 4, 1.0)
    rounds.add((4, 1), keep=0.5)
    rounds.add((2,), keep=0.5)
    w = 0.5 * 2 + 1  # the first round's two sequences at half weight
    assert rounds.rounds == 2 and rounds.w == w and rounds.w2 == 0.25 * 2 + 1
    assert rounds.tokens(4) == 1 + (0.5 * (4 + 1) + 2) / w
    assert rounds.tokens(1) == 1 + (0.5 * (1 + 1) + 1) / w  # min(m, 1)
    assert rounds.tokens(0) == 1.0
    assert rounds.paired_low(4, 1e-3, 1e-3, 1.645) == pytest.approx(0.0, abs=1e-9)


def test_switch_costs_per_destination_kind():
    ar = Strategy.from_name("ar_dense")
    sd = Strategy.from_name("sd_dense")
    assert switch_kind(ar) == "none" and switch_kind(sd) == sd.drafter.kind
    costs = SwitchCosts({"default": 2e-3})
    assert costs.cost(ar) == costs.cost(sd) == 2e-3
    costs.record(ar, 1e-4)
    assert costs.cost(ar) == 1e-4 and costs.cost(sd) == 2e-3
    assert SwitchCosts(0.0).cost(sd) == 0.0 and SwitchCosts({}).cost(sd) == 0.0
    with pytest.raises(ValueError, match=r"switch_cost_s\['none'\] must be a number >= 0"):
        SwitchCosts({"none": -1.0})


def _sh(positions, matched, walks=(), trees=()):
    return {"ngram": ShadowAcceptance(positions, matched, walks, walks, trees)}


def test_shadow_tracker_decays_counts_and_starts_over_when_the_shadow_changes():
    tracker = ShadowTracker()
    assert "ngram" not in tracker and tracker.alpha("ngram", 2, "chain:2", 1.0, 1.0) is None
    tracker.observe(_sh(4, (2, 1)), tokens=1.0, keep=0.75)
    lens = tracker.lens
    assert "ngram" in tracker and lens == (("ngram", 2, ()),)
    tracker.observe(_sh(4, (2, 1)), tokens=1.0, keep=0.75)
    assert tracker.lens is lens  # the same shadow: the same tuple, for memos keyed on it
    assert tracker.chains["ngram"][:2] == (7.0, [3.5, 1.75])
    assert 7.0 < SHADOW_MIN_POSITIONS and tracker.alpha("ngram", 2, "chain:2", 1.0, 1.0) is None
    tracker.observe(_sh(4, (2, 1)), tokens=1.0, keep=0.75)
    a = tracker.alpha("ngram", 2, "chain:2", 1.0, 1.0)
    assert a == alpha_from_tokens("chain:2", 1 + 3 / 4)  # 9.25 positions, 0.75 matched each
    assert tracker.alpha("ngram", 2, "chain:2", 0.5, 1.0) == pytest.approx(a * 0.5)
    assert tracker.alpha("ngram", 2, "chain:2", 1.0, 1.0, z=1.645) < a
    assert tracker.alpha("ngram", 3, "chain:3", 1.0, 1.0) is None  # not shadowed
    # Three chain lengths now, walked: a new shadow, counted from scratch.
    tracker.observe(_sh(4, (2, 1, 0), (2, 3, 3)), tokens=1.0, keep=0.5)
    assert tracker.lens is not lens and tracker.chains["ngram"][0] == 4.0
    assert tracker.walk_rounds("ngram", 2) == 3.0 and tracker.walk_rounds("ngram", "x") is None


def test_shadow_tracker_walks_trees_and_pairs_them_with_the_committed_tokens():
    tracker = ShadowTracker()
    tree = ("full:2x4", 1, 3, 9)
    for _ in range(20):
        tracker.observe(_sh(2, (1, 0), (1, 1), (tree,)), tokens=2.0, keep=0.9)
    assert tracker.lens == (("ngram", 2, ("full:2x4",)),)
    r, d, sq = tracker.walks["ngram"]["full:2x4"]
    assert d == pytest.approx(3 * r) and sq == pytest.approx(9 * r)  # three drafts a round
    walked = alpha_from_tokens("full:2x4", 1.0 + d / r)
    assert tracker.alpha("ngram", 0, "full:2x4", 1.0, 1.0) == walked
    pair = tracker.pairs["ngram"]
    assert pair.n / pair.w == pytest.approx(2.0) and set(pair.rr) == {1, 2, "full:2x4"}
    high, raw, n = tracker.walk_high("ngram", 0, "full:2x4", 1.645)
    assert high == pytest.approx(1.0) and n == pytest.approx(2.0)  # one round each, no spread
    assert raw == walked


def test_candidate_book_memoises_by_identity_and_lists_truncations():
    space = SpaceSpec(
        drafters=("eagle",), modes=("dense",), trees=("chain:0", "chain:2", "chain:6")
    )
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    book = CandidateBook(doc, M, G, prof, batch=1, num_candidates=1)
    cands = book.candidates("32K")
    assert {c.tree for c in cands.values()} == {"chain:0", "chain:2", "chain:6"}
    six = next(c for c in cands.values() if c.tree == "chain:6")
    copy = dataclasses.replace(six)
    assert book.known(six) is book.known(six) and book.known(copy) is book.known(six)
    assert book.sid(copy) == strategy_id(six) and book.known(six).chain == 6
    rows = book.rows("32K", six)
    assert [r[0] for r in rows] == list(cands)
    now = book.now(six, 30000, ())
    assert (now.regime, now.lo, now.hi) == ("32K", 16384, 32768)
    trunc, round_now = book.trunc_rows(now, "32K")
    assert {c.tree for _, c, _, _ in trunc} == {"chain:0", "chain:2"}  # not chain:6 itself
    assert round_now == book.round_s("32K", [six])[strategy_id(six)]
    assert book.trunc_rows(now, "32K") is now.trunc  # memoised on ``now``
