"""Online adaptation (seed 000, Mechanism 3, phase 2): the controller the decode loop calls
after every round.

It keeps an exponential moving average of the tokens produced per round, turns it into the
per-token acceptance the current tree implies (``planner.profile.alpha_from_tokens``), and
compares that with the acceptance the offline ranking assumed for this drafter and regime. When
they differ by more than ``epsilon`` for ``patience`` consecutive rounds, it re-scores the
regime's top candidates and the best-ranked strategy of every (drafter, tree) -- the current
drafter's candidates at their profiled acceptance shifted by the relative change observed,
another drafter's by the change last observed on it (else as profiled) -- and switches to the
best one if it beats the current strategy's re-scored throughput by more than ``hysteresis``
plus the measured switch cost amortised over ``horizon_rounds``, and no switch happened in the
last ``cooldown`` rounds. Hysteresis and cooldown keep it from oscillating. A strategy that
drafts nothing (autoregressive) observes no acceptance: after ``probe_after`` rounds in one,
the controller probes the best-ranked drafting strategy again (reason ``probe``). Every switch
is logged (``switches``) with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.hardware import GpuSpec
from perfmodel.models import ModelSpec
from perfmodel.strategy import Strategy, parse_tree
from planner.profile import (
    Profile,
    alpha_from_tokens,
    expected_tokens,
    profile_from_json,
    regime_of,
)
from planner.rank import score, strategy_from_json
from planner.space import strategy_id


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    epsilon: float = field(default=0.1, metadata={"help": "acceptance deviation that counts"})
    patience: int = field(default=16, metadata={"help": "consecutive deviating rounds to act"})
    ema: float = field(default=0.05, metadata={"help": "weight of the newest round in the EMA"})
    hysteresis: float = field(default=0.05, metadata={"help": "relative gain needed to switch"})
    cooldown: int = field(default=16, metadata={"help": "rounds between two switches"})
    candidates: int = field(default=24, metadata={"help": "ranked strategies re-scored"})
    horizon_rounds: int = field(default=64, metadata={"help": "rounds a switch is amortised"})
    probe_after: int = field(
        default=64, metadata={"help": "rounds without drafts before probing a drafting strategy"}
    )

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"ema must lie in (0, 1], got {self.ema}")
        for name in ("patience", "candidates", "horizon_rounds", "probe_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.epsilon < 0 or self.hysteresis < 0 or self.cooldown < 0:
            raise ValueError("epsilon, hysteresis and cooldown must be >= 0")


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
        switch_cost_s: float = 0.0,
    ):
        """``switch_cost_s``: what a switch is known to cost before this controller has seen
        one (e.g. measured on earlier requests); each switch it makes then measures its own."""
        self.ranking, self.model, self.gpu, self.profile = ranking, model, gpu, profile
        self.config = config or ControllerConfig()
        self.batch = batch
        self.switches: list[dict] = []
        if not switch_cost_s >= 0:
            raise ValueError(f"switch_cost_s must be >= 0, got {switch_cost_s}")
        self.switch_cost_s = float(switch_cost_s)
        self._ema_tokens: float | None = None
        self._strategy_key: str | None = None
        self._deviating = 0
        self._last_switch = -(10**9)
        self._shift: dict[str, float] = {}  # observed / profiled acceptance, per drafter kind
        self._cands: dict[str, dict[str, Strategy]] = {}
        self._round_cache: dict[str, dict[str, float]] = {}

    @classmethod
    def from_ranking(cls, ranking: dict, config: ControllerConfig | None = None,
                     batch: int = 1) -> OnlineController:  # fmt: skip
        """The controller of a ranking document: its model, GPU and acceptance profile."""
        from perfmodel.hardware import get_gpu
        from perfmodel.models import get_model

        missing = [k for k in ("model", "gpu", "regimes", "profile") if k not in ranking]
        if missing:
            raise ValueError(f"the ranking lacks {', '.join(missing)}")
        profile = profile_from_json(ranking["profile"], "the ranking's profile", "ranking")
        return cls(ranking, get_model(ranking["model"]), get_gpu(ranking["gpu"]), profile,
                   config, batch)  # fmt: skip

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

    def after_round(self, stats) -> Strategy | None:
        cfg = self.config
        s: Strategy = stats.strategy
        if "switch" in stats.step_s:  # the loop reports what re-capture and re-selection cost
            self.switch_cost_s = float(stats.step_s["switch"])
        key = strategy_id(s)
        if not stats.drafted:
            # A strategy that drafts nothing observes no acceptance, so it could never leave:
            # after ``probe_after`` rounds, go back to the best-ranked drafting strategy.
            if self.switches and stats.round - self._last_switch >= cfg.probe_after:
                regime = self._ranked_regime(max(stats.context_lens))
                probe = self._probe_strategy(regime)
                if probe is not None:
                    self._log_switch(stats.round, key, probe, "probe", None, None, 0.0)
                    return probe
            return None
        tokens = stats.mean_accepted + 1.0
        if key != self._strategy_key:  # a new strategy: its own acceptance history
            self._strategy_key, self._ema_tokens, self._deviating = key, tokens, 0
        else:
            self._ema_tokens = (1 - cfg.ema) * self._ema_tokens + cfg.ema * tokens
        self._alpha = alpha_from_tokens(s.tree, self._ema_tokens)
        regime = self._ranked_regime(max(stats.context_lens))
        expected = self.profile.alpha_for(regime, s)
        self._deviating = self._deviating + 1 if abs(self._alpha - expected) > cfg.epsilon else 0
        if self._deviating < cfg.patience or stats.round - self._last_switch < cfg.cooldown:
            return None
        best, gain = self._rescore(s, regime, max(stats.context_lens), expected)
        self._deviating = 0
        if best is None:
            return None
        self._log_switch(stats.round, key, best, "acceptance", self._alpha, expected, gain)
        return best

    def _log_switch(self, round_: int, key: str, to: Strategy, reason: str, observed,
                    expected, gain: float) -> None:  # fmt: skip
        self._last_switch = round_
        self.switches.append(
            {
                "round": round_,
                "from": key,
                "to": strategy_id(to),
                "reason": reason,
                "observed_alpha": observed,
                "expected_alpha": expected,
                "predicted_gain": gain,
                "switch_cost_s": self.switch_cost_s,
            }
        )

    def _probe_strategy(self, regime: str) -> Strategy | None:
        """The regime's best-ranked strategy that drafts (None when none does)."""
        for r in self.ranking["regimes"][regime]["ranking"]:
            s = strategy_from_json(r["strategy"])
            if parse_tree(s.tree):
                return s
        return None

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
        missing = [s for s in strategies if strategy_id(s) not in cache]
        if missing:
            ctx = self.ranking["regimes"][regime]["context_len"]
            scored, _ = score(self.model, self.gpu, missing, ctx, self.profile, regime, self.batch)
            cache.update({strategy_id(x.strategy): x.round_s for x in scored})
        return cache

    def warm(self) -> None:
        """Score every ranked regime's candidates and tabulate their trees' expected tokens
        now, before decoding starts (tens of ms per tree the first time), so that no round
        of the loop pays for it."""
        for regime in self.ranking["regimes"]:
            cands = list(self._candidates(regime).values())
            self._round_s(regime, cands)
            for c in cands:
                expected_tokens(c.tree, 0.5)

    def _rescore(self, current: Strategy, regime: str, context_len: int, expected: float):
        """Best candidate under the observed acceptance, or (None, 0) when none is worth it."""
        cfg = self.config
        cands = dict(self._candidates(regime))
        cands[strategy_id(current)] = current
        # The current drafter's candidates shift by the relative change observed on it (so the
        # current strategy scores at exactly the observed acceptance); another drafter keeps
        # the shift last observed on it, or its profile. A prompt that defeats one drafter
        # need not defeat another (random bytes: n-gram lookup finds nothing, a draft model
        # still follows the text the target writes), and the memory keeps two drafters from
        # trading places on one drafter's evidence.
        self._shift[current.drafter.kind] = self._alpha / expected if expected > 0 else 1.0
        round_s = self._round_s(regime, list(cands.values()))
        tpr, tps = {}, {}
        for sid, c in cands.items():
            a = min(1.0, self.profile.alpha_for(regime, c) * self._shift.get(c.drafter.kind, 1.0))
            tpr[sid] = expected_tokens(c.tree, a)
            tps[sid] = self.batch * tpr[sid] / round_s[sid]
        now_id = strategy_id(current)
        top_id = max(tps, key=lambda k: (tps[k], k == now_id))
        if top_id == now_id:
            return None, 0.0
        # Time per token now vs after switching, the switch cost spread over the horizon.
        per_tok_now = 1.0 / tps[now_id]
        per_tok_new = 1.0 / tps[top_id] + self.switch_cost_s / (
            cfg.horizon_rounds * tpr[top_id] * self.batch
        )
        gain = per_tok_now / per_tok_new - 1.0
        return (cands[top_id], gain) if gain > cfg.hysteresis else (None, gain)
