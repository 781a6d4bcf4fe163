"""The NSA row-schedule rows of the kernel sweep (step ``nsa_tiles``, ``kernel_grid``): their
configs and keys, byte counts, fit classes and launch-plan features, their place in the
calibration design and plan, and their summary (no GPU)."""

from __future__ import annotations

import pytest
import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops, kernel_sweep
from ssvkit.calibration.features import serial_steps, tile_rows
from ssvkit.calibration.fit import op_class
from ssvkit.calibration.kernel_design import design_configs
from ssvkit.calibration.kernel_grid import FULL_SWEEP, TINY_SWEEP, sweep_configs
from ssvkit.calibration.kernel_keys import compile_keys
from ssvkit.calibration.kernel_plan import plan_shards, variant_work
from ssvkit.calibration.kernel_summary import summarise
from ssvkit.calibration.nsa_rows import nsa_work, row_compressed_ctas
from ssvkit.calibration.stale_rows import is_stale
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.rows import row_key


def _nsa_row(t=16, rows_per_tile=None, mode="reuse", impl="fused", median_s=1e-4, heads=(32, 8)):
    p = ki.base_params(
        context_len=16384, num_query_tokens=t, batch=1, tree="binary", mode=mode, impl=impl
    )
    p.update(num_q_heads=heads[0], num_kv_heads=heads[1], top_n=16, block_size=64, window=512)
    p.update(comp_block=32, comp_stride=16)
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
    mma.sync rows), 16 slots; one row a tile, 16 tiles of 16 rows, 3 slots (one a branch: 128
    programs fill the SMs); four, 4 tiles of 16 rows, 4 slots (x 3 for the unfused call's
    merges), as the slot plan (``perfmodel.nsa_work``) sizes them."""
    packed, one, four = _nsa_row(), _nsa_row(rows_per_tile=1), _nsa_row(rows_per_tile=4)
    assert op_class(packed) == "nsa_verify/reuse/fused"
    assert op_class(one) == "nsa_verify/reuse/fused/per_query"
    assert op_class(four) == "nsa_verify/reuse/fused"  # the packed class, its own geometry
    assert [tile_rows(r) for r in (packed, one, four)] == [32, 16, 16]
    assert [serial_steps(r, 132) for r in (packed, one, four)] == [16, 3, 4]
    unfused = _nsa_row(rows_per_tile=4, impl="unfused")
    assert serial_steps(unfused, 132) == 12
    # One draft row is one tile whatever the schedule: the packed class prices it.
    assert op_class(_nsa_row(t=1, rows_per_tile=1)) == "nsa_verify/reuse/fused"


def test_unfused_rows_are_priced_as_their_branch_streams_ran():
    """An unfused row without ``params.branch_streams`` ran its branches on one stream: its
    merges in series (4 + 4 + 4 slots at four rows a tile); with it, side by side: the longest
    (4) and a shorter chain, on the same bytes. A fused row ignores it."""
    one = _nsa_row(rows_per_tile=4, impl="unfused")
    side = _nsa_row(rows_per_tile=4, impl="unfused")
    side["params"]["branch_streams"] = True
    assert (serial_steps(one, 132), serial_steps(side, 132)) == (12, 4)
    w_one, w_side = nsa_work(one, None), nsa_work(side, None)
    assert w_side.chain_tiles < w_one.chain_tiles
    assert w_side.requested_bytes == w_one.requested_bytes
    fused = _nsa_row(rows_per_tile=4)
    fused_side = _nsa_row(rows_per_tile=4)
    fused_side["params"]["branch_streams"] = True
    assert nsa_work(fused, None) == nsa_work(fused_side, None)


def test_rows_timed_before_the_lone_compressed_sizing_are_priced_as_they_ran():
    """Batch 16 at Llama-3.1-8B heads, t = 1: 128 row tiles, one slot each under one program an
    SM. A refresh row timed before ``COMPRESSED_CTAS_SINCE`` ran its compressed launch that way;
    one timed since (or without a time) ran two slots a tile; the unfused reuse call's
    compressed branch, beside its other branches, keeps one whenever it ran."""

    def row(mode, impl, stamp):
        r = _nsa_row(t=1, mode=mode, impl=impl)
        r["params"]["batch"] = 16
        if impl == "unfused":
            r["params"]["branch_streams"] = True
        if stamp:
            r["timestamp"] = stamp
        return r

    old, new = "2026-11-29T10:00:00+00:00", "2026-12-01T10:00:00+00:00"
    assert row_compressed_ctas(row("refresh", "fused", old)) == 1
    assert row_compressed_ctas(row("refresh", "fused", new)) == 2
    assert row_compressed_ctas(row("refresh", "fused", None)) == 2
    for impl in ("fused", "unfused"):
        w_old = nsa_work(row("refresh", impl, old), None)
        w_new = nsa_work(row("refresh", impl, new), None)
        # Shorter programs, one more partial slot to merge a tile.
        assert w_new.chain_tiles < w_old.chain_tiles, impl
        assert w_new.merge_steps > w_old.merge_steps, impl
    beside = [nsa_work(row("reuse", "unfused", s), None) for s in (old, new)]
    assert beside[0] == beside[1]
    # The rows to time again (``calibration.stale_rows``): the refresh rows, the one-stream
    # unfused row too (a sweep times only the configs its design makes, and it makes none of
    # these), not the reuse beside or a batch-1 row (their sizing is unchanged).
    one_stream = row("refresh", "unfused", old)
    del one_stream["params"]["branch_streams"]
    small = _nsa_row(t=1, mode="refresh")
    rows = [row("refresh", "fused", old), row("refresh", "unfused", old), one_stream]
    others = [row("reuse", "unfused", old), small]
    assert [is_stale(r) for r in rows + others] == [True, True, True, False, False]


def test_unfused_variants_run_their_branches_side_by_side():
    """The sweep's unfused NSA rows carry ``branch_streams`` True, so they are timed again
    beside the committed one-stream rows (other keys); the fused rows' params, and so their
    keys, are those of the committed rows."""
    with ki.geometry("tiny"):
        configs = [kg.nsa_config(4096, 5, 1, None), kg.nsa_config(4096, 5, 1, 0.7, 4)]
    variants = [v for c in configs for v in c.variants]
    assert {v.params["impl"] for v in variants} == {"fused", "unfused"}
    for v in variants:
        unfused = v.params["impl"] == "unfused"
        assert v.params.get("branch_streams") is (True if unfused else None)
        one_stream = {k: x for k, x in v.params.items() if k != "branch_streams"}
        keys = {row_key(v.op, "graph", p) for p in (v.params, one_stream)}
        assert len(keys) == (2 if unfused else 1)


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


def test_tile_configs_have_their_own_keys_and_skip_the_packed_ones():
    """The sweep's row-schedule configs (step ``nsa_tiles``): every config of the NSA grid whose
    tiles differ from the packed ones, once per schedule, with ``rows_per_tile`` in its params
    (the packed rows' keys unchanged); t = 1 (one tile whatever the schedule) is left to the
    packed rows."""
    assert kernel_sweep.STEPS_RUN["nsa_tiles"][0] is checks.check_nsa_tiles
    assert kernel_ops._RUN["nsa_tiles"] is kernel_ops._run_nsa
    configs = sweep_configs(TINY_SWEEP, ("nsa_tiles",), "tiny")
    assert kg.NSA_TILE_ROWS == (1, 4)
    assert {c.step for c in configs} == {"nsa_tiles"}
    seen = [(c.common["num_query_tokens"], c.common["rows_per_tile"], c) for c in configs]
    # 8 q / 2 KV heads pack 4, 8, 16, 16 rows at t = 3, 5, 12, 17: tiles of 4 rows are the
    # packed tiles at t = 3
    assert {t for t, r, _ in seen if r == 1} == {3, 5, 12, 17}
    assert {t for t, r, _ in seen if r == 4} == {5, 12, 17}
    # per (t, schedule): 4 contexts x (refresh-path indices: 4 variants; overlap 0.7: 2)
    assert len(seen) == (4 + 3) * len(TINY_SWEEP.nsa_contexts) * 2
    assert {len(c.variants) for *_, c in seen} == {4, 2}
    for t, rows, c in seen:
        assert all(v.params["rows_per_tile"] == rows for v in c.variants)
        assert all(v.params["num_query_tokens"] == t for v in c.variants)
    packed = sweep_configs(FULL_SWEEP, ("nsa",), "llama-3.1-8b")
    assert all("rows_per_tile" not in v.params for c in packed for v in c.variants)
    packed_keys = {row_key(v.op, "graph", v.params) for c in packed for v in c.variants}
    tiles = sweep_configs(FULL_SWEEP, ("nsa_tiles",), "llama-3.1-8b")
    assert tiles and not packed_keys & {
        row_key(v.op, "graph", v.params) for c in tiles for v in c.variants
    }


def test_tile_configs_run_their_schedule(monkeypatch):
    """A pending ``nsa_tiles`` config runs the NSA timing with its schedule in ``common`` (the
    launch config ``_nsa_config`` builds) and only its pending variants; a config whose rows
    are all in the file runs nothing."""
    seen = []

    class Runner:
        def __init__(self, done):
            self.done = done

        def pending(self, op, params):
            return [] if (params["mode"], params["impl"]) in self.done else ["graph"]

        def out_of_time(self):
            return False

    def config(r, seed, mod, common, extra, todo):
        seen.append((common.get("rows_per_tile"), extra, tuple(todo)))

    monkeypatch.setattr(kernel_ops, "_nsa_config", config)
    monkeypatch.setattr(kernel_ops, "free", lambda: None)
    with ki.geometry("tiny"):
        cfg = kg.nsa_config(4096, 5, 1, None, rows_per_tile=1)
    assert cfg.step == "nsa_tiles"
    assert kernel_ops.run_config(Runner({("reuse", "fused")}), cfg, 0, None)
    assert seen == [
        (1, kg.NSA_EXTRA, (("reuse", "unfused"), ("refresh", "fused"), ("refresh", "unfused")))
    ]
    every = {(m, i) for m in ("reuse", "refresh") for i in ("fused", "unfused")}
    assert not kernel_ops.run_config(Runner(every), cfg, 0, None)
    assert len(seen) == 1


def test_the_design_and_the_plan_take_the_tile_configs():
    """``ssvkit calibrate``'s design holds the row-schedule lines and points (no packed tiles
    among them), and the plan prices and shards them: a one-row schedule reads more blocks
    than the packed call and compiles its own tiles."""
    design = design_configs(("nsa", "nsa_tiles"))
    tiles = [c for c in design if c.step == "nsa_tiles"]
    assert {c.geometry for c in tiles} - {"llama-3.1-8b"}  # points at other geometries
    for c in tiles:
        with ki.geometry(c.geometry):
            assert not kg.nsa_tiles_packed(c.common["num_query_tokens"], c.common["rows_per_tile"])
    gpu = get_gpu("h200")
    with ki.geometry("llama-3.1-8b"):
        # 8K tokens: the packed call's union is at most the context, 16 rows' own blocks 16K.
        packed = kg.nsa_config(8192, 16, 1, 0.7)
        one = kg.nsa_config(8192, 16, 1, 0.7, rows_per_tile=1)
    (pv, _), (ov, _) = packed.variants, one.variants
    assert variant_work(one, ov)[0] > variant_work(packed, pv)[0]
    assert compile_keys(one, ov, 132) != compile_keys(packed, pv, 132)
    plan = plan_shards(design, 2, gpu, ("graph",))
    assert sorted(id(c) for s in plan.shards for c in s) == sorted(id(c) for c in design)
    assert "nsa_tiles" in plan.estimate(design)["steps"]


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


def test_the_planner_lines_time_nsa_at_their_own_top_n(monkeypatch):
    """The planner lines' NSA configs select ``top_n`` blocks a row (16 and 32), and the NSA
    timing runs the kernel with the config's ``top_n``, not NSA's default: the rows, the
    indices and the FLOPs say 32 (CPU interpreter, the tiny pair's attention)."""
    from ssvkit.calibration.design_lines import PLANNER_LINES, planner_configs
    from ssvkit.kernels import nsa_verify as mod

    nsa = [c for c in planner_configs() if c.step == "nsa"]
    assert {c.common["top_n"] for c in nsa} == set(PLANNER_LINES["nsa"]["top_ns"]) == {16, 32}
    dense = {c.geometry for c in planner_configs() if c.step == "dense"}
    assert dense == {"tiny", "tiny-draft"} and ki.GEOMETRIES["tiny-draft"] == (4, 2, 64)
    monkeypatch.setattr(ki, "DEVICE", "cpu")
    monkeypatch.setattr(ki, "DTYPE", torch.float32)  # the interpreter's bf16 dot is wrong
    monkeypatch.setattr(kernel_ops.tm, "num_rotations", lambda nbytes: 1)
    timed = []

    class Runner:
        def time_op(self, op, params, fn, num_inputs, unique_bytes, flops):
            timed.append((params, flops, fn(0)[1]))

    with ki.geometry("tiny"):
        for top_n in (16, 32):
            cfg = kg.nsa_config(4096, 2, 1, None, 0, top_n)
            kernel_ops._nsa_config(Runner(), 0, mod, cfg.common, cfg.extra, [("reuse", "fused")])
    (p16, f16, idx16), (p32, f32, idx32) = timed
    assert (p16["top_n"], p32["top_n"]) == (16, 32)
    assert idx16.shape[-1] == 16 and idx32.shape[-1] == 32
    assert f32 > f16
