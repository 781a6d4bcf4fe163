"""The shadow-walk tracker: what chain drafters that do not draft would have accepted.

Every round the decode loop scores, for each warm drafter kind with a shadow
(``RoundStats.shadow``, see ``engine.ngram``), what its chains would have matched at the
positions just committed, and optionally the rounds its chains' and trees' walks took over
the same tokens. The tracker keeps decayed sums of those counts (weight ``1 - ema`` per round
on the past, as every other average of the controller), turns them into the acceptance they
imply for a candidate (``alpha``), pairs each walk's rounds with the tokens the current
strategy committed for the paired test of a walked candidate (``PairedWalk``), and counts
how long each watched shadow has stood above its profile (``rising``). A shadow estimate is
used once it rests on ``SHADOW_MIN_POSITIONS`` decayed positions (or decayed rounds of a walk:
about one round of a long chain; fewer is a coin toss). At batch B the shadow may score a fixed
sample of S < B sequences; its intervals then add the share of the sequences' spread the sample
leaves out (``SampleSpread``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens

SHADOW_MIN_POSITIONS = 8.0


@functools.lru_cache(maxsize=64)
def t_for_z(z: float, dof: int) -> float:
    """Student's t quantile of ``dof`` >= 1 degrees of freedom at the normal ``z``'s probability
    p: from the Cornish-Fisher expansion in 1 / dof (Abramowitz & Stegun 26.7.5), Newton's
    steps on the t distribution's closed form for integer degrees of freedom (26.7.3-4) to
    machine precision. Pure Python: a re-score inside a decode must not stop to import scipy."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    p = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    z2 = z * z
    g = (
        z * (z2 + 1.0) / 4.0,
        z * ((5.0 * z2 + 16.0) * z2 + 3.0) / 96.0,
        z * (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) / 384.0,
        z * ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) / 92160.0,
    )
    t = z + sum(gi / dof ** (i + 1) for i, gi in enumerate(g)) if dof > 2 else z
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    for _ in range(50):
        pdf = math.exp(log_norm - (dof + 1) / 2 * math.log1p(t * t / dof))
        step = (_t_cdf(t, dof) - p) / pdf
        t -= step
        if abs(step) <= 1e-13 * max(1.0, abs(t)):
            break
    return t


