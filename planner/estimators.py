"""What the online controller estimates from the rounds it is handed: the current strategy's
acceptance (an EMA with its confidence interval), whether a chain's acceptance has collapsed
(a sequential likelihood-ratio test), what shorter chains of the same drafter would have
accepted on the same text (over the decode's rounds, ``ChainRounds``, or pooled over a profile's
runs, ``pooled_chain_tokens``), and what a switch to each kind of strategy costs.

Every average here decays by ``1 - ema`` per round, one observation per sequence, so all of
them weigh the same rounds alike; the controller (``planner.controller``) decides from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from ssvkit.perfmodel.acceptance import outcome_probabilities
from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens


def switch_kind(s: Strategy) -> str:
    """What a switch to ``s`` has to start: its drafter kind, or ``none`` when it drafts
    nothing (autoregressive decoding)."""
    return s.drafter.kind if parse_tree(s.tree) else "none"


class SwitchCosts(dict):
    """Host seconds of a switch per destination kind (``switch_kind``; ``default`` for the
    kinds not measured yet): going to autoregressive decoding installs a strategy and nothing
    else, while going to a draft model runs its catch-up forward over the tokens committed
    since it last drafted, so one figure for both would price the cheap switch at the dear
    one's cost, or the other way round. Each switch's measured cost replaces its kind's."""

    def __init__(self, switch_cost_s: float | dict[str, float] = 0.0):
        costs = (
            dict(switch_cost_s) if isinstance(switch_cost_s, dict) else {"default": switch_cost_s}
        )
        for kind, v in costs.items():
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"switch_cost_s[{kind!r}] must be a number >= 0, got {v!r}")
        super().__init__({k: float(v) for k, v in costs.items()})

    def record(self, installed: Strategy, seconds: float) -> None:
        """What installing ``installed`` cost (its catch-up included)."""
        self[switch_kind(installed)] = float(seconds)

    def cost(self, to: Strategy) -> float:
        """The host time a switch to ``to`` is expected to cost: the last one measured to its
        kind, else the ``default`` given, else 0."""
        return self.get(switch_kind(to), self.get("default", 0.0))


@dataclass(slots=True)
class AcceptanceEma:
    """The current strategy's tokens per round: an EMA (newest round at ``weight``), its
    second moment and its weights' sum of squares (``1 / w2``: the effective rounds), and the
    per-token acceptance ``alpha`` the EMA implies on the strategy's tree."""

    weight: float
    tokens: float | None = None
    sq: float = 0.0
    w2: float = 1.0
    alpha: float = 0.0

    def add(self, tree: str, tokens: float, restart: bool) -> None:
        """Fold in one round's mean tokens per sequence (``restart``: the first round of a new
        strategy, whose acceptance history starts over)."""
        if restart:
            self.tokens, self.sq, self.w2 = tokens, tokens * tokens, 1.0
        else:
            w = self.weight
            self.tokens = (1 - w) * self.tokens + w * tokens
            self.sq = (1 - w) * self.sq + w * tokens * tokens
            self.w2 = (1 - w) * (1 - w) * self.w2 + w * w
        self.alpha = alpha_from_tokens(tree, self.tokens)

    def spread(self, tree: str, z: float) -> tuple[float, ...]:
        """The acceptance at both ends of the observed one's confidence interval: ``z``
        standard errors of the EMA (its variance from the second moment, over its effective
        number of rounds), inverted on ``tree``; () when ``z`` is 0 or nothing was observed."""
        if z <= 0 or self.tokens is None:
            return ()
        var = max(self.sq - self.tokens * self.tokens, 0.0)
        half = z * math.sqrt(var * self.w2)
        return (
            alpha_from_tokens(tree, self.tokens - half),
            alpha_from_tokens(tree, self.tokens + half),
        )


@dataclass(slots=True)
class CollapseTest:
    """Wald's sequential ratio test of a chain's rounds since it started (or was last
    re-scored): collapsed (alpha = ``ref / 4``) against working (alpha = ``ref - epsilon``).

    Each draft is accepted with probability alpha until the first rejection, so a round of a
    K-chain that accepted m < K drafts has likelihood alpha^m (1 - alpha), m = K alpha^K: the
    accepted drafts (``hits``) and the rounds that stopped at a rejection (``misses``) are
    sufficient. The ratio is a martingale under a working chain, so a chain accepting at
    ``ref - epsilon`` or more passes the threshold with probability at most exp(-threshold)
    per stint, while one that collapsed does within a few rounds."""

    hits: int = 0
    misses: int = 0

    def reset(self) -> None:
        self.hits = self.misses = 0

    def observe(self, accepted, chain: int, ref: float, epsilon: float) -> float:
        """Add one round's per-sequence ``accepted`` drafts of a ``chain``-draft chain; the
        log-likelihood ratio, collapsed over working, of every round since the reset."""
        for m in accepted:
            self.hits += min(m, chain)
            self.misses += m < chain
        a0, a1 = ref - epsilon, ref / 4.0
        return self.hits * math.log(a1 / a0) + self.misses * math.log((1.0 - a1) / (1.0 - a0))


