import pytest
from ssvkit.calibration import ceilings, transfer_sets
from ssvkit.calibration.fit import op_class
from ssvkit.calibration.transfer_sets import (
    TARGETS,
    fit_classes,
    leave_one_out,
    left_out_value,
    parse_sets,
    predicting_class,
    summarize,
    value_name,
    worst_left_out,
)

from ssvkit.cli import main

CEILING = {"hbm_bytes_per_s": 3.0e12, "bf16_flops_per_s": 7.0e14}


@pytest.fixture(scope="module")
def rows():
    return ceilings.profile_rows("h100-sxm")


def _sparse_and_dense(rows):
    """The graph rows of dense verification and of one union class: classes with rows at
    several head geometries, group sizes and contexts (the other union classes add fits, not
    cases)."""
    keep = ("dense_verify", "sparse_verify/union/few_lists")
    return [r for r in rows if r["timing"] == "graph" and op_class(r).startswith(keep)]


@pytest.mark.parametrize("name", ["head", "group", "context"])
def test_left_out_value_never_reaches_its_fit(rows, monkeypatch, name):
    """Every refit of a leave-one-out set sees none of the rows it then predicts, nor any other
    row with their value; every left-out row is predicted or counted as unpredicted."""
    calls = []

    def fit(kept, gpu, ceiling):
        calls.append({"fit": kept})
        return fit_classes(kept, gpu, ceiling)

    def predict(left, classes, gpu, ceiling):
        calls[-1]["left"] = left
        return real_predict(left, classes, gpu, ceiling)

    real_predict = transfer_sets.predict
    subset = _sparse_and_dense(rows)
    base = fit_classes(subset, "h100-sxm", CEILING)
    monkeypatch.setattr(transfer_sets, "fit_classes", fit)
    monkeypatch.setattr(transfer_sets, "predict", predict)
    monkeypatch.setattr(transfer_sets, "_LOO_MEMO", {})  # computed here, not found
    out = leave_one_out(name, subset, "h100-sxm", CEILING, base)
    assert len(calls) >= 2 and out["classes"]
    for call in calls:
        (value,) = {left_out_value(name, r) for r in call["left"]}
        assert value is not None
        assert all(left_out_value(name, r) != value for r in call["fit"])
    scored = sum(c["n"] for c in out["classes"].values()) + sum(out["unpredicted"].values())
    assert scored == sum(left_out_value(name, r) is not None for r in subset)
    if name == "group":  # every group size: its mode's class refitted on the other sizes
        for cls, stats in out["classes"].items():
            assert stats["from"] == [cls]


def test_predicting_class_takes_the_nearest_group_size():
    classes = {f"sparse_verify/union/C{c}/b1": None for c in (1, 2, 8)} | {"dense_verify": None}
    assert predicting_class("dense_verify", classes) == "dense_verify"
    assert predicting_class("sparse_verify/union/C4/b1", classes) == "sparse_verify/union/C2/b1"
    assert predicting_class("sparse_verify/union/C6/b1", classes) == "sparse_verify/union/C8/b1"
    assert predicting_class("sparse_verify/union/C4/bN", classes) is None
    assert predicting_class("sparse_verify/shared/C4/b1", classes) is None
    assert predicting_class("nsa_verify/reuse/fused", classes) is None


def _row(context_len, batch, seconds_scale=1.0):
    nbytes = batch * context_len * 8 * 128 * 2 * 2
    p = {
        "context_len": context_len,
        "batch": batch,
        "num_query_tokens": 16,
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
    }
    return {
        "op": "dense_verify",
        "params": p,
        "timing": "graph",
        "unique_bytes": nbytes,
        "flops": 4 * batch * 16 * 32 * context_len * 128,
        "median_s": seconds_scale * (4e-6 + nbytes / (0.7 * CEILING["hbm_bytes_per_s"])),
        "device_name": "NVIDIA H100 80GB HBM3",
        "timestamp": "2026-01-01T00:00:00+00:00",
        "git_commit": "0000000",
    }


