import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.costs import (
    draft_level_seconds,
    host_step_seconds,
    kv_capacity_tokens,
    kv_offload_seconds,
    mixed_step_seconds,
    prefill_ops,
    prefill_seconds,
    speculation_seconds,
    verify_layer_split,
)
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.prr_costs import prr_layer_costs, repair_seconds
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import BASELINES, Strategy, Workload

MODEL = get_model("llama-3.1-8b")
GPU = get_gpu("h100-sxm", measured=False)
PRED = RooflinePredictor(GPU)


def _cols(names=tuple(BASELINES), **w):
    return build_columns(MODEL, [(Strategy.from_name(n), Workload(**w)) for n in names])


@pytest.mark.parametrize("ctx", [8192, 65536])
def test_layer_split_sums_to_verify(ctx):
    c = _cols(context_len=ctx)
    s = verify_layer_split(MODEL, c, PRED)
    L, R = s.num_layers, s.num_refresh
    total = R * s.layer_s(True) + (L - R) * s.layer_s(False) + s.head_s + s.accept_s
    np.testing.assert_allclose(total, s.verify_s, rtol=1e-12)
    # ssv refreshes every 4th layer and fuses: a reuse layer's attention is cheaper
    i = list(BASELINES).index("ssv")
    assert R[i] == 8
    assert s.attention_reuse_s[i] < s.attention_refresh_s[i]
    dense = list(BASELINES).index("sd_dense")
    assert s.selection_s[dense] == 0 and s.attention_reuse_s[dense] == s.attention_refresh_s[dense]


def test_draft_levels_telescope_to_draft_s():
    c = _cols(("sd_dense", "ssv", "ar_dense"))
    levels = draft_level_seconds(MODEL, c, PRED)
    pred = predict_columns(MODEL, c, PRED)
    np.testing.assert_allclose(levels.sum(axis=1), pred.draft_s, rtol=1e-12)
    assert (levels[:2] > 0).sum(axis=1).tolist() == [6, 6]  # best:16:6 has 6 levels
    assert levels[2].sum() == 0


def test_prefill_attention_is_causal_and_quadratic():
    ops = prefill_ops(MODEL, PRED, np.array([1024.0, 2048.0]))
    f = ops["prefill.attention"].flops
    hq = MODEL.num_q_heads
    expected = MODEL.num_layers * np.array([1024 * 1025 / 2, 2048 * 2049 / 2]) * 4 * hq * 128
    np.testing.assert_allclose(f, expected)
    s = prefill_seconds(MODEL, PRED, [1024, 8192, 65536])
    assert np.all(np.diff(s) > 0)
    # a long prefill is compute-bound: at least its FLOPs at the dense tensor rate
    flops = sum(op.flops for op in prefill_ops(MODEL, PRED, 65536.0).values())
    assert s[2] >= flops / GPU.bf16_flops_per_s


def test_repair_scales_with_missed_blocks_only():
    r = repair_seconds(MODEL, PRED, 1, np.arange(5), 64)
    steps = np.diff(r)
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)  # memory-bound: linear in misses
    kv_block = 64 * 2 * MODEL.num_kv_heads * MODEL.head_dim * 2
    assert steps[0] == pytest.approx(kv_block / GPU.hbm_bytes_per_s, rel=1e-9)
    assert r[0] >= GPU.launch_overhead_s  # launches even with nothing to repair


def test_prr_costs_recover_the_serial_path():
    c = _cols(("ar_sparse",), context_len=65536)
    p = prr_layer_costs(MODEL, c, PRED, 1.0)
    L = MODEL.num_layers
    serial = p.draft_s + L * (p.linear_s + p.selection_s + p.attention_s) + p.head_s + p.accept_s
    np.testing.assert_allclose(serial, p.draft_s + p.serial_verify_s, rtol=1e-12)
    assert 0 < p.compressed_s[0] < p.attention_s[0]
    wider = prr_layer_costs(MODEL, c, PRED, 2.0)
    assert wider.speculative_s[0] > p.speculative_s[0]
    with pytest.raises(ValueError, match="sparse"):
        prr_layer_costs(MODEL, _cols(("ar_dense",)), PRED)


@pytest.mark.parametrize("gpu", ["h200", "h100-sxm"])
def test_prr_parts_priced_by_a_calibrated_profile_are_parts_of_the_layer(gpu):
    """With a calibrated profile, the compressed branch's share is at least nothing and the
    speculative attention over the predicted blocks (no compressed branch) costs at most the
    refresh layer's whole attention, at every context."""
    from ssvkit.perfmodel.calibrated import make_predictor

    c = build_columns(
        MODEL,
        [(Strategy.from_name("ar_sparse"), Workload(context_len=T)) for T in (8192, 32768, 131072)],
    )
    p = prr_layer_costs(MODEL, c, make_predictor(get_gpu(gpu), tp=c.tp), 1.0)
    assert (p.compressed_s >= 0).all() and (p.repair_block_s >= 0).all()
    assert (p.speculative_s <= p.attention_s).all()
    assert p.compressed_s[-1] > p.compressed_s[0]


def test_speculation_grows_with_budget_and_matches_a_chain_at_one():
    c = build_columns(MODEL, [(Strategy.from_name("sd_dense", tree="chain:4"), Workload())])
    one = speculation_seconds(MODEL, c, PRED, None, 1)
    assert one[0] == pytest.approx(predict_columns(MODEL, c, PRED).draft_s[0], rel=1e-12)
    assert speculation_seconds(MODEL, c, PRED, None, 16)[0] > one[0]


def test_mixed_step_parts():
    out = mixed_step_seconds(MODEL, PRED, [8, 0, 8], [0, 2, 2], 4, 32768, 0.05)
    np.testing.assert_allclose(
        out["total_s"],
        out["linear_s"] + out["head_s"] + out["draft_attention_s"] + out["verify_attention_s"],
    )
    assert out["verify_attention_s"][0] == 0 and out["draft_attention_s"][1] == 0
    # a verifier reads its whole context; a drafter reads the sparse share
    one_d = mixed_step_seconds(MODEL, PRED, 1, 0, 4, 32768, 0.05)["draft_attention_s"]
    one_v = mixed_step_seconds(MODEL, PRED, 0, 1, 4, 32768, 0.05)["verify_attention_s"]
    assert one_v > 4 * one_d  # launches (2 per layer) bound the sparse side from below
    # with sparsity 1 a draft step's attention is the verification's over one row
    full = mixed_step_seconds(MODEL, PRED, 1, 0, 0, 32768, 1.0)["draft_attention_s"]
    assert full == pytest.approx(
        mixed_step_seconds(MODEL, PRED, 0, 1, 0, 32768, 1.0)["verify_attention_s"], rel=2e-4
    )


def test_capacity_offload_and_host_hand_values():
    weights = MODEL.num_params() * 2
    per_token = 32 * 2 * 8 * 128 * 2
    assert kv_capacity_tokens(MODEL, GPU) == int((0.9 * 80e9 - weights) // per_token)
    assert kv_capacity_tokens(MODEL, GPU, tp=2) > 2 * kv_capacity_tokens(MODEL, GPU)
    assert kv_offload_seconds(1000, MODEL, GPU) == pytest.approx(1000 * per_token / 64e9)
    assert host_step_seconds(128) == pytest.approx(3.2e-3)
    with pytest.raises(ValueError):
        kv_capacity_tokens(MODEL, GPU, memory_fraction=0)
    tiny = dataclasses.replace(GPU, memory_bytes=1e9)
    assert kv_capacity_tokens(MODEL, tiny) == 0
