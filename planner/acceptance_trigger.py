"""The online controller's acceptance and collapse triggers: the current strategy's acceptance
EMA held against the acceptance expected of it, and a chain's collapse test.

The reference is the profiled acceptance of the strategy in its regime, or, after a re-score
or a truncation that kept it, the acceptance that decision saw, so a steady deviation is
scored once. A new strategy starts a history of its own: the EMA, the count of deviating
rounds and the collapse test restart with it.
"""

from __future__ import annotations

from ssvkit.perfmodel.strategy import Strategy, chain_length
from ssvkit.planner.candidates import Now
from ssvkit.planner.controller_config import ControllerConfig
from ssvkit.planner.estimators import AcceptanceEma, CollapseTest


class AcceptanceTrigger:
    """Whether the current strategy's own acceptance calls for a re-score: it deviates from
    its reference by more than ``epsilon`` for ``patience`` consecutive rounds, or a chain's
    acceptance collapsed."""

    def __init__(self, config: ControllerConfig):
        self.config = config
        self.ema = AcceptanceEma(config.ema)
        self.collapse_test = CollapseTest()
        self.strategy_key: str | None = None
        self.deviating = 0
        self.scored_alpha: float | None = None  # the observed alpha the last re-score kept

    def observe(self, stats, now: Now) -> tuple[bool, bool]:
        """Fold a drafting round into the acceptance EMA: (whether the acceptance trigger
        fires -- a deviation held ``patience`` rounds, or a collapse --, whether it is a
        collapse)."""
        cfg = self.config
        key = now.known.sid
        restart = key != self.strategy_key  # a new strategy: its own acceptance history
        if restart:
            self.strategy_key, self.deviating = key, 0
            self.scored_alpha = None
            self.collapse_test.reset()
        self.ema.add(now.strategy.tree, stats.mean_accepted + 1.0, restart)
        alpha = self.ema.alpha
        ref = now.expected if self.scored_alpha is None else self.scored_alpha
        self.deviating = self.deviating + 1 if abs(alpha - ref) > cfg.epsilon else 0
        deviated = self.deviating >= cfg.patience
        collapse = self.collapsed(now.strategy, stats.accepted, ref)
        return deviated or collapse, collapse

    def collapsed(self, s: Strategy, accepted, ref: float) -> bool:
        """Whether the current chain's acceptance has collapsed (``CollapseTest`` past
        ``collapse_llr``: at most a 1% chance per stint that a working chain triggers at ln
        100, while n-gram lookup on random bytes, or a probe of a drafter the text defeats,
        triggers within a few rounds -- far fewer than ``patience``). Branching trees keep the
        EMA test alone."""
        k = chain_length(s.tree)
        a0 = ref - self.config.epsilon
        if not k or self.config.collapse_llr <= 0 or not 0.0 < a0 < 1.0:
            return False
        llr = self.collapse_test.observe(accepted, k, ref, self.config.epsilon)
        return llr > self.config.collapse_llr

    def rescored(self, alpha: float | None) -> None:
        """After a re-score or a truncation: deviating rounds count afresh, the collapse test
        starts over, and ``alpha`` is the reference from now on (None: the profiled one)."""
        self.deviating = 0
        self.collapse_test.reset()
        self.scored_alpha = alpha
