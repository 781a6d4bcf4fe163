"""The sweeps' runner on the CPU: sealed rows, resume keys, the budget, the L2-resident mode,
and the kernel sweep's sparse selections."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.runner import Runner, read_rows
from ssvkit.calibration.shards import Shard
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.rows import check_redo, load_rows, redo_matches, row_key

CEIL = dict(copy_bytes_per_s=1e12, gemm_flops_per_s=1e15, launch=2e-6, graph=1e-6)


def _runner(path, monkeypatch, samples_s=(1e-5,), **kw):
    r = Runner(path, 600.0, config=tm.QUICK_TIMING, **kw)
    r.ceil = dict(CEIL)
    timed = []

    def bench(fn, timing, *, num_inputs, config):
        timed.append((timing, num_inputs, config.flush_l2))
        fn(0)
        s = samples_s[0]
        return tm.Timing(s, 0.9 * s, 1.1 * s, timing, 3)

    monkeypatch.setattr(tm, "bench", bench)
    return r, timed


def test_rows_are_sealed_and_a_rerun_skips_them(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    r, timed = _runner(path, monkeypatch, work_type=int)
    params = {"context_len": 4, "rotations": 3}
    r.time_op("op", params, lambda i: None, num_inputs=3, unique_bytes=1e7, flops=2e9)
    rows = load_rows(path)  # checksums verified
    assert [row["timing"] for row in rows] == ["launch", "graph"]
    assert rows[0]["launch_s"] == 2e-6 and rows[1]["launch_s"] == 1e-6
    assert rows[0]["unique_bytes"] == 10_000_000 and isinstance(rows[0]["flops"], int)
    assert rows[0]["achieved_bytes_per_s"] == pytest.approx(1e12)
    # A new run resumes: the same config with other derived params is already done.
    again, timed2 = _runner(path, monkeypatch)
    assert again.pending("op", {"context_len": 4, "rotations": 5}) == []
    assert again.pending("op", {"context_len": 5}) == ["launch", "graph"]
    again.time_op("op", params, lambda i: pytest.fail("timed again"), **_work())
    assert len(read_rows(path)) == 2 and again.num_written == 0


def _work():
    return dict(num_inputs=1, unique_bytes=1.0, flops=1.0)


def test_the_budget_stops_before_a_config_that_would_not_fit(tmp_path, monkeypatch):
    r, _ = _runner(tmp_path / "rows.jsonl", monkeypatch, timings=("graph",))
    r.budget_s = 11.0  # twice the first guess of the longest config (5 s) leaves 1 s
    assert not r.out_of_time()
    r.longest_s = 6.0
    assert r.out_of_time() and r.stopped
    r.time_op("op", {"m": 1}, lambda i: pytest.fail("timed past the budget"), **_work())
    assert not (tmp_path / "rows.jsonl").exists()


def test_resident_rows_say_so_and_time_one_unflushed_set(tmp_path, monkeypatch):
    r, timed = _runner(tmp_path / "rows.jsonl", monkeypatch, timings=("graph",))
    r.resident = True
    assert r.rotations(10**10) == 1
    r.time_op("gemm", {"m": 1}, lambda i: None, num_inputs=4, unique_bytes=8.0, flops=2.0)
    (row,) = read_rows(tmp_path / "rows.jsonl")
    assert row["params"] == {"m": 1, "l2": "resident"} and isinstance(row["flops"], float)
    assert timed == [("graph", 1, False)]
    assert r.pending("gemm", {"m": 1}) == [] and row_key("gemm", "graph", {"m": 1}) not in r.done


def test_a_broken_config_is_reported_and_left_out(tmp_path, monkeypatch, capsys):
    r, _ = _runner(tmp_path / "rows.jsonl", monkeypatch, timings=("graph",))

    def broken(i):
        raise RuntimeError("bad launch")

    r.time_op("op", {"m": 1}, broken, **_work())
    assert "RuntimeError: bad launch" in capsys.readouterr().out
    assert not (tmp_path / "rows.jsonl").exists() and not r.stopped


@pytest.mark.parametrize("overlap", [0.5, 0.7, 0.9])
def test_sparse_selections_have_the_exact_overlap_and_load_fraction(overlap):
    top_n, t = 16, 16
    idx = ki.overlap_block_idx([1024, 300], t, top_n, overlap, np.random.default_rng(0))
    assert idx.shape == (2, ki.NUM_KV_HEADS, t, top_n) and idx.dtype == np.int32
    keep = round(overlap * top_n)
    shared = [len(np.intersect1d(idx[0, 0, i], idx[0, 0, i - 1])) for i in range(1, t)]
    assert shared == [keep] * (t - 1)
    for group in (1, 2, 4, 8):  # long prefix: the fresh blocks are new to their span
        f_load = ki.group_blocks(idx[:1], group) / (ki.NUM_KV_HEADS * t * top_n)
        assert f_load == pytest.approx(ki.f_load_formula(group, keep / top_n))


def test_the_tiny_geometry_changes_every_builder(monkeypatch):
    monkeypatch.setattr(ki, "NUM_Q_HEADS", ki.NUM_Q_HEADS)
    monkeypatch.setattr(ki, "NUM_KV_HEADS", ki.NUM_KV_HEADS)
    monkeypatch.setattr(ki, "HEAD_DIM", ki.HEAD_DIM)
    ki.use_geometry("tiny")
    p = ki.base_params(context_len=8)
    assert (p["num_q_heads"], p["num_kv_heads"], p["head_dim"]) == (8, 2, 64)
    assert ki.kv_bytes(1) == 2 * 64 * 2
    with pytest.raises(ValueError, match="'huge'"):
        ki.use_geometry("huge")
    assert json.dumps(p)  # params stay JSON


def test_a_row_cut_short_by_a_kill_is_dropped_and_measured_again(tmp_path, monkeypatch, capsys):
    path = tmp_path / "rows.jsonl"
    r, _ = _runner(path, monkeypatch, timings=("graph",))
    r.time_op("op", {"m": 1}, lambda i: None, **_work())
    r.time_op("op", {"m": 2}, lambda i: None, **_work())
    whole = path.read_text()
    path.write_text(whole[: len(whole) - 40])  # the second row's write was cut off
    assert len(read_rows(path)) == 1
    again, timed = _runner(path, monkeypatch, timings=("graph",))
    assert "cut short" in capsys.readouterr().out
    assert again.pending("op", {"m": 1}) == [] and again.pending("op", {"m": 2}) == ["graph"]
    again.time_op("op", {"m": 2}, lambda i: None, **_work())
    assert [row["params"]["m"] for row in load_rows(path)] == [1, 2]  # checksums verified


def test_rows_record_their_wall_and_first_call_seconds(tmp_path, monkeypatch):
    r, _ = _runner(tmp_path / "rows.jsonl", monkeypatch, timings=("graph",))
    r.time_op("op", {"m": 1}, lambda i: None, **_work())
    (row,) = load_rows(tmp_path / "rows.jsonl")
    assert row["wall_s"] >= 0.0 and row["first_call_s"] >= 0.0
    assert row["wall_s"] >= row["first_call_s"] - 1e-3


def test_done_from_files_count_as_done_except_the_ops_to_redo(tmp_path, monkeypatch):
    committed = tmp_path / "committed.jsonl"
    r, _ = _runner(committed, monkeypatch, timings=("graph",))
    r.time_op("a", {"m": 1}, lambda i: None, **_work())
    r.time_op("b", {"m": 1}, lambda i: None, **_work())
    out = tmp_path / "shard" / "rows.jsonl"
    shard, _ = _runner(out, monkeypatch, timings=("graph",), done_from=(committed,))
    assert shard.pending("a", {"m": 1}) == [] and shard.pending("b", {"m": 1}) == []
    redo, _ = _runner(out, monkeypatch, timings=("graph",), done_from=(committed,), redo_ops=("b",))
    assert redo.pending("a", {"m": 1}) == [] and redo.pending("b", {"m": 1}) == ["graph"]
    redo.time_op("b", {"m": 1}, lambda i: None, **_work())
    assert len(read_rows(committed)) == 2 and len(read_rows(out)) == 1  # never written there


def test_redo_selectors_pick_rows_by_op_and_params(tmp_path, monkeypatch):
    """``op:key=value``: only the rows of ``op`` whose params have every value (compared as
    text) are measured again; a malformed selector is refused naming itself."""
    committed = tmp_path / "committed.jsonl"
    r, _ = _runner(committed, monkeypatch, timings=("graph",))
    params = [{"mode": m, "b": b, "on": on} for m in ("x", "y") for b in (1, 16) for on in (0, 1)]
    for p in params:
        r.time_op("a", dict(p, on=bool(p["on"])), lambda i: None, **_work())
    out = tmp_path / "redo.jsonl"
    sel = ("a:mode=x:b=16", "a:on=True:mode=y:b=1")
    redo, _ = _runner(out, monkeypatch, timings=("graph",), done_from=(committed,), redo_ops=sel)
    again = [p for p in params if redo.pending("a", dict(p, on=bool(p["on"])))]
    assert again == [
        {"mode": "x", "b": 16, "on": 0},
        {"mode": "x", "b": 16, "on": 1},
        {"mode": "y", "b": 1, "on": 1},
    ]
    assert redo_matches(("a",), "a", {}) and not redo_matches(("a:b=1",), "b", {"b": 1})
    for bad in ("a:mode", "a:=x", ":mode=x"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            check_redo((bad,))
    check_redo(("a", "a:mode=x:b=1"))


def test_a_sharded_runner_times_only_the_configs_its_shard_owns(tmp_path, monkeypatch):
    configs = [{"m": m} for m in range(40)]
    owned = []
    for k in range(3):
        r, _ = _runner(tmp_path / f"s{k}.jsonl", monkeypatch, timings=("graph",), shard=Shard(k, 3))
        owned.append({c["m"] for c in configs if r.pending("op", c)})
    assert set().union(*owned) == set(range(40))
    assert sum(len(o) for o in owned) == 40 and all(owned)
