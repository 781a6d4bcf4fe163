"""Prediction intervals (``perfmodel.intervals``): the conformal bounds of a residual set, the
combination rules checked against hand-computed values, the residual set each case takes, and
what the predictors attach to a prediction."""

import math

import numpy as np
import pytest
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.intervals import (
    IntervalSource,
    IntervalTable,
    Residuals,
    Spread,
    bounds,
    conformal_rank_bounds,
    interval,
    kernel_family,
    uncovered_share,
)
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.profiles import shipped_profile
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload

LN = math.log


def _res(low, high, median=1.0, source="heldout", n=100) -> Residuals:
    """Residuals from measured / predicted ratios (their logs are what is stored)."""
    return Residuals(source, n, LN(low), LN(median), LN(high))


def _spread(ops, num_families=2) -> Spread:
    """A one-point spread of ``ops``: (seconds, column, residuals or None)."""
    sp = Spread.zeros(1, num_families)
    for seconds, column, res in ops:
        sp.add_op(np.array([seconds]), column, res)
    return sp


def test_kernel_family_is_the_class_name_before_its_first_slash_without_the_l2_suffix():
    assert kernel_family("sparse_verify/union/C4/b1") == "sparse_verify"
    assert kernel_family("gemm@l2") == "gemm" and kernel_family("rope_qk/m1@l2") == "rope_qk"
    assert kernel_family("dense_verify") == "dense_verify"


def test_conformal_ranks_and_the_fewest_rows_they_need():
    assert conformal_rank_bounds(18, 0.9) is None  # ceil(19 * 0.95) = 19 > 18
    assert conformal_rank_bounds(19, 0.9) == (1, 19)
    assert conformal_rank_bounds(39, 0.9) == (2, 38)  # floor(40 * 0.05), ceil(40 * 0.95)
    assert conformal_rank_bounds(9, 0.8) == (1, 9)
    r = Residuals.of("heldout", np.arange(39.0)[::-1], 0.9)
    assert (r.n, r.low, r.median, r.high) == (39, 1.0, 19.0, 37.0)
    assert Residuals.of("heldout", np.arange(18.0), 0.9) is None
    with pytest.raises(ValueError, match="low <= median <= high"):
        Residuals("heldout", 3, 0.1, 0.0, 0.2)


def test_one_op_takes_its_family_interval_exactly():
    """2 s with measured/predicted in [0.9, 1.2], median 1.05: [1.8, 2.4] (the median shifts the
    centre to 2.1, not the bounds)."""
    sp = _spread([(2.0, 0, _res(0.9, 1.2, 1.05))])
    lo, hi = interval([2.0], over=bounds(sp))[0]
    assert (lo, hi) == pytest.approx((1.8, 2.4), rel=1e-12)
    assert bounds(sp).centre[0] == pytest.approx(LN(1.05))


def test_ops_of_one_family_move_together():
    """1 s and 3 s of one family at [0.9, 1.2]: the sum's bounds are 4 x 0.9 and 4 x 1.2, as if
    both ops sat at the same quantile (full correlation), not narrower."""
    r = _res(0.9, 1.2)
    sp = _spread([(1.0, 0, r), (3.0, 0, r)])
    assert interval([4.0], over=bounds(sp))[0] == pytest.approx((3.6, 4.8), rel=1e-12)


def test_families_combine_in_quadrature():
    """1 s of family a in [0.9, 1.2] and 1 s of b in [0.8, 1.1]: alone, a moves the 2 s sum to
    [1.9, 2.2] and b to [1.8, 2.1]; the log deviations add in quadrature."""
    sp = _spread([(1.0, 0, _res(0.9, 1.2)), (1.0, 1, _res(0.8, 1.1))])
    up = math.hypot(LN(2.2 / 2), LN(2.1 / 2))
    down = math.hypot(LN(1.9 / 2), LN(1.8 / 2))
    lo, hi = interval([2.0], over=bounds(sp))[0]
    assert (lo, hi) == pytest.approx((2 * math.exp(-down), 2 * math.exp(up)), rel=1e-12)
    # Narrower than both families at their bounds together, wider than either alone.
    assert 1.7 < lo < 1.8 and 2.2 < hi < 2.3


