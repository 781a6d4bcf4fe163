"""What the decode loop hands over after a round: the round's trace records and the
controller's call with the round's statistics (``report_round``), which ``HandOver`` runs after
each round (host time ``step_s["control"]``).

A controller with ``overlap`` true takes its decisions one round late instead: the loop hands
round r over during round r + 1, between the launch of r + 1's GPU work and its host
synchronisation, where the host would only wait -- the warm n-gram drafter's shadow of r's
tokens, r's trace records and ``after_round`` (host times ``step_s["shadow"]`` and
``step_s["control_overlap"]`` of round r, inside round r + 1's wall time); a strategy it returns
is installed after round r + 1, for round r + 2. The last round's is handed over after the loop
(``step_s["control"]``). Each host microsecond there costs wall time only when the GPU's queue
runs dry first.
"""

from __future__ import annotations

import time

from ssvkit.engine.controller import Controller, RoundStats
from ssvkit.engine.ngram import NgramDrafter
from ssvkit.engine.results import RoundRecord
from ssvkit.engine.stats import batch_mean
from ssvkit.engine.trace_writer import TraceWriter
from ssvkit.perfmodel.strategy import Strategy


def report_round(
    rec: RoundRecord,
    strategy: Strategy,
    key: str,
    trace: TraceWriter | None,
    controller: Controller,
) -> Strategy | None:
    """Trace records of ``rec`` (a round of ``strategy``) and the controller's call with its
    statistics (host time in ``rec.step_s[key]``); what the controller returned."""
    sel = rec.selection
    if trace is not None:
        rows = zip(rec.sequences, rec.context_lens, rec.accepted, strict=True)
        for b, ctx, a in rows:
            trace.add_round(
                strategy,
                b,
                round_index=len(trace.lines),
                context_len=ctx,
                drafted=rec.drafted,
                accepted=a,
                step_s=rec.step_s,
                t_s=rec.t_s,
                group_overlap=sel.row(b, "group_overlap") if sel else None,
                layer_overlap=sel.row(b, "layer_overlap") if sel else None,
                predict_hit=sel.row(b, "predict_hit") if sel else None,
                reuse_hit=sel.row(b, "reuse_hit") if sel else None,
            )
    stats = RoundStats(
        round=rec.round,
        strategy=strategy,
        context_lens=tuple(rec.context_lens),
        drafted=rec.drafted,
        accepted=tuple(rec.accepted),
        step_s=dict(rec.step_s),
        tokens_generated=rec.tokens,
        group_overlap=batch_mean(sel, "group_overlap", rec.sequences),
        layer_overlap=batch_mean(sel, "layer_overlap", rec.sequences),
        predict_hit=batch_mean(sel, "predict_hit", rec.sequences),
        shadow=rec.shadow,
    )
    c0 = time.perf_counter()
    new = controller.after_round(stats)
    rec.step_s[key] = time.perf_counter() - c0
    return new


def score_shadow(shadow: NgramDrafter, history: list[list[int]]) -> tuple[dict, float]:
    """The warm n-gram drafter's shadow acceptance of the committed tokens ``history``
    (``RoundRecord.shadow``) and its host time."""
    s0 = time.perf_counter()
    shadow.sync(history)
    scored = {"ngram": shadow.take_shadow()}
    return scored, time.perf_counter() - s0


class HandOver:
    """The hand-over of one generate call's rounds: each right after it, or with an
    overlapping controller one round late (``run_pending``, see the module)."""

    def __init__(
        self,
        controller: Controller,
        trace: TraceWriter | None,
        shadow: NgramDrafter | None,
        history: list[list[int]],
    ) -> None:
        self.controller, self.trace = controller, trace
        self.overlap = bool(getattr(controller, "overlap", False))
        self.shadow, self.history = shadow, history
        # The last round, whose host work runs in the next round's window, and the strategy
        # the controller returned there.
        self.pending: tuple[RoundRecord, Strategy] | None = None
        self._decided: Strategy | None = None

    def after_round(
        self, rec: RoundRecord, strategy: Strategy, key: str = "control"
    ) -> Strategy | None:
        """Hand over ``rec``, a round of the current ``strategy``; the strategy to install
        now, if any. Serially: the round's trace records and controller call (host time in
        ``step_s[key]``: ``control_overlap`` where the next round's GPU work already runs,
        ``engine.pipeline``), and what the controller returned. Overlapped: what the
        controller decided during this round (on the round before); this round's host work
        waits for the next round's window."""
        if self.overlap:
            decided, self._decided = self._decided, None
            self.pending = (rec, strategy)
            return decided
        new = report_round(rec, strategy, key, self.trace, self.controller)
        return new if new is not None and new != strategy else None

    def run_pending(self, current: Strategy, serial: bool = False) -> None:
        """The pending round's host work: the warm n-gram drafter's shadow of its tokens, its
        trace records and the controller call -- inside the next round's wall time, while that
        round's GPU work runs (``step_s["shadow"]`` and ``step_s["control_overlap"]`` of the
        pending round), or after the last round (``serial``: ``step_s["control"]``). A
        strategy other than ``current`` that the controller returns waits for
        ``after_round``."""
        rec, strategy = self.pending
        self.pending = None
        if self.shadow is not None:
            rec.shadow, rec.step_s["shadow"] = score_shadow(self.shadow, self.history)
        new = report_round(
            rec,
            strategy,
            "control" if serial else "control_overlap",
            self.trace,
            self.controller,
        )
        if new is not None and new != current:
            self._decided = new

    def finish(self, current: Strategy) -> None:
        """The last round's pending host work, after the loop, where nothing hides it; what
        the controller returns there is not installed."""
        if self.pending is not None:
            self.run_pending(current, serial=True)
            self._decided = None