def test_tiny_synthetic_set_meets_and_misses_its_target():
    """Rows that follow the model exactly transfer to every left-out context; the same rows
    with one context 1.6x slower miss the target (their own refit cannot know)."""
    contexts, batches = (4096, 8192, 16384, 32768, 65536), (1, 2, 4, 8, 16)
    exact = [_row(t, b) for t in contexts for b in batches]
    good = leave_one_out("context", exact, "h100-sxm", CEILING, base={})
    assert good["classes"]["dense_verify"]["n"] == len(exact)
    assert good["classes"]["dense_verify"]["median_ape"] < 0.01
    assert good["met"] and good["classes"]["dense_verify"]["values"] == len(contexts)
    slow = [_row(t, b, 1.6 if t == 16384 else 1.0) for t in contexts for b in batches]
    bad = leave_one_out("context", slow, "h100-sxm", CEILING, base={})
    assert bad["classes"]["dense_verify"]["p90_ape"] > TARGETS["leave_one_out"]["p90_ape"]
    assert not bad["met"] and not bad["classes"]["dense_verify"]["met"]
    by = bad["classes"]["dense_verify"]["by_left_out"]
    assert list(by) == [str(t) for t in contexts]
    assert sum(v["n"] for v in by.values()) == len(slow)
    # The slow context's refit prices it at about 1 / 1.6 of its time; the others' refits,
    # which see its rows, are pulled the other way.
    assert by["16384"]["median_error"] == pytest.approx(1 / 1.6 - 1, abs=0.05)
    assert all(v["median_error"] > 0 for k, v in by.items() if k != "16384")
    value, worst = worst_left_out(bad["classes"]["dense_verify"])
    most = max(v["beyond_p90_target"] for v in by.values())
    assert worst == by[value] and worst["beyond_p90_target"] == most > 0
    p90 = TARGETS["leave_one_out"]["p90_ape"]
    for v in by.values():
        assert 0 <= v["beyond_p90_target"] <= v["n"]
        assert (v["beyond_p90_target"] > 0) == (v["max_ape"] > p90)


def test_a_missed_class_names_the_value_its_refit_misses_on(monkeypatch, capsys):
    """The text report adds, below a missed class, the left-out value of its largest p90."""
    contexts, batches = (4096, 8192, 16384, 32768, 65536), (1, 2, 4, 8, 16)
    slow = [_row(t, b, 1.6 if t == 16384 else 1.0) for t in contexts for b in batches]
    bad = leave_one_out("context", slow, "h100-sxm", CEILING, base={})
    monkeypatch.setattr(transfer_sets, "transfer_report", lambda *a: {"context": bad})
    assert main(["validate", "--sets", "context"]) == 0
    out = capsys.readouterr().out
    value, worst = worst_left_out(bad["classes"]["dense_verify"])
    beyond = worst["beyond_p90_target"]
    assert f"    worst left out: {value}, {beyond} of 5 rows beyond the p90 target: median" in out


def test_value_names():
    assert value_name("head", (32, 8, 128)) == "32q/8kv/d128"
    assert value_name("group", 3) == "C=3" and value_name("context", 65536) == "65536"


def test_summarize_judges_median_and_p90_per_class():
    def rows(cls, apes):
        return [{"class": cls, "from": cls, "median_s": 1.0, "predicted_s": 1.0 + a} for a in apes]

    target = TARGETS["cross_gpu"]
    ok = rows("a", [0.01] * 9 + [0.5])  # median 1%, p90 5.9%: met despite one outlier
    tail = rows("b", [0.01] * 7 + [0.3] * 3)  # median 1%, p90 30%: missed
    out = summarize(ok + tail, {"c": 4}, target)
    assert out["classes"]["a"]["met"] and not out["classes"]["b"]["met"]
    assert not out["met"] and out["unpredicted"] == {"c": 4}
    assert summarize(ok, {}, target)["met"]
    fam = summarize(rows("op/x", [0.01] * 5) + rows("op/y", [0.3] * 5), {}, target)["families"]
    assert fam["op"]["n"] == 10 and fam["op"]["median_ape"] == pytest.approx(0.155)


def test_parse_sets():
    assert parse_sets("all") == ("interp", "head", "group", "context", "gpu", "unseen")
    assert parse_sets("gpu,interp") == ("interp", "gpu")
    with pytest.raises(ValueError, match="'heads'"):
        parse_sets("interp,heads")


def test_check_transfer_exits_1_on_a_missed_target(monkeypatch, capsys):
    def fake(met):
        stats = {"n": 3, "median_ape": 0.01, "p90_ape": 0.02, "max_ape": 0.03}
        cls = {**stats, "from": ["x"], "met": met}
        return {
            "head": {
                "title": "t",
                "target": TARGETS["leave_one_out"],
                "classes": {"x": cls},
                "families": {"x": stats},
                "unpredicted": {},
                "met": met,
            }
        }

    for met in (True, False):
        monkeypatch.setattr(transfer_sets, "transfer_report", lambda *a, met=met: fake(met))
        assert main(["validate", "--sets", "head", "--check-transfer"]) == (0 if met else 1)
        assert main(["validate", "--sets", "head"]) == 0  # measured, not gated
        assert main(["validate", "--sets", "head", "--check"]) == 0  # the held-out split only
    capsys.readouterr()


