"""Merging shard folders into a profile folder: new rows appended after the existing lines,
duplicates skipped (the ceilings rows every shard writes), a line cut short by a killed shard
left out, rows of another device refused with nothing written, ``replace`` for ops measured
again, ``retire`` for the rows of configs a sweep measured in full no longer makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ssvkit.calibration.merge_rows import merge
from ssvkit.perfmodel.rows import load_rows, seal

from ssvkit.cli import main

BASE = dict(
    timing="graph",
    unique_bytes=1,
    flops=1,
    achieved_bytes_per_s=1.0,
    copy_bytes_per_s=4e12,
    gemm_flops_per_s=7e14,
    launch_s=1e-6,
    torch_version="-",
    triton_version="-",
    git_commit="-",
    timestamp="2026-11-28T00:00:00",
)


def _row(op: str, m: int, median_s: float = 1e-5, device: str = "NVIDIA H200") -> str:
    times = dict(median_s=median_s, p10_s=0.9 * median_s, p90_s=1.1 * median_s)
    row = seal({**BASE, **times, "op": op, "params": {"m": m}, "device_name": device})
    return json.dumps(row) + "\n"


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_shards_merge_after_the_committed_lines(tmp_path):
    dest = tmp_path / "h200"
    committed = _row("device_copy", 0) + _row("gemm", 1)
    _write(dest, "op_sweep.jsonl", committed)
    _write(tmp_path / "s0", "op_sweep.jsonl", _row("device_copy", 0) + _row("gemm", 2))
    cut = _row("gemm", 4)
    _write(tmp_path / "s1", "op_sweep.jsonl", _row("gemm", 3) + cut[:-30])
    _write(tmp_path / "s1", "kernel_bench.jsonl", _row("sparse_verify", 5))
    report = merge("h200", [tmp_path / "s0", tmp_path / "s1"], dest)
    assert report["op_sweep.jsonl"] == {
        "added": 2,
        "replaced": 0,
        "skipped": 1,
        "retired": 0,
        "cut": 1,
    }
    assert report["kernel_bench.jsonl"]["added"] == 1
    text = (dest / "op_sweep.jsonl").read_text()
    assert text.startswith(committed)  # the committed lines verbatim, new ones after
    assert [r["params"]["m"] for r in load_rows(dest / "op_sweep.jsonl")] == [0, 1, 2, 3]
    again = merge("h200", [tmp_path / "s0", tmp_path / "s1"], dest)
    assert again["op_sweep.jsonl"]["added"] == 0
    assert (dest / "op_sweep.jsonl").read_text() == text


def test_replace_takes_the_new_row_of_the_ops_named(tmp_path):
    dest = tmp_path / "h200"
    _write(dest, "kernel_bench.jsonl", _row("nsa_verify", 1, 2e-5) + _row("repair", 1, 2e-5))
    newer = _row("nsa_verify", 1, 1e-5) + _row("repair", 1, 1e-5)
    _write(tmp_path / "s0", "kernel_bench.jsonl", newer)
    _write(tmp_path / "s1", "kernel_bench.jsonl", _row("nsa_verify", 1, 3e-5))
    report = merge("h200", [tmp_path / "s0", tmp_path / "s1"], dest, replace=("nsa_verify",))
    assert report["kernel_bench.jsonl"] == {
        "added": 0,
        "replaced": 1,
        "skipped": 2,
        "retired": 0,
        "cut": 0,
    }
    rows = load_rows(dest / "kernel_bench.jsonl")
    assert [(r["op"], r["median_s"]) for r in rows] == [("nsa_verify", 1e-5), ("repair", 2e-5)]


def test_retire_drops_the_rows_no_merged_row_replaces(tmp_path):
    dest = tmp_path / "h200"
    launch = json.loads(_row("nsa_verify", 9))
    launch["timing"] = "launch"
    committed = _row("nsa_verify", 1, 2e-5) + _row("nsa_verify", 2, 2e-5) + _row("repair", 3, 2e-5)
    _write(dest, "kernel_bench.jsonl", committed + json.dumps(seal(launch)) + "\n")
    _write(tmp_path / "s0", "kernel_bench.jsonl", _row("nsa_verify", 1) + _row("nsa_verify", 4))
    report = merge("h200", [tmp_path / "s0"], dest, replace=("nsa_verify",), retire=("nsa_verify",))
    assert report["kernel_bench.jsonl"] == {
        "added": 1, "replaced": 1, "skipped": 0, "retired": 1, "cut": 0
    }  # fmt: skip
    rows = load_rows(dest / "kernel_bench.jsonl")
    # Row 2 is gone; the repair row and the launch-timed row (a timing not merged) stay.
    assert [(r["op"], r["timing"], r["params"]["m"]) for r in rows] == [
        ("nsa_verify", "graph", 1), ("repair", "graph", 3), ("nsa_verify", "launch", 9),
        ("nsa_verify", "graph", 4),
    ]  # fmt: skip
    assert rows[0]["median_s"] == 1e-5


def test_bad_sources_are_refused_with_nothing_written(tmp_path):
    dest = tmp_path / "h200"
    _write(dest, "op_sweep.jsonl", _row("gemm", 1))
    before = (dest / "op_sweep.jsonl").read_text()
    _write(tmp_path / "s0", "op_sweep.jsonl", _row("gemm", 2))
    _write(tmp_path / "h100", "op_sweep.jsonl", _row("gemm", 3, device="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="measured on 'NVIDIA H100 80GB HBM3', not 'NVIDIA H200'"):
        merge("h200", [tmp_path / "s0", tmp_path / "h100"], dest)
    edited = json.loads(_row("gemm", 4))
    edited["median_s"] = 1.05e-5
    _write(tmp_path / "s2", "op_sweep.jsonl", json.dumps(edited) + "\n")
    with pytest.raises(ValueError, match="checksum mismatch"):
        merge("h200", [tmp_path / "s0", tmp_path / "s2"], dest)
    with pytest.raises(ValueError, match="is not a folder"):
        merge("h200", [tmp_path / "none"], dest)
    assert (dest / "op_sweep.jsonl").read_text() == before


def test_the_calibrate_command_merges_and_refuses_mixed_modes(tmp_path, monkeypatch, capsys):
    from ssvkit.calibration import ceilings

    monkeypatch.setattr(ceilings, "PROFILES", tmp_path / "profiles")
    _write(tmp_path / "s0", "op_sweep.jsonl", _row("gemm", 2))
    assert main(["calibrate", "--gpu", "h200", "--merge", str(tmp_path / "s0")]) == 0
    assert "1 rows added" in capsys.readouterr().out
    assert len(load_rows(tmp_path / "profiles" / "h200" / "op_sweep.jsonl")) == 1
    for argv, message in (
        (["--merge", str(tmp_path / "s0"), "--fit-only"], "exclude each other"),
        (["--merge", str(tmp_path / "s0"), "--shard", "0/2"], "--merge runs no sweep"),
        (["--replace", "gemm"], "--replace applies to --merge"),
        (["--retire", "gemm"], "--retire applies to --merge"),
        (["--shard", "0/2"], "give --out DIR"),
        (["--shards", "4"], "--shards applies to --plan"),
        (["--merge", str(tmp_path / "none")], "is not a folder"),
    ):
        assert main(["calibrate", "--gpu", "h200", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
