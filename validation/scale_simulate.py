"""The simulator replaying a scale-campaign cell (``validation.scale_campaign``): the cell's batch
decoding its new tokens in lockstep as the engine does (``sim.loop`` with ``static_batch``: a
finished sequence keeps its slot until the batch ends), each draw of the accepted counts taken in
order from the cell's recorded rounds of sequence 0 (the ``trace`` acceptance model, wrapping),
each round priced by the step model at the cell's strategy, measured selection overlap and
element-wise implementation, from the cell's first context. Its tokens/s is the whole run's,
finished sequences' tail included, and the report sets it beside the run's measured tokens/s.

Sequence 0's counts stand for every sequence's: the oracle drafter gives each sequence the same
acceptance law, so their means differ by sampling alone, and the drain of a run's last rounds
follows from its draws, not from the measured per-sequence lengths.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.trace import dumps_trace, make_header, make_round
from ssvkit.sim.config import SimConfig
from ssvkit.sim.scenarios import simulate
from ssvkit.validation.records import measured_strategy


def simulate_row(doc: dict, r: dict) -> dict | None:
    """The simulator's replay of the measured row ``r`` of the campaign ``doc``: its whole-run
    tokens/s and the rounds it replayed; None where the row recorded no rounds or the step
    model cannot price it."""
    m = r["measured"]
    rounds = m.get("rounds_trace", [])[m.get("capture_rounds", 0) :]
    if not rounds:
        return None
    strategy = measured_strategy(r)
    model = r["model"].removeprefix("random:")
    overlap = r["selection"]["group_overlap"]  # None where the strategy selects nothing
    layers = get_model(model).num_layers
    source = "engine:scale-campaign (step_s: the run's means)"
    head = make_header(source, model, layers, {"cell": {}})
    lines = [make_round(i, 0, "cell", c, d, a, m["steps_s"]) for i, (c, d, a) in enumerate(rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text(dumps_trace(head, lines))
        cfg = SimConfig(
            scenario="ar_dense" if strategy.tree == "chain:0" else "sd_dense",
            model=model,
            gpu=doc["gpu"],
            strategy=strategy,
            batch=r["batch"],
            context_len=rounds[0][0],
            num_tokens=doc["new_tokens"],
            acceptance_model="trace",
            trace=str(path),
            **({} if overlap is None else {"overlap": min(max(overlap, 0.0), 1.0)}),
            elementwise=elementwise_of_run(r["provenance"]),
            timeline_rounds=0,
            static_batch=True,
        )
        try:
            res = simulate(cfg)
        except ValueError:  # a cell the step model cannot price (the prediction says why)
            return None
    return {
        "tokens_per_s": res.figures["simulated_tokens_per_s"]["value"],
        "rounds_replayed": len(rounds),
        "provenance": res.figures["simulated_tokens_per_s"]["provenance"],
    }
