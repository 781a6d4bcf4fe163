"""The full-batch rounds of a batched run (every sequence decoding, none finishing): which rounds
they are, their figures from the decode's rounds and, for a row measured without them, from its
per-round accepted counts; and the scale report comparing them with a prediction of the same
acceptance, on a committed H200 row whose batch ends with a tail of finished sequences."""

from __future__ import annotations

import json

import pytest
from ssvkit.engine.results import RoundRecord
from ssvkit.validation.evaluate import regime_quality
from ssvkit.validation.full_batch import (
    HISTOGRAM_WALL,
    MEAN_ROUND_WALL,
    MEASURED_WALL,
    derived,
    figures,
    full_rounds,
    pooled_tokens_per_s,
    steady,
)
from ssvkit.validation.records import record_path
from ssvkit.validation.scale_report import build_scale, predict_row


def test_full_rounds_are_those_before_any_sequence_finishes():
    assert full_rounds([3, 3, 3, 2, 2, 1], 3) == [True, True, False, False, False, False]
    assert full_rounds([2, 2], 2) == [True, False]  # the last round's sequences finish
    assert full_rounds([1], 1) == [False]
    assert full_rounds([], 4) == []


def _round(i, accepted, wall_s, captured=False):
    return RoundRecord(
        round=i,
        strategy="sd_dense",
        context_lens=[100] * len(accepted),
        drafted=4,
        accepted=accepted,
        step_s={"verify": wall_s / 2},
        wall_s=wall_s,
        warmup=i == 0,
        captured=captured,
        sequences=list(range(len(accepted))),
    )


class _Result:
    def __init__(self, rounds):
        self.rounds = rounds


def test_figures_count_the_full_rounds_after_round_0_without_captures():
    rounds = [
        _round(0, [4, 4], 9.0),  # round 0: left out as in the steady figures
        _round(1, [1, 3], 1.0),
        _round(2, [0, 2], 2.0, captured=True),  # captured a graph: left out
        _round(3, [4, 0], 1.5),
        _round(4, [2, 1], 1.0),  # sequence 1 finishes here: its next round has one sequence
        _round(5, [3], 0.5),
    ]
    got = figures(_Result(rounds), 2)
    assert got["rounds"] == 2 and got["wall"] == MEASURED_WALL
    assert got["tokens"] == (1 + 3 + 2) + (4 + 0 + 2)
    assert got["wall_s"] == 2.5 and got["round_s"] == 1.25
    assert got["tokens_per_s"] == pytest.approx(12 / 2.5)
    assert got["mean_accepted"] == pytest.approx((1 + 3 + 4 + 0) / 4)
    assert got["tokens_per_round"] == pytest.approx(12 / (2 * 2))
    assert figures(_Result(rounds[:1] + rounds[-1:]), 2) is None


def test_a_row_without_them_derives_them_at_its_mean_round():
    measured = {
        "rounds": 4,
        "wall_s": 8.0,
        "capture_rounds": 0,
        # round 0, then two full rounds, a round in which sequence 2 finishes, a tail round
        "accepted_per_sequence": [[5, 5, 5], [1, 2, 0], [3, 0, 0], [2, 2, 4], [1, 0]],
    }
    got = derived(measured, 3)
    assert got["wall"] == MEAN_ROUND_WALL and got["rounds"] == 2
    assert got["round_s"] == 2.0 and got["tokens"] == 6 + 6
    assert got["tokens_per_s"] == pytest.approx(12 / 4.0)
    assert got["mean_accepted"] == pytest.approx(1.0)
    # Recorded figures win; a row with captured rounds cannot say which rounds those were.
    assert derived({**measured, "full_batch": {"tokens_per_s": 1.0}}, 3) == {"tokens_per_s": 1.0}
    assert derived({**measured, "capture_rounds": 1}, 3) is None
    assert derived({**measured, "accepted_per_sequence": [[0, 0, 0], [1, 1]]}, 3) is None


def test_a_steady_run_without_them_derives_them_from_its_histogram():
    # Batch 2, 4 rounds: one sequence decodes all 4 (accepting 3 each), the other finishes
    # after 2 (accepting 0 and 1): 6 decoding pairs, 3 full rounds' worth, 17 tokens.
    run = {"rounds": 4, "wall_s": 8.0, "switch_s": 0.0, "control_s": 0.0}
    run["accepted_hist"] = [1, 1, 0, 4]
    got = steady(run, 2)
    assert got["wall"] == HISTOGRAM_WALL and got["rounds"] == 3.0 and got["round_s"] == 2.0
    assert got["tokens"] == 4 * 4 + 1 + 2 and got["wall_s"] == 6.0
    assert got["tokens_per_s"] == pytest.approx(19 / 6.0)
    # The whole run's figure is lower: the tail rounds carry a finished sequence.
    assert got["tokens_per_s"] > 19 / 8.0
    assert got["tokens_per_round"] == pytest.approx(19 / 6) and got["mean_accepted"] == 13 / 6
    # Recorded figures win; no histogram, no figures; pooled: tokens over time, or None.
    assert steady({**run, "full_batch": {"tokens": 1.0}}, 2) == {"tokens": 1.0}
    assert steady({**run, "accepted_hist": []}, 2) is None
    rec = {**run, "full_batch": {"tokens": 10.0, "wall_s": 2.0}}
    assert pooled_tokens_per_s([run, rec], 2) == pytest.approx((19 + 10) / (6.0 + 2.0))
    assert pooled_tokens_per_s([run, {**run, "accepted_hist": []}], 2) is None


