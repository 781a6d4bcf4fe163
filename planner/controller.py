"""Online adaptation (seed 000, Mechanism 3, phase 2): the controller the decode loop calls
after every round.

It keeps an exponential moving average of the tokens produced per round, turns it into the
per-token acceptance the current tree implies (``planner.profile.alpha_from_tokens``), and
compares that with the acceptance the offline ranking assumed for this drafter and regime (after
a re-score that kept the strategy: with the acceptance that re-score saw, so a steady deviation
is scored once, not every ``patience`` rounds). When they differ by more than ``epsilon`` for
``patience`` consecutive rounds, it re-scores the regime's top candidates and the best-ranked
strategy of every (drafter, tree), and switches to the best one if it beats the current
strategy's re-scored throughput by more than ``hysteresis`` plus the measured switch cost
amortised over ``horizon_rounds``, and no switch happened in the last ``cooldown`` rounds.
Hysteresis and cooldown keep it from oscillating. A candidate the shadow walks (an n-gram
chain or tree, see below) is judged against the current strategy by a paired test instead
(``_walk_gain``): the rounds its walk took over the tokens the current strategy committed,
round by round -- the same text on both sides, so the bursts of real text, which make each
side's own interval wide, cancel. A re-score whose best paid at its point
estimate but not across the confidence intervals below is repeated ``patience`` rounds later
(reason ``recheck``): the intervals narrow as rounds come in while the estimates stay put, so
neither trigger would fire again. While the current strategy drafts, the switch
must also pay at both ends of the observed acceptance's confidence interval (``confidence_z``
standard errors of the EMA, from the EMA's own variance and effective sample size): a
deviation of ``epsilon`` is within the noise of ~40 rounds of a chain (a 4-chain's tokens per
round spread by ~1.4), and on the H100 (run 13, repetitive text) a draft model whose EMA
dipped 0.05-0.1 left for autoregressive decoding in 4 of 5 runs while its fixed runs measured
above autoregressive decoding. A chain whose acceptance has collapsed (the
likelihood ratio of its rounds since it started, a quarter of the expected alpha against it,
above ``collapse_llr``; ``_collapsed``) re-scores at once, cooldown or not (reason
``collapse``): n-gram
lookup on random bytes, or a probe of a drafter the text defeats, is certain after a few
rounds, and each further round at the acceptance that failed is lost.

What each candidate is scored at:

- the current strategy: the acceptance observed on it; the current drafter's other trees: their
  profiled acceptance shifted by the relative change observed -- except its chains no longer
  than the current chain at the same attention factor (**truncation**, ``_Own``): a chain of
  k drafts of that drafter would have drafted the first k of the current chain's on the same
  text, so it would have accepted min(m, k) of a round that accepted m. Once the chain has run
  ``patience`` rounds, their tokens per round are its rounds', not modelled: on run 14's prose
  the draft model's chain:2 measured 17% faster than its chain:4, which the profile (code)
  ranks above it at 16K. The rounds' sums start from ``patience`` observations as profiled
  (``_Own.prior``). A move to one of them is judged by the paired difference of the two chains'
  tokens/s over the same rounds (``_Own.paired_low``: both come from one set of rounds, so the
  variance of their difference is far below the sum of theirs) at the low end of
  ``confidence_z`` standard errors, and it must pay more than ``hysteresis`` there for
  ``patience`` consecutive rounds: it is checked every round, and one round's pass may be
  noise (reason ``truncation``; no re-score). Autoregressive decoding is the chain of no
  drafts: its tokens per round are 1 on any rounds, so it is judged by the same paired test.
  Of the moves that pass, the one with the largest expected gain is taken. A drafter that
  stopped drafting keeps the sums of its last chain for its chains no longer than it, where it
  has no shadow;
- a drafter with a **shadow** estimate in the round statistics (``RoundStats.shadow``: what an
  n-gram chain would have accepted on the tokens just committed, which the decode loop scores
  every round whether or not that drafter drafts, see ``engine.ngram``): its chains at the
  acceptance the shadow implies for that very chain length (times their attention factor over
  the current strategy's), its other trees shifted by the shadow's change on its best-ranked
  chain. A shadow that rises more than ``epsilon`` above the profile (or above what the last
  re-score saw) for ``patience`` rounds triggers a re-score too (reason ``shadow``) -- also
  while decoding autoregressively, which observes no acceptance of its own;
- any other drafter: the shift last observed on it, or its profile. A prompt that defeats one
  drafter need not defeat another (random bytes defeat n-gram lookup, not a draft model).

A strategy that drafts nothing observes no acceptance: after ``probe_after`` rounds in one, the
controller probes a drafting strategy of the best-ranked drafter that has no shadow: its
candidate that scores best on what was last observed of it, its best-ranked one if nothing was
(reason ``probe``). Each probe doubles the wait before the next one (up to ``probe_max`` rounds, or
``probe_after`` when that is longer): text that defeated a drafter twice is likely to go on
doing so, and each probe costs ``patience`` rounds or more at the acceptance that lost. The
wait is back to ``probe_after`` once a drafting strategy has held for ``probe_after`` rounds.
Every switch is logged (``switches``) with its reason. ``drafter_kinds()`` tells the decode
loop which drafters to keep warm, so a switch costs a catch-up, not a restart.

The rounds are taken ``stride`` at a time (4): the loop hands every round over at once, and
the controller goes through the rounds since its last decision together, in order, then decides.
Every counter, average and test advances round by round as with a stride of 1, so a decision
comes at most ``stride - 1`` rounds late. The point is the host's time: a call that finds the
CPU caches cold, as the rest of a decode round leaves them, costs about five warm ones.

Switch costs are kept per destination (``switch_kind``: the drafter kind, or ``none`` for a
strategy that drafts nothing) from the host time the loop reports for each switch: going to
autoregressive decoding installs a strategy and nothing else, while going to a draft model runs
its catch-up forward over the tokens committed since it last drafted -- one figure for both
would price the cheap switch at the dear one's cost, or the other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfmodel.hardware import GpuSpec
from perfmodel.models import ModelSpec
from perfmodel.strategy import Strategy, parse_tree
from planner.profile import (
    REGIMES,
    Profile,
    alpha_from_tokens,
    chain_length,
    expected_tokens,
    profile_from_json,
    regime_of,
)
from planner.rank import score, strategy_from_json
from planner.space import strategy_id

# Decayed positions a shadow estimate needs before the controller uses it, and decayed rounds
# a chain length's walk needs (about one round of a long chain; fewer is a coin toss).
SHADOW_MIN_POSITIONS = 8.0


@dataclass(slots=True)
class _Known:
    """What the controller asks of one strategy every round, worked out once: its id, drafter
    kind, chain length (``chain_length``), and per regime its profiled alpha and attention
    factor."""

    sid: str
    kind: str
    chain: int
    alpha: dict[str, float] = field(default_factory=dict)
    factor: dict[tuple, float] = field(default_factory=dict)  # (regime, drafter) -> factor


@dataclass(slots=True)
class _Own:
    """Decayed sums over the rounds a chain of ``chain`` drafts ran (strategy ``sid``, its
    attention factor ``factor`` for its drafter), one observation per sequence: ``m`` the
    drafts accepted, and per shorter length k = 1..chain-1, ``x = min(m, k)`` -- what a chain
    of k drafts of the same drafter would have accepted on the same text, since its drafts are
    the first k of the longer chain's. ``w`` the weights' sum, ``w2`` their squares' (the
    effective observations are ``w * w / w2``); weights decay by ``1 - ema`` per round, as the
    acceptance EMA's."""

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
        the mean and variance."""
        k = self.chain
        a = min(max(alpha, 0.0), 1.0)
        p = [a**j * (1.0 - a) for j in range(k)] + [a**k]  # P(m = j), j = 0..K
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


@dataclass(slots=True)
class _Pair:
    """Decayed sums, over the rounds of one shadowed drafter kind, for the paired test of
    its walked candidates against the current strategy (``OnlineController._walk_gain``):
    ``w`` the weights' sum, ``w2`` their squares', ``n`` the tokens the current strategy
    committed (per sequence), and per walk key (a chain length, or a tree spec) the squares of
    the rounds its walk took over the same tokens (``rr``; the rounds' own decayed sums are the
    shadow's, ``OnlineController._walk_rounds``). Weights decay by ``1 - ema`` per round, as
    every other average of the controller."""

    w: float = 0.0
    w2: float = 0.0
    n: float = 0.0
    rr: dict = field(default_factory=dict)

    def add(self, tokens: float, walked: dict, keep: float) -> None:
        if self.w:
            self.w, self.w2, self.n = keep * self.w, keep * keep * self.w2, keep * self.n
            for key in self.rr:
                self.rr[key] *= keep
        self.w += 1.0
        self.w2 += 1.0
        self.n += tokens
        rr = self.rr
        for key, x in walked.items():
            rr[key] = rr.get(key, 0.0) + x * x


@dataclass(slots=True)
class _Now:
    """What every round works out the same way while the current strategy (this very object),
    the context's ranked regime and the shadowed chain lengths stay: contexts in ``(lo, hi]``
    fall in ``regime``; ``expected``: the strategy's profiled alpha there; ``refs``: per
    shadow key (``_shadow_keys``: a shadowed kind's reference chain, or a walked tree's
    best-ranked candidate), the key, that strategy, its chain length (0 for a tree),
    attention factor and profiled alpha, and the current strategy's attention factor for its
    kind."""

    strategy: Strategy
    lo: float
    hi: float
    regime: str
    lens: tuple[tuple[str, int], ...]
    known: _Known
    expected: float
    refs: tuple[tuple[object, Strategy, int, float, float, float], ...]
    # ``_trunc_rows``: the current chain's drafter's shorter chains among the candidates
    # (id, chain length, predicted round time) and the current strategy's round time.
    trunc: tuple[tuple[tuple[str, int, float], ...], float] | None = None


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    # 0.05, not 0.1: on the tiny pair at 16K the draft model's chain:4 stops beating
    # autoregressive decoding 0.07-0.12 below its profiled alpha, so a 0.1 trigger fires at or
    # past the crossover; a re-score costs ~0.1 ms and hysteresis decides whether to switch.
    epsilon: float = field(default=0.05, metadata={"help": "acceptance deviation that counts"})
    patience: int = field(default=16, metadata={"help": "consecutive deviating rounds to act"})
    ema: float = field(default=0.05, metadata={"help": "weight of the newest round in the EMA"})
    hysteresis: float = field(default=0.05, metadata={"help": "relative gain needed to switch"})
    cooldown: int = field(default=16, metadata={"help": "rounds between two switches"})
    candidates: int = field(default=24, metadata={"help": "ranked strategies re-scored"})
    horizon_rounds: int = field(default=64, metadata={"help": "rounds a switch is amortised"})
    probe_after: int = field(
        default=64, metadata={"help": "rounds without drafts before probing a drafting strategy"}
    )
    probe_max: int = field(
        default=512, metadata={"help": "longest wait between probes (the wait doubles per probe)"}
    )
    # ln 100: at most a 1% chance per stint that a working chain triggers; a chain:4 whose
    # acceptance fell from 0.52 to ~0.03 (n-gram lookup on random bytes) triggers after ~10
    # rounds, a draft model's from 0.72 to ~0.1 after ~6. 0 turns the trigger off.
    collapse_llr: float = field(
        default=4.6,
        metadata={"help": "log-likelihood ratio at which a chain's acceptance drop acts at once"},
    )
    # 4: the work of four rounds in one call. Each call that finds the CPU caches cold (the
    # rest of a decode round evicts them) costs ~5x a warm one (benchmarks/controller_cost.py:
    # ~36 against ~7 us per round), and on the tiny pair a round is ~1 ms.
    stride: int = field(
        default=4,
        metadata={"help": "rounds taken in one go (decisions up to stride - 1 rounds later)"},
    )
    # True: the loop calls the controller while the next round's GPU work runs (its host time
    # hidden there, a decision one round later); False: between rounds.
    overlap: bool = field(
        default=True,
        metadata={"help": "take decisions a round late, behind the next round's GPU work"},
    )
    # 0: a drafter not tried on this text is scored at its profile, and trying it finds out
    # (a chain that fails collapses within a few rounds). On the H100's fixed runs since the
    # n-gram drafter's empty rounds became cheap (runs 24-26), the draft model's first-depth
    # acceptance moved by +3% to -20% off-distribution where the n-gram drafter's fell 29-65%,
    # and the replay (benchmarks/adaptive_replay.py) of those runs' worlds gains more at 0
    # than at 0.5 on every off-distribution set (run 26: repetitive +13.9% against +5.5%); on
    # run 17's and run 22's worlds, where the draft model fell further, 0.5 gained more.
    transfer: float = field(
        default=0.0,
        metadata={
            "help": "share of the largest acceptance drop observed on this text that a "
            "drafter not yet tried on it is scored with (0: its profile)"
        },
    )
    # 1.645: the switch pays at both ends of a 90% interval of the observed acceptance.
    confidence_z: float = field(
        default=1.645,
        metadata={
            "help": "standard errors of the observed acceptance a switch must pay across "
            "(0: the point estimate alone)"
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"ema must lie in (0, 1], got {self.ema}")
        for name in ("patience", "candidates", "horizon_rounds", "probe_after", "stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.probe_max < 1:
            raise ValueError(f"probe_max must be >= 1, got {self.probe_max}")
        if self.epsilon < 0 or self.hysteresis < 0 or self.cooldown < 0:
            raise ValueError("epsilon, hysteresis and cooldown must be >= 0")
        if not self.collapse_llr >= 0:
            raise ValueError(f"collapse_llr must be >= 0, got {self.collapse_llr}")
        if not 0 <= self.transfer <= 1:
            raise ValueError(f"transfer must lie in [0, 1], got {self.transfer}")
        if not self.confidence_z >= 0:
            raise ValueError(f"confidence_z must be >= 0, got {self.confidence_z}")


class OnlineController:
    """Implements the engine's ``Controller`` protocol (``after_round(stats)``)."""

    def __init__(
        self,
        ranking: dict,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: Profile,
        config: ControllerConfig | None = None,
        batch: int = 1,
        switch_cost_s: float | dict[str, float] = 0.0,
    ):
        """``switch_cost_s``: what a switch is known to cost before this controller has seen
        one (e.g. measured on earlier requests): one figure for every destination, or one per
        destination kind (``switch_kind``; ``default`` for the kinds it lacks, else 0); each
        switch it makes then measures its own destination's."""
        self.ranking, self.model, self.gpu, self.profile = ranking, model, gpu, profile
        self.config = config or ControllerConfig()
        self.batch = batch
        self.switches: list[dict] = []
        self.overlap = self.config.overlap  # engine.loop: called behind the next round
        costs = (
            dict(switch_cost_s) if isinstance(switch_cost_s, dict) else {"default": switch_cost_s}
        )
        for kind, v in costs.items():
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"switch_cost_s[{kind!r}] must be a number >= 0, got {v!r}")
        # Measured switch cost per destination kind (what ``switch_costs`` reports).
        self.switch_costs: dict[str, float] = {k: float(v) for k, v in costs.items()}
        self._probe_wait = self.config.probe_after
        self._drafting_since: int | None = None
        self._ema_tokens: float | None = None
        # The EMA's second moment and its weights' sum of squares (1 / effective rounds).
        self._ema_sq = 0.0
        self._ema_w2 = 1.0
        self._alpha = 0.0
        self._strategy_key: str | None = None
        self._deviating = 0
        self._scored_alpha: float | None = None  # the observed alpha the last re-score kept
        # Chain rounds since the strategy started or was last re-scored: drafts accepted, and
        # rounds that stopped at a rejection (the collapse test's sufficient statistics).
        self._chain_obs = [0, 0]
        self._last_switch = -(10**9)
        self._shift: dict[str, float] = {}  # observed / profiled acceptance, per drafter kind
        self._cands: dict[str, dict[str, Strategy]] = {}
        self._refs: dict[tuple, dict[str, Strategy]] = {}  # _shadow_refs_memo
        self._keys: dict[tuple, tuple] = {}  # _shadow_keys
        self._probes: dict[tuple, Strategy | None] = {}  # _probe_strategy, memoised
        self._round_cache: dict[str, dict[str, float]] = {}
        self._cand_rows: dict[str, list[tuple]] = {}  # _rows, per regime
        # ``_known``: by value, and by identity (``id`` -> (strategy, record); the strategy
        # held keeps its id from being reused).
        self._known_of: dict[Strategy, _Known] = {}
        self._known_id: dict[int, tuple[Strategy, _Known]] = {}
        # Shadow estimates per drafter kind: decayed resolved positions and, per chain length
        # k, decayed positions whose first k drafts matched.
        # per shadowed kind: decayed positions, matches per chain length, and the walks'
        # rounds and accepted drafts per chain length (None when the shadow walks none)
        self._shadow: dict[str, tuple[float, list[float], list | None, list | None]] = {}
        # per shadowed kind, per walked branching tree: decayed rounds, accepted drafts and
        # their squares
        self._walks: dict[str, dict[str, list[float]]] = {}
        self._pairs: dict[str, _Pair] = {}  # per shadowed kind (``_walk_gain``)
        # (kind, chain lengths, walked trees) shadowed
        self._shadow_lens: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
        self._now: _Now | None = None
        # per shadow key (``_shadow_keys``): rounds rising, and the shadow alpha the last
        # re-score saw
        self._shadow_dev: dict = {}
        self._shadow_scored: dict = {}
        # Per drafter kind, the rounds its last chain ran (``_Own``): the current one's, or the
        # memory of one that stopped drafting.
        self._own: dict[str, _Own] = {}
        self._trunc_dev = 0  # consecutive rounds a shorter chain paid (``_shorter_pays``)
        self._queue: list = []  # rounds not taken yet (``stride``)
        # The round of a re-score due because the last one's top paid at its point estimate
        # but not across its interval (None: none due).
        self._recheck_at: int | None = None

    @classmethod
    def from_ranking(
        cls, ranking: dict, config: ControllerConfig | None = None, batch: int = 1
    ) -> OnlineController:
        """The controller of a ranking document: its model, GPU and acceptance profile."""
        from perfmodel.hardware import get_gpu
        from perfmodel.models import get_model

        missing = [k for k in ("model", "gpu", "regimes", "profile") if k not in ranking]
        if missing:
            raise ValueError(f"the ranking lacks {', '.join(missing)}")
        profile = profile_from_json(ranking["profile"], "the ranking's profile", "ranking")
        return cls(
            ranking, get_model(ranking["model"]), get_gpu(ranking["gpu"]), profile, config, batch
        )

    def initial_strategy(self, context_len: int) -> Strategy:
        """The offline-best strategy of the context's regime."""
        regimes = self.ranking["regimes"]
        regime = regime_of(context_len)
        if regime not in regimes:
            raise ValueError(
                f"context {context_len} falls in regime {regime}, which the ranking does not "
                f"hold (it has {', '.join(regimes)})"
            )
        return strategy_from_json(regimes[regime]["ranking"][0]["strategy"])

    def _ranked_regime(self, context_len: int) -> str:
        """The context's regime, or the ranked regime nearest to it (a sequence can grow past
        the regimes the ranking holds)."""
        regimes = self.ranking["regimes"]
        regime = regime_of(context_len)
        if regime in regimes:
            return regime
        return min(regimes, key=lambda r: abs(regimes[r]["context_len"] - context_len))

    def observed_alpha(self) -> float | None:
        return None if self._ema_tokens is None else self._alpha

    def drafter_kinds(self) -> tuple[str, ...]:
        """The drafter kinds of every candidate that drafts, in every ranked regime: what the
        decode loop keeps warm (``engine.controller``)."""
        kinds = {
            c.drafter.kind
            for regime in self.ranking["regimes"]
            for c in self._candidates(regime).values()
            if parse_tree(c.tree)
        }
        return tuple(sorted(kinds))

    def shadow_trees(self, context_len: int | None = None) -> tuple[str, ...]:
        """The branching trees of the n-gram candidates of the context's ranked regime (every
        ranked regime's without ``context_len``): the trees the warm n-gram drafter's shadow
        walks (``engine.ngram``), so that they are scored from their own walks rather than
        shifted by the chains'. (The ranking resolves ``best:N`` trees per regime, so each
        regime has trees of its own; walking only the context's keeps the shadow's host time
        to its three.)"""
        regimes = (
            self.ranking["regimes"] if context_len is None else (self._ranked_regime(context_len),)
        )
        trees = {
            c.tree
            for regime in regimes
            for c in self._candidates(regime).values()
            if c.drafter.kind == "ngram" and not self._known(c).chain and parse_tree(c.tree)
        }
        return tuple(sorted(trees))

    def shadow_alpha(self, regime: str, c: Strategy, current: Strategy) -> float | None:
        """The acceptance the shadow estimate implies for candidate ``c`` (None when its drafter
        has no estimate yet or ``c`` is neither a chain nor a walked tree the shadow scores):
        the expected tokens per round of its chain length, or its tree's walk, inverted on its
        tree, times its attention factor over the current strategy's, both for ``c``'s drafter
        (the shadow saw the current strategy's target)."""
        kind = c.drafter.kind
        if kind not in self._shadow:
            return None
        factor, now = self._factor(regime, c), self._factor(regime, current, kind)
        return self._shadow_alpha(c.drafter.kind, self._known(c).chain, c.tree, factor, now)

    def _shadow_alpha(
        self, kind: str, chain: int, tree: str, factor: float, factor_now: float, z: float = 0.0
    ) -> float | None:
        """``shadow_alpha`` of a candidate of drafter ``kind`` on ``tree`` (a chain of
        ``chain``, or 0), its attention factor and the current strategy's given; ``z`` > 0:
        at the low end of its confidence interval, ``z`` standard errors of the matched length
        (the variance of min(geometric, chain) at the estimate, over the decayed positions --
        fewer than the effective ones, so the interval errs wide; a walked tree's: its rounds'
        own variance, over its decayed rounds)."""
        est = self._shadow.get(kind)
        if est is None or est[0] < SHADOW_MIN_POSITIONS or factor_now <= 0:
            return None
        if not chain:  # a branching tree: its own walk, when the shadow walks it
            walk = self._walks.get(kind, {}).get(tree)
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

    def after_round(self, stats) -> Strategy | None:
        """Take the round: every ``stride`` rounds, the rounds since in order (counters,
        averages and tests advance round by round as with a stride of 1), and a decision
        after the last of them -- a switch, or None. In between, None."""
        if self.config.stride <= 1:
            return self._round(stats, True)
        self._queue.append(stats)
        if len(self._queue) < self.config.stride:
            return None
        queue, self._queue = self._queue, []
        for st in queue[:-1]:
            self._round(st, False)
        return self._round(queue[-1], True)

    def _round(self, stats, decide: bool) -> Strategy | None:
        """One round's bookkeeping; with ``decide``, the decision too."""
        cfg = self.config
        s: Strategy = stats.strategy
        if "switch" in stats.step_s:  # what installing this strategy cost (catch-up included)
            self.switch_costs[switch_kind(s)] = float(stats.step_s["switch"])
        self._observe_shadow(getattr(stats, "shadow", None), stats.mean_accepted + 1.0)
        ctx = max(stats.context_lens)
        now = self._now
        if (
            now is None
            or now.strategy is not s
            or now.lens is not self._shadow_lens
            or not now.lo < ctx <= now.hi
        ):
            now = self._now = self._make_now(s, ctx)
        key, regime = now.known.sid, now.regime
        drafting = bool(stats.drafted)
        if not drafting:
            self._drafting_since = None
        elif self._drafting_since is None:
            self._drafting_since = stats.round
        elif stats.round - self._drafting_since >= cfg.probe_after:
            self._probe_wait = cfg.probe_after  # drafting held: the text suits a drafter again
        expected, own = None, False
        if drafting:
            tokens = stats.mean_accepted + 1.0
            if key != self._strategy_key:  # a new strategy: its own acceptance history
                self._strategy_key, self._ema_tokens, self._deviating = key, tokens, 0
                self._ema_sq, self._ema_w2 = tokens * tokens, 1.0
                self._scored_alpha = None
                self._chain_obs = [0, 0]
            else:
                w = cfg.ema
                self._ema_tokens = (1 - w) * self._ema_tokens + w * tokens
                self._ema_sq = (1 - w) * self._ema_sq + w * tokens * tokens
                self._ema_w2 = (1 - w) * (1 - w) * self._ema_w2 + w * w
            self._alpha = alpha_from_tokens(s.tree, self._ema_tokens)
            if now.known.chain:
                own = self._own.get(now.known.kind)
                if own is None or own.sid != key:
                    own = self._own[now.known.kind] = _Own(
                        key, now.known.chain, self._factor(regime, s)
                    )
                    own.prior(now.expected, cfg.patience)
                own.add(stats.accepted, 1.0 - cfg.ema)
            expected = now.expected
            ref = expected if self._scored_alpha is None else self._scored_alpha
            self._deviating = self._deviating + 1 if abs(self._alpha - ref) > cfg.epsilon else 0
            own = self._deviating >= cfg.patience
            collapse = self._collapsed(s, stats.accepted, ref)
            own = own or collapse
        else:
            self._strategy_key = key
            collapse = False
        shadow_kind = self._shadow_rising(now, drafting)
        if stats.round - self._last_switch < cfg.cooldown and not collapse:
            return None
        pick = self._shorter_pays(now, regime) if drafting else None
        self._trunc_dev = self._trunc_dev + 1 if pick is not None else 0
        if not decide:
            return None
        if pick is not None and self._trunc_dev >= cfg.patience and not own and shadow_kind is None:
            # A shorter chain of this drafter has paid across its paired interval for
            # ``patience`` rounds: switch to it (no re-score: the rest stands as last scored).
            self._deviating = self._trunc_dev = 0
            self._chain_obs = [0, 0]
            self._scored_alpha = self._alpha
            self._log_switch(
                stats.round, key, pick[0], "truncation", self._alpha, expected, pick[1]
            )
            return pick[0]
        recheck = self._recheck_at is not None and stats.round >= self._recheck_at
        if own or shadow_kind is not None or recheck:
            spread = self._spread(s.tree) if drafting and not collapse else ()
            best, gain = self._rescore(s, regime, ctx, expected, spread)
            # A top that paid at its point estimate but not across its interval: look again
            # once ``patience`` more rounds have narrowed the interval (reason ``recheck``).
            # Its estimate need not move for that, so no deviation or rise would trigger it.
            self._recheck_at = (
                stats.round + cfg.patience if best is None and gain > cfg.hysteresis else None
            )
            # What this re-score saw: the same deviation does not trigger another one.
            self._deviating = 0
            self._chain_obs = [0, 0]
            self._scored_alpha = self._alpha if drafting else None
            for skey, ref in self._shadow_keys(regime):
                self._shadow_dev[skey] = 0
                a = self.shadow_alpha(regime, ref, s)
                if a is not None:
                    self._shadow_scored[skey] = a
            if best is None:
                return None
            if own or shadow_kind is None:
                reason = "collapse" if collapse else "acceptance" if own else "recheck"
                observed = self._alpha if drafting else None
                self._log_switch(stats.round, key, best, reason, observed, expected, gain)
            else:
                ref = dict(self._shadow_keys(regime))[shadow_kind]
                self._log_switch(
                    stats.round,
                    key,
                    best,
                    "shadow",
                    self._shadow_scored[shadow_kind],
                    self._alpha_for(regime, ref),
                    gain,
                )
            return best
        if not drafting and self.switches and stats.round - self._last_switch >= self._probe_wait:
            # A strategy that drafts nothing observes no acceptance, so without a shadow of a
            # drafter it could never leave: go back to the best-ranked drafting strategy.
            probe = self._probe_choice(regime, s)
            if probe is not None:
                self._log_switch(stats.round, key, probe, "probe", None, None, 0.0)
                self._probe_wait = max(min(2 * self._probe_wait, cfg.probe_max), cfg.probe_after)
                return probe
        return None

    def _spread(self, tree: str) -> tuple[float, ...]:
        """The acceptance at both ends of the observed one's confidence interval:
        ``confidence_z`` standard errors of the tokens-per-round EMA (its variance from the
        EMA's second moment, over its effective number of rounds, ``1 / sum of squared
        weights``), inverted on ``tree``; () when ``confidence_z`` is 0."""
        z = self.config.confidence_z
        if z <= 0 or self._ema_tokens is None:
            return ()
        var = max(self._ema_sq - self._ema_tokens * self._ema_tokens, 0.0)
        half = z * math.sqrt(var * self._ema_w2)
        return (
            alpha_from_tokens(tree, self._ema_tokens - half),
            alpha_from_tokens(tree, self._ema_tokens + half),
        )

    def _collapsed(self, s: Strategy, accepted, ref: float) -> bool:
        """Whether the current chain's acceptance has collapsed: Wald's sequential ratio test
        of the rounds since it started (or was last re-scored), collapsed (alpha = ``ref`` / 4)
        against working (alpha = ``ref - epsilon``), past ``collapse_llr``. Each draft is
        accepted with probability alpha until the first rejection, so a round of a K-chain
        that accepted m < K drafts has likelihood alpha^m (1 - alpha), m = K alpha^K. The ratio
        is a martingale under a working chain, so a chain accepting at ``ref - epsilon`` or more
        triggers with probability at most exp(-collapse_llr) per stint (1% at ln 100), while
        one that collapsed does within a few rounds -- far fewer than ``patience`` -- and acts
        inside the cooldown: leaving a strategy that stopped working is no oscillation.
        Branching trees keep the EMA test alone."""
        k = chain_length(s.tree)
        a0 = ref - self.config.epsilon
        if not k or self.config.collapse_llr <= 0 or not 0.0 < a0 < 1.0:
            return False
        obs = self._chain_obs
        for m in accepted:
            obs[0] += min(m, k)
            obs[1] += m < k
        a1 = ref / 4.0
        hits, misses = obs
        llr = hits * math.log(a1 / a0) + misses * math.log((1.0 - a1) / (1.0 - a0))
        return llr > self.config.collapse_llr

    def switch_cost(self, to: Strategy) -> float:
        """The host time a switch to ``to`` is expected to cost: the last one measured to its
        kind, else the ``default`` given, else 0."""
        return self.switch_costs.get(switch_kind(to), self.switch_costs.get("default", 0.0))

    def _id(self, s: Strategy) -> str:
        """``strategy_id``, memoised (``_known``): it hashes the strategy's JSON (~20 us), and
        the controller needs the current one's every round."""
        return self._known(s).sid

    def _known(self, s: Strategy) -> _Known:
        """``s``'s record, looked up by identity first: the loop hands the controller back the
        strategy object it installed round after round, and hashing a ``Strategy`` (by value:
        its 15 fields and its drafter's) costs more than the rest of a quiet round."""
        hit = self._known_id.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        known = self._known_of.get(s)
        if known is None:
            known = _Known(strategy_id(s), s.drafter.kind, chain_length(s.tree))
            self._known_of[s] = known
        if len(self._known_id) >= 4096:  # a caller building a new object per round
            self._known_id.clear()
        self._known_id[id(s)] = (s, known)
        return known

    def _alpha_for(self, regime: str, s: Strategy) -> float:
        """``profile.alpha_for``, memoised per strategy and regime."""
        per_regime = self._known(s).alpha
        a = per_regime.get(regime)
        if a is None:
            a = per_regime[regime] = self.profile.alpha_for(regime, s)
        return a

    def _factor(self, regime: str, s: Strategy, drafter: str | None = None) -> float:
        """``profile.attention_factor`` (for ``drafter``, default ``s``'s), memoised per
        strategy, regime and drafter."""
        memo = self._known(s).factor
        key = (regime, drafter)
        f = memo.get(key)
        if f is None:
            f = memo[key] = self.profile.attention_factor(regime, s, drafter)
        return f

    def _make_now(self, s: Strategy, context_len: int) -> _Now:
        """``_Now`` of ``s`` at ``context_len`` (with the shadowed chain lengths as they are)."""
        regime = self._ranked_regime(context_len)
        lo, hi = context_len, context_len  # the nearest ranked regime: this context only
        if regime == regime_of(context_len):
            bounds = [-math.inf, *REGIMES.values()]
            i = list(REGIMES).index(regime)
            lo, hi = bounds[i], bounds[i + 1] if i + 1 < len(REGIMES) else math.inf
        refs = tuple(
            (
                skey,
                ref,
                self._known(ref).chain,
                self._factor(regime, ref),
                self._alpha_for(regime, ref),
                self._factor(regime, s, ref.drafter.kind),
            )
            for skey, ref in self._shadow_keys(regime)
        )
        return _Now(
            s, lo, hi, regime, self._shadow_lens, self._known(s), self._alpha_for(regime, s), refs
        )

    def _observe_shadow(self, shadow, tokens: float) -> None:
        """Fold this round's shadow counts into the decayed sums (weight ``1 - ema`` per round
        on the past, as the acceptance EMA), and with ``tokens`` (what the round committed per
        sequence) the paired sums (``_Pair``)."""
        if not shadow:
            return
        keep = 1.0 - self.config.ema
        for kind, sh in shadow.items():
            walked = {k: r for k, r in enumerate(getattr(sh, "rounds", ()), 1)}
            walked.update((t[0], t[1]) for t in getattr(sh, "trees", ()))
            pair = self._pairs.get(kind)
            if pair is None or pair.rr.keys() != walked.keys():
                pair = self._pairs[kind] = _Pair()
            pair.add(tokens, walked, keep)
            old = self._shadow.get(kind)
            walked = bool(getattr(sh, "rounds", ()))
            trees = getattr(sh, "trees", ())
            walks = self._walks.get(kind)
            if walks is None or len(walks) != len(trees) or any(t[0] not in walks for t in trees):
                walks = self._walks[kind] = {t[0]: [float(x) for x in t[1:]] for t in trees}
                old = None  # what is shadowed changed: start over
            else:
                for spec, r, d, sq in trees:
                    w = walks[spec]
                    w[0], w[1], w[2] = keep * w[0] + r, keep * w[1] + d, keep * w[2] + sq
            if old is None or len(old[1]) != len(sh.matched) or (old[2] is not None) != walked:
                self._shadow[kind] = (
                    float(sh.positions),
                    [float(x) for x in sh.matched],
                    [float(x) for x in sh.rounds] if walked else None,
                    [float(x) for x in sh.drafts] if walked else None,
                )
                self._shadow_lens = tuple(
                    (k, len(v[1]), tuple(self._walks.get(k, ()))) for k, v in self._shadow.items()
                )
            else:
                matched = [keep * a + b for a, b in zip(old[1], sh.matched, strict=True)]
                rounds = drafts = None
                if walked:
                    rounds = [keep * a + b for a, b in zip(old[2], sh.rounds, strict=True)]
                    drafts = [keep * a + b for a, b in zip(old[3], sh.drafts, strict=True)]
                self._shadow[kind] = (keep * old[0] + sh.positions, matched, rounds, drafts)

    def _shadow_refs_memo(self, regime: str) -> dict[str, Strategy]:
        """Per shadowed drafter kind, its best-ranked chain among the regime's candidates: what
        its shadow is compared with (its profile) and what shifts its other trees. Memoised:
        the dictionary itself, not to be changed."""
        key = (regime, self._shadow_lens)
        refs = self._refs.get(key)
        if refs is None:  # depends on the regime and the shadowed chain lengths only
            refs = {}
            for kind, n, _ in key[1]:
                for c in self._candidates(regime).values():
                    if c.drafter.kind == kind and 1 <= chain_length(c.tree) <= n:
                        refs[kind] = c
                        break
            self._refs[key] = refs
        return refs

    def _shadow_keys(self, regime: str) -> tuple[tuple, ...]:
        """What a rising shadow is watched on: per shadowed drafter kind, its reference chain
        (``_shadow_refs_memo``; key: the kind), and per tree its shadow walks, the regime's
        best-ranked candidate of that kind on it (key: (kind, tree)). Memoised."""
        key = (regime, self._shadow_lens)
        keys = self._keys.get(key)
        if keys is None:
            out = list(self._shadow_refs_memo(regime).items())
            for kind, _, trees in self._shadow_lens:
                for spec in trees:
                    ref = next(
                        (
                            c
                            for c in self._candidates(regime).values()
                            if c.drafter.kind == kind and c.tree == spec
                        ),
                        None,
                    )
                    if ref is not None:
                        out.append(((kind, spec), ref))
            keys = self._keys[key] = tuple(out)
        return keys

    def _shadow_rising(self, now: _Now, drafting: bool):
        """Count, per shadow key (``_shadow_keys``) the current strategy does not observe
        itself, the rounds its shadow stands more than ``epsilon`` above its profile (or above
        what the last re-score saw: a candidate doing worse than assumed cannot win a
        re-score, so only a rise triggers one); the key whose count reached ``patience``, if
        any. A drafting chain observes its drafter's chains (``_Own``), not its trees."""
        cfg, hit = self.config, None
        for skey, ref, chain, factor, profiled, factor_now in now.refs:
            kind = ref.drafter.kind
            if drafting and kind == now.known.kind and (chain or ref.tree == now.strategy.tree):
                continue  # the drafting drafter observes itself
            a = self._shadow_alpha(kind, chain, ref.tree, factor, factor_now)
            base = max(profiled, self._shadow_scored.get(skey, 0.0))
            rising = a is not None and a - base > cfg.epsilon
            self._shadow_dev[skey] = self._shadow_dev.get(skey, 0) + 1 if rising else 0
            if self._shadow_dev[skey] >= cfg.patience and hit is None:
                hit = skey
        return hit

    def _log_switch(
        self, round_: int, key: str, to: Strategy, reason: str, observed, expected, gain: float
    ) -> None:
        self._last_switch = round_
        self._recheck_at = None
        self.switches.append(
            {
                "round": round_,
                "from": key,
                "to": self._id(to),
                "reason": reason,
                "observed_alpha": observed,
                "expected_alpha": expected,
                "predicted_gain": gain,
                "switch_cost_s": self.switch_cost(to),
            }
        )

    def _probe_strategy(self, regime: str) -> Strategy | None:
        """The regime's best-ranked strategy that drafts with a drafter the shadow does not
        cover (None when there is none: the shadow observes the others every round)."""
        shadowed = self._shadow_refs_memo(regime)
        key = (regime, tuple(shadowed))
        if key not in self._probes:  # depends on the regime and the shadowed kinds only
            self._probes[key] = None
            for r in self.ranking["regimes"][regime]["ranking"]:
                s = strategy_from_json(r["strategy"])
                if parse_tree(s.tree) and s.drafter.kind not in shadowed:
                    self._probes[key] = s
                    break
        return self._probes[key]

    def _candidates(self, regime: str) -> dict[str, Strategy]:
        """The regime's top candidates, plus the best-ranked strategy of every (drafter, tree):
        a change in acceptance mostly moves the best tree, which the top of one ranking may
        not hold."""
        if regime not in self._cands:
            ranked = self.ranking["regimes"][regime]["ranking"]
            picked = ranked[: self.config.candidates]
            seen = set()
            for r in ranked:
                key = (r["strategy"]["drafter"]["kind"], r["strategy"]["tree"])
                if key not in seen:
                    seen.add(key)
                    picked.append(r)
            strategies = (strategy_from_json(r["strategy"]) for r in picked)
            self._cands[regime] = {strategy_id(c): c for c in strategies}
        return self._cands[regime]

    def _round_s(self, regime: str, strategies: list[Strategy]) -> dict[str, float]:
        """Predicted round time (step model + loop overhead) per strategy at the regime's
        ranked context, computed once per strategy: it does not depend on acceptance, so a
        re-score only recomputes tokens per round (a full ``score`` call takes ~15-30 ms of
        host time, more than ten 1-ms decode rounds)."""
        cache = self._round_cache.setdefault(regime, {})
        missing = [s for s in strategies if self._id(s) not in cache]
        if missing:
            ctx = self.ranking["regimes"][regime]["context_len"]
            scored, _ = score(self.model, self.gpu, missing, ctx, self.profile, regime, self.batch)
            cache.update({strategy_id(x.strategy): x.round_s for x in scored})
        return cache

    def _rows(self, regime: str, current: Strategy) -> list[tuple]:
        """What a re-score reads of each candidate, worked out once per regime: id, strategy,
        drafter kind, chain length, attention factor, profiled alpha, predicted round time.
        The current strategy is one of them (the last one when it is no candidate)."""
        rows = self._cand_rows.get(regime)
        cands = self._candidates(regime)
        if rows is None:
            rows = self._cand_rows[regime] = self._make_rows(regime, list(cands.values()))
        if self._id(current) not in cands:
            rows = rows + self._make_rows(regime, [current])
        return rows

    def _make_rows(self, regime: str, strategies: list[Strategy]) -> list[tuple]:
        round_s = self._round_s(regime, strategies)
        return [
            (
                k.sid,
                c,
                k.kind,
                k.chain,
                self._factor(regime, c),
                self._alpha_for(regime, c),
                round_s[k.sid],
            )
            for c, k in ((c, self._known(c)) for c in strategies)
        ]

    def warm(self) -> None:
        """Score every ranked regime's candidates and tabulate their trees' expected tokens
        now, before decoding starts (tens of ms per tree the first time), so that no round
        of the loop pays for it."""
        for regime in self.ranking["regimes"]:
            cands = list(self._candidates(regime).values())
            self._round_s(regime, cands)
            for c in cands:
                expected_tokens(c.tree, 0.5)

    def _rescore(
        self,
        current: Strategy,
        regime: str,
        context_len: int,
        expected: float | None,
        spread: tuple[float, ...] = (),
    ):
        """Best candidate under the observed acceptance (``expected``: the current strategy's
        profiled alpha, None when it drafts nothing), or (None, gain) when none is worth it --
        also when, with ``spread`` (the current strategy's acceptance at the ends of its
        confidence interval, ``_spread``), the switch would not pay at one of them."""
        cfg = self.config
        now_id = self._id(current)
        # The current drafter's candidates shift by the relative change observed on it (so the
        # current strategy scores at exactly the observed acceptance); a shadowed drafter's
        # chains score at their shadow acceptance, its other trees shift by the shadow's change
        # on its best-ranked chain; another drafter keeps the shift last observed on it, or its
        # profile. The memory keeps two drafters from trading places on one drafter's evidence.
        own_kind = current.drafter.kind if expected is not None else None
        if own_kind is not None:
            self._shift[own_kind] = self._alpha / expected if expected > 0 else 1.0
        for kind, ref in self._shadow_refs_memo(regime).items():
            a, prof = self.shadow_alpha(regime, ref, current), self._alpha_for(regime, ref)
            if kind != own_kind and a is not None and prof > 0:
                self._shift[kind] = a / prof
        cands, tpr, tps = self._tally(current, regime)
        # The current chain's drafter's shorter chains, once the chain has run ``patience``
        # rounds (their tokens per round are then its rounds', ``_tally``): the paired test
        # gates them, and only after they paid for ``patience`` rounds (``_shorter_pays``: it
        # is checked every round, and one round's pass may be noise); until then they sit
        # this re-score out.
        shorter = {}
        now = self._now
        if own_kind is not None and now is not None and now.strategy is current:
            own = self._own.get(own_kind)
            if own is not None and own.sid == now_id and own.rounds >= cfg.patience:
                rows, round_now = self._trunc_rows(now, regime)
                shorter = {sid: (own, k, t, round_now) for sid, _, k, t in rows if k >= 1}
        sustained = self._trunc_dev >= cfg.patience
        ids = tps if sustained else [k for k in tps if k not in shorter]
        top_id = max(ids, key=lambda k: (tps[k], k == now_id))
        if top_id == now_id:
            return None, 0.0
        gain = self._gain(cands, tpr, tps, now_id, top_id)
        if gain <= cfg.hysteresis:
            return None, gain
        if top_id in shorter:
            if self._paired_gain(*shorter[top_id], cands[top_id]) > cfg.hysteresis:
                return cands[top_id], gain
        else:
            walk = self._walk_gain(regime, current, cands[top_id], tpr[top_id])
            if (
                walk > cfg.hysteresis
                if walk is not None
                else self._spread_pays(current, regime, cands, now_id, top_id, expected, spread)
            ):
                return cands[top_id], gain
        # The top did not pay across its interval: a shorter chain that pays across its own.
        for sid in sorted(shorter if sustained else (), key=lambda k: -tps[k]):
            if sid != top_id and tps[sid] > tps[now_id]:
                if self._paired_gain(*shorter[sid], cands[sid]) > cfg.hysteresis:
                    return cands[sid], self._gain(cands, tpr, tps, now_id, sid)
        return None, gain

    def _spread_pays(
        self,
        current: Strategy,
        regime: str,
        cands: dict,
        now_id: str,
        top_id: str,
        expected: float | None,
        spread: tuple[float, ...],
    ) -> bool:
        """Whether the switch to ``top_id`` pays by more than ``hysteresis`` with the current
        strategy's acceptance at both ends of its interval (``spread``), shadowed candidates at
        the low end of theirs."""
        cfg = self.config
        own_kind = current.drafter.kind if expected is not None else None
        if own_kind is None or not expected > 0:
            return True
        point = self._shift[own_kind]
        try:
            for a in spread:
                self._shift[own_kind] = a / expected
                _, tpr_b, tps_b = self._tally(current, regime, cfg.confidence_z)
                if self._gain(cands, tpr_b, tps_b, now_id, top_id) <= cfg.hysteresis:
                    return False
        finally:
            self._shift[own_kind] = point
        return True

    def _walk_gain(
        self, regime: str, current: Strategy, c: Strategy, tokens: float
    ) -> float | None:
        """Relative gain of switching to ``c``, a candidate whose shadow walk (a chain length,
        or a tree) ran over the very tokens the current strategy committed, at the low end of
        a paired interval; None when ``c`` has no such walk.

        Per round ``i`` the current strategy took one round for the tokens it committed, and
        the walk ``r_i`` rounds over the same tokens (up to the walk's round in progress), so
        ``c`` spends ``mean(r) * round_c`` where the current spends ``round_now``: the same
        text on both sides, so the text's bursts, which make each side's own estimate noisy,
        cancel. ``mean(r)`` is taken ``confidence_z`` standard errors high (the decayed rounds'
        effective count, ``w^2 / w2``) and scaled by ``c``'s attention factor over the
        current's (``tokens``: what the re-score expects of ``c``, against its walk's own
        figure); the switch cost spreads over ``horizon_rounds`` of ``c``'s rounds."""
        kind, known = c.drafter.kind, self._known(c)
        pair = self._pairs.get(kind)
        key = known.chain or c.tree
        if pair is None or pair.w < SHADOW_MIN_POSITIONS or key not in pair.rr or tokens <= 1.0:
            return None
        raw = self._shadow_alpha(kind, known.chain, c.tree, 1.0, 1.0)
        rounds = self._walk_rounds(kind, key)
        if raw is None or rounds is None:
            return None
        scale = expected_tokens(c.tree, raw) / tokens  # > 1: c's attention accepts less
        w = pair.w
        mean = rounds / w
        var = max(pair.rr[key] / w - mean * mean, 0.0)
        high = (mean + self.config.confidence_z * math.sqrt(var * pair.w2) / w) * scale
        if high <= 0:
            return None
        rs = self._round_s(regime, [current, c])
        n = pair.n / w  # tokens per round of the current strategy, per sequence
        per_tok_now = rs[self._id(current)] / (n * self.batch)
        per_tok_new = high * rs[known.sid] / (n * self.batch) + self.switch_cost(c) / (
            self.config.horizon_rounds * tokens * self.batch
        )
        return per_tok_now / per_tok_new - 1.0

    def _walk_rounds(self, kind: str, key) -> float | None:
        """The decayed rounds the shadow's walk ``key`` (a chain length, or a tree spec) of
        drafter ``kind`` took: the chains' walks' or the trees' (None when not walked)."""
        if isinstance(key, int):
            est = self._shadow.get(kind)
            return est[2][key - 1] if est is not None and est[2] is not None else None
        walk = self._walks.get(kind, {}).get(key)
        return None if walk is None else walk[0]

    def _trunc_rows(self, now: _Now, regime: str):
        """(rows, round time of the current strategy): per candidate chain of the current
        chain's drafter no longer than it, at the same attention factor (so the same
        acceptance), not the current strategy itself, and per candidate that drafts nothing
        (chain length 0: one token every round, whatever the text): its id, strategy, chain
        length and predicted round time. Memoised on ``now``."""
        if now.trunc is None:
            rows = self._rows(regime, now.strategy)
            sid_now, k_now = now.known.sid, now.known.chain
            f_now = self._factor(regime, now.strategy)
            round_now = next(r[6] for r in rows if r[0] == sid_now)
            trunc = tuple(
                (sid, c, chain, round_s)
                for sid, c, kind, chain, factor, _, round_s in rows
                if sid != sid_now
                and (
                    (kind == now.known.kind and 1 <= chain <= k_now and factor == f_now)
                    or not parse_tree(c.tree)
                )
            )
            now.trunc = (trunc, round_now)
        return now.trunc

    def _paired_gain(
        self,
        own: _Own,
        k: int,
        round_k: float,
        round_now: float,
        to: Strategy,
        z: float | None = None,
    ) -> float:
        """Relative gain of switching to ``to``, a chain of ``k`` drafts of the current
        chain's drafter, at the low end of the paired interval of its tokens/s over the
        current strategy's (``_Own.paired_low``, ``confidence_z`` standard errors), the
        switch cost spread over ``horizon_rounds``."""
        cfg = self.config
        low = own.paired_low(k, round_k, round_now, cfg.confidence_z if z is None else z)
        tps_now = self.batch * own.tokens(own.chain) / round_now
        tps_low = tps_now + self.batch * low
        if tps_low <= 0:
            return -1.0
        per_tok_new = 1.0 / tps_low + self.switch_cost(to) / (
            cfg.horizon_rounds * own.tokens(k) * self.batch
        )
        return (1.0 / tps_now) / per_tok_new - 1.0

    def _shorter_pays(self, now: _Now, regime: str) -> tuple[Strategy, float] | None:
        """Of the shorter chains of the current chain's drafter and autoregressive decoding
        (``_trunc_rows``), those that gain more than ``hysteresis`` at the low end of their
        paired interval, once the current chain has run ``patience`` rounds: the one that
        gains most at the point estimate, with that gain; else None. The interval says
        whether a move pays at all; among the moves that do, the expected gain says which.
        (Picking by the low end instead favours the chain most like the current one, whose
        difference varies least: on the H100's prose, n-gram chain:2 over autoregressive
        decoding, which measured 4-9% faster there in runs 18 and 19.)"""
        own = self._own.get(now.known.kind)
        if own is None or own.sid != now.known.sid or own.rounds < self.config.patience:
            return None
        rows, round_now = self._trunc_rows(now, regime)
        best, top = None, -math.inf
        for _, c, k, t in rows:
            if self._paired_gain(own, k, t, round_now, c) > self.config.hysteresis:
                g = self._paired_gain(own, k, t, round_now, c, z=0.0)
                if g > top:
                    best, top = c, g
        return None if best is None else (best, top)

    def _probe_choice(self, regime: str, current: Strategy) -> Strategy | None:
        """The strategy a probe goes to: of the drafter of ``_probe_strategy``, the candidate
        that scores best on what was last observed of it (``_tally``: the rounds its last
        chain ran, or the shift last observed) -- text that defeated its long chains may still
        pay a short one -- or, when nothing was, at the shift a drafter not yet tried on this
        text is scored with (its profile; with ``transfer`` above 0, on text that defeated
        another drafter, its shorter chains, which lose less if it fails here too)."""
        base = self._probe_strategy(regime)
        if base is None:
            return base
        cands, _, tps = self._tally(current, regime)
        kind = base.drafter.kind
        ids = [sid for sid, c in cands.items() if c.drafter.kind == kind and parse_tree(c.tree)]
        return cands[max(ids, key=lambda k: tps[k])] if ids else base

    def _tally(self, current: Strategy, regime: str, z: float = 0.0) -> tuple[dict, dict, dict]:
        """Every candidate (by id), its expected tokens per round and tokens/s, at the
        acceptance the shifts and shadows say now (``_rescore``; shadow estimates ``z``
        standard errors low)."""
        now_id = self._id(current)
        now_kind = current.drafter.kind if parse_tree(current.tree) else None
        cands, tpr, tps = {}, {}, {}
        untried = self._untried_shift()
        for sid, c, kind, chain, factor, profiled, round_s in self._rows(regime, current):
            cands[sid] = c
            own = self._own.get(kind)
            if (
                own is not None
                and own.rounds >= self.config.patience
                and sid != now_id
                and 1 <= chain <= own.chain
                and factor == own.factor
                and (own.sid == now_id if kind == now_kind else kind not in self._shadow)
            ):
                # What its drafts would have accepted in the rounds the current (or the last)
                # chain of its drafter ran.
                tpr[sid] = own.tokens(chain)
                tps[sid] = self.batch * tpr[sid] / round_s
                continue
            a = None
            if sid != now_id and kind in self._shadow:
                factor_now = self._factor(regime, current, kind)
                a = self._shadow_alpha(kind, chain, c.tree, factor, factor_now, z)
            if a is None:
                a = min(1.0, profiled * self._shift.get(kind, untried))
            tpr[sid] = expected_tokens(c.tree, a)
            tps[sid] = self.batch * tpr[sid] / round_s
        return cands, tpr, tps

    def _untried_shift(self) -> float:
        """The shift a drafter not yet observed on this text is scored at: ``transfer`` of the
        largest drop observed on any drafter (1: no drop observed, or ``transfer`` 0)."""
        low = min(self._shift.values(), default=1.0)
        return 1.0 - self.config.transfer * max(0.0, 1.0 - low)

    def _gain(self, cands: dict, tpr: dict, tps: dict, now_id: str, to_id: str) -> float:
        """Relative gain of switching to ``to_id``: time per token now vs after switching, the
        switch cost spread over ``horizon_rounds``."""
        per_tok_now = 1.0 / tps[now_id]
        per_tok_new = 1.0 / tps[to_id] + self.switch_cost(cands[to_id]) / (
            self.config.horizon_rounds * tpr[to_id] * self.batch
        )
        return per_tok_now / per_tok_new - 1.0


def switch_kind(s: Strategy) -> str:
    """What a switch to ``s`` has to start: its drafter kind, or ``none`` when it drafts
    nothing (autoregressive decoding)."""
    return s.drafter.kind if parse_tree(s.tree) else "none"
