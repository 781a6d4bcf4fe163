import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ssvkit.perfmodel.acceptance import (
    TreeAcceptance,
    best_tree,
    chain_parents,
    expected_tokens_per_round,
    expected_tokens_positional,
    expected_tokens_tree,
    outcome_probabilities,
    tree_level_sizes,
)


def test_chain_reference_value():
    # 1 + .8 + .64 + .512 + .4096
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)


def test_chain_edges():
    assert expected_tokens_per_round(0.0, 5) == 1.0
    assert expected_tokens_per_round(1.0, 5) == 6.0
    assert expected_tokens_per_round(0.5, 0) == 1.0


def test_chain_vectorised():
    out = expected_tokens_per_round(np.array([0.5, 0.8]), np.array([1, 4]))
    np.testing.assert_allclose(out, [1.5, 3.3616])


def test_positional_matches_iid_and_hand_case():
    assert expected_tokens_positional([0.8] * 4) == pytest.approx(3.3616)
    # 1 + .9 + .9*.5 + .9*.5*.2
    assert expected_tokens_positional([0.9, 0.5, 0.2]) == pytest.approx(2.44)


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_acceptance_range_is_checked(bad):
    with pytest.raises(ValueError, match="acceptance"):
        expected_tokens_per_round(bad, 4)


def test_outcome_probabilities_sum_to_one():
    p = outcome_probabilities(0.7, 5)
    assert p.sum() == pytest.approx(1.0)
    assert p[-1] == pytest.approx(0.7**5)
    assert p[0] == pytest.approx(0.3)
    # Each probability is a scalar power, bit for bit, whatever numpy's vectorised power gives.
    for a in (0.0, 0.13, 0.6, 0.97, 1.0):
        for k in (0, 1, 4, 9):
            want = [a**j * (1.0 - a) for j in range(k)] + [a**k]
            assert outcome_probabilities(a, k).tolist() == want
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 0, got -1"):
        outcome_probabilities(0.5, -1)


@given(st.floats(0, 1), st.floats(0, 1), st.integers(0, 12), st.integers(0, 12))
def test_expected_tokens_monotone_and_bounded(a1, a2, k1, k2):
    lo_a, hi_a = sorted((a1, a2))
    lo_k, hi_k = sorted((k1, k2))
    e = expected_tokens_per_round
    assert e(lo_a, hi_k) <= e(hi_a, hi_k) + 1e-12
    assert e(hi_a, lo_k) <= e(hi_a, hi_k) + 1e-12
    assert 1.0 <= e(hi_a, hi_k) <= hi_k + 1 + 1e-12


def test_tree_hand_case():
    # root children: rank0 p=.6, rank1 p=.3; node 2 is the rank-0 child of node 0 (p .6).
    acc = TreeAcceptance(((0.6, 0.3),))
    assert expected_tokens_tree([-1, -1, 0], acc) == pytest.approx(1 + 0.6 + 0.3 + 0.36)


def test_tree_chain_equals_chain_formula():
    acc = TreeAcceptance.from_alpha(0.8, 1)
    assert expected_tokens_tree(chain_parents(4), acc) == pytest.approx(3.3616)


def test_tree_acceptance_rejects_impossible_rows():
    with pytest.raises(ValueError, match="sums to"):
        TreeAcceptance(((0.8, 0.5),))


def _brute_best(n, acc):
    best = 1.0
    for parents in itertools.product(*[range(-1, i) for i in range(n)]):
        best = max(best, expected_tokens_tree(list(parents), acc))
    return best


@pytest.mark.parametrize("table", [((0.7, 0.2, 0.05),), ((0.5, 0.3), (0.9, 0.05))])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_best_tree_is_optimal(table, n):
    acc = TreeAcceptance(table)
    tree = best_tree(n, acc)
    assert len(tree.parents) <= n
    assert tree.expected_tokens == pytest.approx(expected_tokens_tree(list(tree.parents), acc))
    assert tree.expected_tokens == pytest.approx(_brute_best(n, acc))


def test_best_tree_respects_depth_and_degenerates_to_chain():
    acc = TreeAcceptance.from_alpha(0.9, 3)
    t = best_tree(12, acc, max_depth=2)
    assert len(tree_level_sizes(list(t.parents))) <= 2
    chain = best_tree(4, TreeAcceptance.from_alpha(0.8, 1))
    assert chain.parents == (-1, 0, 1, 2)