def test_tokens_per_s_is_the_round_interval_inverted():
    sp = _spread([(2.0, 0, _res(0.9, 1.2))])
    assert interval([50.0], under=bounds(sp))[0] == pytest.approx((50 / 1.2, 50 / 0.9))


def test_a_speedup_takes_its_sides_independent_and_itself_as_exact():
    """A speedup over an anchor: the anchor's round (2 s, [0.9, 1.2]) over the strategy's (1 s,
    [0.95, 1.1]); each side's log widths add in quadrature, the anchor's upper with the
    strategy's lower."""
    anchor = bounds(_spread([(2.0, 0, _res(0.9, 1.2))]))
    own = bounds(_spread([(1.0, 0, _res(0.95, 1.1))]))
    lo, hi = interval([2.0], over=anchor, under=own)[0]
    assert hi == pytest.approx(2 * math.exp(math.hypot(LN(1.2), LN(0.95))))
    assert lo == pytest.approx(2 * math.exp(-math.hypot(LN(0.9), LN(1.1))))
    same = interval([1.0], over=anchor, under=anchor, same=np.array([True]))[0]
    assert list(same) == [1.0, 1.0]


def test_the_quadrature_rule_holds_its_coverage_for_gaussian_family_errors():
    """Three families with Gaussian log errors (shares 0.5 / 0.3 / 0.2, sigma 5 / 10 / 20%)
    given their 90% bounds: the rule's interval holds 90% of 200,000 seeded draws to within a
    point (the sum of lognormal parts is nearly, not exactly, what the rule assumes)."""
    sigma, share, z = np.array([0.05, 0.1, 0.2]), np.array([0.5, 0.3, 0.2]), 1.6448536269514722
    sp = _spread([(s, i, Residuals("heldout", 100, -z * g, 0.0, z * g)) for i, (s, g) in
                  enumerate(zip(share, sigma, strict=True))], num_families=3)  # fmt: skip
    lo, hi = interval([1.0], over=bounds(sp))[0]
    draws = np.random.default_rng(0).standard_normal((200_000, 3)) * sigma
    total = np.exp(draws) @ share
    assert np.mean((total >= lo) & (total <= hi)) == pytest.approx(0.9, abs=0.01)


def test_ops_without_residuals_count_as_uncovered_at_their_point_value():
    sp = _spread([(3.0, 0, _res(0.9, 1.2)), (1.0, None, None)])
    assert uncovered_share(sp)[0] == pytest.approx(0.25)
    lo, hi = interval([4.0], over=bounds(sp))[0]
    assert (lo, hi) == pytest.approx((3 * 0.9 + 1, 3 * 1.2 + 1))


TABLE = IntervalTable(
    0.9,
    {
        "heldout": {"gemm": _res(0.95, 1.05), "*": _res(0.9, 1.1, source="heldout, all families")},
        "leave_one_out": {"gemm": _res(0.8, 1.3, source="leave_one_out")},
        "cross_gpu": {"gemm": _res(0.7, 1.02, source="cross_gpu")},
        "current_kernels": {
            "nsa_verify": _res(0.2, 0.6, median=0.35, source="current_kernels"),
        },
    },
)


def test_each_case_takes_the_hull_of_the_sets_it_calls_for():
    own = IntervalSource(TABLE)
    assert own.residuals("gemm", False) == TABLE.sets["heldout"]["gemm"]
    wide = own.residuals("gemm", True)  # extrapolated: widened by the leave-one-out residuals
    assert (wide.low, wide.high) == (LN(0.8), LN(1.3)) and wide.source == "heldout + leave_one_out"
    moved = IntervalSource(TABLE, transferred=True)
    r = moved.residuals("gemm", False)
    assert (r.low, r.high) == (LN(0.7), LN(1.05)) and r.source == "heldout + cross_gpu"
    # A family without residuals of its own takes the pooled heldout ones; no cross-GPU stands in.
    r = moved.residuals("rmsnorm", False)
    assert r.source == "heldout, all families" and (r.low, r.high) == (LN(0.9), LN(1.1))


