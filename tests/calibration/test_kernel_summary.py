"""The kernel sweep's summary: floor targets on synthetic rows, the command on committed rows
(no GPU)."""

from __future__ import annotations

import json

import pytest
from ssvkit.calibration import ceilings, kernel_sweep
from ssvkit.calibration.kernel_summary import _heads, floor_target_met, summarise
from ssvkit.calibration.runner import read_rows


def test_floor_target_is_relative_above_20us_and_absolute_below():
    assert floor_target_met(29e-6, 20e-6) and not floor_target_met(31e-6, 20e-6)
    assert floor_target_met(17.9e-6, 10e-6) and not floor_target_met(18.1e-6, 10e-6)


def _row(op, batch, median_s, unique_bytes):
    return {
        "op": op,
        "timing": "graph",
        "params": {"batch": batch, "mode": "reuse", "context_len": 1, "impl": "fused"},
        "median_s": median_s,
        "unique_bytes": unique_bytes,
        "flops": 0,
        "copy_bytes_per_s": 1e12,
        "gemm_flops_per_s": 1e15,
    }


def test_baselines_pair_rows_of_one_head_geometry_and_row_count():
    """A union row's speedup is over per_query at its own heads and draft rows, not over
    another geometry's row that shares its context, top_n, overlap and batch."""
    rows = []
    for heads, t, pq_s, union_s in (
        ((32, 8, 128), 16, 40e-6, 20e-6),
        ((32, 2, 128), 8, 9e-6, 3e-6),
    ):
        for mode, s in (("per_query", pq_s), ("union", union_s)):
            p = dict(context_len=1, top_n=16, overlap=0.7, batch=1, mode=mode, group_size=4)
            p.update(num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2])
            p.update(num_query_tokens=t, f_load=0.5)
            row = {**_row("sparse_verify", 1, s, 1), "params": p, "launch_s": 1e-6}
            rows.append({**row, "achieved_bytes_per_s": 1.0})
    speedups = {(e["heads"], e["t"]): e["speedup"] for e in summarise(rows)["sparse"]}
    assert speedups == {("32/8/128", 16): 2.0, ("32/2/128", 8): 3.0}


def test_summary_counts_rows_meeting_their_floor_per_op_and_batch():
    rows = [
        _row("nsa_verify", 1, 30e-6, 10_000_000),  # floor 10 us: 30 > 18, missed
        _row("nsa_verify", 1, 15e-6, 10_000_000),  # met
        _row("nsa_verify", 16, 40e-6, 30_000_000),  # floor 30 us: 1.33 x, met
        _row("nsa_verify", 16, 60e-6, 30_000_000),  # 2 x, missed
    ]
    got = {(e["op"], e["B"]): e for e in summarise(rows)["floor targets"]}
    assert (got["nsa_verify", 1]["rows"], got["nsa_verify", 1]["met"]) == (2, 1)
    assert (got["nsa_verify", 16]["rows"], got["nsa_verify", 16]["met"]) == (2, 1)
    assert got["nsa_verify", 16]["worst_x"] == 2.0


def _select_row(impl, median_s, heads=(32, 8, 128), t=16):
    row = _row("select_blocks", 1, median_s, 2_000_000)  # floor 2 us
    row["params"] = {"batch": 1, "context_len": 131072, "top_n": 64, "method": "mean"}
    row["params"]["num_query_tokens"] = t
    row["params"].update(impl=impl, num_q_heads=heads[0], num_kv_heads=heads[1])
    row["params"]["head_dim"] = heads[2]
    return row


def test_select_pairs_stay_within_one_head_geometry():
    rows = [_select_row("one_launch", 9e-6), _select_row("two_launch", 16e-6)]
    rows += [
        _select_row(i, s, (16, 2, 64)) for i, s in (("one_launch", 5e-6), ("two_launch", 4e-6))
    ]
    pairs = {
        e["heads"]: (round(e["one_us"]), round(e["two_us"])) for e in summarise(rows)["select"]
    }
    assert pairs == {"32/8/128": (9, 16), "16/2/64": (5, 4)}


