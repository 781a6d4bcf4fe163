import json
from dataclasses import replace

import pytest
from ssvkit.calibration import ceilings
from ssvkit.calibration.features import depth, serial_steps, stage_counts, tile_rows
from ssvkit.calibration.fit import fit_profile, is_heldout, op_class
from ssvkit.calibration.fit_class import stage_caps
from ssvkit.calibration.row_work import is_select_plan, is_slot_plan
from ssvkit.calibration.validate import disagreements, fit_agreement, ratio_pairs, report
from ssvkit.perfmodel.calibrated import CalibratedPredictor, make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import ModelSpec, get_model
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload

from ssvkit.cli import main

PROFILE = ceilings.PROFILES / "h100-sxm" / "profile.json"


@pytest.fixture(scope="module")
def rows():
    return ceilings.profile_rows("h100-sxm")


def test_committed_profile_is_the_fit_of_the_committed_rows(rows):
    """A refit predicts what the committed profile predicts (``AGREEMENT_LIMITS``); its
    parameters need not be equal (``fit_agreement``)."""
    overlay = json.loads((ceilings.PROFILES / "h100-sxm" / "ceilings.json").read_text())
    refit, _ = fit_profile(rows, "h100-sxm", overlay["ceilings"])
    agree = fit_agreement(rows, refit, json.loads(PROFILE.read_text()))
    assert agree["rows"] > 2000
    assert not disagreements(agree), agree


def test_fit_agreement_tells_another_fit_apart(rows):
    committed = json.loads(PROFILE.read_text())
    assert fit_agreement(rows, committed, committed)["max_rel_diff"] == 0.0
    slower = json.loads(PROFILE.read_text())
    fit = slower["classes"]["nsa_verify/refresh/fused"]["fit"]
    fit["t0_s"] *= 2  # a class with a doubled launch cost
    agree = fit_agreement(rows, committed, slower)
    assert disagreements(agree) == [f"p99_rel_diff {agree['p99_rel_diff']:.3g} > 0.05"]


def test_heldout_rule_holds_out_whole_values(rows):
    held = [r for r in rows if is_heldout(r)]
    assert all(is_heldout(r) for r in rows if r["params"].get("context_len") in (49152, 98304))
    assert all(is_heldout(r) for r in rows if r["params"].get("num_query_tokens") == 12)
    assert all(is_heldout(r) for r in rows if r["params"].get("m") == 12)
    frac = len(held) / len(rows)
    assert 0.2 < frac < 0.5
    # one sparse verification class per kernel path and grid regime, every group size in it;
    # a union of one query runs the per_query launch and is fitted with it
    union = [r for r in rows if r["op"] == "sparse_verify" and r["params"]["mode"] == "union"]
    grouped = [r for r in union if r["params"]["group_size"] > 1]
    regimes = {"sparse_verify/union/few_lists", "sparse_verify/union/many_lists"}
    assert {op_class(r) for r in grouped} == regimes
    assert len({r["params"]["group_size"] for r in grouped}) > 2
    alone = {op_class(r) for r in union if r["params"]["group_size"] == 1}
    assert alone == {"sparse_verify/per_query/few_lists", "sparse_verify/per_query/many_lists"}