def test_a_family_whose_kernels_changed_takes_their_residuals_centre_and_spread():
    """A family with rows of kernels newer than the profile's fit rows (``current_kernels``)
    takes their median as its centre and the hull of their bounds with the case's, extrapolated
    or transferred too; a family without such rows is priced as before."""
    for src, extrapolated in ((IntervalSource(TABLE), False), (IntervalSource(TABLE), True)):
        r = src.residuals("nsa_verify", extrapolated)
        assert r.median == LN(0.35) and r.source.endswith("+ current_kernels")
        assert r.low == LN(0.2) and r.high == LN(1.1)  # the pooled heldout's upper side
    moved = IntervalSource(TABLE, transferred=True).residuals("nsa_verify", False)
    assert moved.median == LN(0.35) and moved.source.endswith("+ current_kernels")
    assert IntervalSource(TABLE).residuals("gemm", True).source == "heldout + leave_one_out"


def test_a_transfer_onto_datasheet_ceilings_widens_the_upper_side_only():
    src = IntervalSource(TABLE, transferred=True, gap_bytes=0.1, gap_flops=0.3)
    assert src.gap("elementwise") == 0.1 and src.gap("gemm") == 0.3
    sp = Spread.zeros(1, len(src.axis))
    sp.add_op(np.array([1.0]), src.axis["gemm"], src.residuals("gemm", False), gap=0.0)
    plain = interval([1.0], over=bounds(sp))[0]
    sp = Spread.zeros(1, len(src.axis))
    sp.add_op(np.array([1.0]), src.axis["gemm"], src.residuals("gemm", False), gap=src.gap("gemm"))
    gapped = interval([1.0], over=bounds(sp))[0]
    assert gapped[0] == pytest.approx(plain[0]) and gapped[1] > plain[1] * 1.2


def _predict(gpu, contexts=(32768,), strategy="ar_dense"):
    model = get_model("llama-3.1-8b")
    c = build_columns(
        model, [(Strategy.from_name(strategy), Workload(context_len=T)) for T in contexts]
    )
    return predict_columns(model, c, make_predictor(gpu, tp=c.tp))


def test_the_shipped_profile_carries_its_residual_sets():
    table = shipped_profile("h100-sxm").intervals
    assert table.coverage == 0.9
    assert set(table.sets) == {"heldout", "leave_one_out", "cross_gpu", "current_kernels"}
    assert {"gemm", "dense_verify", "sparse_verify", "*"} <= set(table.sets["heldout"])
    assert table.cross_gpus == ("h200",)
    # The H100's sparse verification fit rows time earlier kernels than its unfitted/ rows,
    # which run faster than the fit prices them.
    assert set(table.sets["current_kernels"]) == {"sparse_verify", "*"}
    assert table.sets["current_kernels"]["sparse_verify"].median < math.log(0.95)
    assert shipped_profile("h200").intervals.sets.get("current_kernels", {}) == {}


def test_an_extrapolated_call_gets_a_wider_interval_than_the_same_op_in_range():
    """Dense verification at 32K lies inside its class's measured range, at 64M contexts
    outside (more bytes a call than any row): the op's relative interval widens to the
    leave-one-out residuals."""
    pred = _predict(get_gpu("h100-sxm"), (32768, 1 << 26))
    assert list(pred.op_outside["verify.attention"]) == [False, True]
    assert pred.extrapolated[1]
    secs = pred.op_seconds["verify.attention"]
    iv = interval(secs, over=bounds(pred.spread(keys=["verify.attention"])))
    rel = iv / secs[:, None]
    assert rel[1, 1] - rel[1, 0] > 1.25 * (rel[0, 1] - rel[0, 0])


