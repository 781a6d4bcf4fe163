"""The online controller's re-score: every candidate of a regime scored at the acceptance
observed now, and the tests a move must pass before the controller takes it.

Each candidate is scored from what is known of its drafter on this text: the acceptance
observed on the current strategy, its drafter's own rounds for its shorter chains
(**truncation**), the **shadow** of a drafter that does not draft, else the shift last observed
on a drafter or its profile (``Rescorer`` gives each case).

The best candidate must beat the current strategy by more than ``hysteresis`` plus the
switch cost amortised over ``horizon_rounds``, and then pass across the noise: a shorter
chain by the paired test of its rounds (``paired_gain``), a walked candidate by the paired
test of its walk over the same tokens (``walk_gain``: the text's bursts, which make each
side's own interval wide, cancel), any other at both ends of the observed acceptance's
confidence interval (``spread_pays``).
"""

from __future__ import annotations

import math

from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.perfmodel.tree_tokens import expected_tokens_interp
from ssvkit.planner.candidates import CandidateBook, Now
from ssvkit.planner.controller_config import ControllerConfig
from ssvkit.planner.estimators import ChainRounds, SwitchCosts
from ssvkit.planner.shadow import ShadowTracker


class Rescorer:
    """Scores a regime's candidates (``book``) from what is known of each drafter on this
    text: ``shift`` (observed over profiled acceptance, per drafter kind), ``own`` (the rounds
    each drafter's last chain ran, ``ChainRounds``) and the ``shadow``.

    What each candidate is scored at:

    - the current strategy: the acceptance observed on it; the current drafter's other trees:
      their profiled acceptance shifted by the relative change observed -- except its chains
      no longer than the current chain at the same attention factor (**truncation**,
      ``ChainRounds``): once the chain has run ``patience`` rounds, their tokens per round are
      its rounds', not modelled (a chain of k drafts would have accepted ``min(m, k)`` of a
      round the current chain accepted ``m`` in). A drafter that stopped drafting keeps the
      sums of its last chain for its chains no longer than it, where it has no shadow;
    - a drafter with a **shadow** (``ShadowTracker``): its chains at the acceptance the shadow
      implies for that very chain length (times their attention factor over the current
      strategy's), its other trees shifted by the shadow's change on its best-ranked chain;
    - any other drafter: the shift last observed on it, or its profile (a prompt that defeats
      one drafter need not defeat another: random bytes defeat n-gram lookup, not a draft
      model).
    """

    def __init__(
        self,
        book: CandidateBook,
        shadow: ShadowTracker,
        costs: SwitchCosts,
        config: ControllerConfig,
        batch: int,
    ):
        self.book, self.shadow, self.costs, self.config = book, shadow, costs, config
        self.batch = batch
        self.shift: dict[str, float] = {}
        self.own: dict[str, ChainRounds] = {}

    def shadow_alpha(self, regime: str, c: Strategy, current: Strategy) -> float | None:
        """The acceptance the shadow implies for candidate ``c`` (``ShadowTracker.alpha``)
        with its attention factor over the current strategy's, both for ``c``'s drafter; None
        when its drafter has no estimate yet or ``c`` is neither a chain nor a walked tree."""
        kind = c.drafter.kind
        if kind not in self.shadow:
            return None
        factor, now = self.book.factor(regime, c), self.book.factor(regime, current, kind)
        return self.shadow.alpha(c.drafter.kind, self.book.known(c).chain, c.tree, factor, now)

    def rescore(
        self,
        current: Strategy,
        regime: str,
        expected: float | None,
        spread: tuple[float, ...],
        alpha: float,
        now: Now | None,
        trunc_dev: int,
    ):
        """Best candidate under the observed acceptance ``alpha`` (``expected``: the current
        strategy's profiled alpha, None when it drafts nothing), or (None, gain) when none is
        worth it -- also when, with ``spread`` (the current strategy's acceptance at the ends
        of its confidence interval), the switch would not pay at one of them. ``trunc_dev``:
        the rounds a shorter chain has paid in a row (``shorter_pays``)."""
        cfg = self.config
        now_id = self.book.sid(current)
        own_kind = current.drafter.kind if expected is not None else None
        self._update_shifts(current, regime, own_kind, expected, alpha)
        cands, tpr, tps = self.tally(current, regime)
        shorter = self._shorter_rows(current, regime, now, now_id, own_kind)
        sustained = trunc_dev >= cfg.patience
        ids = tps if sustained else [k for k in tps if k not in shorter]
        top_id = max(ids, key=lambda k: (tps[k], k == now_id))
        if top_id == now_id:
            return None, 0.0
        gain = self.gain(cands, tpr, tps, now_id, top_id)
        if gain <= cfg.hysteresis:
            return None, gain
        if top_id in shorter:
            if self.paired_gain(*shorter[top_id], cands[top_id]) > cfg.hysteresis:
                return cands[top_id], gain
        else:
            walk = self.walk_gain(regime, current, cands[top_id], tpr[top_id])
            if (
                walk > cfg.hysteresis
                if walk is not None
                else self.spread_pays(current, regime, cands, now_id, top_id, expected, spread)
            ):
                return cands[top_id], gain
        # The top did not pay across its interval: a shorter chain that pays across its own.
        for sid in sorted(shorter if sustained else (), key=lambda k: -tps[k]):
            if sid != top_id and tps[sid] > tps[now_id]:
                if self.paired_gain(*shorter[sid], cands[sid]) > cfg.hysteresis:
                    return cands[sid], self.gain(cands, tpr, tps, now_id, sid)
        return None, gain

    def _update_shifts(
        self,
        current: Strategy,
        regime: str,
        own_kind: str | None,
        expected: float | None,
        alpha: float,
    ) -> None:
        """The current drafter shifts by the relative change observed on it (so the current
        strategy scores at exactly the observed acceptance); a shadowed drafter by its shadow's
        change on its best-ranked chain; another drafter keeps the shift last observed on it.
        The memory keeps two drafters from trading places on one drafter's evidence."""
        if own_kind is not None:
            self.shift[own_kind] = alpha / expected if expected > 0 else 1.0
        for kind, ref in self.book.shadow_refs(regime, self.shadow.lens).items():
            a, prof = self.shadow_alpha(regime, ref, current), self.book.alpha_for(regime, ref)
            if kind != own_kind and a is not None and prof > 0:
                self.shift[kind] = a / prof

    def _shorter_rows(
        self, current: Strategy, regime: str, now: Now | None, now_id: str, own_kind
    ) -> dict:
        """The current chain's drafter's shorter chains, once the chain has run ``patience``
        rounds (their tokens per round are then its rounds', ``tally``), by id: the arguments
        of their ``paired_gain``. The paired test gates them, and only after they paid for
        ``patience`` rounds (``shorter_pays`` is checked every round, and one round's pass may
        be noise); until then they sit the re-score out."""
        if own_kind is None or now is None or now.strategy is not current:
            return {}
        own = self.own.get(own_kind)
        if own is None or own.sid != now_id or own.rounds < self.config.patience:
            return {}
        rows, round_now = self.book.trunc_rows(now, regime)
        return {sid: (own, k, t, round_now) for sid, _, k, t in rows if k >= 1}

    def spread_pays(
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
        point = self.shift[own_kind]
        try:
            for a in spread:
                self.shift[own_kind] = a / expected
                _, tpr_b, tps_b = self.tally(current, regime, cfg.confidence_z)
                if self.gain(cands, tpr_b, tps_b, now_id, top_id) <= cfg.hysteresis:
                    return False
        finally:
            self.shift[own_kind] = point
        return True

    def walk_gain(self, regime: str, current: Strategy, c: Strategy, tokens: float) -> float | None:
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
        known = self.book.known(c)
        if tokens <= 1.0:
            return None
        walk = self.shadow.walk_high(c.drafter.kind, known.chain, c.tree, self.config.confidence_z)
        if walk is None:
            return None
        rounds_high, raw, n = walk  # n: tokens per round of the current strategy, per sequence
        scale = expected_tokens_interp(c.tree, raw) / tokens  # > 1: c's attention accepts less
        high = rounds_high * scale
        if high <= 0:
            return None
        rs = self.book.round_s(regime, [current, c])
        per_tok_now = rs[self.book.sid(current)] / (n * self.batch)
        per_tok_new = high * rs[known.sid] / (n * self.batch) + self.costs.cost(c) / (
            self.config.horizon_rounds * tokens * self.batch
        )
        return per_tok_now / per_tok_new - 1.0

    def paired_gain(
        self,
        own: ChainRounds,
        k: int,
        round_k: float,
        round_now: float,
        to: Strategy,
        z: float | None = None,
    ) -> float:
        """Relative gain of switching to ``to``, a chain of ``k`` drafts of the current
        chain's drafter, at the low end of the paired interval of its tokens/s over the
        current strategy's (``ChainRounds.paired_low``, ``confidence_z`` standard errors), the
        switch cost spread over ``horizon_rounds``."""
        cfg = self.config
        low = own.paired_low(k, round_k, round_now, cfg.confidence_z if z is None else z)
        tps_now = self.batch * own.tokens(own.chain) / round_now
        tps_low = tps_now + self.batch * low
        if tps_low <= 0:
            return -1.0
        per_tok_new = 1.0 / tps_low + self.costs.cost(to) / (
            cfg.horizon_rounds * own.tokens(k) * self.batch
        )
        return (1.0 / tps_now) / per_tok_new - 1.0

    def shorter_pays(self, now: Now, regime: str) -> tuple[Strategy, float] | None:
        """Of the shorter chains of the current chain's drafter and autoregressive decoding
        (``CandidateBook.trunc_rows``), those that gain more than ``hysteresis`` at the low
        end of their paired interval, once the current chain has run ``patience`` rounds: the
        one that gains most at the point estimate, with that gain; else None. The interval
        says whether a move pays at all; among the moves that do, the expected gain says
        which (picking by the low end instead favours the chain most like the current one,
        whose difference varies least, over a faster one further from it)."""
        own = self.own.get(now.known.kind)
        if own is None or own.sid != now.known.sid or own.rounds < self.config.patience:
            return None
        rows, round_now = self.book.trunc_rows(now, regime)
        best, top = None, -math.inf
        for _, c, k, t in rows:
            if self.paired_gain(own, k, t, round_now, c) > self.config.hysteresis:
                g = self.paired_gain(own, k, t, round_now, c, z=0.0)
                if g > top:
                    best, top = c, g
        return None if best is None else (best, top)

    def probe_choice(self, regime: str, current: Strategy) -> Strategy | None:
        """The strategy a probe goes to: of the drafter of ``CandidateBook.probe_strategy``,
        the candidate that scores best on what was last observed of it (``tally``: the rounds
        its last chain ran, or the shift last observed) -- text that defeated its long chains
        may still pay a short one -- or, when nothing was, at the shift a drafter not yet
        tried on this text is scored with (its profile; with ``transfer`` above 0, on text
        that defeated another drafter, its shorter chains, which lose less if it fails here
        too)."""
        base = self.book.probe_strategy(regime, self.shadow.lens)
        if base is None:
            return base
        cands, _, tps = self.tally(current, regime)
        kind = base.drafter.kind
        ids = [sid for sid, c in cands.items() if c.drafter.kind == kind and parse_tree(c.tree)]
        return cands[max(ids, key=lambda k: tps[k])] if ids else base

    def tally(self, current: Strategy, regime: str, z: float = 0.0) -> tuple[dict, dict, dict]:
        """Every candidate (by id), its expected tokens per round and tokens/s, at the
        acceptance the shifts and shadows say now (shadow estimates ``z`` standard errors
        low)."""
        now_id = self.book.sid(current)
        now_kind = current.drafter.kind if parse_tree(current.tree) else None
        cands, tpr, tps = {}, {}, {}
        untried = self.untried_shift()
        for sid, c, kind, chain, factor, profiled, round_s in self.book.rows(regime, current):
            cands[sid] = c
            own = self.own.get(kind)
            if (
                own is not None
                and own.rounds >= self.config.patience
                and sid != now_id
                and 1 <= chain <= own.chain
                and factor == own.factor
                and (own.sid == now_id if kind == now_kind else kind not in self.shadow)
            ):
                # What its drafts would have accepted in the rounds the current (or the last)
                # chain of its drafter ran.
                tpr[sid] = own.tokens(chain)
                tps[sid] = self.batch * tpr[sid] / round_s
                continue
            a = None
            if sid != now_id and kind in self.shadow:
                factor_now = self.book.factor(regime, current, kind)
                a = self.shadow.alpha(kind, chain, c.tree, factor, factor_now, z)
            if a is None:
                a = min(1.0, profiled * self.shift.get(kind, untried))
            tpr[sid] = expected_tokens_interp(c.tree, a)
            tps[sid] = self.batch * tpr[sid] / round_s
        return cands, tpr, tps

    def untried_shift(self) -> float:
        """The shift a drafter not yet observed on this text is scored at: ``transfer`` of the
        largest drop observed on any drafter (1: no drop observed, or ``transfer`` 0)."""
        low = min(self.shift.values(), default=1.0)
        return 1.0 - self.config.transfer * max(0.0, 1.0 - low)

    def gain(self, cands: dict, tpr: dict, tps: dict, now_id: str, to_id: str) -> float:
        """Relative gain of switching to ``to_id``: time per token now vs after switching, the
        switch cost spread over ``horizon_rounds``."""
        per_tok_now = 1.0 / tps[now_id]
        per_tok_new = 1.0 / tps[to_id] + self.costs.cost(cands[to_id]) / (
            self.config.horizon_rounds * tpr[to_id] * self.batch
        )
        return per_tok_now / per_tok_new - 1.0
