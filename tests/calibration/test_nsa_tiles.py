"""The NSA row-schedule rows of the kernel sweep (``calibration.kernel_nsa_tiles``): their keys,
byte counts, fit classes and launch-plan features, and their summary (no GPU)."""

from __future__ import annotations

import pytest
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_nsa_tiles, kernel_ops
from ssvkit.calibration.fit import op_class, serial_steps, tile_rows
from ssvkit.calibration.kernel_summary import summarise
from ssvkit.calibration.kernel_sweep import FULL_SWEEP, STEPS, TINY_SWEEP


def _nsa_row(t=16, rows_per_tile=None, mode="reuse", impl="fused", median_s=1e-4, heads=(32, 8)):
    p = ki.base_params(
        context_len=16384, num_query_tokens=t, batch=1, tree="binary", mode=mode, impl=impl
    )
    p.update(num_q_heads=heads[0], num_kv_heads=heads[1], top_n=16, block_size=64, window=512)
    if rows_per_tile is not None:
        p["rows_per_tile"] = rows_per_tile
    return {
        "op": "nsa_verify",
        "timing": "graph",
        "params": p,
        "median_s": median_s,
        "unique_bytes": 1e6,
        "flops": 0,
        "copy_bytes_per_s": 1e12,
        "gemm_flops_per_s": 1e15,
    }


def test_one_row_tiles_are_the_per_query_class_and_carry_their_plan():
    """Llama-3.1-8B heads at t = 16 on 132 SMs: packed, one tile of 64 MMA rows (wgmma: 32
    mma.sync rows), 16 splits; one row a tile, 16 tiles of 16 rows, 1 split (no merge); four,
    4 tiles of 16 rows, 4 splits (x 3 for the unfused call's merges)."""
    packed, one, four = _nsa_row(), _nsa_row(rows_per_tile=1), _nsa_row(rows_per_tile=4)
    assert op_class(packed) == "nsa_verify/reuse/fused"
    assert op_class(one) == "nsa_verify/reuse/fused/per_query"
    assert op_class(four) == "nsa_verify/reuse/fused"  # the packed class, its own geometry
    assert [tile_rows(r) for r in (packed, one, four)] == [32, 16, 16]
    assert [serial_steps(r, 132) for r in (packed, one, four)] == [16, 0, 4]
    unfused = _nsa_row(rows_per_tile=4, impl="unfused")
    assert serial_steps(unfused, 132) == 12
    # One draft row is one tile whatever the schedule: the packed class prices it.
    assert op_class(_nsa_row(t=1, rows_per_tile=1)) == "nsa_verify/reuse/fused"


def test_tile_bytes_count_each_tiles_union_outside_the_window():
    """Two rows per sequence and KV head over 16K tokens of 64-token blocks (window: the last 8
    blocks): packed, the union of both rows once; one row a tile, each row's own blocks."""
    ctx, t = 16384, 2
    idx = torch.full((1, ki.NUM_KV_HEADS, t, 3), -1, dtype=torch.int32)
    idx[:, :, 0] = torch.tensor([1, 2, 3], dtype=torch.int32)
    idx[:, :, 1] = torch.tensor([2, 3, 255], dtype=torch.int32)  # block 255: in the window
    fixed = kernel_ops._nsa_bytes(idx, ctx, t, 1) - kernel_ops._nsa_bytes(idx, ctx, t, 0)
    # per KV head: rows {1, 2, 3} and {2, 3} outside the window vs their union {1, 2, 3}
    assert fixed == ki.NUM_KV_HEADS * ki.kv_bytes(2 * 64)
    assert kernel_ops._nsa_bytes(idx, ctx, t, 2) == kernel_ops._nsa_bytes(idx, ctx, t, 0)


def test_tile_configs_have_their_own_keys_and_skip_the_packed_ones(monkeypatch):
    """The sweep's row-schedule configs: every config of the NSA grid whose tiles differ from
    the packed ones, once per schedule, with ``rows_per_tile`` in its params (the packed rows'
    keys unchanged); t = 1 (one tile whatever the schedule) is left to the packed rows."""
    assert STEPS["nsa_tiles"][1] is kernel_nsa_tiles.nsa_tile_sweep
    seen = []

    class Runner:
        stopped = False

        def pending(self, op, params):
            return ["graph"]

        def out_of_time(self):
            return False

    def config(r, seed, mod, common, extra, todo):
        seen.append((common["num_query_tokens"], extra.get("rows_per_tile"), tuple(todo)))

    monkeypatch.setattr(kernel_ops, "_nsa_config", config)
    monkeypatch.setattr(kernel_ops, "free", lambda: None)
    ki.use_geometry("tiny")
    try:
        kernel_nsa_tiles.nsa_tile_sweep(Runner(), TINY_SWEEP, 0, None)
    finally:
        ki.use_geometry("llama-3.1-8b")
    assert kernel_nsa_tiles.NSA_TILE_ROWS == (1, 4)
    # 8 q / 2 KV heads pack 4, 8, 16, 16 rows at t = 3, 5, 12, 17: tiles of 4 rows are the
    # packed tiles at t = 3
    assert {t for t, r, _ in seen if r == 1} == {3, 5, 12, 17}
    assert {t for t, r, _ in seen if r == 4} == {5, 12, 17}
    # per (t, schedule): 4 contexts x (refresh-path indices: 4 variants; overlap 0.7: 2)
    assert len(seen) == (4 + 3) * len(TINY_SWEEP.nsa_contexts) * 2
    assert {len(todo) for *_, todo in seen} == {4, 2}
    seen.clear()
    kernel_ops.nsa_sweep(Runner(), FULL_SWEEP, 0, None)
    assert {r for _, r, _ in seen} == {None}  # the packed configs: no rows_per_tile key


def test_summary_sets_each_schedule_against_the_packed_call():
    rows = [
        _nsa_row(median_s=100e-6),
        _nsa_row(rows_per_tile=1, median_s=250e-6),
        _nsa_row(rows_per_tile=4, median_s=150e-6),
        _nsa_row(t=12, rows_per_tile=1, median_s=1e-3),  # no packed row at t = 12: left out
    ]
    got = summarise(rows)
    assert [(e["rows"], e["packed_speedup"]) for e in got["nsa row schedules"]] == [
        (1, pytest.approx(2.5)),
        (4, pytest.approx(1.5)),
    ]
    assert all(e["fused_us"] == pytest.approx(100) for e in got["nsa"])
