"""NSA's row schedule in the step model: the grouping mode sets how many draft rows share a row
tile and its union of selected blocks (``perfmodel.strategy.nsa_rows_per_tile``), so seed 000's
naive baseline (``sd_sparse_naive``, one row a tile) loads every row's blocks and SSV's group
size C changes what it loads; the one-row path is priced by a labelled stand-in class until a
profile has rows of it."""

import dataclasses

import pytest
from ssvkit.perfmodel.baselines import compare
from ssvkit.perfmodel.calibrated import CalibratedPredictor, stand_in
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.profiles import profile_path, shipped_profile
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import (
    PACKED_ROWS,
    Strategy,
    Workload,
    nsa_rows_per_tile,
    with_nsa_rows_per_tile,
)

from ssvkit.cli import main

LLAMA = get_model("llama-3.1-8b")
needs_profile = pytest.mark.skipif(
    profile_path("h100-sxm") is None, reason="no committed H100 profile"
)


def test_modes_map_to_row_schedules_and_back():
    assert nsa_rows_per_tile("per_query", 8) == 1
    assert nsa_rows_per_tile("union", 4) == 4
    assert nsa_rows_per_tile("shared", 4) == PACKED_ROWS == 0
    with pytest.raises(ValueError, match="mode must be one of"):
        nsa_rows_per_tile("grouped", 4)
    ssv = Strategy.from_name("ssv")
    assert ssv.nsa_rows_per_tile == ssv.group_size == 4
    assert Strategy.from_name("sd_sparse_naive").nsa_rows_per_tile == 1
    for rows, mode in ((0, "shared"), (1, "per_query"), (8, "union")):
        s = with_nsa_rows_per_tile(ssv, rows)
        assert (s.mode, s.nsa_rows_per_tile, s.name, s.tree) == (mode, rows, "ssv", ssv.tree)
    assert with_nsa_rows_per_tile(ssv, 4) is ssv
    mean = dataclasses.replace(ssv, metadata="mean")  # block metadata: mode is its grouping
    assert with_nsa_rows_per_tile(mean, 0) is mean
    with pytest.raises(ValueError, match="nsa_rows_per_tile must be an integer >= 0, got -2"):
        with_nsa_rows_per_tile(ssv, -2)


@needs_profile
def test_group_size_and_the_naive_baseline_change_the_prediction():
    """The issue's numbers: ``ssvkit predict --strategies ssv --context 32K --group-size G``
    gave 317.9 tok/s for G = 1, 4, 8, 16 (every mode priced as the union of all rows). Now each
    G loads its tiles' unions, G = 1 is the naive per-query schedule, and the packed schedule
    (G = 16 holds all the rows a tile can) keeps the measured rows' pricing. Grouping pays over
    the per-query schedule; where it pays most is the fitted kernels' (C = 4 here)."""
    ssv = Strategy.from_name("ssv")
    strategies = [dataclasses.replace(ssv, group_size=g, name=f"C{g}") for g in (1, 4, 8, 16)]
    strategies += [
        dataclasses.replace(ssv, mode="shared", group_size=1, name="packed"),
        Strategy.from_name("sd_sparse_naive"),
        dataclasses.replace(ssv, mode="per_query", group_size=1, name="per_query"),
    ]
    rows = compare(LLAMA, get_gpu("h100-sxm"), strategies, [32768], Workload())
    tps = {r["strategy"]: r["tokens_per_s"] for r in rows}
    assert len({round(tps[f"C{g}"], 3) for g in (1, 4, 8, 16)}) == 4
    assert tps["C1"] < min(tps["C4"], tps["C16"]) and tps["C16"] == pytest.approx(tps["packed"])
    assert tps["C1"] == pytest.approx(tps["per_query"])
    assert tps["sd_sparse_naive"] < tps["C4"]  # ssv: union C = 4, refresh/reuse


