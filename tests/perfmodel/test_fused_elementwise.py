"""The engine's two element-wise implementations in the step model (``perfmodel.ops``): the
triton backend's fused kernels (one ``add_rms_norm`` per residual add and norm, ``rope_kv_write``,
``silu_mul``) against torch's separate ops, each priced by its own classes, the fused ones by
the labelled ``residual_add`` stand-in where a profile has none of them."""

import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.accept_ops import accept_launches
from ssvkit.perfmodel.acceptance import tree_level_sizes
from ssvkit.perfmodel.calibrated import ONE_LAUNCH_STAND_IN, CalibratedPredictor, stand_in
from ssvkit.perfmodel.elementwise import (
    CHAINED_NORMS_SINCE,
    FUSED_ACCEPT_SINCE,
    elementwise_of_backend,
    elementwise_of_run,
)
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.linear_rule import chained_norms
from ssvkit.perfmodel.models import ModelSpec, get_model
from ssvkit.perfmodel.ops import FUSED_CLASSES
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.profiles import profile_path, shipped_profile
from ssvkit.perfmodel.step import build_columns, predict_columns, product_columns
from ssvkit.perfmodel.strategy import Strategy, Workload, parse_tree

LLAMA = get_model("llama-3.1-8b")
TORCH_OPS = ("norms", "residual", "rope", "rope_row", "kv_write", "kv_write_row", "ffn_act")
TORCH_OPS += ("ffn_act_row", "embed_norm", "rope_tables")
FUSED_OPS = ("add_rms_norm", "rms_norm", "embed", "rope_kv_write", "silu_mul")
needs_h200 = pytest.mark.skipif(profile_path("h200") is None, reason="no committed H200 profile")


def _both(model, gpu_predictor, strategy=None, fused="fused_unchained", **workload):
    """One prediction of the torch point (index 0) and the ``fused`` point (index 1: by default
    the fused kernels without the norms chained into the projections)."""
    s = strategy or Strategy.from_name("sd_dense")
    points = [(s, Workload(elementwise=e, **workload)) for e in ("torch", fused)]
    c = build_columns(model, points)
    return predict_columns(model, c, gpu_predictor(c), s.drafter)


def _launches(pred, names, point: int) -> float:
    return sum(
        float(np.broadcast_to(pred.ops[f"verify.{n}"].launches, (2,))[point])
        for n in names
        if f"verify.{n}" in pred.ops
    )


def test_the_fused_path_is_cheaper_by_the_launches_it_removes():
    """With memory and arithmetic free, only launches cost: the fused forward is shorter by
    4 launches a layer (norm and residual add twice, KV store in two, q's rotary into one) and
    one a forward (the rope tables): 4 x 32 + 1 = 129 for Llama-3.1-8B; the fused acceptance
    step by what ``accept_launches`` counts for its tree (one forward's tree: the same)."""
    free = dataclasses.replace(
        get_gpu("h100-sxm", measured=False),
        hbm_bytes_per_s=1e30,
        bf16_flops_per_s=1e30,
        fp32_flops_per_s=1e30,
        launch_overhead_s=1e-6,
    )
    pred = _both(LLAMA, lambda c: RooflinePredictor(free, tp=c.tp), context_len=8192)
    removed = 4 * LLAMA.num_layers + 1
    assert _launches(pred, TORCH_OPS, 0) - _launches(pred, FUSED_OPS, 1) == removed
    # Each point runs its own implementation's ops only.
    assert _launches(pred, FUSED_OPS, 0) == 0 == _launches(pred, TORCH_OPS, 1)
    accept = np.broadcast_to(pred.ops["verify.accept"].launches, (2,))
    depth = len(tree_level_sizes(parse_tree(Strategy.from_name("sd_dense").tree, 0.7)))
    assert accept[0] == accept_launches(depth, LLAMA.num_layers, 0, 0)
    assert accept[1] == accept_launches(depth, LLAMA.num_layers, 0, 0, 1.0, 1.0) < accept[0]
    gap = float(pred.verify_s[0] - pred.verify_s[1])
    assert gap == pytest.approx((removed + accept[0] - accept[1]) * 1e-6, rel=1e-9)
    # Chained into the projections (16 rows against Llama-3.1-8B's weights): per layer two
    # add_rms_norm and silu_mul fewer, the final norm's add_rms_norm kept.
    chained = _both(
        LLAMA, lambda c: RooflinePredictor(free, tp=c.tp), fused="fused", context_len=8192
    )
    fewer = _launches(pred, FUSED_OPS, 1) - _launches(chained, FUSED_OPS, 1)
    assert fewer == 3 * LLAMA.num_layers - 1
    gap = float(pred.verify_s[1] - chained.verify_s[1])
    assert gap == pytest.approx(fewer * 1e-6, rel=1e-9)


