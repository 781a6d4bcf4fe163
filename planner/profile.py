"""Acceptance and overlap profiles per context regime (``RegimeProfile``): what the ranking
assumes about prompts.

Per regime a profile holds the acceptance alpha of each drafter kind (or drafter on one tree),
the factor sparse verification puts on it and the selected-block overlap of each traversal
order (``RegimeProfile`` says how each is keyed and looked up). The decode loop's host time per
round is not a profile's: the step model prices it for the GPU host (``perfmodel.loop_host``).
A profile comes from engine runs or traces (measured on sample prompts) or from a JSON file
(``load_profile``; its format is in ``docs/planner.md``); without one, the
ranking uses the ``Workload`` defaults and labels its figures ``assumed``.

A regime or entry missing from the file falls back to the file's ``default`` entry when
present, else to the workload defaults (``RegimeProfile.assumed`` lists what a regime takes
from them). A planner evaluation (``validation/data/planner.json``) or a ranking document holds
the profile it measured or used under ``"profile"``; ``load_profile`` reads that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.files import read_json
from ssvkit.perfmodel.strategy import Strategy, Workload, parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens

PROFILE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
PROFILE_TABLES = ("acceptance", "overlap", "attention")
# Tables a version 1 or 2 profile may hold that the ranking does not read: ``overhead``, a
# planner evaluation's own fit of the loop's host time; the ranking prices that time with the
# GPU host's fit (``perfmodel.loop_host``).
UNREAD_TABLES = ("overhead",)
REGIMES = {"<=4K": 4096, "8K": 8192, "16K": 16384, "32K": 32768, "64K+": 65536}


def regime_of(context_len: int) -> str:
    """The regime a context falls in (the smallest representative context >= it)."""
    for name, ctx in REGIMES.items():
        if context_len <= ctx:
            return name
    return "64K+"


def attention_key(s: Strategy) -> str | None:
    """What of a strategy's attention changes the target's outputs (None: dense): grouping,
    block metadata, budget and refresh schedule. Exact
    grouping (``per_query``, ``union``, ``shared`` with C = 1) selects what per-query selection
    does; ``shared`` C > 1 shares one selection per group (block metadata only: the NSA
    kernels select per row whatever the mode); fusion changes no result."""
    if not s.is_sparse:
        return None
    shared = s.mode == "shared" and s.group_size > 1 and s.metadata != "nsa"
    group = f"shared{s.group_size}" if shared else "exact"
    meta = s.metadata if s.metadata != "nsa" else f"nsa{s.comp_block}s{s.comp_stride}"
    return f"{group}:{meta}:top{s.top_n}x{s.block_size}w{s.window}:r{s.refresh_every}"


@dataclass(frozen=True, slots=True)
class RegimeProfile:
    """alpha per (regime, drafter kind or drafter@tree), sparse-attention factor per (regime,
    attention key) and gamma per (regime, traversal).

    Each table maps a regime (or ``default``) to its entries.

    Attributes
    ----------
    acceptance : dict
        The per-token acceptance alpha of each drafter kind (``"ngram"``), and optionally of a
        drafter on one tree (``"ngram@chain:7"``, the tree as the ranking holds it: ``best:N``
        trees are resolved to ``parents:...``). Trees of one drafter do not share one alpha in
        practice (an n-gram drafter's second branch is rarely as good as a draft model's), so
        a measured per-tree value wins over the drafter's.
    overlap : dict
        The adjacent selected-block overlap gamma of each traversal order.
    source : str
        Where the profile comes from, e.g. ``measured:engine-traces``,
        ``profile:FILE:<the file's source>`` or ``assumed:workload-defaults``.
    attention : dict
        The factor on alpha of sparse verification, per attention key (``attention_key``:
        grouping that changes the selection -- exact or ``sharedC`` --, budget and refresh
        schedule), optionally per drafter kind (``"ngram@exact:..."``, which wins over the bare
        key) or per drafter kind for every key (``"ngram@sparse"``, between the two). Sparse
        verification changes the target's own distribution (its top blocks, not all of them),
        so it changes what is accepted -- and by how much depends on the drafter: an n-gram
        drafter proposes what the context repeats, which the dense target copies from wherever
        it lies and a sparse one only from the blocks it selected, while a small model's
        proposals are the local guesses a sparse target still makes. An absent key means 1.
    """

    acceptance: dict[str, dict[str, float]] = field(default_factory=dict)
    overlap: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "assumed:workload-defaults"
    attention: dict[str, dict[str, float]] = field(default_factory=dict)

    def _get(self, table: dict, regime: str, key: str):
        for r in (regime, "default"):
            v = table.get(r, {}).get(key)
            if v is not None:
                return v
        return None

    def alpha(self, regime: str, drafter: str) -> float:
        """The drafter kind's alpha (its reference tree, dense attention)."""
        v = self._get(self.acceptance, regime, drafter)
        return Workload().acceptance if v is None else v

    def alpha_for(self, regime: str, s: Strategy) -> float:
        """The alpha ``s`` should see: its drafter on its tree when measured (else the
        drafter's), times its sparse attention's factor, at most 1."""
        v = self._get(self.acceptance, regime, f"{s.drafter.kind}@{s.tree}")
        a = self.alpha(regime, s.drafter.kind) if v is None else v
        return min(1.0, a * self.attention_factor(regime, s))

    def attention_factor(self, regime: str, s: Strategy, drafter: str | None = None) -> float:
        """The factor ``s``'s sparse attention puts on the alpha of ``drafter`` (default:
        ``s``'s drafter kind): the first measured of the drafter's for this key
        (``"ngram@<key>"``), the drafter's for any sparse attention (``"ngram@sparse"``) and
        the key's; 1 for dense or unmeasured."""
        key = attention_key(s)
        if key is None:
            return 1.0
        kind = s.drafter.kind if drafter is None else drafter
        for k in (f"{kind}@{key}", f"{kind}@sparse", key):
            f = self._get(self.attention, regime, k)
            if f is not None:
                return f
        return 1.0

    def gamma(self, regime: str, traversal: str) -> float:
        for key in (regime, "default"):
            v = self.overlap.get(key, {}).get(traversal)
            if v is not None:
                return v
        return Workload().overlap

    def assumed(self, regime: str, strategies) -> list[str]:
        """What the prediction of ``strategies`` in ``regime`` takes from the workload defaults
        rather than from this profile (the regime's entry or ``default``): one line each, empty
        when the profile covers them all."""
        kinds, traversals, unfactored = set(), set(), set()
        for s in strategies:
            if not parse_tree(s.tree):
                continue  # drafts nothing: no acceptance to assume
            if (
                self._get(self.acceptance, regime, f"{s.drafter.kind}@{s.tree}") is None
                and self._get(self.acceptance, regime, s.drafter.kind) is None
            ):
                kinds.add(s.drafter.kind)
            if s.is_sparse:
                if self._get(self.overlap, regime, s.traversal) is None:
                    traversals.add(s.traversal)
                kind, key = s.drafter.kind, attention_key(s)
                if all(
                    self._get(self.attention, regime, k) is None
                    for k in (f"{kind}@{key}", f"{kind}@sparse", key)
                ):
                    unfactored.add(kind)
        out = []
        if kinds:
            out.append(
                f"acceptance of {', '.join(sorted(kinds))} (workload default "
                f"{Workload().acceptance})"
            )
        if unfactored:
            out.append(
                f"sparse attention's effect on the acceptance of "
                f"{', '.join(sorted(unfactored))} (none)"
            )
        if traversals:
            out.append(
                f"block overlap of {', '.join(sorted(traversals))} (workload default "
                f"{Workload().overlap})"
            )
        return out

    def to_json(self) -> dict:
        tables = {
            "acceptance": self.acceptance,
            "attention": self.attention,
            "overlap": self.overlap,
        }
        regimes = sorted(set().union(*tables.values()))
        return {
            "version": PROFILE_VERSION,
            "source": self.source,
            "regimes": {r: {k: t.get(r, {}) for k, t in tables.items()} for r in regimes},
        }


