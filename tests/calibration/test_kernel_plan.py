"""The kernel sweep's configs, calibration design, shard split and plan, on the CPU: the design
keeps the committed rows' keys, covers the axes the transfer sets leave out, and every pending
config lands in exactly one shard, the same whichever shard computes the split."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from ssvkit.calibration import ceilings, kernel_sweep
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_design import design_configs, lattice_lhs
from ssvkit.calibration.kernel_grid import KernelConfig, sparse_config, sweep_configs
from ssvkit.calibration.kernel_keys import compile_keys, select_keys
from ssvkit.calibration.kernel_plan import (
    STEP_ORDER,
    PlanCosts,
    compile_s,
    config_cost,
    plan_shards,
)
from ssvkit.calibration.runner import done_keys, read_rows
from ssvkit.calibration.shards import Shard, assign
from ssvkit.perfmodel.attention_plan import dense_verify_plan
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.nsa_plan import DEFAULT_CONTEXT_TILES
from ssvkit.perfmodel.rows import row_key

H200_ROWS = ceilings.PROFILES / "h200" / "kernel_bench.jsonl"
GPU = get_gpu("h200")


@pytest.fixture(scope="module")
def design() -> list[KernelConfig]:
    return design_configs()


def _keys(configs, timing="graph") -> set[str]:
    return {row_key(v.op, timing, v.params) for c in configs for v in c.variants}


def test_shard_parsing_and_the_hash_rule():
    assert Shard.parse("2/4") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"
    for bad in ("4/4", "1", "a/4", "-1/4", "1/0"):
        with pytest.raises(ValueError, match="shard"):
            Shard.parse(bad)
    keys = [f"op||{i}" for i in range(200)]
    owners = [[k for k in range(4) if Shard(k, 4).owns(key)] for key in keys]
    assert all(len(o) == 1 for o in owners)
    assert min(Counter(o[0] for o in owners).values()) > 30


def test_assign_is_longest_first_to_the_least_loaded_shard():
    units = [("a", 5.0), ("b", 4.0), ("c", 3.0), ("d", 3.0), ("e", 2.0), ("f", 2.0)]
    owner = assign(units, 2)
    assert owner == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1, "f": 0}  # loads 10 and 9
    assert assign(list(reversed(units)), 2) == owner  # the order given does not matter
    with pytest.raises(ValueError, match="distinct"):
        assign([("a", 1.0), ("a", 2.0)], 2)


def test_lattice_lhs_uses_every_level_equally_often_and_is_seeded():
    axes = {"x": (1, 2, 3), "y": tuple(range(12))}
    pts = lattice_lhs(axes, 12, seed=3)
    assert Counter(p["x"] for p in pts) == {1: 4, 2: 4, 3: 4}
    assert sorted(p["y"] for p in pts) == list(range(12))
    assert lattice_lhs(axes, 12, seed=3) == pts and lattice_lhs(axes, 12, seed=4) != pts


def test_the_design_keeps_the_committed_rows_keys(design):
    """Every kernel row the H200 has committed is a row of the design, so a calibration run
    measures none of them again (only the ceilings rows of each run are not configs), except
    select rows without an ``impl``: they timed the two-launch selection before it had a
    one-launch form, and the design times both under new keys; NSA rows of a row schedule
    whose ``context_tiles`` (none: "per_tile") is not the kernels' default: they timed an
    earlier default, and the design times today's under new keys; and unfused NSA rows without
    ``branch_streams``: they ran one stream, and the design times the same configs side by
    side under keys of their own, while every fused NSA row keeps its key."""
    kept = [
        r
        for r in read_rows(H200_ROWS)
        if r["timing"] == "graph"
        and r["op"] not in ("device_copy", "empty_triton_kernel")
        and not (r["op"] == "select_blocks" and "impl" not in r["params"])
        and not (
            r["params"].get("rows_per_tile")
            and r["params"].get("context_tiles") != DEFAULT_CONTEXT_TILES
        )
    ]
    serial = [
        r
        for r in kept
        if r["op"] == "nsa_verify"
        and r["params"]["impl"] == "unfused"
        and "branch_streams" not in r["params"]
    ]
    one_stream = {row_key(r["op"], r["timing"], r["params"]) for r in serial}
    committed = {row_key(r["op"], r["timing"], r["params"]) for r in kept}
    planned = _keys(design)
    assert len(committed) > 500 and one_stream and committed - one_stream <= planned
    assert not one_stream & planned
    side = {row_key(r["op"], r["timing"], {**r["params"], "branch_streams": True}) for r in serial}
    assert side <= planned
    pending = kernel_sweep.pending_against(done_keys([H200_ROWS]), ("graph",))
    left = [v for c in design for v in pending(c)]
    assert (
        not left or not _keys([KernelConfig("dense", "llama-3.1-8b", {}, tuple(left))]) & committed
    )


def test_the_design_covers_the_transfer_sets_axes(design):
    """At least three head geometries (GQA 4 to 16, head dims 64, 128 and 256), group sizes
    1-8, t up to 64 and batches 1-64, each at several values of the others."""
    by_step = {s: [c for c in design if c.step == s] for s in ("dense", "sparse")}
    for step, configs in by_step.items():
        geoms = {ki.GEOMETRIES[c.geometry] for c in configs}
        assert {hq // hkv for hq, hkv, _ in geoms} >= {4, 5, 8, 16}, step
        assert {d for *_, d in geoms} == {64, 128, 256}, step
        assert max(c.common["num_query_tokens"] for c in configs) == 64, step
        batches = {c.common["batch"] for c in configs}
        assert {1, 3, 64} <= batches, step
    groups = Counter(
        (v.params["mode"], v.params["group_size"], c.geometry)
        for c in by_step["sparse"]
        for v in c.variants
    )
    for c in range(1, 9):
        geoms_at_c = {g for (m, gs, g) in groups if m == "union" and gs == c}
        assert len(geoms_at_c) >= 2, c
    lines = [c for c in by_step["sparse"] if c.geometry == "llama-3.1-8b"]
    assert {v.params["group_size"] for c in lines for v in c.variants} >= set(range(1, 9))


def test_every_step_is_timed_at_head_dimension_256(design):
    """The head-dimension lines: each step's points at the lines' geometry, seeded, every
    axis at more than one level, within the cache limit, and not the test design's geometry."""
    from ssvkit.calibration.kernel_design import HEAD_DIM_LINES, fits, head_dim_configs
    from ssvkit.calibration.unseen_design import GEOMETRIES as UNSEEN_GEOMETRIES

    got = head_dim_configs()
    assert _keys(got) == _keys(head_dim_configs())
    assert _keys(got) <= _keys(design)
    assert Counter(c.step for c in got) == Counter(HEAD_DIM_LINES["points"])
    assert {ki.GEOMETRIES[c.geometry][2] for c in got} == {256}
    assert HEAD_DIM_LINES["geometry"] not in UNSEEN_GEOMETRIES
    for step in HEAD_DIM_LINES["points"]:
        sub = [c.common for c in got if c.step == step]
        for axis in ("batch", "context_len", "num_query_tokens"):
            assert len({p[axis] for p in sub}) > 1, (step, axis)
        assert all(fits(HEAD_DIM_LINES["geometry"], p["batch"], p["context_len"]) for p in sub)