def test_norms_chain_where_every_projection_streams():
    """``linear_rule.chained_norms``: at most 32 rows, every projection weight of a rank at
    least 16 MiB, a dense layer; the tiny pair's weights are too small, a TP rank's quarter of
    Llama-3.1-8B's q/k/v projection (12 MiB) too."""
    m = np.array([1.0, 16.0, 32.0, 33.0])
    assert chained_norms(LLAMA, m, 1, 1.0).tolist() == [1.0, 1.0, 1.0, 0.0]
    assert chained_norms(LLAMA, m, 1, 0.0).tolist() == [0.0] * 4
    assert chained_norms(LLAMA, m, 4, 1.0).tolist() == [0.0] * 4
    assert chained_norms(get_model("qwen3-30b-a3b"), m, 1, 1.0).tolist() == [0.0] * 4


def test_the_fused_ops_are_named_after_their_kernels_and_read_less():
    """One add_rms_norm moves the residual add's and the norm's bytes in one pass: less than
    the torch path's norms and residual adds together, at every point."""
    pred = _both(LLAMA, lambda c: RooflinePredictor(get_gpu("h200", measured=False), tp=c.tp))
    ops = pred.ops
    assert ops["verify.add_rms_norm"].kernel == f"add_rms_norm/d{LLAMA.hidden_size}"
    assert ops["verify.rms_norm"].kernel == f"add_rms_norm/d{LLAMA.hidden_size}"
    assert ops["verify.rope_kv_write"].kernel == "rope_kv_write"
    assert ops["verify.silu_mul"].kernel == "silu_mul_fused"
    assert ops["verify.embed"].kernel == "embed"
    torch_norm = ops["verify.norms"].bytes[0] + ops["verify.residual"].bytes[0]
    assert ops["verify.add_rms_norm"].bytes[1] < torch_norm
    # Calls: two add_rms_norm a layer, one rope_kv_write and one silu_mul.
    assert float(ops["verify.add_rms_norm"].calls[1]) == 2 * LLAMA.num_layers
    assert float(ops["verify.rope_kv_write"].calls[1]) == LLAMA.num_layers
    assert float(ops["verify.silu_mul"].calls[1]) == LLAMA.num_layers


def test_product_columns_take_one_implementation_for_every_point():
    s = [Strategy.from_name("ar_dense")]
    fused = product_columns(LLAMA, s, context_len=[4096, 8192])
    torch_ = product_columns(LLAMA, s, elementwise="torch", context_len=[4096, 8192])
    assert fused.fused_elementwise.tolist() == [1.0, 1.0]
    assert torch_.fused_elementwise.tolist() == [0.0, 0.0]
    assert fused.fused_accept.tolist() == [1.0, 1.0] and torch_.fused_accept.tolist() == [0, 0]
    old = product_columns(LLAMA, s, elementwise="fused_torch_accept", context_len=[4096])
    assert old.fused_elementwise.tolist() == [1.0] and old.fused_accept.tolist() == [0.0]
    with pytest.raises(ValueError, match="elementwise must be one of fused, torch, .*'cuda'"):
        product_columns(LLAMA, s, elementwise="cuda")
    with pytest.raises(ValueError, match="elementwise must be one of fused, torch, .*'x'"):
        Workload(elementwise="x")


def _without_fused(profile):
    """``profile`` less its fused element-wise classes (a GPU whose op sweep lacks them)."""
    kept = {
        k: v
        for k, v in profile.classes.items()
        if k.split("/")[0].split("@")[0] not in FUSED_CLASSES
    }
    return dataclasses.replace(profile, classes=kept)


@needs_h200
def test_without_fused_classes_a_labelled_stand_in_prices_them():
    """A profile without fused classes: ``residual_add`` stands in for each, the figures say
    ``stand-in``, and the torch point, whose classes the profile has, does not."""
    gpu = get_gpu("h200")
    shipped = shipped_profile("h200")
    assert any(k.split("/")[0] in FUSED_CLASSES for k in shipped.classes)
    profile = _without_fused(shipped)
    pred = _both(LLAMA, lambda c: CalibratedPredictor(gpu, profile, tp=c.tp), context_len=32768)
    want = [f"{k} <- {ONE_LAUNCH_STAND_IN}" for k in ("add_rms_norm/d4096", "embed")]
    want += [f"{k} <- {ONE_LAUNCH_STAND_IN}" for k in ("rope_kv_write", "silu_mul_fused")]
    assert pred.stood_in_for(1) == want and pred.label(1).endswith(":stand-in")
    assert pred.stood_in_for(0) == [] and "stand-in" not in pred.label(0)
    assert float(pred.verify_s[1]) < float(pred.verify_s[0])
    assert stand_in("rope_kv_write") == ONE_LAUNCH_STAND_IN
    assert stand_in("rmsnorm/d4096") is None  # torch's classes never stand in