@needs_profile
def test_the_one_row_path_is_priced_by_a_labelled_stand_in():
    # torch's element-wise ops, which the profile has classes of: NSA's is the only stand-in.
    rows = compare(
        LLAMA,
        get_gpu("h100-sxm"),
        [Strategy.from_name(n) for n in ("ar_sparse", "sd_sparse_naive", "ssv")],
        [32768],
        Workload(elementwise="torch"),
    )
    by = {r["strategy"]: r for r in rows}
    naive = by["sd_sparse_naive"]
    assert naive["provenance"].endswith(":stand-in")
    assert naive["stand_ins"] == [
        "nsa_verify/refresh/unfused/per_query <- nsa_verify/refresh/unfused"
    ]
    assert naive["op_s"]["verify.sparse_attention_refresh_per_query"] > 0
    # Its interval takes the leave-one-out residuals too, as an extrapolated op's does; the
    # packed calls of ssv take the held-out ones.
    assert "leave_one_out" in naive["op_residuals"]["verify.sparse_attention_refresh_per_query"]
    fused = by["ssv"]["op_residuals"]["verify.sparse_attention_fused_refresh"]
    assert fused == "heldout"
    # One draft row is one tile under every schedule: ar_sparse keeps the packed class.
    for name in ("ar_sparse", "ssv"):
        assert by[name]["stand_ins"] == [] and "stand-in" not in by[name]["provenance"]
    assert stand_in("nsa_verify/reuse/fused/per_query") == "nsa_verify/reuse/fused"
    assert stand_in("sparse_verify/per_query/b1") is None


@needs_profile
def test_a_profile_with_per_query_rows_prices_them_itself():
    """Once a profile has the one-row class, no stand-in: its own rates price the call."""
    gpu = get_gpu("h100-sxm")
    base = shipped_profile("h100-sxm")
    packed = base.classes["nsa_verify/refresh/unfused"]
    own = dataclasses.replace(packed, t0_s=packed.t0_s + 1e-3)
    classes = {**base.classes, "nsa_verify/refresh/unfused/per_query": own}
    profile = dataclasses.replace(base, classes=classes)
    naive = Strategy.from_name("sd_sparse_naive")
    c = build_columns(LLAMA, [(naive, Workload(elementwise="torch"))])
    plain = predict_columns(LLAMA, c, CalibratedPredictor(gpu, base, tp=c.tp))
    mine = predict_columns(LLAMA, c, CalibratedPredictor(gpu, profile, tp=c.tp))
    key = "verify.sparse_attention_refresh_per_query"
    assert plain.stand_in[0] and not mine.stand_in[0] and mine.stand_ins == {}
    calls = LLAMA.num_layers
    assert mine.op_seconds[key][0] - plain.op_seconds[key][0] == pytest.approx(calls * 1e-3)
    assert mine.label(0) == plain.provenance


@needs_profile
def test_predict_prints_distinct_group_sizes_and_names_the_stand_in(capsys):
    tps = []
    for g in ("1", "4", "8", "16"):
        argv = ["predict", "--strategies", "ssv", "--context", "32K", "--group-size", g]
        assert main(argv) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if " ssv " in x)
        tps.append(float(line.split()[2]))
    assert len(set(tps)) == 4
    assert main(["predict", "--strategies", "sd_sparse_naive", "--context", "32K"]) == 0
    out = capsys.readouterr().out
    assert "stand-in (sd_sparse_naive): the profile has no rows of " in out
    assert "nsa_verify/refresh/unfused/per_query" in out


@pytest.mark.skipif(profile_path("h200") is None, reason="no committed H200 profile")
def test_the_compressed_tiling_moves_the_naive_and_union_schedules_only():
    """On the H200 profile (fitted on rows of both compressed tilings) ``sd_sparse_naive`` and
    ``ssv`` at 128K are priced faster with the compressed branch on shared tiles than on each
    row tile; ``ar_sparse`` (one row, one tile) is priced the same either way."""
    gpu = get_gpu("h200")
    for name, moves in (("sd_sparse_naive", True), ("ssv", True), ("ar_sparse", False)):
        s = Strategy.from_name(name)
        per_tile = dataclasses.replace(s, nsa_context_tiles="per_tile", name="per_tile")
        rows = compare(LLAMA, gpu, [s, per_tile], [131072], Workload(acceptance=0.8))
        tps = {r["strategy"]: r["tokens_per_s"] for r in rows}
        if moves:
            assert tps[name] > 1.05 * tps["per_tile"], name
        else:
            assert tps[name] == pytest.approx(tps["per_tile"]), name


