"""The shadow-walk tracker: what chain drafters that do not draft would have accepted.

Every round the decode loop scores, for each warm drafter kind with a shadow
(``RoundStats.shadow``, see ``engine.ngram``), what its chains would have matched at the
positions just committed, and optionally the rounds its chains' and trees' walks took over
the same tokens. The tracker keeps decayed sums of those counts (weight ``1 - ema`` per round
on the past, as every other average of the controller), turns them into the acceptance they
imply for a candidate (``alpha``), pairs each walk's rounds with the tokens the current
strategy committed for the paired test of a walked candidate (``PairedWalk``), and counts
how long each watched shadow has stood above its profile (``rising``).

A shadow estimate is used once it rests on ``SHADOW_MIN_POSITIONS`` decayed positions (or
decayed rounds of a walk: about one round of a long chain; fewer is a coin toss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.tree_tokens import alpha_from_tokens

SHADOW_MIN_POSITIONS = 8.0


@dataclass(slots=True)
class PairedWalk:
    """Decayed sums, over the rounds of one shadowed drafter kind, for the paired test of its
    walked candidates against the current strategy: ``w`` the weights' sum, ``w2`` their
    squares', ``n`` the tokens the current strategy committed (per sequence), ``s`` the
    sequences each round held, and per walk key (a chain length, or a tree spec) the squares
    of the rounds its walk took over the same tokens per sequence (``rr``; the rounds' own
    decayed sums, summed over the batch, are the tracker's, ``walk_rounds``)."""

    w: float = 0.0
    w2: float = 0.0
    n: float = 0.0
    s: float = 0.0
    rr: dict = field(default_factory=dict)

    def add(self, tokens: float, walked: dict, keep: float, sequences: int = 1) -> None:
        """One round: ``tokens`` per sequence, ``walked`` rounds per walk key summed over the
        round's ``sequences``."""
        if self.w:
            self.w, self.w2, self.n = keep * self.w, keep * keep * self.w2, keep * self.n
            self.s = keep * self.s
            for key in self.rr:
                self.rr[key] *= keep
        self.w += 1.0
        self.w2 += 1.0
        self.n += tokens
        self.s += sequences
        rr = self.rr
        for key, x in walked.items():
            x = x / sequences
            rr[key] = rr.get(key, 0.0) + x * x


class ShadowTracker:
    """Decayed shadow counts per drafter kind.

    ``chains[kind]``: decayed positions, per chain length k the decayed positions whose first
    k drafts matched, and the chains' walks' decayed rounds and accepted drafts per chain
    length (None when the shadow walks none); ``walks[kind][tree]``: a walked branching
    tree's decayed rounds, accepted drafts and their squares; ``pairs[kind]``: its
    ``PairedWalk``; ``lens``: (kind, chain lengths, walked trees) per shadowed kind, a new
    tuple whenever what is shadowed changes (callers memoise on its identity). ``dev`` and
    ``scored``: per watched key, the rounds its shadow has risen, and the shadow alpha the
    last re-score saw."""

    def __init__(self) -> None:
        self.chains: dict[str, tuple[float, list[float], list | None, list | None]] = {}
        self.walks: dict[str, dict[str, list[float]]] = {}
        self.pairs: dict[str, PairedWalk] = {}
        self.lens: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
        self.dev: dict = {}
        self.scored: dict = {}

    def __contains__(self, kind: str) -> bool:
        return kind in self.chains

    def observe(self, shadow, tokens: float, keep: float, sequences: int = 1) -> None:
        """Fold one round's shadow counts (summed over its ``sequences``) into the decayed sums
        (the past weighted by ``keep``), and with ``tokens`` (what the round committed per
        sequence) the paired sums. A change of what is shadowed (chain lengths, walked or not,
        trees) starts that kind over."""
        if not shadow:
            return
        for kind, sh in shadow.items():
            self._observe_pair(kind, sh, tokens, keep, sequences)
            restart = self._observe_trees(kind, getattr(sh, "trees", ()), keep)
            self._observe_chains(kind, sh, keep, restart)

    def _observe_pair(self, kind: str, sh, tokens: float, keep: float, sequences: int) -> None:
        walked = {k: r for k, r in enumerate(getattr(sh, "rounds", ()), 1)}
        walked.update((t[0], t[1]) for t in getattr(sh, "trees", ()))
        pair = self.pairs.get(kind)
        if pair is None or pair.rr.keys() != walked.keys():
            pair = self.pairs[kind] = PairedWalk()
        pair.add(tokens, walked, keep, sequences)

    def _observe_trees(self, kind: str, trees, keep: float) -> bool:
        """Fold the walked trees' counts in; True when the set of trees changed (the kind's
        chain sums then start over too)."""
        walks = self.walks.get(kind)
        if walks is None or len(walks) != len(trees) or any(t[0] not in walks for t in trees):
            self.walks[kind] = {t[0]: [float(x) for x in t[1:]] for t in trees}
            return True
        for spec, r, d, sq in trees:
            w = walks[spec]
            w[0], w[1], w[2] = keep * w[0] + r, keep * w[1] + d, keep * w[2] + sq
        return False

    def _observe_chains(self, kind: str, sh, keep: float, restart: bool) -> None:
        old = None if restart else self.chains.get(kind)
        walked = bool(getattr(sh, "rounds", ()))
        if old is None or len(old[1]) != len(sh.matched) or (old[2] is not None) != walked:
            self.chains[kind] = (
                float(sh.positions),
                [float(x) for x in sh.matched],
                [float(x) for x in sh.rounds] if walked else None,
                [float(x) for x in sh.drafts] if walked else None,
            )
            self.lens = tuple(
                (k, len(v[1]), tuple(self.walks.get(k, ()))) for k, v in self.chains.items()
            )
            return
        matched = [keep * a + b for a, b in zip(old[1], sh.matched, strict=True)]
        rounds = drafts = None
        if walked:
            rounds = [keep * a + b for a, b in zip(old[2], sh.rounds, strict=True)]
            drafts = [keep * a + b for a, b in zip(old[3], sh.drafts, strict=True)]
        self.chains[kind] = (keep * old[0] + sh.positions, matched, rounds, drafts)

    def alpha(
        self, kind: str, chain: int, tree: str, factor: float, factor_now: float, z: float = 0.0
    ) -> float | None:
        """The acceptance the shadow of drafter ``kind`` implies for a candidate on ``tree`` (a
        chain of ``chain`` drafts, or 0 for a walked branching tree): its walk's (or, for a
        chain not walked, the positions') expected tokens per round inverted on the tree,
        times the candidate's attention factor over the current strategy's (the shadow saw the
        current strategy's target); None when there is too little to go on.

        ``z`` > 0: at the low end of its confidence interval, ``z`` standard errors of the
        matched length (the variance of min(geometric, chain) at the estimate, over the decayed
        positions -- fewer than the effective ones, so the interval errs wide; a walked tree's:
        its rounds' own variance, over its decayed rounds)."""
        est = self.chains.get(kind)
        if est is None or est[0] < SHADOW_MIN_POSITIONS or factor_now <= 0:
            return None
        if not chain:  # a branching tree: its own walk, when the shadow walks it
            walk = self.walks.get(kind, {}).get(tree)
            if walk is None or walk[0] < SHADOW_MIN_POSITIONS:
                return None
            n, mean = walk[0], walk[1] / walk[0]
            if z > 0:
                mean -= z * math.sqrt(max(walk[2] / n - mean * mean, 0.0) / n)
            return min(1.0, alpha_from_tokens(tree, 1.0 + mean) * factor / factor_now)
        if chain > len(est[1]):
            return None
        if est[2] is not None:  # the chain's walk: its own rounds on this text (engine.ngram)
            n = est[2][chain - 1]
            if n < SHADOW_MIN_POSITIONS:
                return None
            mean = est[3][chain - 1] / n
        else:
            n, mean = est[0], sum(est[1][:chain]) / est[0]
        if z > 0:
            a = alpha_from_tokens(tree, 1.0 + mean)
            second = sum((2 * j - 1) * a**j for j in range(1, chain + 1))
            mean -= z * math.sqrt(max(second - mean * mean, 0.0) / n)
        return min(1.0, alpha_from_tokens(tree, 1.0 + mean) * factor / factor_now)

    def walk_rounds(self, kind: str, key) -> float | None:
        """The decayed rounds the walk ``key`` (a chain length, or a tree spec) of drafter
        ``kind`` took (None when not walked)."""
        if isinstance(key, int):
            est = self.chains.get(kind)
            return est[2][key - 1] if est is not None and est[2] is not None else None
        walk = self.walks.get(kind, {}).get(key)
        return None if walk is None else walk[0]

    def walk_high(self, kind: str, chain: int, tree: str, z: float):
        """For a candidate whose walk (chain length ``chain``, or ``tree`` when 0) ran over the
        very tokens the current strategy committed: (its rounds per round of the current
        strategy and per sequence -- a batch advances every sequence each round --, ``z``
        standard errors high over the decayed rounds' effective count, the alpha its walk
        implies as is, the current strategy's tokens per round per sequence); None when it
        has no such walk yet."""
        pair = self.pairs.get(kind)
        key = chain or tree
        if pair is None or pair.w < SHADOW_MIN_POSITIONS or key not in pair.rr:
            return None
        raw = self.alpha(kind, chain, tree, 1.0, 1.0)
        rounds = self.walk_rounds(kind, key)
        if raw is None or rounds is None:
            return None
        w = pair.w
        mean = rounds / pair.s
        var = max(pair.rr[key] / w - mean * mean, 0.0)
        return mean + z * math.sqrt(var * pair.w2) / w, raw, pair.n / w

    def rising(self, now, drafting: bool, epsilon: float, patience: int):
        """Count, per watched key of ``now.refs`` the current strategy does not observe
        itself, the rounds its shadow stands more than ``epsilon`` above its profile (or above
        what the last re-score saw: a candidate doing worse than assumed cannot win a
        re-score, so only a rise triggers one); the first key whose count reached
        ``patience``, if any. A drafting chain observes its drafter's chains
        (``ChainRounds``), not its trees."""
        hit = None
        for skey, ref, chain, factor, profiled, factor_now in now.refs:
            kind = ref.drafter.kind
            if drafting and kind == now.known.kind and (chain or ref.tree == now.strategy.tree):
                continue  # the drafting drafter observes itself
            a = self.alpha(kind, chain, ref.tree, factor, factor_now)
            base = max(profiled, self.scored.get(skey, 0.0))
            rising = a is not None and a - base > epsilon
            self.dev[skey] = self.dev.get(skey, 0) + 1 if rising else 0
            if self.dev[skey] >= patience and hit is None:
                hit = skey
        return hit
