"""``planner.profile``'s list interpolation (what the online controller calls every round) is
``np.interp`` bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.strategy import parse_tree
from planner.profile import _interp, _tokens_table, alpha_from_tokens, expected_tokens

TREES = ("chain:1", "chain:4", "chain:7", "best:16:6", "best:32:8", "full:2x3")


def _np_expected_tokens(tree: str, alpha: float) -> float:
    """``expected_tokens`` as it was: ``np.interp`` on the arrays."""
    if not parse_tree(tree):
        return 1.0
    alphas, tokens = _tokens_table(tree)
    return float(np.interp(min(max(alpha, 0.0), alphas[-1]), alphas, tokens))


def _np_alpha_from_tokens(tree: str, tokens_per_round: float) -> float:
    """``alpha_from_tokens`` as it was: ``np.interp`` on the arrays."""
    if not parse_tree(tree):
        return 0.0
    alphas, tokens = _tokens_table(tree)
    if tokens_per_round <= tokens[0]:
        return 0.0
    if tokens_per_round >= tokens[-1]:
        return 1.0
    return float(np.interp(tokens_per_round, tokens, alphas))


@pytest.mark.parametrize("tree", TREES)
def test_list_interpolation_is_np_interp_bit_for_bit(tree):
    alphas, tokens = _tokens_table(tree)
    rng = np.random.default_rng(7)
    probes = np.concatenate(
        [
            rng.uniform(-0.2, 1.2, 4000),
            rng.uniform(0.5, tokens[-1] + 0.5, 4000),
            alphas, tokens,  # grid points exactly, and their neighbours
            np.nextafter(alphas, 2.0), np.nextafter(tokens, -1.0),
            [0.0, 1.0, -np.inf, np.inf],
        ]
    ).tolist()  # fmt: skip
    for x in probes:
        assert _interp(x, alphas.tolist(), tokens.tolist()) == np.interp(x, alphas, tokens)
        assert _interp(x, tokens.tolist(), alphas.tolist()) == np.interp(x, tokens, alphas)
        assert expected_tokens(tree, x) == _np_expected_tokens(tree, x)
        assert alpha_from_tokens(tree, x) == _np_alpha_from_tokens(tree, x)
    assert np.isnan(_interp(float("nan"), alphas.tolist(), tokens.tolist()))
    assert expected_tokens("chain:0", 0.7) == 1.0 and alpha_from_tokens("chain:0", 2.0) == 0.0
