"""Acceptance models: expected tokens produced per verification round.

Every count here includes the bonus token: a round always yields at least one token (the
target's own sample at the first rejected position, or after the last draft if all are
accepted). Sources: seed 000 "Prerequisites" (E[accepted] = sum_k prod_i alpha_i), seed 002
(acceptance of a chain as the probability of each verification outcome), and Sequoia's positional
tree-acceptance model (Chen et al., 2024) for trees and the best tree for a node budget.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


def _check_prob(name: str, p) -> None:
    a = np.asarray(p, dtype=float)
    if np.isnan(a).any() or (a < 0).any() or (a > 1).any():
        raise ValueError(f"{name} must lie in [0, 1], got {p!r}")


def expected_tokens_per_round(alpha, num_draft_tokens):
    """Expected tokens per round of a chain of K drafts with iid acceptance alpha.

    ``E = sum_{i=0}^{K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha)``: draft i is reached only if
    drafts 1..i-1 were accepted, and the bonus token adds the i = 0 term (seed 000, E[accepted]
    with alpha_i = alpha, plus one). alpha = 0.8, K = 4 gives 3.3616. Vectorised over both
    arguments. Assumes independence across positions; ignores EOS and length limits.
    """
    _check_prob("acceptance", alpha)
    a = np.asarray(alpha, dtype=float)
    k = np.asarray(num_draft_tokens)
    if (k < 0).any():
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens!r}")
    one = np.isclose(a, 1.0)
    safe = np.where(one, 0.5, a)
    out = np.where(one, k + 1.0, (1.0 - safe ** (k + 1.0)) / (1.0 - safe))
    return float(out) if out.ndim == 0 else out


def expected_tokens_positional(alphas) -> float:
    """Expected tokens per round for a chain with a positional acceptance vector.

    ``E = 1 + sum_{k=1}^{K} prod_{i<=k} alpha_i`` where alpha_i is the probability that draft i
    is accepted given drafts 1..i-1 were (seed 000 eq. for E[accepted], plus the bonus token).
    """
    a = np.asarray(alphas, dtype=float)
    _check_prob("acceptance vector", a)
    return float(1.0 + np.cumprod(a).sum()) if a.size else 1.0


def outcome_probabilities(alpha: float, num_draft_tokens: int) -> np.ndarray:
    """P(exactly k drafts accepted), k = 0..K, for a chain with iid alpha (seed 002: the
    verification outcomes the speculation cache is keyed on): alpha^k (1 - alpha) for k < K and
    alpha^K for k = K.

    Each power is Python's scalar ``pow`` (the C library's), not numpy's vectorised power,
    which may differ from it in the last bit by build and CPU: the online controller's priors
    (``planner.estimators.ChainRounds``) read these probabilities too, and their decisions
    replay bit for bit only when every caller sees the same values."""
    _check_prob("acceptance", alpha)
    if num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens!r}")
    a, k = float(alpha), int(num_draft_tokens)
    return np.array([a**j * (1.0 - a) for j in range(k)] + [a**k])


def sibling_acceptance(alpha: float, num_ranks: int) -> np.ndarray:
    """Per-sibling-rank acceptance from a scalar alpha: p_r = alpha (1 - alpha)^(r-1).

    p_r is the probability that the target's token equals the draft's r-th ranked candidate
    given the parent was accepted. The geometric decay is a modelling assumption used only when
    no measured per-rank vector is given: the ranks are disjoint events, so sum_r p_r =
    1 - (1 - alpha)^R <= 1, and rank 1 reproduces the chain's alpha.
    """
    _check_prob("acceptance", alpha)
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    r = np.arange(num_ranks)
    return alpha * (1.0 - alpha) ** r


@dataclass(frozen=True, slots=True)
class TreeAcceptance:
    """Acceptance of tree nodes by depth and sibling rank (Sequoia's positional model).

    ``table[d][r]`` is the probability that the rank-r child (0-based) of an accepted node at
    depth d is accepted; rows past the table's depth reuse its last row.
    """

    table: tuple[tuple[float, ...], ...] = field(metadata={"help": "[depth][rank] acceptance"})

    def __post_init__(self) -> None:
        if not self.table or not all(self.table):
            raise ValueError("TreeAcceptance.table must be a non-empty [depth][rank] table")
        for row in self.table:
            _check_prob("tree acceptance", row)
            if sum(row) > 1 + 1e-9:
                raise ValueError(
                    f"tree acceptance ranks are disjoint events; a row sums to {sum(row):.3f} > 1"
                )

    @classmethod
    def from_alpha(cls, alpha: float, num_ranks: int = 4) -> TreeAcceptance:
        """Depth-independent table from a scalar alpha via ``sibling_acceptance``."""
        return cls((tuple(sibling_acceptance(alpha, num_ranks)),))

    def p(self, depth: int, rank: int) -> float:
        row = self.table[min(depth, len(self.table) - 1)]
        return row[rank] if rank < len(row) else 0.0

    @property
    def num_ranks(self) -> int:
        return max(len(r) for r in self.table)


def node_depths_ranks(parents: list[int]) -> tuple[list[int], list[int]]:
    """Depth (1 = child of the root) and sibling rank (0-based, by index order) of each node."""
    depth, rank, seen = [], [], {}
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}]={p} must satisfy -1 <= parent < {i}")
        depth.append(1 if p < 0 else depth[p] + 1)
        rank.append(seen.get(p, 0))
        seen[p] = rank[-1] + 1
    return depth, rank


def expected_tokens_tree(parents: list[int], acc: TreeAcceptance) -> float:
    """Expected tokens per round for a draft tree (node -> parent, -1 = the root).

    ``E = 1 + sum_nodes prod_{v on the root path} p(depth(v) - 1, rank(v))``: a node contributes
    one token exactly when it and all its ancestors are accepted; the 1 is the bonus token
    (Sequoia, eq. for the expected number of generated tokens). Ranks are assigned in index
    order among siblings. Assumes acceptance depends only on (depth, rank).
    """
    depth, rank = node_depths_ranks(parents)
    reach = []
    for i, p in enumerate(parents):
        pi = acc.p(depth[i] - 1, rank[i])
        reach.append(pi if p < 0 else reach[p] * pi)
    return 1.0 + float(sum(reach))


def full_depth_probability(parents: list[int], acc: TreeAcceptance) -> float:
    """Probability that a round's kept path reaches the tree's deepest level: the sum of the
    reach probabilities (``expected_tokens_tree``) of the nodes at the maximum depth, which are
    disjoint events (one path is kept). A draft model that expands level by level never runs
    such a leaf through its own forward, so the next round catches it up first
    (``engine.draft_model``); 0 for an empty tree."""
    if not parents:
        return 0.0
    depth, rank = node_depths_ranks(parents)
    deepest = max(depth)
    reach = []
    for i, p in enumerate(parents):
        pi = acc.p(depth[i] - 1, rank[i])
        reach.append(pi if p < 0 else reach[p] * pi)
    return float(sum(r for r, d in zip(reach, depth, strict=True) if d == deepest))


@dataclass(frozen=True, slots=True)
class BestTree:
    parents: tuple[int, ...]
    expected_tokens: float


def best_tree(num_nodes: int, acc: TreeAcceptance, max_depth: int | None = None) -> BestTree:
    """The tree of ``num_nodes`` draft nodes that maximises expected tokens (Sequoia's DP).

    ``V(d, n)`` is the best value of a subtree with n nodes whose root sits at depth d:
    ``V(d, n) = 1 + G(d + 1, 0, n - 1)``, and ``G(d, r, m)`` distributes m nodes over the
    children of ranks r, r+1, ... at depth d: stop, or give rank r a subtree of j nodes worth
    ``p(d - 1, r) V(d, j)``; stopping keeps sibling ranks contiguous. Exact for acceptance that
    depends on (depth, rank) only; cost O(max_depth * ranks * n^2). Returns the parents in
    BFS-by-depth order.
    """
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    max_depth = num_nodes if max_depth is None else max_depth
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    ranks = acc.num_ranks

    @functools.cache
    def value(d: int, n: int) -> float:  # subtree rooted at depth d with n nodes (root incl.)
        if n <= 0:
            return 0.0
        return 1.0 + (children(d + 1, 0, n - 1)[0] if d < max_depth else 0.0)

    @functools.cache
    def children(d: int, r: int, m: int) -> tuple[float, tuple[int, ...]]:
        # -> (value, sizes of the subtrees of ranks r, r+1, ...)
        if m <= 0 or r >= ranks or d > max_depth:
            return 0.0, ()
        # Stopping here keeps sibling ranks contiguous, so ranks stay the index order.
        best_v, best_sizes = 0.0, ()
        p = acc.p(d - 1, r)
        if p > 0:
            for j in range(1, m + 1):
                rest_v, rest_sizes = children(d, r + 1, m - j)
                v = p * value(d, j) + rest_v
                if v > best_v + 1e-15:
                    best_v, best_sizes = v, (j, *rest_sizes)
        return best_v, best_sizes

    if max_depth == 0 or num_nodes == 0:
        return BestTree((), 1.0)
    # Rebuild the tree top-down, level by level, from the DP's chosen subtree sizes.
    parents: list[int] = []
    level = [(-1, 1, num_nodes)]  # (node id, depth of its children, nodes below it)
    while level:
        nxt = []
        for node, d, m in level:
            if d > max_depth:
                continue
            for size in children(d, 0, m)[1]:
                if size:
                    parents.append(node)
                    nxt.append((len(parents) - 1, d + 1, size - 1))
        level = nxt
    e = 1.0 + children(1, 0, num_nodes)[0]
    return BestTree(tuple(parents), float(e))


def chain_parents(num_draft_tokens: int) -> list[int]:
    """Parents of a chain of K drafts."""
    return list(range(-1, num_draft_tokens - 1))


def full_tree_parents(branching: int, depth: int) -> list[int]:
    """Parents of a full ``branching``-ary tree of ``depth`` levels, in BFS order."""
    if branching < 1 or depth < 1:
        raise ValueError(f"branching and depth must be >= 1, got {branching}, {depth}")
    parents: list[int] = []
    level = [-1]
    for _ in range(depth):
        nxt = []
        for p in level:
            for _ in range(branching):
                parents.append(p)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def tree_level_sizes(parents: list[int]) -> list[int]:
    """Number of nodes per depth (the M of each drafting forward pass)."""
    depth, _ = node_depths_ranks(parents)
    if not depth:
        return []
    return [depth.count(d) for d in range(1, max(depth) + 1)]