def test_below_a_launch_bound_class_s_smallest_rows_is_no_extrapolation():
    """The autoregressive round's acceptance step moves fewer bytes a launch than any
    ``residual_add`` row, whose smallest rows are launch-bound: no extrapolation. A class whose
    smallest rows are not launch-bound flags the same call."""
    import dataclasses

    from ssvkit.perfmodel.accept_ops import ONE_LAUNCH_CLASS

    pred = _predict(get_gpu("h100-sxm"))
    assert not pred.op_outside["verify.accept"][0] and not pred.extrapolated[0]
    fit = shipped_profile("h100-sxm").classes[ONE_LAUNCH_CLASS]
    bw, peak = 3e12, 1e15
    small = 10 ** fit.bytes_range[0] / 30
    assert fit.in_range(small, 0.0, bw, peak) and not fit.in_range(small * 1e6, 0.0, bw, peak)
    slow = dataclasses.replace(fit, t0_s=fit.t0_s * 1e-3)
    assert not slow.in_range(small, 0.0, bw, peak)


def test_a_chain_longer_than_any_measured_one_is_an_extrapolation():
    """The H100's few-lists sparse classes saw only split calls (short walks): a call whose
    program walks a list longer than any of their rows did is flagged; the same bytes and
    FLOPs with the longest measured walk are not, nor a class without a chain term."""
    import dataclasses

    fit = shipped_profile("h100-sxm").classes["sparse_verify/union/few_lists"]
    bw, peak = 3e12, 1e15
    nbytes, flops = 10 ** np.mean(fit.bytes_range), 0.0
    assert fit.depth_max > 0
    assert fit.in_range(nbytes, flops, bw, peak, fit.depth_max)
    assert not fit.in_range(nbytes, flops, bw, peak, 2 * fit.depth_max)
    assert fit.in_range(nbytes, flops, bw, peak)  # no chain given
    no_chain = dataclasses.replace(fit, depth_max=0.0)
    assert no_chain.in_range(nbytes, flops, bw, peak, 2 * fit.depth_max)


def test_more_serial_steps_than_any_measured_row_are_an_extrapolation():
    """A split call's merge steps beyond the most any row of its class ran (the profile keeps
    them beside the fit) are flagged whatever the bytes; as many are not, nor calls priced
    without steps, nor a class whose profile keeps none."""
    import dataclasses

    fit = shipped_profile("h200").classes["dense_verify"]
    bw, peak = 3e12, 1e15
    nbytes, flops = 10 ** np.mean(fit.bytes_range), 0.0
    assert fit.steps_max is not None and fit.steps_max >= 1
    assert fit.in_range(nbytes, flops, bw, peak, steps=fit.steps_max)
    assert not fit.in_range(nbytes, flops, bw, peak, steps=fit.steps_max + 1)
    assert fit.in_range(nbytes, flops, bw, peak)
    kept_none = dataclasses.replace(fit, steps_max=None)
    assert kept_none.in_range(nbytes, flops, bw, peak, steps=fit.steps_max + 1)
    assert "steps_max" not in fit.to_json()  # kept beside the fit, outside the profile id's hash


def test_a_head_dimension_no_row_has_is_an_extrapolation():
    """Dense verification was measured at head dimension 128, not 96 (Phi-3's, which no row
    has): a call at 96 is flagged whatever its bytes, one at 128 or with no head dimension
    given is not, nor a class whose rows carry none."""
    import dataclasses

    fit = shipped_profile("h200").classes["dense_verify"]
    bw, peak = 3e12, 1e15
    nbytes, flops = 10 ** np.mean(fit.bytes_range), 0.0
    assert 128 in fit.head_dims and 96 not in fit.head_dims
    assert fit.in_range(nbytes, flops, bw, peak, head_dim=128)
    assert fit.in_range(nbytes, flops, bw, peak)
    assert not fit.in_range(nbytes, flops, bw, peak, head_dim=96)
    assert dataclasses.replace(fit, head_dims=()).in_range(nbytes, flops, bw, peak, head_dim=96)
    assert "head_dims" not in fit.to_json()  # kept beside the fit, outside the profile id's hash


