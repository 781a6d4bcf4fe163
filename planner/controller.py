"""Online adaptation (seed 000, Mechanism 3, phase 2): the controller the decode loop calls
after every round.

It keeps an EMA of the tokens produced per round, turns it into the per-token acceptance the
current tree implies, and compares that with the acceptance the offline ranking assumed for
this drafter and regime (``planner.acceptance_trigger``). Triggers -- the acceptance deviates,
a chain collapses, a shadowed drafter rises above its profile, a re-score that paid only at its
point estimate is due again -- re-score the regime's candidates (``planner.rescore``) and may
switch; a shorter chain that pays across its paired interval is taken without one. Every switch
is logged (``switches``) with its reason; a strategy that drafts nothing is left now and then
for a probe of a drafting one. ``OnlineController`` gives each trigger and how the controller
decides at batch B > 1.
"""

from __future__ import annotations

from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.planner.acceptance_trigger import AcceptanceTrigger
from ssvkit.planner.candidates import CandidateBook, Now
from ssvkit.planner.controller_config import ControllerConfig
from ssvkit.planner.estimators import ChainRounds, SwitchCosts, switch_kind
from ssvkit.planner.profile import RegimeProfile, profile_from_json, regime_of
from ssvkit.planner.rank import strategy_from_json
from ssvkit.planner.rescore import Rescorer
from ssvkit.planner.shadow import ShadowTracker

__all__ = ["ControllerConfig", "OnlineController", "switch_kind"]


