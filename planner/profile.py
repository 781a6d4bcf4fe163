"""Acceptance and overlap profiles per context regime: what the ranking assumes about prompts.

A profile says, per regime, the per-token acceptance alpha of each drafter kind and the adjacent
selected-block overlap gamma of each traversal order. It comes from engine traces (measured on
sample prompts) or from a JSON file; without one, the ranking uses the ``Workload`` defaults and
labels its figures ``assumed``.

File format (version 1)::

    {"version": 1, "source": "...",
     "regimes": {"16K": {"acceptance": {"eagle": 0.71, "ngram": 0.35},
                         "overlap": {"bfs": 0.68, "dfs": 0.61, "position": 0.74}}, ...}}

A regime missing from the file, or a drafter/traversal missing from a regime, falls back to the
file's ``default`` entry when present, else to the workload defaults.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

from perfmodel.strategy import Workload, parse_tree, tree_expected_tokens

PROFILE_VERSION = 1
REGIMES = {"<=4K": 4096, "8K": 8192, "16K": 16384, "32K": 32768, "64K+": 65536}


def regime_of(context_len: int) -> str:
    """The regime a context falls in (the smallest representative context >= it)."""
    for name, ctx in REGIMES.items():
        if context_len <= ctx:
            return name
    return "64K+"


@dataclass(frozen=True, slots=True)
class Profile:
    """alpha per (regime, drafter kind), gamma per (regime, traversal)."""

    acceptance: dict[str, dict[str, float]] = field(default_factory=dict)
    overlap: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "assumed:workload-defaults"

    def alpha(self, regime: str, drafter: str) -> float:
        for key in (regime, "default"):
            v = self.acceptance.get(key, {}).get(drafter)
            if v is not None:
                return v
        return Workload().acceptance

    def gamma(self, regime: str, traversal: str) -> float:
        for key in (regime, "default"):
            v = self.overlap.get(key, {}).get(traversal)
            if v is not None:
                return v
        return Workload().overlap

    def to_json(self) -> dict:
        regimes = sorted(set(self.acceptance) | set(self.overlap))
        return {
            "version": PROFILE_VERSION,
            "source": self.source,
            "regimes": {
                r: {"acceptance": self.acceptance.get(r, {}), "overlap": self.overlap.get(r, {})}
                for r in regimes
            },
        }


def _check_prob(where: str, v) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{where} must be a number in [0, 1], got {v!r}")
    return float(v)


def load_profile(path: str | Path) -> Profile:
    """Parse and validate a profile file; ``ValueError`` names the bad entry."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"acceptance profile {str(p)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"acceptance profile {str(p)!r} is not valid JSON: {e.msg}") from None
    return profile_from_json(d, f"acceptance profile {str(p)!r}", f"profile:{p.name}")


def profile_from_json(d, where: str = "profile", label: str = "profile") -> Profile:
    """A profile from its JSON document (version 1); ``ValueError`` names the bad entry."""
    if not isinstance(d, dict) or d.get("version") != PROFILE_VERSION:
        raise ValueError(f"{where} must have version {PROFILE_VERSION}")
    acc, ovl = {}, {}
    for regime, entry in (d.get("regimes") or {}).items():
        if regime not in REGIMES and regime != "default":
            raise ValueError(f"profile regime {regime!r} is not one of {', '.join(REGIMES)}")
        acc[regime] = {
            k: _check_prob(f"{regime}.acceptance.{k}", v)
            for k, v in (entry.get("acceptance") or {}).items()
        }
        ovl[regime] = {
            k: _check_prob(f"{regime}.overlap.{k}", v)
            for k, v in (entry.get("overlap") or {}).items()
        }
    return Profile(acc, ovl, f"{label}:{d.get('source', 'unknown')}")


def alpha_from_tokens(tree: str, tokens_per_round: float) -> float:
    """The per-token acceptance that makes ``tree``'s expected tokens per round equal the
    observed mean (the inverse of ``tree_expected_tokens``, monotone in alpha). Clipped to the
    tree's range: 1 token per round -> 0, every node accepted -> 1."""
    parents = parse_tree(tree)
    if not parents:
        return 0.0
    lo, hi = tree_expected_tokens(parents, 0.0), tree_expected_tokens(parents, 1.0 - 1e-9)
    if tokens_per_round <= lo:
        return 0.0
    if tokens_per_round >= hi:
        return 1.0
    return float(
        brentq(
            lambda a: tree_expected_tokens(parents, a) - tokens_per_round,
            0.0,
            1.0 - 1e-9,
            xtol=1e-6,
        )
    )


def profile_from_traces(headers_rounds, strategies: dict) -> Profile:
    """Build a profile from engine traces.

    ``headers_rounds`` is a list of (header, rounds) from ``sim.trace``; ``strategies`` maps a
    trace's strategy id to its ``Strategy``. alpha per (regime, drafter) inverts the mean tokens
    per round of each strategy's tree; gamma per (regime, traversal) is the mean of the rounds'
    per-layer group overlaps.
    """
    acc: dict[str, dict[str, list[float]]] = {}
    ovl: dict[str, dict[str, list[float]]] = {}
    for _, rounds in headers_rounds:
        by_key: dict[tuple[str, str], list] = {}
        for r in rounds:
            s = strategies.get(r["strategy"])
            if s is None or not r.get("drafted"):
                continue
            regime = regime_of(int(r["context_len"]))
            by_key.setdefault((regime, r["strategy"]), []).append(r)
        for (regime, sid), rs in by_key.items():
            s = strategies[sid]
            tokens = float(np.mean([r["accepted"] + 1 for r in rs]))
            acc.setdefault(regime, {}).setdefault(s.drafter.kind, []).append(
                alpha_from_tokens(s.tree, tokens)
            )
            g = [x for r in rs for x in (r.get("group_overlap") or []) if not math.isnan(x)]
            if g:
                ovl.setdefault(regime, {}).setdefault(s.traversal, []).append(float(np.mean(g)))
    return Profile(
        {k: {d: float(np.mean(v)) for d, v in m.items()} for k, m in acc.items()},
        {k: {t: float(np.mean(v)) for t, v in m.items()} for k, m in ovl.items()},
        "measured:engine-traces",
    )