def _json_prob(where: str, v) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{where} must be a number in [0, 1], got {v!r}")
    return float(v)


def _json_nonneg(where: str, v) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    if not ok:
        raise ValueError(f"{where} must be a finite number >= 0, got {v!r}")
    return float(v)


def load_profile(path: str | Path) -> RegimeProfile:
    """Parse and validate a profile file; ``ValueError`` names the bad entry."""
    p = Path(path)
    d = read_json(p, "acceptance profile")
    if isinstance(d, dict) and isinstance(d.get("profile"), dict):
        # An evaluation or a ranking document: the profile it measured or ranked with.
        return profile_from_json(
            d["profile"],
            f"acceptance profile {str(p)!r} (its 'profile')",
            f"profile:{p.name}#profile",
        )
    return profile_from_json(d, f"acceptance profile {str(p)!r}", f"profile:{p.name}")


def profile_from_json(d, where: str = "profile", label: str = "profile") -> RegimeProfile:
    """A profile from its JSON document (version 1, 2 or 3; the format is in
    ``docs/planner.md``; an older version's ``UNREAD_TABLES`` are accepted and not read);
    ``ValueError`` names the bad entry."""
    if not isinstance(d, dict) or d.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"{where} must have version {' or '.join(map(str, READABLE_VERSIONS))}")
    if not isinstance(d.get("regimes"), dict):
        raise ValueError(f"{where} has no 'regimes' object: not a profile")
    acc, ovl, att = {}, {}, {}
    unread = UNREAD_TABLES if d["version"] < 3 else ()
    for regime, entry in d["regimes"].items():
        if regime not in REGIMES and regime != "default":
            raise ValueError(f"profile regime {regime!r} is not one of {', '.join(REGIMES)}")
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: regime {regime} must be an object, got {entry!r}")
        extra = sorted(set(entry) - set(PROFILE_TABLES) - set(unread))
        if extra:
            # e.g. an evaluation's own regime entries, read as if they were a profile's
            raise ValueError(
                f"{where}: regime {regime} has {extra[0]!r}, not one of {', '.join(PROFILE_TABLES)}"
            )
        tables = {}
        for name in PROFILE_TABLES:
            table = entry.get(name) or {}
            if not isinstance(table, dict):
                raise ValueError(
                    f"{where}: {regime}.{name} must be an object of key -> number, got {table!r}"
                )
            tables[name] = table
        acc[regime] = {
            k: _json_prob(f"{regime}.acceptance.{k}", v) for k, v in tables["acceptance"].items()
        }
        ovl[regime] = {
            k: _json_prob(f"{regime}.overlap.{k}", v) for k, v in tables["overlap"].items()
        }
        att[regime] = {
            k: _json_nonneg(f"{regime}.attention.{k}", v) for k, v in tables["attention"].items()
        }
    return RegimeProfile(acc, ovl, f"{label}:{d.get('source', 'unknown')}", att)


def profile_from_traces(headers_rounds, strategies: dict) -> RegimeProfile:
    """Build a profile from engine traces.

    ``headers_rounds`` is a list of (header, rounds) from ``perfmodel.trace``; ``strategies`` maps a
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
    return RegimeProfile(
        {k: {d: float(np.mean(v)) for d, v in m.items()} for k, m in acc.items()},
        {k: {t: float(np.mean(v)) for t, v in m.items()} for k, m in ovl.items()},
        "measured:engine-traces",
    )