def test_nsa_rows_carry_their_launch_plan(rows):
    """The NSA rows' merge steps and row tile come from the plan their kernels ran on 132 SMs:
    the split plan of the launch-timed rows (8 q / 2 KV heads: t = 12 is one tile of 64 rows
    split 64 ways, t = 17 two tiles split 33 ways); dense verification rows carry the rows
    their SMs hold and their merge's steps (``perfmodel.dense_work``), other ops neither; the
    fitted NSA and dense classes price both terms, and block selection its score tiles' MMA
    work."""
    tiny = {
        (r["params"]["num_query_tokens"], r["params"]["impl"], r["params"]["mode"]): r
        for r in rows
        if r["op"] == "nsa_verify"
        and r["params"]["num_q_heads"] == 8
        and r["timing"] == "launch"
        and not is_slot_plan(r)
    }
    assert serial_steps(tiny[(12, "unfused", "reuse")], 132) == 192
    assert serial_steps(tiny[(17, "unfused", "reuse")], 132) == 99
    assert serial_steps(tiny[(17, "fused", "refresh")], 132) == 33
    # 16 / 16 / 32 mma.sync rows, then 64-row wgmma tiles at half a row each
    assert [tile_rows(tiny[(t, "fused", "reuse")]) for t in (1, 3, 5, 12, 17)] == [
        16,
        16,
        32,
        32,
        32,
    ]
    gemm = next(r for r in rows if r["op"] == "gemm")
    assert serial_steps(gemm, 132) == 0 == tile_rows(gemm)
    # 32 q / 8 KV heads at batch 16, 32K: one program an SM, t = 16 fills a 64-row wgmma tile
    # (32 mma.sync rows), t = 32 a 128-row one; t = 64 runs two 128-row tiles a KV head in two
    # waves, still one program an SM at a time
    h100 = get_gpu("h100-sxm", measured=False)
    dense = {
        (r["params"]["num_query_tokens"], r["params"]["batch"]): r
        for r in rows
        if r["op"] == "dense_verify"
        and r["params"]["num_q_heads"] == 32
        and r["params"]["context_len"] == 32768
    }
    assert [tile_rows(dense[(t, 16)], h100) for t in (1, 8, 16, 32, 64)] == [16, 32, 32, 64, 64]
    assert serial_steps(dense[(16, 16)], 132, h100) == 0  # one split: no merge
    assert serial_steps(dense[(16, 1)], 132, h100) == 1  # 15 splits: one step of 16 partials
    committed = json.loads(PROFILE.read_text())["classes"]
    for name, cls in committed.items():
        if name.startswith("sparse_verify/"):  # priced on its launch plan's chain and row tile
            assert cls["fit"]["slot_plan"] and cls["fit"]["t_depth_s"] > 0, name
            continue
        stepped = name.startswith("nsa_verify/") or name == "dense_verify"
        tiled = stepped or name.startswith("select_blocks/")
        assert (cls["fit"]["t_step_s"] > 0) == stepped, name
        assert (cls["fit"]["t_row_s"] > 0) == tiled, name


def test_repair_rows_carry_their_chain(rows):
    """A repair row's depth is the KV tiles one program walks times its waves on the H100,
    each weighted by its work (2/3 at D = 64, ``perfmodel.repair_work``): the tiny pair's
    batch-1 grid (32 programs) fits in one wave, so its chain is its missed blocks; recompute
    walks the selected blocks; the fitted repair classes price it (t_k > 0), and the tiles'
    misses of L2 (t_km > 0)."""
    h100 = get_gpu("h100-sxm", measured=False)
    rep = {
        (
            r["params"]["num_q_heads"],
            r["params"]["batch"],
            r["params"]["mode"],
            r["params"].get("missed_blocks"),
        ): r
        for r in rows
        if r["op"] == "repair" and r["params"]["context_len"] == 16384
    }
    assert depth(rep[(8, 1, "repair", 32)], h100) == pytest.approx(32 * 2 / 3)
    assert depth(rep[(32, 16, "repair", 3)], h100) == 24  # 2048 programs, 8 waves of 264
    assert depth(rep[(8, 1, "recompute", 64)], h100) == pytest.approx(64 * 2 / 3)
    assert stage_counts(rep[(32, 16, "repair", 3)], h100) == (8.0,)  # its waves
    committed = json.loads(PROFILE.read_text())["classes"]
    for name in ("repair/repair", "repair/recompute"):
        fit = committed[name]["fit"]
        assert fit["slot_plan"] and fit["t_depth_s"] > 0 and fit["t_depth_miss_s"] > 0, name