@pytest.mark.parametrize(
    ("strategy", "metadata"), [("sd_dense", None), ("ssv", "nsa"), ("ssv", "quest")]
)
def test_attention_at_an_unmeasured_head_dimension_is_labelled_extrapolated(strategy, metadata):
    """The same model at head dimension 96 (Phi-3's, which no row has): its attention and
    selection ops (dense, NSA, block selection and sparse verification) are flagged, so its
    figures take the widened intervals; its GEMMs are not. At 128 none is."""
    import dataclasses

    gpu = get_gpu("h200")
    base = get_model("llama-3.1-8b")
    wide = dataclasses.replace(base, name="llama-d96", head_dim=96)
    strat = Strategy.from_name(strategy)
    if metadata:
        strat = dataclasses.replace(strat, metadata=metadata)
    got = {}
    for model in (base, wide):
        c = build_columns(model, [(strat, Workload(context_len=32768))])
        got[model.head_dim] = predict_columns(model, c, make_predictor(gpu, tp=c.tp))
    secs = got[96].op_seconds
    kinds = ("attention", "selection", "sparse_verify")
    run = [k for k in secs if k.startswith("verify.") and any(x in k for x in kinds) and secs[k][0]]
    assert len(run) >= (1 if strategy == "sd_dense" else 2)
    assert all(got[96].op_outside[k][0] and not got[128].op_outside[k][0] for k in run)
    assert got[96].extrapolated[0] and not got[128].extrapolated[0]
    assert not got[96].op_outside["verify.qkv_proj"][0]


def test_roofline_and_cross_architecture_predictions_carry_no_interval():
    roof = _predict(get_gpu("h100-sxm", measured=False))
    assert roof.spread() is None and "roofline" in roof.interval_note
    cross = _predict(get_gpu("a100-80g", any_architecture=True))
    assert cross.spread() is None and "hopper to ampere" in cross.interval_note


def test_a_transfer_takes_the_datasheet_gap_only_where_the_target_has_datasheet_ceilings(
    h200_without_a_profile,
):
    h200, pcie = (make_predictor(get_gpu(g)).interval_source for g in ("h200", "h100-pcie"))
    assert h200.transferred and (h200.gap_bytes, h200.gap_flops) == (0.0, 0.0)
    sxm = shipped_profile("h100-sxm")
    sheet = get_gpu("h100-sxm", measured=False)
    assert pcie.gap_bytes == pytest.approx(sheet.hbm_bytes_per_s / sxm.copy_bytes_per_s - 1)
    assert pcie.gap_flops == pytest.approx(sheet.bf16_flops_per_s / sxm.gemm_flops_per_s - 1)
    assert not make_predictor(get_gpu("h100-sxm")).interval_source.transferred


def test_a_transfer_that_leaves_the_measured_range_is_labelled_and_widened(h200_without_a_profile):
    """The H100 profile moved to the H200: dense verification at 64M contexts lies outside the
    class's range, so the point is ``extrapolated`` and the op takes the leave-one-out residuals
    beside the held-out ones (and, transferred, the cross-GPU ones of its family's H200 rows)."""
    pred = _predict(get_gpu("h200"), (32768, 1 << 26))
    assert pred.provenance == f"transferred:{shipped_profile('h100-sxm').profile_id}->h200"
    assert pred.extrapolated[1]
    assert list(pred.op_outside["verify.attention"]) == [False, True]
    src = pred.interval_source
    assert src.residuals("dense_verify", True).source == "heldout + cross_gpu + leave_one_out"
    assert src.residuals("dense_verify", False).source == "heldout + cross_gpu"
    secs = pred.op_seconds["verify.attention"]
    rel = interval(secs, over=bounds(pred.spread(keys=["verify.attention"]))) / secs[:, None]
    # the leave-one-out residuals widen the extrapolated point's interval (by how much is
    # the committed residuals' spread: 5% with the H100 profile's)
    assert rel[1, 0] < rel[0, 0] and rel[1, 1] - rel[1, 0] > 1.02 * (rel[0, 1] - rel[0, 0])
