"""The shadow tracker on a sample of the batch (``planner.shadow``): a walk read per sampled
sequence, intervals widened by the share of the sequences' spread the sample leaves out (by
hand on three sequences), none where that spread cannot be measured, and the full batch's
intervals unchanged."""

from __future__ import annotations

import math

import pytest
from ssvkit.engine.controller import SequenceWalks, ShadowAcceptance
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.shadow import ShadowTracker, t_for_z

TREE = "full:2x2"
Z = 1.645


def _round(per_seq, sampled: bool = True):
    """One round of sequences whose chain:1 walk took one round and whose tree walk took one
    round accepting ``a`` drafts, per ``a`` of ``per_seq`` (None: the sequence did not
    advance): summed, with each one beside when ``sampled``."""
    live = [a for a in per_seq if a is not None]
    n = len(live)
    sh = dict(
        positions=n,
        matched=(sum(1 for a in live if a),),
        rounds=(n,),
        drafts=(sum(min(a, 1) for a in live),),
        trees=((TREE, n, sum(live), sum(a * a for a in live)),),
    )
    if sampled:
        sh["sequences"] = n
        sh["by_sequence"] = tuple(
            SequenceWalks(0, (0, 0), (0, 0))
            if a is None
            else SequenceWalks(1, (1, 1), (min(a, 1), a))
            for a in per_seq
        )
    return {"ngram": ShadowAcceptance(**sh)}


def test_a_sampled_walks_interval_holds_the_sequences_spread_by_hand():
    """Three sampled sequences of twelve accept 2, 0 and 1 drafts of the tree every round (keep
    1: plain sums over n = 10 rounds). Rounds' variance: 5/3 - 1 per round over 3n rounds;
    cluster variance of the ratio: 3/2 (n^2 + n^2 + 0) / (3n)^2 = 1/3; the interval takes the
    first plus 3/4 of the excess, at Student's t of 2 degrees of freedom."""
    t = ShadowTracker()
    for _ in range(10):
        t.observe(_round([2, 0, 1]), tokens=1.0, keep=1.0, sequences=12)
    within = (5 / 3 - 1) / 30
    var = within + 0.75 * (1 / 3 - within) * (t_for_z(Z, 2) / Z) ** 2
    mean, err = t.accepted("ngram", 0, TREE, Z)
    assert mean == pytest.approx(1.0) and err == pytest.approx(Z * math.sqrt(var), rel=1e-12)
    assert t_for_z(Z, 2) == pytest.approx(2.92, abs=0.01)
    # The paired walk reads rounds per sampled sequence (3 a round), not per the batch's 12,
    # and every sequence walks one round a round: no spread, so no widening.
    high, _, n = t.walk_high("ngram", 1, "chain:1", Z)
    assert high == pytest.approx(1.0) and n == pytest.approx(1.0)
    # The same counts taken as the whole batch: the rounds' variance alone.
    full = ShadowTracker()
    for _ in range(10):
        full.observe(_round([2, 0, 1], sampled=False), tokens=1.0, keep=1.0, sequences=3)
    assert full.accepted("ngram", 0, TREE, Z)[1] == pytest.approx(Z * math.sqrt(within))
    assert "ngram" not in full.spread and full.share["ngram"] == 1.0


@pytest.mark.parametrize("z", [0.5, 1.0, 1.645, 1.96, 2.576])
def test_t_for_z_is_students_quantile(z):
    from scipy.stats import norm, t

    for dof in range(1, 40):
        assert t_for_z(z, dof) == pytest.approx(t.ppf(norm.cdf(z), dof), rel=1e-9), dof
    with pytest.raises(ValueError, match="dof must be >= 1, got 0"):
        t_for_z(z, 0)


def test_a_sample_that_cannot_measure_its_spread_gives_no_interval():
    # two of three sequences done: one live sequence, no spread to measure
    t = ShadowTracker()
    for _ in range(20):
        t.observe(_round([2, None, None]), tokens=1.0, keep=1.0, sequences=12)
    assert t.accepted("ngram", 0, TREE, 0.0) == (2.0, 0.0)  # the point estimate stands
    assert t.accepted("ngram", 0, TREE, Z) is None
    assert t.alpha("ngram", 0, TREE, 1.0, 1.0, Z) is None
    assert t.walk_high("ngram", 1, "chain:1", Z) is None
    # a sample without its sequences' walks: nothing to measure the spread on
    bare = ShadowTracker()
    sh = ShadowAcceptance(4, (2,), (4,), (2,), ((TREE, 4, 4, 8),), sequences=4)
    for _ in range(5):
        bare.observe({"ngram": sh}, tokens=1.0, keep=1.0, sequences=16)
    assert bare.accepted("ngram", 0, TREE, 0.0) == (1.0, 0.0)
    assert bare.accepted("ngram", 0, TREE, Z) is None


def test_a_round_none_of_the_sample_advanced_in_is_skipped():
    t = ShadowTracker()
    for _ in range(10):
        t.observe(_round([2, 0, 1]), tokens=1.0, keep=0.5, sequences=12)
    before = (t.walks["ngram"][TREE][:], t.pairs["ngram"].w, t.spread["ngram"].sums.copy())
    t.observe(_round([None, None, None]), tokens=1.0, keep=0.5, sequences=12)
    assert t.walks["ngram"][TREE] == before[0] and t.pairs["ngram"].w == before[1]
    assert (t.spread["ngram"].sums == before[2]).all()


def test_the_sample_is_a_controller_setting():
    assert ControllerConfig().shadow_sequences == 8
    assert ControllerConfig(shadow_sequences=0).shadow_sequences == 0
    with pytest.raises(ValueError, match="shadow_sequences must be 0 .all. or >= 2.*got 1"):
        ControllerConfig(shadow_sequences=1)
