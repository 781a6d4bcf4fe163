"""Acceptance, overlap and loop-overhead profiles per context regime: what the ranking assumes
about prompts and about the decode loop that runs the strategies.

A profile says, per regime:

- ``acceptance``: the per-token acceptance alpha of each drafter kind (``"ngram"``), and
  optionally of a drafter on one tree (``"ngram@chain:7"``, the tree as the ranking holds it:
  ``best:N`` trees are resolved to ``parents:...``). Trees of one drafter do not share one
  alpha in practice (an n-gram drafter's second branch is rarely as good as a draft model's),
  so a measured per-tree value wins over the drafter's;
- ``attention``: the factor on alpha of sparse verification, per attention key
  (``attention_key``: grouping that changes the selection -- exact or ``sharedC`` --, budget and
  refresh schedule), optionally per drafter kind (``"ngram@exact:..."``, which wins over the
  bare key) or per drafter kind for every key (``"ngram@sparse"``, between the two). Sparse
  verification changes the target's own distribution (its top blocks, not all of them), so it
  changes what is accepted -- and by how much depends on the drafter: an
  n-gram drafter proposes what the context repeats, which the dense target copies from
  wherever it lies and a sparse one only from the blocks it selected, while a small model's
  proposals are the local guesses a sparse target still makes. An absent key means 1;
- ``overlap``: the adjacent selected-block overlap gamma of each traversal order;
- ``overhead``: host time per round the step model does not count (the loop's Python work,
  host-side drafting, launches outside graphs), as coefficients of ``OVERHEAD_TERMS``, fitted on
  the profile runs (``fit_overhead``). Absent means 0, the step model alone.

It comes from engine runs or traces (measured on sample prompts) or from a JSON file; without
one, the ranking uses the ``Workload`` defaults and labels its figures ``assumed``.

File format (version 2; version 1 files, which lack ``attention`` and ``overhead``, still load)::

    {"version": 2, "source": "...",
     "regimes": {"16K": {"acceptance": {"eagle": 0.71, "ngram": 0.35, "ngram@chain:7": 0.31},
                         "attention": {"exact:nsa32s16:top16x64w512:r2": 0.93,
                                       "ngram@exact:nsa32s16:top16x64w512:r2": 0.55},
                         "overlap": {"bfs": 0.68, "dfs": 0.61, "position": 0.74},
                         "overhead": {"round": 4e-4, "node": 2e-5}}, ...}}

A regime missing from the file, or an entry missing from a regime, falls back to the file's
``default`` entry when present, else to the workload defaults (``Profile.assumed`` lists what
a regime takes from them). A planner evaluation (``validation/data/planner.json``) or a ranking
document holds the profile it measured or used under ``"profile"``; ``load_profile`` reads that.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from perfmodel.acceptance import node_depths_ranks
from perfmodel.files import read_json
from perfmodel.strategy import Strategy, Workload, parse_tree, tree_expected_tokens

PROFILE_VERSION = 2
READABLE_VERSIONS = (1, 2)
# Loop overhead per round = sum of coefficient x feature (``overhead_features``).
OVERHEAD_TERMS = (
    "round",
    "speculative",
    "draft_model",
    "node",
    "draft_level",
    "sparse",
    "host_node",
)
PROFILE_TABLES = ("acceptance", "overlap", "attention", "overhead")
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
    depth = max(node_depths_ranks(list(parents))[0], default=0)
    spec = float(len(parents) > 0)
    dm = float(s.drafter.kind == "draft_model") * spec
    nodes = float(len(parents))
    host = float(s.drafter.kind == "ngram") * nodes
    return np.array([1.0, spec, dm, nodes, depth * dm, float(s.is_sparse), host])


def fit_overhead(
    strategies: list[Strategy], residual_s: list[float], round_s: list[float] | None = None
) -> tuple[dict, dict]:
    """Least squares of the per-round residual (measured round wall time minus the step model's
    round time) on ``overhead_features``: the coefficients and the fit's figures (rows, rms and
    max absolute error, seconds; rms relative error when weighted; the autoregressive rows).

    Every coefficient is non-negative except ``speculative`` when autoregressive rows are
    among the runs (``round + speculative``, a drafting round's intercept, is non-negative): it
    is then the difference between a drafting round's residual and an autoregressive one's,
    whose sign is the step model's (it may price a drafting round's GPU work above what it
    takes). Held at 0 or above, that difference leaks into ``round`` -- the whole of an
    autoregressive round's overhead -- and moves autoregressive decoding's prediction at 32K by
    9% between two evaluations of one code. Without autoregressive rows the two terms are one
    column and ``speculative`` stays non-negative.

    With ``round_s`` (the measured round times) each row is weighted by 1 / its round time, so
    the fit minimises relative round-time error -- what tokens/s and speedup errors are: an
    unweighted fit lets the 2-4 ms rounds of tree strategies outvote the ~0.7 ms
    autoregressive rounds, whose overhead it then misses by 10% and more (every speedup divides
    by an autoregressive baseline)."""
    if len(strategies) != len(residual_s) or not strategies:
        raise ValueError("fit_overhead needs one residual per strategy, and at least one")
    x = np.stack([overhead_features(s) for s in strategies])
    y = np.asarray(residual_s, dtype=float)
    w = np.ones_like(y)
    if round_s is not None:
        r = np.asarray(round_s, dtype=float)
        if r.shape != y.shape or not (r > 0).all():
            raise ValueError("fit_overhead: round_s needs one positive round time per strategy")
        w = 1.0 / r
    i, j = OVERHEAD_TERMS.index("round"), OVERHEAD_TERMS.index("speculative")
    ar = x[:, j] == 0
    if ar.any() and not ar.all():
        # Solved for an autoregressive round's intercept and a drafting round's, both >= 0
        # (what ``profile_from_json`` checks: ``round`` and ``round + speculative``); then
        # ``speculative`` is their difference.
        xr = x.copy()
        xr[:, i], xr[:, j] = ar, ~ar
        coef, _ = nnls(xr * w[:, None], y * w)
        coef[j] -= coef[i]
    else:
        coef, _ = nnls(x * w[:, None], y * w)
    err = x @ coef - y
    fit = {
        "rows": len(y),
        "autoregressive_rows": int(ar.sum()),
        "rms_s": float(np.sqrt(np.mean(err**2))),
        "max_abs_s": float(np.max(np.abs(err))),
    }
    if round_s is not None:
        fit["rms_rel"] = float(np.sqrt(np.mean((err * w) ** 2)))
    return dict(zip(OVERHEAD_TERMS, map(float, coef), strict=True)), fit


@dataclass(frozen=True, slots=True)
class Profile:
    """alpha per (regime, drafter kind or drafter@tree), sparse-attention factor per (regime,
    attention key), gamma per (regime, traversal), loop overhead per regime."""

    acceptance: dict[str, dict[str, float]] = field(default_factory=dict)
    overlap: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "assumed:workload-defaults"
    attention: dict[str, dict[str, float]] = field(default_factory=dict)
    overhead: dict[str, dict[str, float]] = field(default_factory=dict)

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

    def overhead_s(self, regime: str, s: Strategy) -> float:
        """Loop overhead per round of ``s`` (0 without a fitted overhead)."""
        coef = self.overhead.get(regime) or self.overhead.get("default")
        if not coef:
            return 0.0
        w = np.array([coef.get(t, 0.0) for t in OVERHEAD_TERMS])
        return float(overhead_features(s) @ w)

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
        if not (self.overhead.get(regime) or self.overhead.get("default")):
            out.append("loop overhead per round (none: the step model alone)")
        return out

    def to_json(self) -> dict:
        tables = {
            "acceptance": self.acceptance,
            "attention": self.attention,
            "overlap": self.overlap,
            "overhead": self.overhead,
        }
        regimes = sorted(set().union(*tables.values()))
        return {
            "version": PROFILE_VERSION,
            "source": self.source,
            "regimes": {r: {k: t.get(r, {}) for k, t in tables.items()} for r in regimes},
        }


def _check_prob(where: str, v) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{where} must be a number in [0, 1], got {v!r}")
    return float(v)


def _check_finite(where: str, v) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    return float(v)


def _check_nonneg(where: str, v) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    if not ok:
        raise ValueError(f"{where} must be a finite number >= 0, got {v!r}")
    return float(v)


def load_profile(path: str | Path) -> Profile:
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


def profile_from_json(d, where: str = "profile", label: str = "profile") -> Profile:
    """A profile from its JSON document (version 1 or 2); ``ValueError`` names the bad entry."""
    if not isinstance(d, dict) or d.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"{where} must have version {' or '.join(map(str, READABLE_VERSIONS))}")
    if not isinstance(d.get("regimes"), dict):
        raise ValueError(f"{where} has no 'regimes' object: not a profile")
    acc, ovl, att, ovh = {}, {}, {}, {}
    for regime, entry in d["regimes"].items():
        if regime not in REGIMES and regime != "default":
            raise ValueError(f"profile regime {regime!r} is not one of {', '.join(REGIMES)}")
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: regime {regime} must be an object, got {entry!r}")
        extra = sorted(set(entry) - set(PROFILE_TABLES))
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
            k: _check_prob(f"{regime}.acceptance.{k}", v) for k, v in tables["acceptance"].items()
        }
        ovl[regime] = {
            k: _check_prob(f"{regime}.overlap.{k}", v) for k, v in tables["overlap"].items()
        }
        att[regime] = {
            k: _check_nonneg(f"{regime}.attention.{k}", v) for k, v in tables["attention"].items()
        }
        bad = [k for k in tables["overhead"] if k not in OVERHEAD_TERMS]
        if bad:
            terms = ", ".join(OVERHEAD_TERMS)
            raise ValueError(f"{regime}.overhead.{bad[0]} is not one of {terms}")
        ovh[regime] = {
            k: (_check_finite if k == "speculative" else _check_nonneg)(f"{regime}.overhead.{k}", v)
            for k, v in tables["overhead"].items()
        }
        # ``speculative`` is signed (``fit_overhead``), but no round's overhead goes below 0.
        if ovh[regime].get("round", 0.0) + ovh[regime].get("speculative", 0.0) < 0:
            raise ValueError(
                f"{regime}.overhead: round + speculative must be >= 0, got "
                f"{ovh[regime].get('round', 0.0)!r} + {ovh[regime].get('speculative', 0.0)!r}"
            )
    return Profile(acc, ovl, f"{label}:{d.get('source', 'unknown')}", att, ovh)


@functools.lru_cache(maxsize=256)
def _tokens_table(tree: str) -> tuple[np.ndarray, np.ndarray]:
    """Expected tokens per round of ``tree`` on a grid of alpha (strictly increasing in alpha):
    the inverse is then one interpolation, cheap enough for the controller to call per round
    (a root search costs 0.3-0.5 ms per call, which a 1 ms decode round cannot afford)."""
    parents = parse_tree(tree)
    alphas = np.linspace(0.0, 1.0 - 1e-9, 513)
    return alphas, np.array([tree_expected_tokens(parents, a) for a in alphas])


@functools.lru_cache(maxsize=256)
def _tokens_grid(tree: str) -> tuple[list[float], list[float]] | None:
    """``_tokens_table`` as lists (None for a tree that drafts nothing): one scalar
    interpolated on lists (``_interp``) costs a third of ``np.interp``'s call on arrays, and
    the controller interpolates a few times per round and once per candidate per re-score."""
    if not parse_tree(tree):
        return None
    alphas, tokens = _tokens_table(tree)
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


def expected_tokens(tree: str, alpha: float) -> float:
    """``tree_expected_tokens`` by interpolation on the cached grid (within 1e-5 of it): what
    the controller evaluates for every candidate at every re-score."""
    grid = _tokens_grid(tree)
    if grid is None:
        return 1.0
    alphas, tokens = grid
    return float(_interp(min(max(alpha, 0.0), alphas[-1]), alphas, tokens))


def alpha_from_tokens(tree: str, tokens_per_round: float) -> float:
    """The per-token acceptance that makes ``tree``'s expected tokens per round equal the
    observed mean (the inverse of ``tree_expected_tokens``, monotone in alpha; interpolated on a
    513-point grid, within 1e-5 of the root). Clipped to the tree's range: 1 token per round
    -> 0, every node accepted -> 1."""
    grid = _tokens_grid(tree)
    if grid is None:
        return 0.0
    alphas, tokens = grid
    if tokens_per_round <= tokens[0]:
        return 0.0
    if tokens_per_round >= tokens[-1]:
        return 1.0
    return float(_interp(tokens_per_round, tokens, alphas))


@functools.lru_cache(maxsize=256)
def chain_length(tree: str) -> int:
    """K for a chain of K drafts (node i's parent is node i - 1), else 0 (autoregressive
    decoding and branching trees)."""
    parents = parse_tree(tree)
    if not parents or any(p != i - 1 for i, p in enumerate(parents)):
        return 0
    return len(parents)


def accepted_histogram(accepted) -> list[int]:
    """Counts of the drafts accepted per sequence and round: entry m, the rounds that accepted
    m (``pooled_chain_tokens`` reads them)."""
    flat = np.asarray(list(accepted), dtype=np.int64).ravel()
    if flat.size and flat.min() < 0:
        raise ValueError(f"accepted counts must be >= 0, got {int(flat.min())}")
    return np.bincount(flat).tolist() if flat.size else []


def pooled_chain_tokens(runs: list[tuple[int, list[int]]], k: int) -> float | None:
    """Tokens per round of a chain of ``k`` drafts, from the runs of every chain of the same
    drafter with ``K >= k`` drafts (``(K, accepted_histogram)`` each): a K-chain's first k
    drafts are what a k-chain would draft on the same text, so where it accepted m, a k-chain
    would have accepted min(m, k). Each run counts once (the mean over runs of
    ``1 + E[min(m, k)]``), as the profile's per-run means do. None when no run has ``K >= k``
    and rounds.

    Five prompts' own runs can put an n-gram chain:7 below its own chain:4 (1.90 against 2.05
    tokens per round at 8K on the H100), which no text can do; pooled, the shorter chains are
    read from two to three times the rounds, and their order is the truncation's."""
    if k < 1:
        raise ValueError(f"chain length must be >= 1, got {k}")
    means = []
    for big, hist in runs:
        n = sum(hist)
        if big < k or n == 0:
            continue
        means.append(1.0 + sum(min(m, k) * c for m, c in enumerate(hist)) / n)
    return float(np.mean(means)) if means else None


def profile_from_traces(headers_rounds, strategies: dict) -> Profile:
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
    return Profile(
        {k: {d: float(np.mean(v)) for d, v in m.items()} for k, m in acc.items()},
        {k: {t: float(np.mean(v)) for t, v in m.items()} for k, m in ovl.items()},
        "measured:engine-traces",
    )
