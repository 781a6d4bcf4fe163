"""Expected tokens per round of a tree spec (``chain:4``, ``parents:...``) and its inverse, the
per-token acceptance that a measured tokens per round implies, fast enough to call per decode
round.

Both read one cached grid per tree: ``tree_expected_tokens`` at 513 evenly spaced acceptances
in [0, 1), strictly increasing, so either direction is one linear interpolation (within 1e-5
of the exact value or root). A root search costs 0.3-0.5 ms per call, which a 1 ms decode round
cannot afford; the online controller interpolates a few times per round and once per candidate
per re-score. The interpolation runs on Python lists (``_interp``), bit for bit what
``np.interp`` gives, at a third of its cost for one scalar.
"""

from __future__ import annotations

import functools
from bisect import bisect_right

import numpy as np
from ssvkit.perfmodel.strategy import parse_tree, tree_expected_tokens

GRID_POINTS = 513


@functools.lru_cache(maxsize=256)
def tokens_grid(tree: str) -> tuple[np.ndarray, np.ndarray]:
    """Acceptances and ``tree``'s expected tokens per round at each (strictly increasing)."""
    parents = parse_tree(tree)
    alphas = np.linspace(0.0, 1.0 - 1e-9, GRID_POINTS)
    return alphas, np.array([tree_expected_tokens(parents, a) for a in alphas])


@functools.lru_cache(maxsize=256)
def _grid_lists(tree: str) -> tuple[list[float], list[float]] | None:
    """``tokens_grid`` as lists (None for a tree that drafts nothing)."""
    if not parse_tree(tree):
        return None
    alphas, tokens = tokens_grid(tree)
    return alphas.tolist(), tokens.tolist()


def _interp(x: float, xp: list[float], fp: list[float]) -> float:
    """``np.interp(x, xp, fp)`` of one scalar, bit for bit, for strictly increasing finite
    ``xp``: numpy's ``arr_interp`` takes ``fp[0]`` left of the grid, ``fp[-1]`` from its last
    point on, ``fp[j]`` where ``x == xp[j]``, else ``slope * (x - xp[j]) + fp[j]`` with
    ``slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])`` on the bracketing interval."""
    if x != x:  # NaN
        return x
    if x < xp[0]:
        return fp[0]
    if x >= xp[-1]:
        return fp[-1]
    j = bisect_right(xp, x) - 1
    if xp[j] == x:
        return fp[j]
    return (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]) * (x - xp[j]) + fp[j]


def expected_tokens_interp(tree: str, alpha: float) -> float:
    """``tree_expected_tokens`` of the tree spec ``tree`` at ``alpha``, interpolated on its
    grid (within 1e-5 of it; alpha clipped to the grid); 1 for a tree that drafts nothing."""
    grid = _grid_lists(tree)
    if grid is None:
        return 1.0
    alphas, tokens = grid
    return float(_interp(min(max(alpha, 0.0), alphas[-1]), alphas, tokens))


def alpha_from_tokens(tree: str, tokens_per_round: float) -> float:
    """The per-token acceptance that makes ``tree``'s expected tokens per round equal the
    observed mean (the inverse of ``tree_expected_tokens``, monotone in alpha; interpolated on
    its grid, within 1e-5 of the root). Clipped to the tree's range: 1 token per round -> 0,
    every node accepted -> 1; 0 for a tree that drafts nothing."""
    grid = _grid_lists(tree)
    if grid is None:
        return 0.0
    alphas, tokens = grid
    if tokens_per_round <= tokens[0]:
        return 0.0
    if tokens_per_round >= tokens[-1]:
        return 1.0
    return float(_interp(tokens_per_round, tokens, alphas))