class OnlineController:
    """Implements the engine's ``Controller`` protocol (``after_round(stats)``).

    The acceptance it compares with the ranking's is, after a re-score that kept the strategy,
    the acceptance that re-score saw, so a steady deviation is scored once. Four triggers
    re-score the regime's candidates (``planner.rescore``) and may switch, each switch logged
    (``switches``) with its reason:

    - ``acceptance``: the deviation exceeds ``epsilon`` for ``patience`` consecutive rounds, and
      no switch happened in the last ``cooldown`` rounds (hysteresis and cooldown keep the
      controller from oscillating); ``collapse``: a chain's acceptance collapsed
      (``estimators.CollapseTest``), which acts at once, cooldown or not -- leaving a strategy
      that stopped working is no oscillation;
    - ``shadow``: a shadowed drafter (``planner.shadow``) stands more than ``epsilon`` above
      its profile for ``patience`` rounds -- also while decoding autoregressively, which
      observes no acceptance of its own;
    - ``recheck``: the last re-score's best paid at its point estimate but not across its
      confidence interval; the interval narrows as rounds come in while the estimate stays
      put, so the re-score is repeated ``patience`` rounds later;
    - ``truncation`` (no re-score): a shorter chain of the current chain's drafter, or
      autoregressive decoding, has paid across its paired interval for ``patience`` rounds.

    A strategy that drafts nothing observes no acceptance: after ``probe_after`` rounds in one,
    the controller probes a drafting strategy of the best-ranked drafter that has no shadow
    (reason ``probe``). Each probe doubles the wait before the next one (up to ``probe_max``
    rounds, or ``probe_after`` when that is longer): text that defeated a drafter twice is
    likely to go on doing so. The wait is back to ``probe_after`` once a drafting strategy has
    held for ``probe_after`` rounds. ``drafter_kinds()`` tells the decode loop which drafters to
    keep warm, so a switch costs a catch-up, not a restart.

    **At batch B > 1** the sequences of a round accept different counts; the controller decides
    on the batch's figures. The acceptance EMA takes the round's mean per sequence (its
    interval the batch mean's); the collapse test and ``ChainRounds`` take each sequence's count
    as an observation; the shadow's counts are summed over the batch -- or over the fixed sample
    of ``shadow_sequences`` it scores, its intervals then widened by the sequences' spread
    (``planner.shadow``) --, a walk's rounds read per sequence (the batch advances all its
    sequences each round). Candidates are scored at batch B (round time of the batch's step
    with the loop's host time; B x tokens per sequence over it), B the ranking's unless given; a
    round of more than B sequences is refused.
    """

    def __init__(
        self,
        ranking: dict,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: RegimeProfile,
        config: ControllerConfig | None = None,
        batch: int | None = None,
        switch_cost_s: float | dict[str, float] = 0.0,
    ):
        """``batch``: the sequences each round decodes, which candidates are scored at (default:
        the ranking's ``batch``, else 1). ``switch_cost_s``: what a switch is known to cost
        before this controller has seen one (e.g. measured on earlier requests): one figure for
        every destination, or one per destination kind (``switch_kind``; ``default`` for the
        kinds it lacks, else 0); each switch it makes then measures its own destination's."""
        self.ranking, self.model, self.gpu, self.profile = ranking, model, gpu, profile
        self.config = config or ControllerConfig()
        batch = ranking.get("batch", 1) if batch is None else batch
        if not (isinstance(batch, int) and batch >= 1):
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        self.batch = batch
        self.switches: list[dict] = []
        self.overlap = self.config.overlap  # engine.hand_over: called behind the next round
        self.shadow_sequences = self.config.shadow_sequences  # engine.ngram: the shadow's sample
        # Measured switch cost per destination kind.
        self.switch_costs = SwitchCosts(switch_cost_s)
        self._book = CandidateBook(ranking, model, gpu, profile, batch, self.config.candidates)
        self._shadow = ShadowTracker()
        self._scorer = Rescorer(self._book, self._shadow, self.switch_costs, self.config, batch)
        self._acceptance = AcceptanceTrigger(self.config)
        self._probe_wait = self.config.probe_after
        self._drafting_since: int | None = None
        self._last_switch = -(10**9)
        self._now: Now | None = None
        self._trunc_dev = 0  # consecutive rounds a shorter chain paid (``shorter_pays``)
        self._queue: list = []  # rounds not taken yet (``stride``)
        # The round of a re-score due because the last one's top paid at its point estimate
        # but not across its interval (None: none due).
        self._recheck_at: int | None = None

    @classmethod
    def from_ranking(
        cls, ranking: dict, config: ControllerConfig | None = None, batch: int | None = None
    ) -> OnlineController:
        """The controller of a ranking document: its model, GPU and acceptance profile (and its
        batch unless ``batch`` is given)."""
        from ssvkit.perfmodel.hardware import get_gpu
        from ssvkit.perfmodel.models import get_model

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

    def observed_alpha(self) -> float | None:
        ema = self._acceptance.ema
        return None if ema.tokens is None else ema.alpha

    def drafter_kinds(self) -> tuple[str, ...]:
        """The drafter kinds of every candidate that drafts, in every ranked regime: what the
        decode loop keeps warm (``engine.controller``)."""
        kinds = {
            c.drafter.kind
            for regime in self.ranking["regimes"]
            for c in self._book.candidates(regime).values()
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
        book = self._book
        regimes = (
            self.ranking["regimes"] if context_len is None else (book.ranked_regime(context_len),)
        )
        trees = {
            c.tree
            for regime in regimes
            for c in book.candidates(regime).values()
            if c.drafter.kind == "ngram" and not book.known(c).chain and parse_tree(c.tree)
        }
        return tuple(sorted(trees))

    def shadow_alpha(self, regime: str, c: Strategy, current: Strategy) -> float | None:
        """The acceptance the shadow estimate implies for candidate ``c`` (None when its drafter
        has no estimate yet or ``c`` is neither a chain nor a walked tree the shadow scores):
        the expected tokens per round of its chain length, or its tree's walk, inverted on its
        tree, times its attention factor over the current strategy's, both for ``c``'s drafter
        (the shadow saw the current strategy's target)."""
        return self._scorer.shadow_alpha(regime, c, current)

    def switch_cost(self, to: Strategy) -> float:
        """The host time a switch to ``to`` is expected to cost: the last one measured to its
        kind, else the ``default`` given, else 0."""
        return self.switch_costs.cost(to)

    def warm(self) -> None:
        """Score every ranked regime's candidates and tabulate their trees' expected tokens
        now, before decoding starts, so that no round of the loop pays for it."""
        self._book.warm()

    def _round_s(self, regime: str, strategies: list[Strategy]) -> dict[str, float]:
        """Predicted round time per strategy at the regime's ranked context (memoised)."""
        return self._book.round_s(regime, strategies)

    def after_round(self, stats) -> Strategy | None:
        """Take the round: every ``stride`` rounds, the rounds since in order, and a decision
        after the last of them -- a switch, or None. In between, None.

        Counters, averages and tests advance round by round as with a stride of 1, so a
        decision comes at most ``stride - 1`` rounds late. The point is the host's time: a
        call that finds the CPU caches cold, as the rest of a decode round leaves them, costs
        about five warm ones."""
        if len(stats.accepted) > self.batch:
            raise ValueError(
                f"a round of {len(stats.accepted)} sequences handed to a controller that scores "
                f"at batch {self.batch}"
            )
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
        sequences = len(stats.accepted)
        if "switch" in stats.step_s:  # what installing this strategy cost (catch-up included)
            self.switch_costs.record(s, stats.step_s["switch"])
        self._shadow.observe(
            getattr(stats, "shadow", None), stats.mean_accepted + 1.0, 1.0 - cfg.ema, sequences
        )
        ctx = max(stats.context_lens)
        now = self._situation(s, ctx)
        drafting = bool(stats.drafted)
        self._track_drafting(stats.round, drafting)
        expected, own_trigger, collapse = None, False, False
        if drafting:
            own_trigger, collapse = self._acceptance.observe(stats, now)
            if now.known.chain:
                self._own_rounds(now).add(stats.accepted, 1.0 - cfg.ema)
            expected = now.expected
        else:
            self._acceptance.strategy_key = now.known.sid
        shadow_key = self._shadow.rising(now, drafting, cfg.epsilon, cfg.patience)
        if stats.round - self._last_switch < cfg.cooldown and not collapse:
            return None
        pick = self._scorer.shorter_pays(now, now.regime) if drafting else None
        self._trunc_dev = self._trunc_dev + 1 if pick is not None else 0
        if not decide:
            return None
        if pick is not None and self._trunc_dev >= cfg.patience and not own_trigger:
            if shadow_key is None:
                return self._truncate(stats.round, now, pick, expected)
        recheck = self._recheck_at is not None and stats.round >= self._recheck_at
        if own_trigger or shadow_key is not None or recheck:
            return self._rescore_and_switch(
                stats.round, ctx, now, drafting, expected, own_trigger, collapse, shadow_key
            )
        if not drafting and self.switches and stats.round - self._last_switch >= self._probe_wait:
            return self._probe(stats.round, now)
        return None

    def _situation(self, s: Strategy, ctx: int) -> Now:
        """``Now`` of the round: the last one's while the strategy object, the shadowed chain
        lengths and the context's regime stay."""
        now = self._now
        if (
            now is None
            or now.strategy is not s
            or now.lens is not self._shadow.lens
            or not now.lo < ctx <= now.hi
        ):
            now = self._now = self._book.now(s, ctx, self._shadow.lens)
        return now

    def _track_drafting(self, round_: int, drafting: bool) -> None:
        """Since when drafting strategies have held; the probe wait is back to
        ``probe_after`` once they held that long (the text suits a drafter again)."""
        if not drafting:
            self._drafting_since = None
        elif self._drafting_since is None:
            self._drafting_since = round_
        elif round_ - self._drafting_since >= self.config.probe_after:
            self._probe_wait = self.config.probe_after

    def _own_rounds(self, now: Now) -> ChainRounds:
        """The current chain's ``ChainRounds``, started from ``patience`` observations as
        profiled when the chain is new."""
        own = self._scorer.own.get(now.known.kind)
        if own is None or own.sid != now.known.sid:
            own = ChainRounds(
                now.known.sid, now.known.chain, self._book.factor(now.regime, now.strategy)
            )
            self._scorer.own[now.known.kind] = own
            own.prior(now.expected, self.config.patience)
        return own

    def _truncate(self, round_: int, now: Now, pick, expected) -> Strategy:
        """Switch to the shorter chain that paid across its paired interval for ``patience``
        rounds (no re-score: the rest stands as last scored)."""
        self._trunc_dev = 0
        alpha = self._acceptance.ema.alpha
        self._acceptance.rescored(alpha)
        self._log_switch(round_, now.known.sid, pick[0], "truncation", alpha, expected, pick[1])
        return pick[0]

    def _rescore(
        self,
        current: Strategy,
        regime: str,
        context_len: int,
        expected: float | None,
        spread: tuple[float, ...] = (),
    ):
        """``Rescorer.rescore`` at what the controller observes now: the best candidate, or
        (None, gain) when none is worth it."""
        observed = self._acceptance.ema.alpha
        return self._scorer.rescore(
            current, regime, expected, spread, observed, self._now, self._trunc_dev
        )

    def _rescore_and_switch(
        self,
        round_: int,
        ctx: int,
        now: Now,
        drafting: bool,
        expected,
        own_trigger: bool,
        collapse: bool,
        shadow_key,
    ) -> Strategy | None:
        """Re-score; remember what it saw (the same deviation or rise does not trigger another
        one), schedule a recheck when its top paid at its point estimate alone, and switch to
        its best when that pays."""
        cfg, s, regime, ema = self.config, now.strategy, now.regime, self._acceptance.ema
        spread = ema.spread(s.tree, cfg.confidence_z) if drafting and not collapse else ()
        best, gain = self._rescore(s, regime, ctx, expected, spread)
        self._recheck_at = round_ + cfg.patience if best is None and gain > cfg.hysteresis else None
        self._acceptance.rescored(ema.alpha if drafting else None)
        keys = self._book.shadow_keys(regime, self._shadow.lens)
        for skey, ref in keys:
            self._shadow.dev[skey] = 0
            a = self.shadow_alpha(regime, ref, s)
            if a is not None:
                self._shadow.scored[skey] = a
        if best is None:
            return None
        if own_trigger or shadow_key is None:
            reason = "collapse" if collapse else "acceptance" if own_trigger else "recheck"
            observed = ema.alpha if drafting else None
            self._log_switch(round_, now.known.sid, best, reason, observed, expected, gain)
        else:
            ref = dict(keys)[shadow_key]
            observed, profiled = self._shadow.scored[shadow_key], self._book.alpha_for(regime, ref)
            self._log_switch(round_, now.known.sid, best, "shadow", observed, profiled, gain)
        return best

    def _probe(self, round_: int, now: Now) -> Strategy | None:
        """Without a shadow of a drafter, a strategy that drafts nothing could never leave: go
        back to a drafting strategy (``Rescorer.probe_choice``) and double the next wait."""
        probe = self._scorer.probe_choice(now.regime, now.strategy)
        if probe is None:
            return None
        self._log_switch(round_, now.known.sid, probe, "probe", None, None, 0.0)
        cfg = self.config
        self._probe_wait = max(min(2 * self._probe_wait, cfg.probe_max), cfg.probe_after)
        return probe

    def _log_switch(
        self, round_: int, key: str, to: Strategy, reason: str, observed, expected, gain: float
    ) -> None:
        self._last_switch = round_
        self._recheck_at = None
        self.switches.append(
            {
                "round": round_,
                "from": key,
                "to": self._book.sid(to),
                "reason": reason,
                "observed_alpha": observed,
                "expected_alpha": expected,
                "predicted_gain": gain,
                "switch_cost_s": self.switch_cost(to),
            }
        )