@needs_h200
def test_a_profile_with_fused_classes_prices_them_itself():
    """Once the profile has a fused class, its own rates price the op: no stand-in, and a
    costlier class gives a costlier op; a width it lacks takes its nearest width, flagged
    extrapolated, before any stand-in."""
    gpu = get_gpu("h200")
    base = _without_fused(shipped_profile("h200"))
    add = base.classes[ONE_LAUNCH_STAND_IN]
    own = {
        name: dataclasses.replace(add, name=name, t0_s=add.t0_s + 1e-5)
        for name in ("add_rms_norm/d8192", "rope_kv_write", "silu_mul_fused", "embed")
    }
    profile = dataclasses.replace(base, classes={**base.classes, **own})
    c = build_columns(LLAMA, [(Strategy.from_name("ar_dense"), Workload())])
    plain = predict_columns(LLAMA, c, CalibratedPredictor(gpu, base, tp=c.tp))
    mine = predict_columns(LLAMA, c, CalibratedPredictor(gpu, profile, tp=c.tp))
    assert plain.stand_in[0] and not mine.stand_in[0] and mine.stand_ins == {}
    assert mine.extrapolated[0]  # d4096 priced by the d8192 class
    key = "verify.rope_kv_write"
    calls = float(mine.ops[key].calls[0])
    assert float(mine.op_seconds[key][0] - plain.op_seconds[key][0]) == pytest.approx(
        calls * 1e-5, rel=1e-6
    )


@pytest.mark.skipif(profile_path("h100-sxm") is None, reason="no committed H100 profile")
def test_a_resident_fused_op_stands_in_with_the_resident_class():
    """A model whose weights fit in L2 names its fused ops ``@l2``; in a profile without their
    classes they take the resident ``residual_add@l2`` where the profile has it."""
    tiny = ModelSpec(
        name="tiny",
        family="llama",
        num_layers=2,
        hidden_size=64,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
    )
    gpu, shipped = get_gpu("h100-sxm"), shipped_profile("h100-sxm")
    classes = {k: v for k, v in shipped.classes.items() if not k.startswith("add_rms_norm")}
    profile = dataclasses.replace(shipped, classes=classes)
    assert ONE_LAUNCH_STAND_IN + "@l2" in profile.classes
    c = build_columns(tiny, [(Strategy.from_name("ar_dense"), Workload(context_len=1024))])
    pred = predict_columns(tiny, c, CalibratedPredictor(gpu, profile, tp=c.tp))
    assert f"add_rms_norm/d64@l2 <- {ONE_LAUNCH_STAND_IN}@l2" in pred.stood_in_for(0)
    assert pred.stand_in[0]


def test_the_implementation_of_a_measured_run():
    """A document's backend names it; without one, the CPU ran torch, and a GPU run the fused
    kernels from the day they landed on, torch before; a fused run before the acceptance step
    became kernels ran that step in torch ops, one before the norms chained into the
    projections did not chain them."""
    assert elementwise_of_backend("triton") == "fused"
    assert elementwise_of_backend("torch") == "torch"
    with pytest.raises(ValueError, match="backend must be one of triton, torch, got 'cuda'"):
        elementwise_of_backend("cuda")
    gpu = {"device_name": "NVIDIA H100 80GB HBM3"}
    assert elementwise_of_run({**gpu, "backend": "torch"}) == "torch"
    triton = {**gpu, "backend": "triton"}
    assert elementwise_of_run({**triton, "timestamp": "2026-11-29T00:00:00+00:00"}) == (
        "fused_torch_accept"
    )
    assert elementwise_of_run({**triton, "timestamp": FUSED_ACCEPT_SINCE}) == "fused_unchained"
    assert elementwise_of_run({**triton, "timestamp": CHAINED_NORMS_SINCE}) == "fused"
    assert elementwise_of_run(triton) == "fused"
    assert elementwise_of_run({**gpu, "timestamp": "2026-11-25T00:36:30+00:00"}) == "torch"
    assert elementwise_of_run({**gpu, "timestamp": "2026-11-28T12:15:43+00:00"}) == (
        "fused_torch_accept"
    )
    assert elementwise_of_run({**gpu, "timestamp": FUSED_ACCEPT_SINCE}) == "fused_unchained"
    assert elementwise_of_run({**gpu, "timestamp": CHAINED_NORMS_SINCE}) == "fused"
    assert elementwise_of_run({"device_name": "cpu", "timestamp": "2027-01-01"}) == "torch"
    with pytest.raises(ValueError, match="names no backend and no timestamp"):
        elementwise_of_run(gpu)