@dataclass(slots=True)
class ChainRounds:
    """Decayed sums over the rounds a chain of ``chain`` drafts ran (strategy ``sid``, its
    attention factor ``factor`` for its drafter), one observation per sequence: ``m`` the
    drafts accepted, and per shorter length k = 1..chain-1, ``x = min(m, k)``.

    A chain of k drafts of the same drafter drafts the first k of the longer chain's on the
    same text, so it would have accepted min(m, k) of a round that accepted m: the sums give
    every shorter chain's tokens per round on this very text, and the paired difference of
    its tokens/s and the chain's (both from one set of rounds, so the variance of their
    difference is far below the sum of theirs). Autoregressive decoding is the chain of no
    drafts (one token every round). ``w`` the weights' sum, ``w2`` their squares' (the
    effective observations are ``w * w / w2``)."""

    sid: str
    chain: int
    factor: float
    rounds: int = 0
    w: float = 0.0
    w2: float = 0.0
    m: float = 0.0
    mm: float = 0.0
    x: list[float] = field(default_factory=list)  # sum w min(m, k), k = 1..chain-1
    xx: list[float] = field(default_factory=list)  # sum w min(m, k)^2
    xm: list[float] = field(default_factory=list)  # sum w min(m, k) m

    def __post_init__(self) -> None:
        k1 = self.chain - 1
        self.x, self.xx, self.xm = [0.0] * k1, [0.0] * k1, [0.0] * k1

    def prior(self, alpha: float, n: float) -> None:
        """Start from ``n`` observations as the profile expects them: each draft accepted with
        probability ``alpha`` until the first rejection (their expected sums). The data
        outweigh them as the weights decay; until then the rare full acceptances a few rounds
        may lack (the heavy tail of the difference a longer chain makes) are not missing from
        the mean and variance. P(m = j) is ``perfmodel.acceptance.outcome_probabilities``."""
        k = self.chain
        p = outcome_probabilities(min(max(alpha, 0.0), 1.0), k).tolist()  # P(m = j), j = 0..K
        self.w += n
        self.w2 += n
        self.m += n * sum(j * q for j, q in enumerate(p))
        self.mm += n * sum(j * j * q for j, q in enumerate(p))
        for i in range(k - 1):
            x = [min(j, i + 1) for j in range(k + 1)]
            self.x[i] += n * sum(v * q for v, q in zip(x, p, strict=True))
            self.xx[i] += n * sum(v * v * q for v, q in zip(x, p, strict=True))
            self.xm[i] += n * sum(v * j * q for j, (v, q) in enumerate(zip(x, p, strict=True)))

    def add(self, accepted, keep: float) -> None:
        """Fold in one round's per-sequence accepted drafts, the past weighted by ``keep``."""
        k1 = self.chain - 1
        if self.w:
            self.w, self.w2, self.m, self.mm = (
                keep * self.w,
                keep * keep * self.w2,
                keep * self.m,
                keep * self.mm,
            )
            self.x = [keep * v for v in self.x]
            self.xx = [keep * v for v in self.xx]
            self.xm = [keep * v for v in self.xm]
        self.rounds += 1
        for m in accepted:
            m = min(m, self.chain)
            self.w += 1.0
            self.w2 += 1.0
            self.m += m
            self.mm += m * m
            for k in range(1, min(m, k1) + 1):  # min(m, k) = k for k <= m
                self.x[k - 1] += k
                self.xx[k - 1] += k * k
                self.xm[k - 1] += k * m
            for k in range(m + 1, k1 + 1):  # min(m, k) = m for k > m
                self.x[k - 1] += m
                self.xx[k - 1] += m * m
                self.xm[k - 1] += m * m

    def tokens(self, k: int) -> float:
        """Expected tokens per round of a chain of ``k`` <= ``chain`` drafts: 1 + E[min(m, k)]
        (1 for k = 0: autoregressive decoding)."""
        if k <= 0:
            return 1.0
        return 1.0 + (self.m if k >= self.chain else self.x[k - 1]) / self.w

    def paired_low(self, k: int, round_k: float, round_now: float, z: float) -> float:
        """The low end (``z`` standard errors) of the tokens/s a chain of ``k`` drafts with
        round time ``round_k`` gains over this chain with round time ``round_now``, per
        sequence: the mean of the per-observation difference ``(1 + min(m, k)) / round_k -
        (1 + m) / round_now``, whose two terms come from the same rounds -- the variance of
        the difference, not the sum of the two variances."""
        w = self.w
        em = self.m / w
        vm = max(self.mm / w - em * em, 0.0)
        if k >= self.chain:  # the same drafts: x = m
            ex, vx, cxm = em, vm, vm
        elif k <= 0:  # autoregressive decoding: x = 0, one token every round
            ex, vx, cxm = 0.0, 0.0, 0.0
        else:
            ex = self.x[k - 1] / w
            vx = max(self.xx[k - 1] / w - ex * ex, 0.0)
            cxm = self.xm[k - 1] / w - ex * em
        mean = (1.0 + ex) / round_k - (1.0 + em) / round_now
        var = vx / round_k**2 + vm / round_now**2 - 2.0 * cxm / (round_k * round_now)
        return mean - z * math.sqrt(max(var, 0.0) * self.w2 / (w * w))


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