def test_kv_write_rows_carry_their_chain(rows):
    """A KV-write row's depth is the elements its index_put_ threads store in series, K then V
    (perfmodel.torch_plan): 2 rows x 2 heads x 64 dims are 2 steps per store, 4 rows already
    the cap of 4; the fitted KV-write classes price it (t_k > 0)."""
    h100 = get_gpu("h100-sxm", measured=False)
    kv = {
        (r["params"]["m"], r["params"]["num_kv_heads"], r["params"]["head_dim"]): r
        for r in rows
        if r["op"] == "kv_write" and "l2" not in r["params"]
    }
    assert depth(kv[(2, 2, 64)], h100) == 4
    assert depth(kv[(1, 2, 64)], h100) == 2
    assert depth(kv[(512, 8, 128)], h100) == 8
    committed = json.loads(PROFILE.read_text())["classes"]
    for name in ("kv_write", "kv_write/m1", "kv_write@l2"):
        assert committed[name]["fit"]["t_depth_s"] > 0, name


def test_sampling_rows_walk_their_vocabulary(rows):
    """A sampling row's depth is its vocabulary (the row every program walks, a floor many rows
    hide); every fitted sampling class prices it, and the ops without a chain have none."""
    h100 = get_gpu("h100-sxm", measured=False)
    for r in rows:
        if r["op"] == "sampling":
            assert depth(r, h100) == r["params"]["vocab"]
        elif r["op"] in ("rmsnorm", "residual_add", "silu_mul"):
            assert depth(r, h100) == 0
    committed = json.loads(PROFILE.read_text())["classes"]
    sampling = [c for n, c in committed.items() if n.startswith("sampling/")]
    assert sampling and all(c["fit"]["t_depth_s"] > 0 for c in sampling)


def test_select_rows_carry_their_topn_stage(rows):
    """A block-selection row of the torch pick (the launch-timed rows) counts its top-n stage's
    work (perfmodel.torch_plan): at batch 4 and 2 KV heads, 16 query rows over 16K context + 16
    rows in blocks of 64, top 64: 128 rows x 257 blocks scanned, 128 x 64 keys sorted, sorts of
    64. The fitted classes (current kernels) price their stages: block selection its pick's
    and score programs' five counts (``perfmodel.select_work``), NSA its program waves and a
    refresh call's pick rows, dense verification its merge launch and the bytes its busiest
    SMs stream past an even share (``perfmodel.dense_work``), repair its programs an SM
    (``perfmodel.repair_work``), sparse verification its waves, the row tiles a slot writes,
    its tiles an SM (and a union's plan compares); no other class has stage rates."""
    sel = next(
        r
        for r in rows
        if r["op"] == "select_blocks"
        and not is_select_plan(r)
        and (r["params"]["batch"], r["params"]["num_kv_heads"]) == (4, 2)
        and (r["params"]["context_len"], r["params"]["top_n"]) == (16384, 64)
    )
    assert stage_counts(sel) == (128 * 257, 128 * 64, 64)
    assert stage_counts(next(r for r in rows if r["op"] == "gemm")) == ()
    committed = json.loads(PROFILE.read_text())["classes"]
    for name, cls in committed.items():
        rates = cls["fit"]["t_stage_s"]
        if name.startswith("select_blocks/"):
            assert len(rates) == 5 and min(rates) >= 0 and max(rates) > 0, name
        elif name.startswith("nsa_verify/"):
            refresh = name.startswith("nsa_verify/refresh/")
            assert len(rates) == (2 if refresh else 1) and min(rates) > 0, name
        elif name.startswith("sparse_verify/"):
            assert len(rates) == (4 if name.startswith("sparse_verify/union/") else 3), name
        elif name == "dense_verify":
            # Its merge launch, and its tail bytes at no slower than an SM's share of HBM.
            share = get_gpu("h100-sxm").num_sms / committed_bw()
            assert len(rates) == 2 and rates[0] > 0 and 0 <= rates[1] <= share * (1 + 1e-9)
        elif name.startswith("repair/"):
            assert len(rates) == 1 and rates[0] > 0, name
        else:
            assert rates == [], name


