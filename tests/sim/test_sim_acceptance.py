import numpy as np
import pytest
from ssvkit.perfmodel.acceptance import (
    TreeAcceptance,
    expected_tokens_positional,
    expected_tokens_tree,
)
from ssvkit.perfmodel.strategy import parse_tree, tree_expected_tokens
from ssvkit.sim.acceptance import build_acceptance, outcome_distribution


@pytest.mark.parametrize("tree", ["chain:1", "chain:6", "full:2x3", "best:16:6", "best:32:8"])
@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.95])
def test_iid_mean_is_perfmodels_expected_tokens(tree, alpha):
    parents = parse_tree(tree, alpha)
    acc = build_acceptance("iid", parents, alpha)
    assert acc.probs.sum() == pytest.approx(1.0)
    assert acc.expected_tokens() == pytest.approx(tree_expected_tokens(parents, alpha), rel=1e-12)


def test_positional_and_tree_tables():
    chain = parse_tree("chain:4")
    pos = build_acceptance("positional", chain, 0.7, "0.9,0.8,0.6")
    assert pos.expected_tokens() == pytest.approx(expected_tokens_positional([0.9, 0.8, 0.6, 0.6]))
    tree = parse_tree("full:2x2")
    table = TreeAcceptance(((0.6, 0.3), (0.5, 0.2)))
    t = build_acceptance("tree", tree, 0.7, "0.6,0.3;0.5,0.2")
    assert t.expected_tokens() == pytest.approx(expected_tokens_tree(list(tree), table))


def test_outcome_distribution_hand_case():
    # chain of 2 with alpha .5: P(0)=.5, P(1)=.25, P(2)=.25
    p = outcome_distribution([-1, 0], TreeAcceptance(((0.5,),)))
    np.testing.assert_allclose(p, [0.5, 0.25, 0.25])


def test_sampler_matches_distribution_and_seed():
    acc = build_acceptance("iid", parse_tree("chain:4"), 0.7)
    draw = acc.sampler(np.random.default_rng(3))
    x = np.array([draw() for _ in range(40000)])
    freq = np.bincount(x, minlength=5) / x.size
    np.testing.assert_allclose(freq, acc.probs, atol=0.01)
    again = acc.sampler(np.random.default_rng(3))
    assert [again() for _ in range(100)] == x[:100].tolist()


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="not a list of numbers"):
        build_acceptance("positional", parse_tree("chain:2"), 0.7, "0.9,x")
    with pytest.raises(ValueError, match="sums to"):
        build_acceptance("tree", parse_tree("full:2x1"), 0.7, "0.7,0.5")