def test_two_launch_selection_stands_in_only_where_a_profile_lacks_it():
    """Block-metadata selection is priced by the two-launch class the engine runs: both shipped
    profiles have it; a profile without it stands in with the method's class; a strategy that
    selects nothing records no stand-in."""
    assert stand_in("select_blocks/mean/two_launch") == "select_blocks/mean"
    mean = dataclasses.replace(Strategy.from_name("ssv"), metadata="mean")
    nsa = Strategy.from_name("ssv")
    key = "verify.selection"
    h200 = shipped_profile("h200")
    lacking = dataclasses.replace(
        h200, classes={k: v for k, v in h200.classes.items() if not k.endswith("/two_launch")}
    )
    cases = (
        ("h200", h200, False),
        ("h100-sxm", shipped_profile("h100-sxm"), False),
        ("h200", lacking, True),
    )
    for gpu, profile, stood in cases:
        c = build_columns(LLAMA, [(mean, Workload(elementwise="torch")), (nsa, Workload())])
        p = predict_columns(LLAMA, c, CalibratedPredictor(get_gpu(gpu), profile))
        assert p.ops[key].kernel == "select_blocks/mean/two_launch"
        assert p.op_seconds[key][0] > 0 and p.op_seconds[key][1] == 0
        sel = "select_blocks/mean/two_launch <- select_blocks/mean"
        assert (sel in p.stood_in_for(0)) is stood and bool(p.stand_in[0]) is stood
        assert sel not in p.stood_in_for(1)


def test_each_metadata_method_takes_its_own_selection_class():
    """A quest point's selection is the quest op, priced by the quest class; a mean point's
    the mean op; each is zero at the other's point."""
    ssv = Strategy.from_name("ssv")
    pts = [(dataclasses.replace(ssv, metadata=m), Workload()) for m in ("mean", "quest")]
    c = build_columns(LLAMA, pts)
    p = predict_columns(LLAMA, c, CalibratedPredictor(get_gpu("h200"), shipped_profile("h200")))
    mean, quest = p.ops["verify.selection"], p.ops["verify.selection_quest"]
    assert mean.kernel == "select_blocks/mean/two_launch"
    assert quest.kernel == "select_blocks/quest/two_launch"
    assert p.op_seconds["verify.selection"][1] == 0 < p.op_seconds["verify.selection"][0]
    assert (
        p.op_seconds["verify.selection_quest"][0] == 0 < p.op_seconds["verify.selection_quest"][1]
    )


def test_the_tile_plan_reaches_the_step_model_and_the_engine():
    """``Strategy.nsa_tile_plan`` is counted by the step model's NSA work: one draft row a
    tile is the same tile under "fit" and "fit_slots", which are priced alike and apart from
    "fixed" where their slots differ (batch 16 at 128K); the engine's NSA attention runs the
    plan. A bad plan is refused naming it."""
    from ssvkit.engine.attention import AttentionConfig

    gpu = get_gpu("h200")
    s = Strategy.from_name("ar_sparse")
    plans = [dataclasses.replace(s, nsa_tile_plan=p, name=p) for p in ("fixed", "fit", "fit_slots")]
    rows = compare(LLAMA, gpu, plans, [131072], Workload(acceptance=0.8, batch=16))
    tps = {r["strategy"]: r["tokens_per_s"] for r in rows}
    assert tps["fit"] == pytest.approx(tps["fit_slots"])
    assert tps["fit"] != pytest.approx(tps["fixed"], rel=1e-3)
    assert AttentionConfig.from_strategy(plans[2]).tile_plan == "fit_slots"
    with pytest.raises(ValueError, match="nsa_tile_plan must be one of .*'wide'"):
        dataclasses.replace(s, nsa_tile_plan="wide")