def test_select_pairs_stay_within_one_draft_row_count():
    rows = [_select_row("one_launch", 9e-6), _select_row("two_launch", 16e-6)]
    rows += [_select_row(i, s, t=45) for i, s in (("one_launch", 30e-6), ("two_launch", 20e-6))]
    pairs = {e["t"]: (round(e["one_us"]), round(e["two_us"])) for e in summarise(rows)["select"]}
    assert pairs == {16: (9, 16), 45: (30, 20)}


def _nsa_row(median_s, **schedule):
    row = _row("nsa_verify", 1, median_s, 1)
    row["params"].update(num_query_tokens=17, overlap=0.7, **schedule)
    return row


def test_the_fused_call_is_compared_with_the_unfused_side_by_side_and_on_one_stream():
    """The fused row's speedup is over the unfused call with its branches side by side (the
    kernels' default), and apart over the one-stream call; a file of one kind has only it."""
    fused, one = _nsa_row(10e-6), _nsa_row(20e-6)
    one["params"]["impl"] = "unfused"
    side = {**one, "median_s": 15e-6, "params": {**one["params"], "branch_streams": True}}
    (both,) = summarise([fused, one, side])["nsa"]
    assert (both["speedup"], both["speedup_one_stream"]) == pytest.approx((1.5, 2.0))
    (alone,) = summarise([fused, one])["nsa"]
    assert alone["speedup"] is None and alone["speedup_one_stream"] == pytest.approx(2.0)


def test_a_row_schedule_pairs_with_the_packed_call_whatever_its_compressed_tiles():
    """A row schedule's row keys ``context_tiles``, the packed row of the same call does not."""
    rows = [_nsa_row(20e-6), _nsa_row(30e-6, rows_per_tile=1, context_tiles="paired")]
    rows.append(_nsa_row(50e-6, rows_per_tile=4))
    got = {
        (e["rows"], e["tiles"]): e["packed_speedup"] for e in summarise(rows)["nsa row schedules"]
    }
    assert got == pytest.approx({(1, "paired"): 1.5, (4, "per_tile"): 2.5})


def test_select_rows_pair_one_launch_with_two_and_the_default_counts_for_the_target():
    rows = [_select_row("one_launch", 9e-6), _select_row("two_launch", 16e-6)]
    summary = summarise(rows)
    (pair,) = summary["select"]
    assert (pair["one_us"], pair["two_us"], pair["floor_us"]) == pytest.approx((9, 16, 2))
    assert pair["x_floor"] == pytest.approx(4.5) and pair["target_met"]  # 9 <= 2 + 8 us
    (target,) = [e for e in summary["floor targets"] if e["op"] == "select_blocks"]
    # The two launches (the default) count: 16 us > 2 + 8 us; the one-launch row is left out.
    assert (target["rows"], target["met"]) == (1, 0)


def test_summary_only_prints_the_committed_rows_without_a_gpu(capsys):
    out = str(ceilings.PROFILES / "h200")
    assert kernel_sweep.main(["--out", out, "--summary-only", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    targets = {(e["op"], e["B"]): e for e in summary["floor targets"]}
    rows = [r for r in read_rows(ceilings.PROFILES / "h200" / "kernel_bench.jsonl")]
    graph = [r for r in rows if r["timing"] == "graph"]
    assert targets["sparse_verify", 16]["rows"] > 0
    assert len(summary["dense"]) == sum(r["op"] == "dense_verify" for r in graph)
    nsa = [r for r in graph if r["op"] == "nsa_verify"]
    # Rows of a row schedule (``rows_per_tile``) are the "nsa row schedules" section's.
    packed = {_heads(r["params"]) for r in nsa if "rows_per_tile" not in r["params"]}
    assert {e["heads"] for e in summary["nsa"]} == packed
    assert any("rows_per_tile" in r["params"] for r in nsa)
    assert kernel_sweep.main(["--out", out, "--summary-only"]) == 0
    text = capsys.readouterr().out
    assert "floor targets (graph replay)" in text and "  heads" in text


@pytest.mark.parametrize(
    "argv, bad",
    [
        (["--ops", "dense,bogus"], "bogus"),
        (["--geometry", "huge"], "huge"),
        (["--budget-s", "0"], "0"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(tmp_path, capsys, argv, bad):
    assert kernel_sweep.main(["--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and bad in err
    assert not any(tmp_path.iterdir())