def test_a_set_of_the_same_sealed_rows_is_computed_once(rows, monkeypatch):
    subset = _sparse_and_dense(rows)
    base = fit_classes(subset, "h100-sxm", CEILING)
    monkeypatch.setattr(transfer_sets, "_LOO_MEMO", {})
    first = transfer_sets.leave_one_out_rows("head", subset, "h100-sxm", CEILING, base)
    monkeypatch.setattr(transfer_sets, "fit_classes", lambda *a: pytest.fail("refitted"))
    again = [dict(r) for r in subset]  # equal rows, other objects
    assert transfer_sets.leave_one_out_rows("head", again, "h100-sxm", CEILING, base) is first
    unsealed = [{k: v for k, v in r.items() if k != "checksum"} for r in subset]
    with pytest.raises(pytest.fail.Exception, match="refitted"):
        transfer_sets.leave_one_out_rows("head", unsealed, "h100-sxm", CEILING, base)


def test_cross_gpu_compares_only_rows_of_the_kernels_the_fit_describes(monkeypatch):
    """A class fitted on the current kernels' launch plans does not price rows that time
    earlier kernels, nor the reverse: those rows are counted apart per class; rows of classes
    fitted either way on both sides, and rows no class predicts, go on."""
    from types import SimpleNamespace

    monkeypatch.setattr(transfer_sets, "op_class", lambda r: r["cls"])
    monkeypatch.setattr(transfer_sets, "is_plan_priced", lambda r: r["plan"])
    monkeypatch.setattr(transfer_sets, "merge_generation", lambda r: None)
    monkeypatch.setattr(transfer_sets, "union_plan_generation", lambda r: None)
    classes = {"nsa": SimpleNamespace(slot_plan=True), "gemm": SimpleNamespace(slot_plan=False)}
    rows = [
        {"cls": "nsa", "plan": True},
        {"cls": "nsa", "plan": False},
        {"cls": "nsa", "plan": False},
        {"cls": "gemm", "plan": False},
        {"cls": "gemm", "plan": True},
        {"cls": "rope", "plan": False},
    ]
    same, other = transfer_sets.same_kernels(rows, classes)
    assert same == [rows[0], rows[3], rows[5]]
    assert other == {"nsa": 2, "gemm": 1}


def test_cross_gpu_compares_split_sparse_rows_only_under_the_same_merge(monkeypatch):
    """A split sparse verification row is priced only by a class whose split fit rows ran
    the same merge kernel (the current kernels' merge launch and merge in the launch are one
    generation, two paths of one plan); a row that does not split is priced whatever merge the
    fit's split rows ran."""
    from types import SimpleNamespace

    monkeypatch.setattr(transfer_sets, "op_class", lambda r: r["cls"])
    monkeypatch.setattr(transfer_sets, "is_plan_priced", lambda r: True)
    monkeypatch.setattr(transfer_sets, "merge_generation", lambda r: r["merge"])
    monkeypatch.setattr(transfer_sets, "union_plan_generation", lambda r: r.get("plan"))
    classes = {c: SimpleNamespace(slot_plan=True) for c in ("few", "many", "mixed", "now")}
    fit_rows = [
        {"cls": "few", "merge": "row"},
        {"cls": "many", "merge": None},
        {"cls": "mixed", "merge": "row"},
        {"cls": "mixed", "merge": "tile"},
        {"cls": "now", "merge": "tile"},
        {"cls": "now", "merge": "fused"},
    ]
    merges = transfer_sets.generations_by_class(fit_rows)
    assert merges == {
        "few": {"merge": {"row"}},
        "mixed": {"merge": {"row", "tile"}},
        "now": {"merge": {"tile"}},
    }
    rows = [
        {"cls": "few", "merge": "tile"},
        {"cls": "few", "merge": "row"},
        {"cls": "few", "merge": None},
        {"cls": "many", "merge": "tile"},
        {"cls": "mixed", "merge": "tile"},
        {"cls": "now", "merge": "fused"},
        {"cls": "now", "merge": "tile"},
        {"cls": "now", "merge": "row"},
    ]
    same, other = transfer_sets.same_kernels(rows, classes, merges)
    assert same == [rows[1], rows[2], rows[3], rows[5], rows[6]]
    assert other == {"few": 1, "mixed": 1, "now": 1}