def _t_cdf(t: float, dof: int) -> float:
    """The t distribution's CDF at ``t``, ``dof`` >= 1 an integer (A&S 26.7.3-4: a finite sum in
    cos(theta)^2, theta = arctan(t / sqrt(dof)))."""
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2 == 0:
        term = total = 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    else:
        total, term = 0.0, 1.0
        if dof > 1:
            total = 1.0
            for k in range(1, (dof - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        a = 2.0 / math.pi * (theta + s * math.cos(theta) * total)
    return 0.5 + 0.5 * a


class SampleSpread:
    """Per sampled sequence (a slot of ``ShadowAcceptance.by_sequence``) the decayed rounds it
    advanced in and, per walk (``index``: a chain length or a tree spec to its column), the
    decayed rounds walked and drafts accepted.

    At batch B the shadow may score a fixed sample of S < B sequences
    (``engine.ngram.shadow_sample``; ``ShadowAcceptance.sequences``); its estimates are then the
    sample's ratios of decayed sums, whose error about the batch's has two parts: the rounds'
    noise, which the tracker's variances measure, and how far the sampled sequences differ from
    the others, which persists from round to round and which they do not see. These sums
    measure the sequences as clusters: the variance of a ratio ``r = sum D_s / sum R_s`` over
    S' live sequences, ``S' / (S' - 1) sum (D_s - r R_s)^2 / (sum R_s)^2``, holds both parts.
    An interval then takes the rounds' variance plus the share the sample leaves out,
    ``1 - S / B`` (the finite-population correction: at S = B the full tracker's intervals), of
    the cluster variance's excess over it, that excess at Student's t of S' - 1 degrees of
    freedom rather than the normal ``z`` (it is estimated from a few sequences: at S' = 8 and
    z = 1.645, t = 1.89). With fewer than two live sequences, or a sample without its
    sequences' walks, a shadow estimate has no interval (None). Point estimates carry no such
    term: the rising-shadow trigger compares them with ``epsilon``, and a re-score they trigger
    decides on the intervals.
    """

    __slots__ = ("sums", "index", "walks")

    def __init__(self, slots: int, index: dict) -> None:
        self.index, self.walks = index, len(index)
        self.sums = np.zeros((slots, 1 + 2 * self.walks))

    def add(self, by_sequence, keep: float) -> None:
        rows = [(1.0 if x.tokens else 0.0, *x.rounds, *x.drafts) for x in by_sequence]
        self.sums *= keep
        self.sums += rows

    def cluster(self, key, pair: bool) -> tuple[float, int] | None:
        """The cluster variance (see the class) of walk ``key``'s accepted drafts per round,
        or with ``pair`` of its rounds per round of a sequence, and the live sequences it rests
        on; None for a key not walked or fewer than two live sequences."""
        j = self.index.get(key)
        if j is None:
            return None
        sums = self.sums
        if pair:
            num, den = sums[:, 1 + j], sums[:, 0]
        else:
            num, den = sums[:, 1 + self.walks + j], sums[:, 1 + j]
        live = int(np.count_nonzero(den))
        total = float(den.sum())
        if live < 2 or total <= 0:
            return None
        r = float(num.sum()) / total
        res = num - r * den
        return live / (live - 1) * float(res @ res) / (total * total), live


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
        # per kind: the sequences its last round's counts cover over the round's
        self.share: dict[str, float] = {}
        self.spread: dict[str, SampleSpread] = {}  # per kind scored on a sample

    def __contains__(self, kind: str) -> bool:
        return kind in self.chains

    def observe(self, shadow, tokens: float, keep: float, sequences: int = 1) -> None:
        """Fold one round's shadow counts (summed over its ``sequences``, or over the sample
        of them a shadow gives, ``ShadowAcceptance.sequences``) into the decayed sums (the past
        weighted by ``keep``), and with ``tokens`` (what the round committed per sequence)
        the paired sums. A change of what is shadowed (chain lengths, walked or not, trees)
        starts that kind over; a round none of whose sampled sequences advanced is skipped."""
        if not shadow:
            return
        for kind, sh in shadow.items():
            sampled = getattr(sh, "sequences", None)
            if sampled == 0:
                continue
            seqs = sequences if sampled is None else sampled
            self.share[kind] = min(1.0, seqs / sequences) if sequences else 1.0
            pair_restart = self._observe_pair(kind, sh, tokens, keep, seqs)
            restart = self._observe_trees(kind, getattr(sh, "trees", ()), keep)
            self._observe_chains(kind, sh, keep, restart)
            self._observe_spread(kind, sh, keep, restart or pair_restart)

    def _observe_pair(self, kind: str, sh, tokens: float, keep: float, sequences: int) -> bool:
        """Fold the round into the kind's paired sums; True when they started over."""
        walked = {k: r for k, r in enumerate(getattr(sh, "rounds", ()), 1)}
        walked.update((t[0], t[1]) for t in getattr(sh, "trees", ()))
        pair = self.pairs.get(kind)
        restart = pair is None or pair.rr.keys() != walked.keys()
        if restart:
            pair = self.pairs[kind] = PairedWalk()
        pair.add(tokens, walked, keep, sequences)
        return restart

    def _observe_spread(self, kind: str, sh, keep: float, restart: bool) -> None:
        """Fold the sampled sequences' own walks into the kind's ``SampleSpread`` (dropped when
        the shadow scores every sequence)."""
        by_sequence = getattr(sh, "by_sequence", ())
        if not by_sequence:
            self.spread.pop(kind, None)
            return
        spread = self.spread.get(kind)
        if restart or spread is None or spread.sums.shape[0] != len(by_sequence):
            index = {k: k - 1 for k in range(1, len(sh.rounds) + 1)}
            index.update((t[0], len(sh.rounds) + i) for i, t in enumerate(sh.trees))
            spread = self.spread[kind] = SampleSpread(len(by_sequence), index)
        spread.add(by_sequence, keep)

    def _with_spread(self, kind: str, key, within: float, z: float, pair: bool) -> float | None:
        """``within`` (a walk's variance over its rounds) plus, when the shadow scores a sample
        of the batch, the share of the sequences' spread the sample leaves out (``SampleSpread``),
        that part scaled by (t / z)^2 so that ``z`` standard errors of the sum hold it at
        Student's t; None when the sample cannot measure it."""
        share = self.share.get(kind, 1.0)
        if share >= 1.0:
            return within
        spread = self.spread.get(kind)
        got = None if spread is None else spread.cluster(key, pair)
        if got is None:
            return None
        cluster, live = got
        t = t_for_z(z, live - 1)
        return within + (1.0 - share) * max(cluster - within, 0.0) * (t / z) ** 2

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
        chain of ``chain`` drafts, or 0 for a walked branching tree): its accepted drafts per
        round (``accepted``; with ``z`` > 0 at the low end of its interval) inverted on the
        tree, times the candidate's attention factor over the current strategy's (the shadow
        saw the current strategy's target); None when there is too little to go on."""
        if factor_now <= 0:
            return None
        got = self.accepted(kind, chain, tree, z)
        if got is None:
            return None
        mean, err = got
        return min(1.0, alpha_from_tokens(tree, 1.0 + mean - err) * factor / factor_now)

    def accepted(self, kind: str, chain: int, tree: str, z: float = 0.0):
        """(The accepted drafts per round of a candidate on ``tree`` -- a chain of ``chain``
        drafts, or 0 for a walked branching tree -- as the shadow of drafter ``kind`` found
        them: its walk's, or for a chain not walked the positions' ``E[min(m, chain)]``;
        ``z`` standard errors of it), or None when there is too little to go on.

        The standard error: a chain's, the variance of min(geometric, chain) at the estimate,
        over the decayed positions or rounds (fewer than the effective ones, so the interval
        errs wide); a walked tree's, its rounds' own variance over its decayed rounds; on a
        sample of the batch, either with the sequences' spread the sample leaves out (the
        module; None when it cannot be measured)."""
        est = self.chains.get(kind)
        if est is None or est[0] < SHADOW_MIN_POSITIONS:
            return None
        if not chain:  # a branching tree: its own walk, when the shadow walks it
            walk = self.walks.get(kind, {}).get(tree)
            if walk is None or walk[0] < SHADOW_MIN_POSITIONS:
                return None
            n, mean = walk[0], walk[1] / walk[0]
            if z <= 0:
                return mean, 0.0
            var = self._with_spread(kind, tree, max(walk[2] / n - mean * mean, 0.0) / n, z, False)
            return None if var is None else (mean, z * math.sqrt(var))
        if chain > len(est[1]):
            return None
        if est[2] is not None:  # the chain's walk: its own rounds on this text (engine.ngram)
            n = est[2][chain - 1]
            if n < SHADOW_MIN_POSITIONS:
                return None
            mean = est[3][chain - 1] / n
        else:
            n, mean = est[0], sum(est[1][:chain]) / est[0]
        if z <= 0:
            return mean, 0.0
        a = alpha_from_tokens(tree, 1.0 + mean)
        second = sum((2 * j - 1) * a**j for j in range(1, chain + 1))
        var = self._with_spread(kind, chain, max(second - mean * mean, 0.0) / n, z, False)
        return None if var is None else (mean, z * math.sqrt(var))

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
        var = max(pair.rr[key] / w - mean * mean, 0.0) * pair.w2 / (w * w)
        if z > 0:
            var = self._with_spread(kind, key, var, z, pair=True)
            if var is None:
                return None
        return mean + z * math.sqrt(var), raw, pair.n / w

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