def test_a_regime_is_scored_on_the_full_batch_figures_the_whole_runs_beside():
    def row(pred, whole, full):
        return {
            "predicted_tokens_per_s": pred,
            "measured": {"tokens_per_s": whole, "full_batch_tokens_per_s": full},
        }

    # The whole runs order the last two the other way (a drain of finished sequences).
    rows = [row(3.0, 30.0, 31.0), row(2.0, 18.0, 24.0), row(1.0, 20.0, 21.0)]
    q = regime_quality(rows)
    assert q["measured_figure"] == "full_batch" and q["kendall_tau"] == pytest.approx(1.0)
    assert q["whole_run"]["kendall_tau"] == pytest.approx(1 / 3) and q["regret"] == 0.0
    # Without the full-batch figure of every row the whole runs' are scored.
    rows[1]["measured"]["full_batch_tokens_per_s"] = None
    q = regime_quality(rows)
    assert q["measured_figure"] == "whole_run" and q["kendall_tau"] == pytest.approx(1 / 3)


@pytest.fixture(scope="module")
def h200():
    return json.loads(record_path("scale-campaign-h200.json").read_text())


def test_the_report_compares_a_full_batch_with_a_full_batch(h200):
    """sd_sparse_naive at 128K batch 6: 752 tokens in 56 rounds (2.24 per sequence and round)
    while every sequence decodes in 43 rounds that emit 2.41; the report measures those rounds
    and predicts at their acceptance, so both sides have the same tokens per round. The row
    records its full-batch figures; a row measured before they were recorded has them derived
    from its per-round accepted counts: the same rounds and tokens, at the run's mean round."""
    row = next(
        r
        for r in h200["rows"]
        if (r["baseline"], r["batch"], r["acceptance"]) == ("sd_sparse_naive", 6, 0.6)
    )
    m = row["measured"]
    full = derived(m, 6)
    assert full is m["full_batch"] and full["wall"] == "measured"
    assert full["rounds"] == 43 and full["tokens_per_round"] == pytest.approx(2.4070, abs=1e-4)
    assert m["tokens"] / (m["rounds"] * 6) < 0.95 * full["tokens_per_round"]
    older = derived({k: v for k, v in m.items() if k != "full_batch"}, 6)
    assert (older["rounds"], older["tokens"]) == (full["rounds"], full["tokens"])
    spent = m["wall_s"] + m["switch_s"] + m["control_s"]
    assert older["round_s"] == pytest.approx(spent / m["rounds"])
    pred = predict_row(h200, row)
    assert pred["tokens_per_round"] == pytest.approx(full["tokens_per_round"], rel=1e-6)
    rep = build_scale({**h200, "rows": [row]}, "scale.json")
    (cell,) = rep["cells"]
    assert cell["measured"]["tokens_per_s"] == pytest.approx(full["tokens_per_s"])
    assert cell["measured"]["run_tokens_per_s"] == m["tokens_per_s"] < full["tokens_per_s"]
    assert cell["measured"]["round_s"] == pytest.approx(full["round_s"])
    assert cell["predicted"]["tokens_per_s"] == pytest.approx(pred["tokens_per_s"])
    assert "full batch (43 of 56 rounds" in cell["measured"]["rounds"]


def test_a_decodes_tokens_per_s_pays_the_controllers_host_time_as_its_full_rounds_do():
    """``DecodeResult.tokens_per_s`` counts the online controller's serial calls and switches
    between the counted rounds (as the full-batch figures and the bench's steady figures do);
    an overlapped call ran inside the next round's wall time and is not added again."""
    from ssvkit.engine.results import DecodeResult

    rounds = [_round(i, [1, 1], 1.0) for i in range(4)]
    rounds[2].step_s.update(switch=2.0, control=0.5, control_overlap=0.25)
    result = DecodeResult([[0], [0]], rounds, 0.0, "cuda-events")
    tokens = 3 * 2 * 2  # rounds 1-3 (round 0 is warm-up), two sequences, two tokens each
    assert result.tokens_per_s() == pytest.approx(tokens / (3 * 1.0 + 2.0 + 0.5))
    full = figures(result, 2)
    assert full["tokens_per_s"] == pytest.approx(4 * 2 / (2 * 1.0 + 2.5))  # rounds 1 and 2