def test_cross_gpu_compares_union_rows_only_under_the_same_plan_kernel(monkeypatch):
    """A union row that built its plan is priced only by a class whose fit rows built theirs
    with the same kernel; a row that built none is priced whatever the fit's rows ran."""
    from types import SimpleNamespace

    monkeypatch.setattr(transfer_sets, "op_class", lambda r: r["cls"])
    monkeypatch.setattr(transfer_sets, "is_plan_priced", lambda r: True)
    monkeypatch.setattr(transfer_sets, "merge_generation", lambda r: None)
    monkeypatch.setattr(transfer_sets, "union_plan_generation", lambda r: r["plan"])
    classes = {"u": SimpleNamespace(slot_plan=True)}
    fit = transfer_sets.generations_by_class(
        [{"cls": "u", "plan": "compare"}, {"cls": "u", "plan": None}]
    )
    assert fit == {"u": {"union_plan": {"compare"}}}
    rows = [{"cls": "u", "plan": p} for p in ("sort", "compare", None)]
    same, other = transfer_sets.same_kernels(rows, classes, fit)
    assert same == rows[1:] and other == {"u": 1}


def test_a_sparse_row_names_the_merge_its_split_call_ran():
    """The committed H100 rows' split calls ran the one-row merge; the H200's ran the tiled
    merge launch, or merged in their last split programs, where the launch plan does so today
    (one load, one wave) and the rows were timed since; calls that do not split ran none."""
    from ssvkit.calibration.row_work import merge_generation, sparse_work

    sparse = {
        gpu: [r for r in ceilings.profile_rows(gpu) if r["op"] == "sparse_verify"]
        for gpu in ("h100-sxm", "h200")
    }
    assert {merge_generation(r) for r in sparse["h100-sxm"]} == {"row", None}
    assert {merge_generation(r) for r in sparse["h200"]} == {"tile", "fused", None}
    for r in sparse["h200"]:
        if merge_generation(r) == "fused":
            assert sparse_work(r, None).merge_launches == 0


def test_a_union_row_names_the_plan_kernel_its_call_ran():
    """The committed H100 rows' union calls built their plans by comparing ids, the H200's
    graph rows by sorting them; calls that build no plan (per_query, shared, groups of one
    query) name none."""
    from ssvkit.calibration.row_work import union_plan_generation

    for gpu, timing, name in (("h100-sxm", "graph", "compare"), ("h200", "graph", "sort")):
        rows = [r for r in ceilings.profile_rows(gpu) if r["timing"] == timing]
        got = {union_plan_generation(r) for r in rows if r["op"] == "sparse_verify"}
        assert got == {name, None}
        assert {union_plan_generation(r) for r in rows if r["op"] != "sparse_verify"} == {None}


def test_a_sparse_row_is_priced_with_the_warps_it_ran():
    """A program of 64 packed rows at D = 64 (16 query / 2 KV heads, C = 8) ran 8 warps before
    ``SPARSE_ACC_WARPS_SINCE`` and 4 since (its accumulator is 64 x 64); 16 rows ran 4 either
    way. The row's work follows: 4 warps issue the 64 rows as one warpgroup's wgmma tile (its
    FLOPs count half), and an SM holds two such programs, so twice the splits fill the wave."""
    from ssvkit.calibration.row_work import SPARSE_ACC_WARPS_SINCE, sparse_config, sparse_work

    def row(group_size, stamp):
        p = dict(
            context_len=16384, num_query_tokens=16, num_q_heads=16, num_kv_heads=2, head_dim=64,
            batch=4, mode="shared", group_size=group_size, overlap=0.7, top_n=16, block_size=64,
            f_load=0.5, global_unique_bytes=10**8,
        )  # fmt: skip
        return {"op": "sparse_verify", "params": p, "unique_bytes": 10**8, "timestamp": stamp}

    before, since = "2026-12-05T19:00:00+00:00", SPARSE_ACC_WARPS_SINCE
    assert sparse_config(row(8, before)).num_warps == 8
    assert sparse_config(row(8, since)).num_warps in (None, 4)
    assert sparse_config(row(2, before)).num_warps == 4
    old, new = sparse_work(row(8, before), None), sparse_work(row(8, since), None)
    assert (new.mma_flops, new.num_splits) == (old.mma_flops / 2, 2 * old.num_splits)


