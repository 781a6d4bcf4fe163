"""What the decode loop hands over after a round: the round's trace records and the
controller's call with the round's statistics. The loop runs it after each round, or, with an
overlapping controller, inside the next round's wall time while that round's GPU work runs."""

from __future__ import annotations

import time

from ssvkit.engine.controller import Controller, RoundStats
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