def committed_bw() -> float:
    return json.loads(PROFILE.read_text())["ceilings"]["copy_bytes_per_s"]


def test_only_the_dense_tail_rate_is_capped():
    assert stage_caps("dense_verify", 3e-11) == (None, 3e-11)
    assert stage_caps("sparse_verify", 3e-11) == stage_caps("select_blocks", 3e-11) == ()


def test_report_targets_and_ratios_can_fail():
    base = {"timing": "graph", "class": "x", "params": {}}
    good = [
        {**base, "op": "gemm", "median_s": 1.0, "predicted_s": 1.01, "split": s}
        for s in ("fit", "heldout") * 5
    ]
    rep = report(good)
    assert rep["targets"]["heldout_median_ape"]["met"]
    assert rep["targets"]["heldout_p90_ape"]["met"]
    bad = [{**r, "predicted_s": 1.3} for r in good]
    assert not report(bad)["targets"]["heldout_median_ape"]["met"]
    mk = {"timing": "graph", "split": "heldout", "class": "d"}
    dense = [
        {
            **mk,
            "op": "dense_verify",
            "median_s": 2.0,
            "predicted_s": 2.0,
            "params": {"context_len": 8, "batch": 1, "num_query_tokens": 16},
        },
        {
            **mk,
            "op": "dense_verify",
            "median_s": 1.0,
            "predicted_s": 1.5,
            "params": {"context_len": 8, "batch": 1, "num_query_tokens": 1},
        },
    ]
    (pair,) = ratio_pairs(dense)
    assert pair["kind"] == "t16_vs_t1" and pair["measured"] == 2.0
    assert pair["predicted"] == pytest.approx(4 / 3)


