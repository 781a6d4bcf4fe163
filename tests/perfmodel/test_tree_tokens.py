"""A tree spec's expected tokens per round and its inverse by interpolation
(``perfmodel.tree_tokens``), and a chain's length (``perfmodel.strategy.chain_length``)."""

import numpy as np
import pytest
from ssvkit.perfmodel.strategy import chain_length, parse_tree, tree_expected_tokens
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens, expected_tokens_interp, tokens_grid


@pytest.mark.parametrize("tree", ["chain:1", "chain:4", "full:2x3", "best:16:6"])
def test_interpolation_is_within_1e5_of_the_exact_tokens_and_inverts_them(tree):
    parents = parse_tree(tree)
    for a in (0.0, 0.05, 0.2, 0.55, 0.85, 0.999):
        exact = tree_expected_tokens(parents, a)
        assert expected_tokens_interp(tree, a) == pytest.approx(exact, abs=1e-5)
        if a < 0.9:  # near 1 a branching tree's tokens barely move with alpha
            assert alpha_from_tokens(tree, exact) == pytest.approx(a, abs=1e-5)
    # alpha past 1 is clipped to the grid's end; tokens past the tree's range to 0 and 1
    top = tree_expected_tokens(parents, 1.0 - 1e-9)
    assert expected_tokens_interp(tree, 1.5) == pytest.approx(top, abs=1e-9)
    assert expected_tokens_interp(tree, -0.5) == 1.0
    assert alpha_from_tokens(tree, 0.5) == 0.0 and alpha_from_tokens(tree, 1.0) == 0.0
    assert alpha_from_tokens(tree, len(parents) + 2.0) == 1.0


def test_a_chain_of_k_reads_its_closed_form():
    # chain of 4 at alpha 0.8: 1 + 0.8 + 0.64 + 0.512 + 0.4096
    assert expected_tokens_interp("chain:4", 0.8) == pytest.approx(3.3616, abs=1e-5)
    assert alpha_from_tokens("chain:4", 3.3616) == pytest.approx(0.8, abs=1e-5)
    assert alpha_from_tokens("chain:2", 1.75) == pytest.approx(0.5, abs=1e-5)  # 1 + a + a^2


def test_trees_that_draft_nothing_and_the_grid():
    assert expected_tokens_interp("chain:0", 0.7) == 1.0
    assert alpha_from_tokens("chain:0", 2.0) == 0.0
    alphas, tokens = tokens_grid("chain:3")
    assert alphas[0] == 0.0 and alphas[-1] < 1.0 and tokens[0] == 1.0
    assert (np.diff(alphas) > 0).all() and (np.diff(tokens) > 0).all()


def test_chain_length():
    got = [chain_length(t) for t in ("chain:0", "chain:1", "chain:7", "best:8:4", "full:1x3")]
    assert got == [0, 1, 7, 0, 3]
    assert chain_length("parents:-1,0,0") == 0
