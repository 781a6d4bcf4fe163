"""The decode loop's host time per round that the step model does not count: the loop's Python
work, host-side drafting and the acceptance walk, launches outside graphs.

It is linear in a few features of the strategy (``overhead_features``), one coefficient per
term of ``OVERHEAD_TERMS`` (seconds per unit of the feature); ``host_overhead_s`` prices one
round from a set of coefficients. The coefficients are measured, not modelled: the engine's
round times minus the step model's are fitted on the features by
``calibration.host_overhead_fit.fit_overhead``, per context regime, and the planner's profile
holds them. No coefficients price a round at 0 (the step model alone).
"""

from __future__ import annotations

import math

import numpy as np
from ssvkit.perfmodel.strategy import Strategy, parse_tree, tree_depth

# Host time per round = sum of coefficient x feature (``overhead_features``).
OVERHEAD_TERMS = (
    "round",
    "speculative",
    "draft_model",
    "node",
    "draft_level",
    "sparse",
    "host_node",
)


def overhead_features(s: Strategy) -> np.ndarray:
    """The features of ``OVERHEAD_TERMS`` for a strategy: 1 per round, 1 when it drafts at all
    (an autoregressive round has no drafting, tree or acceptance work on the host), 1 when a
    draft model drafts, tree nodes, draft levels (tree depth) of a draft model, 1 for sparse
    attention, and tree nodes of an n-gram drafter (whose lookups run on the host).

    The last term keeps apart two costs that one node term confounds. The engine's step times
    show a draft model's drafting growing with the tree's depth (one draft forward per level,
    ~45 us per level beyond the step model), whatever the number of nodes, while an n-gram
    drafter's host lookups grow with the nodes (~25 us each); the acceptance walk grows with the
    nodes for both. One node term charges a draft model's levels to its nodes, so it prices
    chains of a draft model too cheap and its branching trees too dear."""
    parents = parse_tree(s.tree)
    depth = tree_depth(parents)
    spec = float(len(parents) > 0)
    dm = float(s.drafter.kind == "draft_model") * spec
    nodes = float(len(parents))
    host = float(s.drafter.kind == "ngram") * nodes
    return np.array([1.0, spec, dm, nodes, depth * dm, float(s.is_sparse), host])


def host_overhead_s(coefficients: dict[str, float], s: Strategy) -> float:
    """Host seconds of one round of ``s``: ``overhead_features(s)`` weighted by
    ``coefficients`` (term -> seconds per unit; a missing term counts 0, no terms price 0)."""
    if not coefficients:
        return 0.0
    w = np.array([coefficients.get(t, 0.0) for t in OVERHEAD_TERMS])
    return float(overhead_features(s) @ w)


def check_overhead(where: str, table: dict) -> dict[str, float]:
    """Coefficients read from a file, checked; ``ValueError`` names the bad entry (``where``
    prefixes it, e.g. ``16K.overhead``). Every term is a known one and a finite number >= 0,
    except ``speculative``: the difference between a drafting round's intercept and an
    autoregressive one's (``fit_overhead``), which may be negative as long as no round's
    overhead is (``round + speculative >= 0``)."""
    bad = [k for k in table if k not in OVERHEAD_TERMS]
    if bad:
        raise ValueError(f"{where}.{bad[0]} is not one of {', '.join(OVERHEAD_TERMS)}")
    out = {}
    for k, v in table.items():
        number = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if k == "speculative" and not number:
            raise ValueError(f"{where}.{k} must be a finite number, got {v!r}")
        if k != "speculative" and not (number and v >= 0):
            raise ValueError(f"{where}.{k} must be a finite number >= 0, got {v!r}")
        out[k] = float(v)
    if out.get("round", 0.0) + out.get("speculative", 0.0) < 0:
        raise ValueError(
            f"{where}: round + speculative must be >= 0, got "
            f"{out.get('round', 0.0)!r} + {out.get('speculative', 0.0)!r}"
        )
    return out
