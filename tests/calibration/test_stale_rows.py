"""Stale rows: a row whose call, timed now, would run another launch plan is stale, and a sweep's
``--redo stale`` times exactly those rows of its ``--done-from`` files again."""

from __future__ import annotations

import json

from ssvkit.calibration import row_work as rw
from ssvkit.calibration import stale_rows as sr
from ssvkit.calibration.ceilings import PROFILES
from ssvkit.calibration.kernel_sweep_options import parse_args
from ssvkit.calibration.runner import done_keys
from ssvkit.perfmodel.rows import row_key, seal

BEFORE_TILE = "2026-12-06T12:00:00+00:00"  # before rw.DENSE_WARPGROUP_TILE_SINCE
AFTER_TILE = "2026-12-06T16:00:00+00:00"


def _template(op: str) -> dict:
    path = PROFILES / "h200" / "kernel_bench.jsonl"
    return next(r for r in map(json.loads, path.open()) if r["op"] == op)


def _dense(t: int, timestamp: str) -> dict:
    """A sealed dense verification row at Llama-3.1-8B attention (G = 4, D = 128)."""
    row = _template("dense_verify")
    params = dict(row["params"], num_query_tokens=t, num_q_heads=32, num_kv_heads=8, head_dim=128)
    return seal({**row, "params": params, "timestamp": timestamp})


def test_a_dense_row_of_the_32_row_tile_is_stale_and_only_it():
    assert rw.timed_before(_dense(8, BEFORE_TILE), rw.DENSE_WARPGROUP_TILE_SINCE)
    assert sr.is_stale(_dense(8, BEFORE_TILE))  # 32 packed rows: now a 64-row tile
    assert not sr.is_stale(_dense(16, BEFORE_TILE))  # 64 rows: one tile either way
    assert not sr.is_stale(_dense(8, AFTER_TILE))  # timed on the 64-row tile


def test_a_row_that_leaves_the_plan_priced_classes_is_stale_and_other_ops_never_are():
    nsa = {**_template("nsa_verify"), "git_commit": rw.NSA_SPLIT_PLAN_COMMITS[0]}
    assert not rw.is_slot_plan(nsa) and sr.is_stale(nsa)
    copy = {**_template("device_copy"), "timestamp": BEFORE_TILE, "git_commit": "51d8197"}
    assert sr.launch_work(copy) is None and not sr.is_stale(copy)


def test_redo_stale_leaves_out_exactly_the_stale_rows(tmp_path):
    rows = [_dense(8, BEFORE_TILE), _dense(16, BEFORE_TILE), _dense(12, AFTER_TILE)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = [row_key(r["op"], r["timing"], r["params"]) for r in rows]
    assert done_keys([path]) == set(keys)
    assert done_keys([path], (sr.STALE,)) == set(keys[1:])
    opts = parse_args(["--out", str(tmp_path / "o"), "--redo", "stale", "--done-from", str(path)])
    assert opts.redo == (sr.STALE,)


def test_every_stale_committed_row_is_of_a_plan_priced_op():
    for gpu in ("h200", "h100-sxm"):
        path = PROFILES / gpu / "kernel_bench.jsonl"
        stale = [r for r in map(json.loads, path.open()) if sr.is_stale(r)]
        assert stale, gpu
        assert {r["op"] for r in stale} <= {"nsa_verify", "sparse_verify", "select_blocks",
                                           "dense_verify", "repair"}  # fmt: skip