def test_selection_and_sparse_verification_are_timed_at_one_to_three_rows(design):
    """The few-rows lines: at two head geometries, batch 1 and more, sparse verification at
    t = 1, 2 and 3 (``per_query``; ``union`` and ``shared`` at group sizes 2 to t only, a
    group never wider than the rows) and block selection at one row."""
    from ssvkit.calibration.design_lines import few_rows_configs

    got = few_rows_configs()
    assert _keys(got) <= _keys(design)
    sparse = [(c, v.params) for c in got if c.step == "sparse" for v in c.variants]
    for geometry in ("llama-3.1-8b", "qwen3-30b-a3b"):
        at = {(p["num_query_tokens"], p["batch"]) for c, p in sparse if c.geometry == geometry}
        assert {(t, b) for t in (1, 2, 3) for b in (1, 16)} <= at, geometry
    assert all(p["group_size"] <= p["num_query_tokens"] for _, p in sparse)
    assert {p["group_size"] for _, p in sparse if p["mode"] != "per_query"} == {2, 3}
    select = {(c.common["num_query_tokens"], c.common["batch"]) for c in got if c.step == "select"}
    assert {(1, 1), (1, 16)} <= select


def test_selection_is_timed_at_contexts_between_the_powers_of_two(design):
    """The between lines: block selection at fitted contexts (none held out) whose score rows
    leave long tails past their power-of-two chunk, at two head geometries, batch 1 and 16,
    both metadata kinds."""
    from ssvkit.calibration.design_lines import between_configs
    from ssvkit.calibration.fit import HELDOUT_CONTEXTS
    from ssvkit.perfmodel.pick_work import row_layout

    got = between_configs()
    assert _keys(got) <= _keys(design)
    tails = set()
    for c in got:
        p = c.common
        assert c.step == "select" and p["context_len"] not in HELDOUT_CONTEXTS
        chunk, tail, _ = row_layout(-(-(p["context_len"] + p["num_query_tokens"]) // 64))
        tails.add(tail / chunk)
    assert max(tails) == 1.0 and min(tails) == 0.5
    for geometry in ("llama-3.1-8b", "glm-4-9b"):
        at = {(c.common["batch"], c.common["method"]) for c in got if c.geometry == geometry}
        assert at == {(b, m) for b in (1, 16) for m in ("mean", "quest")}, geometry


def test_selection_is_timed_past_sixteen_query_rows_in_both_regimes(design):
    """The score-rows lines: block selection at score tiles of 32 and 64 query rows (four warps
    and 16-block tiles at 64), at head dimensions 64, 128 and 256, at batch 1 and at batches
    whose score programs outnumber the SMs, both metadata kinds."""
    from ssvkit.calibration.design_lines import score_rows_configs
    from ssvkit.perfmodel.select_work import score_tile

    got = score_rows_configs()
    assert _keys(got) <= _keys(design)
    tiles = set()
    for c in got:
        p = c.common
        kinds = 2 if p["method"] == "quest" else 1
        tiles.add(score_tile(p["num_query_tokens"], kinds, p["head_dim"]))
    assert {t_pad for t_pad, _, _ in tiles} == {32, 64}
    assert (64, 16, 4) in tiles and (32, 32, 2) in tiles and (32, 16, 2) in tiles
    for geometry, d in (("llama-3.1-8b", 128), ("16q-2kv-d64", 64), ("8q-4kv-d256", 256)):
        at = {(c.common["batch"], c.common["method"]) for c in got if c.geometry == geometry}
        assert at == {(b, m) for b in (1, 4, 16) for m in ("mean", "quest")}, geometry
        assert {c.common["head_dim"] for c in got if c.geometry == geometry} == {d}
    # Every one launch of at most 64 rows fits the H200's SM: both launch counts everywhere.
    for c in got:
        assert {v.params["impl"] for v in c.variants} == {"one_launch", "two_launch"}


def test_selection_past_32_query_rows_is_timed_at_three_contexts(design):
    """Rows past 32 query rows at a shorter and a longer context than 64K too, at every
    geometry, batch regime and metadata kind of the lines: leaving one context out of the fit
    still leaves such rows in it."""
    from ssvkit.calibration.design_lines import score_rows_configs

    got = [c for c in score_rows_configs() if c.common["num_query_tokens"] > 32]
    for geometry in ("llama-3.1-8b", "16q-2kv-d64", "8q-4kv-d256"):
        at = {
            (c.common["context_len"], c.common["batch"], c.common["method"])
            for c in got
            if c.geometry == geometry
        }
        for ctx in (16 * 1024, 64 * 1024, 128 * 1024):
            assert {(b, m) for c_, b, m in at if c_ == ctx} >= {
                (b, m) for b in (1, 16) for m in ("mean", "quest")
            }, (geometry, ctx)


def test_the_design_times_dense_grids_between_one_and_two_waves(design):
    """At Llama-3.1-8B attention, 128-row dense tiles (t = 17 and 32), one an SM, at grids of
    one wave of the H200's SMs and of several partial second waves: those whose second wave
    is under 85% full split, the others run unsplit."""
    waves = {}
    for c in design:
        p = c.common
        if c.step != "dense" or c.geometry != "llama-3.1-8b" or p["num_query_tokens"] < 17:
            continue
        t, b = p["num_query_tokens"], p["batch"]
        plan = dense_verify_plan(b, t, 32, 8, 128, p["context_len"] + t, GPU.num_sms)
        if plan.block_m == 128:
            waves[round(plan.num_m_tiles * b * 8 / GPU.num_sms, 2)] = plan.num_splits
    assert {0.97, 1.03, 1.21, 1.45, 1.82} <= set(waves)
    assert waves[0.97] == waves[1.82] == 1
    assert min(waves[1.03], waves[1.21], waves[1.45]) > 1


def test_compile_keys_follow_the_kernels_specialisations():
    with ki.geometry("llama-3.1-8b"):
        cfg = sparse_config(16384, 16, 1, 32, 0.7, [("per_query", 1), ("union", 1)])
        c3 = sparse_config(16384, 16, 1, 32, 0.7, [("union", 3), ("union", 5)])
        odd = sparse_config(16384, 11, 1, 32, 0.7, [("per_query", 1)])
    pq, u1 = (compile_keys(cfg, v, 132) for v in cfg.variants)
    assert pq == u1  # union of one query is the per-query kernel
    k3, k5 = (compile_keys(c3, v, 132) for v in c3.variants)
    assert k3 != k5 and any(k[0] == "union_plan" for k in k3)
    assert compile_keys(odd, odd.variants[0], 132) != pq  # t = 11 is not divisible by 16
    [dense] = sweep_configs(kernel_sweep.QUICK_SWEEP, ("dense",), "glm-4-9b")[:1]
    assert {k[0] for k in compile_keys(dense, dense.variants[0], 132)} >= {"dense_verify"}
    assert config_cost(dense, GPU, ("graph",)).build_s > 0


def test_selection_compile_keys_follow_its_launch_plan():
    """One launch compiles the fused kernel, two the score launch and the pick; a context of
    the same row layout and score tiles shares them, one of another row layout compiles a new
    pick, a batch whose programs walk more tiles a new score launch; the score launches and the
    fused kernel are priced as block-scoring compilations."""

    def kernels(**kw):
        p = dict(num_query_tokens=16, context_len=122880, block_size=64, batch=1, top_n=16)
        return select_keys({**p, "method": "mean", "impl": "two_launch", **kw}, 32, 8, 128, 132)

    two, one = kernels(), kernels(impl="one_launch")
    assert {k[0] for k in two} == {"select_meta", "select_scores", "select_pick"}
    assert {k[0] for k in one} == {"select_meta", "select_fused"}
    assert kernels(context_len=114688) == two  # 1793 and 1921 blocks: one 1024 + 1024 layout
    longer = kernels(context_len=131072)  # 2049 blocks: a 2048 chunk and its tail
    assert {k[0] for k in longer - two} == {"select_pick"}
    wider = kernels(batch=16)  # 128 pairs: four tiles a score program
    assert "select_scores" in {k[0] for k in wider - two}
    assert {k[0] for k in kernels(method="quest") - two} >= {"select_meta", "select_scores"}
    costs = PlanCosts()
    fused = [k for k in one if k[0] == "select_fused"]
    assert compile_s(fused, costs) == costs.select_compile_s
    assert compile_s(two, costs) == costs.select_compile_s + 2 * costs.small_compile_s


def test_every_pending_config_is_in_exactly_one_shard(design, tmp_path):
    pending = kernel_sweep.pending_against(done_keys([_done_less_some(tmp_path)]), ("graph",))
    todo = [c for c in design if pending(c)]
    plan = plan_shards(todo, 4, GPU, ("graph",), pending=pending)
    ids = Counter(id(c) for shard in plan.shards for c in shard)
    assert len(ids) == len(todo) and set(ids.values()) == {1}
    totals = [plan.estimate(s, pending)["total_s"] for s in plan.shards]
    assert max(totals) < 1.25 * (sum(totals) / 4)
    again = plan_shards(todo, 4, GPU, ("graph",), pending=pending)
    assert [[c.name for c in s] for s in again.shards] == [[c.name for c in s] for s in plan.shards]
    steps = [c.step for c in plan.shards[0]]
    assert steps == sorted(steps, key=STEP_ORDER.index)


def test_the_plan_command_and_its_bad_options(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--grid", "calibration", "--gpu", "h200", "--timings"]
    argv += ["graph", "--done-from", str(H200_ROWS), "--shard", "1/4"]
    assert kernel_sweep.main([*argv, "--plan"]) == 0
    out = capsys.readouterr().out
    assert "*     1" in out and "working set under the 60 MiB L2" in out
    assert not (tmp_path / "kernel_bench.jsonl").exists()
    for bad, message in (
        (["--shard", "4/4"], "shard index must be in [0, 4)"),
        (["--gpu", "h900"], "unknown GPU 'h900'"),
        (["--grid", "grand"], "grid must be one of lines, calibration"),
        (["--done-from", str(tmp_path / "kernel_bench.jsonl")], "the file this shard writes"),
    ):
        assert kernel_sweep.main([*argv, *bad, "--plan"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert kernel_sweep.main(["--out", str(tmp_path), "--shard", "0/2", "--plan"]) == 2
    assert "give --gpu" in capsys.readouterr().err
    assert Path(tmp_path).is_dir()


def test_shards_time_their_own_configs_once_and_resume(tmp_path, monkeypatch, capsys):
    """Two shards of the calibration design (repair and select, faked on the CPU) write
    disjoint rows whose union is every pending row; a rerun writes nothing; each step is
    checked once, before its first config, and not at all where nothing is pending."""
    checked: list[str] = []
    _fake_gpu_sweep(monkeypatch, ("repair", "select"), checked)
    done_from = _done_less_some(tmp_path)
    argv = ["--grid", "calibration", "--gpu", "h200", "--timings", "graph", "--ops"]
    argv += ["repair,select", "--done-from", str(done_from)]
    rows = []
    for k in range(2):
        out = tmp_path / f"s{k}"
        assert kernel_sweep.main([*argv, "--out", str(out), "--shard", f"{k}/2"]) == 0
        rows.append(_keys_of(out / "kernel_bench.jsonl"))
    assert rows[0] and rows[1] and not rows[0] & rows[1]
    done = done_keys([done_from])
    pending = kernel_sweep.pending_against(done, ("graph",))
    want = _keys([c for c in design_configs(("repair", "select")) if pending(c)])
    assert rows[0] | rows[1] == want - done
    assert checked == ["repair", "select", "repair", "select"]
    before = (tmp_path / "s0" / "kernel_bench.jsonl").read_text()
    assert kernel_sweep.main([*argv, "--out", str(tmp_path / "s0"), "--shard", "0/2"]) == 0
    assert (tmp_path / "s0" / "kernel_bench.jsonl").read_text() == before
    assert checked[4:] == [] and "0 rows written" in capsys.readouterr().out


def test_a_run_stopped_at_the_budget_says_what_it_left_and_the_same_command_resumes(
    tmp_path, monkeypatch, capsys
):
    """A run whose budget runs out after its first config names the configs it left; the same
    command on the same rows file times exactly those and finishes."""
    from ssvkit.calibration.runner import Runner

    timed = _fake_gpu_sweep(monkeypatch, ("repair",), [])
    stop_after_one = lambda self: setattr(self, "stopped", len(timed) >= 1) or self.stopped  # noqa: E731
    monkeypatch.setattr(Runner, "out_of_time", stop_after_one)
    argv = ["--grid", "calibration", "--gpu", "h200", "--timings", "graph", "--ops", "repair"]
    argv += ["--out", str(tmp_path)]
    total = len(design_configs(("repair",)))
    assert kernel_sweep.main(argv) == kernel_sweep.STOPPED_AT_BUDGET
    out = capsys.readouterr().out
    assert f"stopped at the budget with {total - 1} of {total} configs left" in out
    monkeypatch.setattr(Runner, "out_of_time", lambda self: False)
    assert kernel_sweep.main(argv) == 0
    assert len(timed) == total == len(set(timed))
    assert "stopped at the budget" not in capsys.readouterr().out


def test_warm_workers_call_each_pending_op_once_between_them_and_write_no_row(
    tmp_path, monkeypatch
):
    """``--warm K/N`` workers split the pending configs: together they call every pending
    op once, none twice, run no check and write no row; the ops already in the rows file are
    not called."""
    import torch

    checked: list[str] = []
    _fake_gpu_sweep(monkeypatch, ("repair",), checked)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    called: list[tuple] = []

    def fake_run(r, cfg, seed, mod):  # the op modules' path: one time_op call a variant
        for v in cfg.variants:
            call = (v.op, row_key(v.op, "", v.params))
            fn = lambda i, c=call: called.append(c)  # noqa: E731
            r.time_op(v.op, v.params, fn, num_inputs=2, unique_bytes=1.0, flops=1.0)

    monkeypatch.setattr(kernel_sweep.ops, "run_config", fake_run)
    configs = design_configs(("repair",))
    first = configs[0].variants[0]
    rows = tmp_path / "kernel_bench.jsonl"
    rows.write_text(
        json.dumps(dict(op=first.op, timing="graph", params=first.params)) + "\n"
    )  # one op already timed
    argv = ["--grid", "calibration", "--gpu", "h200", "--timings", "graph", "--ops", "repair"]
    argv += ["--out", str(tmp_path)]
    for k in range(3):
        assert kernel_sweep.main([*argv, "--warm", f"{k}/3"]) == 0
    want = {row_key(v.op, "", v.params) for c in configs for v in c.variants} - {
        row_key(first.op, "", first.params)
    }
    assert Counter(key for _, key in called) == Counter(want)
    assert checked == [] and len(read_rows(rows)) == 1


def test_compile_jobs_run_their_workers_first_then_time_every_config(tmp_path, monkeypatch):
    """``--compile-jobs 3`` starts three ``--warm`` workers of the same command, waits for
    them, then times the configs itself; each worker's command line parses to its share."""
    from ssvkit.calibration import kernel_warm
    from ssvkit.calibration.kernel_sweep_options import parse_args

    timed = _fake_gpu_sweep(monkeypatch, ("repair",), [])
    started: list[list[str]] = []

    class Done:
        def __init__(self, cmd):
            started.append(cmd)
            assert not timed  # the workers run before any config is timed

        def wait(self):
            return 0

    monkeypatch.setattr(kernel_warm.subprocess, "Popen", Done)
    argv = ["--grid", "calibration", "--gpu", "h200", "--timings", "graph", "--ops", "repair"]
    argv += ["--out", str(tmp_path), "--compile-jobs", "3"]
    assert kernel_sweep.main(argv) == 0
    assert len(started) == 3 and len(timed) == len(design_configs(("repair",)))
    for k, cmd in enumerate(started):
        assert cmd[1:3] == ["-m", "ssvkit.calibration.kernel_sweep"]
        opts = parse_args(cmd[3:])
        assert opts.warm == Shard(k, 3) and opts.compile_jobs == 1 and opts.out == tmp_path


def test_a_warm_worker_skips_a_config_whose_inputs_do_not_fit_and_warms_the_rest(
    tmp_path, monkeypatch, capsys
):
    """Warm workers share the GPU's memory: a config whose inputs run out of it is skipped
    (the timed run compiles it) and the worker calls the configs after it, exiting 0."""
    import torch

    _fake_gpu_sweep(monkeypatch, ("repair",), [])
    called: list[str] = []

    def run(r, cfg, seed, mod):
        called.append(cfg.name)
        if len(called) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.50 GiB")

    monkeypatch.setattr(kernel_sweep.ops, "run_config", run)
    argv = ["--grid", "calibration", "--gpu", "h200", "--timings", "graph", "--ops", "repair"]
    argv += ["--out", str(tmp_path), "--warm", "0/2", "--compile-jobs", "1"]
    assert kernel_sweep.main(argv) == 0
    assert len(called) > 1
    assert "1 configs skipped for memory" in capsys.readouterr().out
    assert not (tmp_path / "kernel_bench.jsonl").exists() or not read_rows(
        tmp_path / "kernel_bench.jsonl"
    )


def _fake_gpu_sweep(monkeypatch, steps, checked: list[str]) -> list[str]:
    """Make ``kernel_sweep.main`` run on the CPU: a GPU reported present, fixed provenance
    and ceilings, each step's check appending its name to ``checked``, and every config
    "timed" by writing its pending rows; returns the names of the configs timed, in order."""
    import torch
    from ssvkit.kernels import timing as tm

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    prov = dict(device_name="NVIDIA H200", torch_version="-", triton_version="-", git_commit="-")
    monkeypatch.setattr(tm, "provenance", lambda: {**prov, "timestamp": "2026-11-28T00:00:00"})
    ceil = dict(copy_bytes_per_s=4e12, gemm_flops_per_s=7e14, launch=2e-6, graph=1e-6)
    monkeypatch.setattr(kernel_sweep, "write_ceilings", lambda r: setattr(r, "ceil", ceil))
    for step in steps:
        check = (lambda mod, s=step: checked.append(s), None)
        monkeypatch.setitem(kernel_sweep.STEPS_RUN, step, check)
    timed: list[str] = []

    def fake_run(r, cfg, seed, mod):
        timed.append(cfg.name)
        for v in cfg.variants:
            for timing in r.pending(v.op, v.params):
                r.write(v.op, v.params, tm.Timing(1e-5, 9e-6, 1.1e-5, timing, 5), 1.0, 1.0)

    monkeypatch.setattr(kernel_sweep.ops, "run_config", fake_run)
    monkeypatch.setattr(kernel_sweep, "_print_summary", lambda path, as_json: None)
    return timed


def _done_less_some(tmp_path: Path) -> Path:
    """The committed H200 rows less every other repair, select and NSA row: a sweep with
    these done has rows of three steps pending, however complete the committed file is."""
    lines = H200_ROWS.read_text().splitlines()
    ops = ('"op": "repair"', '"op": "select_blocks"', '"op": "nsa_verify"')
    some = [i for i, line in enumerate(lines) if any(op in line for op in ops)][::2]
    out = tmp_path / "done.jsonl"
    out.write_text("".join(f"{x}\n" for i, x in enumerate(lines) if i not in set(some)))
    return out


def _keys_of(path: Path) -> set[str]:
    return {
        row_key(r["op"], r["timing"], r["params"])
        for r in read_rows(path)
        if r["op"] not in ("device_copy", "empty_triton_kernel")
    }


def test_a_graph_only_run_writes_its_ceilings_rows_by_graph_replay(tmp_path, monkeypatch):
    from ssvkit.calibration.runner import Runner
    from ssvkit.kernels import timing as tm

    r = Runner(tmp_path / "rows.jsonl", 60.0, config=tm.QUICK_TIMING, timings=("graph",))
    rates = {"memcpy_launch": 3e12, "memcpy_graph": 4e12, "triton_graph": 4.2e12}

    def measure():
        r.ceil = dict(copy_bytes_per_s=4.2e12, gemm_flops_per_s=7e14, graph=1e-6)
        return rates

    monkeypatch.setattr(r, "measure_ceilings", measure)
    kernel_sweep.write_ceilings(r)
    rows = read_rows(tmp_path / "rows.jsonl")
    assert {(x["op"], x["timing"]) for x in rows} == {
        ("empty_triton_kernel", "graph"),
        ("device_copy", "graph"),
    }
    assert sorted(x["params"]["impl"] for x in rows if x["op"] == "device_copy") == [
        "memcpy_graph",
        "triton_graph",
    ]


def test_the_plan_reports_what_earlier_runs_measured():
    from ssvkit.calibration.kernel_plan import PlanCosts, measured_text

    assert measured_text([{"op": "gemm"}]) is None
    rows = [{"wall_s": w, "first_call_s": f} for w, f in ((3.0, 2.5), (0.2, 0.01), (4.0, 3.5))]
    text = measured_text(rows, PlanCosts(compile_s=2.0))
    assert "3 rows in 0.1 min, median 3.00 s a row; 2 first calls compiled" in text
    assert "median 3.00 s (the plan assumes 2 s" in text


def test_calibrate_hands_compile_jobs_to_the_kernel_sweep(tmp_path):
    import argparse

    from ssvkit.calibration.kernel_sweep_options import parse_args

    from ssvkit.cli import calibrate_cmd

    p = argparse.ArgumentParser()
    calibrate_cmd.add_arguments(p)
    profile_dir = ceilings.PROFILES / "h200"
    for extra, jobs in (([], 1), (["--compile-jobs", "6"], 6)):
        args = p.parse_args(["--gpu", "h200", "--out", str(tmp_path), *extra])
        opts = parse_args(calibrate_cmd._kernel_argv(args, tmp_path, profile_dir, 100.0))
        assert opts.compile_jobs == jobs and opts.warm is None and opts.out == tmp_path


def test_the_short_dense_calls_of_record_stay_out_of_the_design(design):
    """The short dense calls (``validation/data/dense-short-h200.json``, 8-31 us) are
    validation data: fitted with the other dense rows they trade the class's long calls for
    the short ones (docs/results/calibration.md, "Short dense calls"), so no design config
    times one of them again."""
    import json

    from ssvkit.validation.records import record_path

    rows = json.loads(record_path("dense-short-h200.json").read_text())["rows"]
    short = {row_key(r["op"], r["timing"], r["params"]) for r in rows}
    assert len(short) == len(rows) > 100
    assert not short & _keys(design)
    ids = [(c.step, c.geometry, tuple(sorted(map(str, c.common.items())))) for c in design]
    assert len(ids) == len(set(ids))