def test_a_dense_row_is_priced_with_the_row_tile_it_ran():
    """At 32 query / 8 KV heads, t = 8 packs 32 rows: a 32-row tile before
    ``DENSE_WARPGROUP_TILE_SINCE`` and a 64-row warpgroup tile since, which computes twice the
    rows at the same row cost (a wgmma row counts half) and streams the same bytes; t = 16
    (64 rows) ran the 64-row tile either way."""
    from ssvkit.calibration.row_work import DENSE_WARPGROUP_TILE_SINCE, dense_work

    def row(t, stamp):
        p = dict(
            context_len=32768, num_query_tokens=t, num_q_heads=32, num_kv_heads=8, head_dim=128,
            batch=1,
        )  # fmt: skip
        return {"op": "dense_verify", "params": p, "timestamp": stamp}

    before, since = "2026-12-05T19:00:00+00:00", DENSE_WARPGROUP_TILE_SINCE
    old, new = dense_work(row(8, before), None), dense_work(row(8, since), None)
    assert new.flops == pytest.approx(2 * old.flops)
    assert (new.sm_rows, new.requested_bytes) == (old.sm_rows, old.requested_bytes)
    assert dense_work(row(16, before), None) == dense_work(row(16, since), None)


def test_the_committed_cross_gpu_sets_leave_out_the_rows_of_other_kernels():
    """The H100's fit rows of NSA, selection, dense verification and repair time the current
    kernels, as the H200's do; its sparse verification rows time the kernels before the
    one-row merge (split calls) and before the compare plan (union calls). So the H200 -> H100
    set scores the NSA and selection rows, counts the split and union sparse rows apart
    instead of scoring them, and keeps the sparse calls that do not split and build no plan.
    The H200's classes are its shipped profile's (which rows a class prices depends on its
    kernel plan and its fit rows' merges, not on its fitted values), so no refit runs here."""
    from ssvkit.perfmodel.profiles import shipped_profile

    h200 = ceilings.profile_rows("h200")
    h100 = ceilings.profile_rows("h100-sxm")
    ceiling = ceilings.derive("h100-sxm", h100)["ceilings"]
    fit = shipped_profile("h200").classes
    s = transfer_sets.cross_gpu("h200", fit, h200, "h100-sxm", h100, ceiling)
    assert {c.split("/")[0] for c in s["other_kernels"]} == {"sparse_verify"}
    assert "sparse_verify/union/many_lists" in s["other_kernels"]
    for name in ("dense_verify", "nsa_verify/reuse/fused", "select_blocks/mean", "repair/repair"):
        assert name in s["classes"], name
    assert "sparse_verify/per_query/many_lists" in s["classes"]
    assert all(c["n"] > 0 for c in s["classes"].values())
    # Per head geometry: every row of an op with heads (attention, rotary embeddings) scored,
    # the rows of ops without (GEMMs, norms, element-wise ops, KV writes) in no geometry.
    geometries = s["geometries"]
    assert {"8q/2kv/d64", "32q/8kv/d128"} <= set(geometries)
    headed = ("dense_verify", "nsa_verify", "select_blocks", "repair", "sparse_verify", "rot")
    headed += ("rope_qk", "rope_kv_write")
    scored = sum(st["n"] for c, st in s["classes"].items() if c.startswith(headed))
    assert sum(g["n"] for g in geometries.values()) == scored


def test_a_selection_row_timed_before_the_tile_pick_is_priced_with_the_whole_row_pick():
    """A two-launch row at batch 16, 128K, t = 16 and eight KV heads timed at a commit of the
    whole-row pick picked over whole rows (2,048 rows of 2,049 blocks: a chunk and a tail
    walked); a call of that shape timed today takes the tile pick, which walks its 512
    gathered blocks and no tail."""
    from ssvkit.calibration.row_work import SELECT_WHOLE_ROW_PICK_COMMITS, select_work

    rows = [
        r
        for r in ceilings.profile_rows("h200")
        if r["op"] == "select_blocks"
        and r["params"].get("impl") == "two_launch"
        and (r["params"]["batch"], r["params"]["context_len"]) == (16, 131072)
        and (r["params"]["num_query_tokens"], r["params"]["top_n"]) == (16, 16)
        and r["params"]["num_kv_heads"] == 8
    ]
    assert rows
    whole_row = next(iter(SELECT_WHOLE_ROW_PICK_COMMITS))
    for r in rows:
        then = select_work({**r, "git_commit": whole_row}, None)
        now = select_work({**r, "git_commit": "0" * 40}, None)
        assert then.pick_tail_chain > 0 and now.pick_tail_chain == 0
        assert now.pick_chain < then.pick_chain