def test_ratio_pairs_match_geometry_whatever_the_row_order():
    """repair_vs_recompute of two geometries at one context and batch: each repair row pairs
    with the recompute row of its own head counts only, in either row order; the rotation
    count (a measurement param) may differ within a pair."""
    mk = {"timing": "graph", "split": "fit", "class": "r", "op": "repair"}

    def row(heads, mode, frac, t, rot):
        p = {"context_len": 16384, "batch": 1, "num_q_heads": heads, "num_kv_heads": heads // 4}
        p.update(mode=mode, missed_fraction=frac, rotations=rot)
        return {**mk, "params": p, "median_s": t, "predicted_s": t}

    rows = [
        row(32, "recompute", 1.0, 4.0, 8),
        row(8, "recompute", 1.0, 2.0, 30),
        row(32, "repair", 0.5, 2.0, 16),
        row(8, "repair", 0.5, 0.5, 60),
    ]
    for order in (rows, rows[::-1]):
        pairs = sorted(p["measured"] for p in ratio_pairs(order))
        assert pairs == [0.25, 0.5]  # 0.5 / 2 and 2 / 4; never 0.5 / 4 or 2 / 2


def test_validate_cli_json_and_check(capsys):
    assert main(["validate", "--json", "--sets", "interp"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overall"]["heldout"]["n"] > 100 and "dense_verify" in doc["classes"]
    assert doc["transfer"] == {}  # no transfer set chosen, none computed
    rc = main(["validate", "--check", "--sets", "interp"])
    capsys.readouterr()
    assert rc == (0 if all(t["met"] for t in doc["targets"].values()) else 1)


def test_validate_plots(tmp_path, capsys):
    # the plots are the interpolation report's: no transfer set is needed for them
    assert main(["validate", "--plot", str(tmp_path), "--sets", "interp"]) == 0
    for name in ("predicted_vs_measured.png", "error_by_op.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert main(["validate", "--plot", str(tmp_path / "missing"), "--sets", "interp"]) == 2


def test_profile_for_another_gpu_is_refused():
    with pytest.raises(ValueError, match="not 'h200'"):
        Profile.load(PROFILE, gpu="h200")
    prof = Profile.load(PROFILE)
    with pytest.raises(ValueError, match="is for 'h100-sxm'"):
        CalibratedPredictor(get_gpu("h200"), prof)


def test_calibrated_predictions_label_extrapolation():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    pts = [(Strategy.from_name("ar_dense"), Workload(context_len=T)) for T in (32768, 1 << 26)]
    c = build_columns(m, pts)
    pred = make_predictor(g, tp=c.tp)
    assert isinstance(pred, CalibratedPredictor)
    p = predict_columns(m, c, pred)
    assert p.provenance.startswith("calibrated:h100-sxm-")
    assert p.extrapolated[1] and (p.tokens_per_s > 0).all()
    roof = make_predictor(get_gpu("h100-sxm", measured=False), tp=c.tp)
    assert not isinstance(roof, CalibratedPredictor)


def test_resident_ops_take_the_resident_class_or_fall_back_to_the_cold_one():
    """A tiny model's ops are priced with the ``@l2`` classes when the profile has them (rows
    timed L2-resident fit there, apart from the cold rows); without them, with the cold ones."""
    row = {"op": "gemm", "params": {"m": 1, "n": 64, "k": 64, "l2": "resident"}}
    assert op_class(row) == "gemm@l2"
    assert op_class({**row, "params": {"m": 1, "n": 64, "k": 64}}) == "gemm"
    prof, g = Profile.load(PROFILE), get_gpu("h100-sxm")
    tiny = ModelSpec(
        name="tiny",
        family="llama",
        num_layers=2,
        hidden_size=256,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=512,
        vocab_size=256,
    )
    c = build_columns(tiny, [(Strategy.from_name("ar_dense"), Workload(context_len=4096))])
    cold = {k: v for k, v in prof.classes.items() if not k.endswith("@l2")}
    p_cold = predict_columns(tiny, c, CalibratedPredictor(g, replace(prof, classes=cold)))
    assert p_cold.ops["verify.qkv_proj"].kernel == "gemm@l2"  # asked for, absent: cold class
    fast = replace(cold["gemm"], name="gemm@l2", t0_s=cold["gemm"].t0_s / 10)
    resident = replace(prof, classes={**cold, "gemm@l2": fast})
    p_res = predict_columns(tiny, c, CalibratedPredictor(g, resident))
    t_cold = float(p_cold.op_seconds["verify.qkv_proj"][0])
    assert 0 < float(p_res.op_seconds["verify.qkv_proj"][0]) < t_cold
    # what the resident sweep does not time (attention) stays on its cold class
    assert p_res.op_seconds["verify.attention"][0] == p_cold.op_seconds["verify.attention"][0]


def test_only_the_slot_planned_nsa_classes_fit_an_overlap_exponent():
    """The committed profiles, both fitted on the current kernels' NSA rows: their NSA classes
    carry a fitted p in [1, 32]; every other class takes the bounds' maximum."""
    for gpu in ("h200", "h100-sxm"):
        profile = Profile.load(ceilings.PROFILES / gpu / "profile.json", gpu=gpu)
        for name, cf in profile.classes.items():
            fitted = name.startswith("nsa_verify/")
            assert (1.0 <= cf.overlap_p <= 32.0) if fitted else cf.overlap_p == 0.0, name


def test_the_current_nsa_classes_flop_efficiency_never_falls_with_size():
    """A FLOP knot no row's compute bound reaches cannot dip below a smaller call's
    (``MONOTONE_FLOPS_OPS``): the committed profiles' NSA classes, fitted on the current
    kernels' plan, rise or stay level."""
    for gpu, classes in (("h200", 8), ("h100-sxm", 4)):
        profile = Profile.load(ceilings.PROFILES / gpu / "profile.json", gpu=gpu)
        nsa = {n: c for n, c in profile.classes.items() if n.startswith("nsa_verify/")}
        assert len(nsa) == classes
        for name, cf in nsa.items():
            flops_eff = cf.flops_eff
            assert all(b >= a for a, b in zip(flops_eff, flops_eff[1:], strict=False)), name
