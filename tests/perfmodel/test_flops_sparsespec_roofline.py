import pytest
from ssvkit.perfmodel.roofline import (
    attention_intensity,
    gemm_intensity,
    op_time_s,
    sparse_attention_intensity,
)
from ssvkit.perfmodel.seed_formulas import (
    attention_reduction,
    dense_ffn_flops,
    full_attention_flops,
    moe_ffn_flops,
    new_kv_bytes_per_step,
    offload_hidden,
    reduction,
    self_spec_speedup,
    sparse_attention_flops,
    sparse_ffn_flops,
    sparse_moe_flops,
)
from ssvkit.perfmodel.sparsespec import (
    delayed_verification,
)


def test_flops_table_hand_values():
    B, T, d = 2, 10, 4
    assert full_attention_flops(B, T, d) == 6 * 2 * 10 * 16 + 4 * 2 * 100 * 4
    assert sparse_attention_flops(B, T, d, 1.0) == 6 * 2 * 10 * 16
    assert sparse_attention_flops(B, T, d, 0.0) == full_attention_flops(B, T, d)
    assert dense_ffn_flops(1, 1, 3, 5) == 90
    assert sparse_ffn_flops(1, 1, 3, 5, 0.0) == dense_ffn_flops(1, 1, 3, 5)
    assert sparse_ffn_flops(1, 1, 3, 5, 1.0) == 30  # only the gate stays
    assert moe_ffn_flops(1, 1, 2, 3, 4, 8) == 6 * 4 * 2 * 3 + 2 * 2 * 8
    assert sparse_moe_flops(1, 1, 2, 3, 4, 8, 0.5) == 6 * 2 * 2 * 3 + 2 * 2 * 8
    assert reduction(100, 64) == pytest.approx(0.36)
    with pytest.raises(ValueError, match="s_f"):
        sparse_ffn_flops(1, 1, 1, 1, 1.5)


def test_roofline_and_intensities():
    # memory-bound: 1 GB at 2 TB/s = 0.5 ms, plus 2 launches of 5 us
    assert op_time_s(1e9, 1e9, 1e15, 2e12, 5e-6, 2) == pytest.approx(0.5e-3 + 10e-6)
    assert op_time_s(1e15, 1.0, 1e15, 2e12) == pytest.approx(1.0)
    # seed 000: AR decode 0.5 FLOP/byte in fp16 (QK only, MHA), K = 4 drafts -> 2.5
    assert attention_intensity(1, 1, 2, count_pv=False) == 0.5
    assert attention_intensity(5, 1, 2, count_pv=False) == 2.5
    assert attention_intensity(1, 4, 2) == 4.0
    # per-query sparse kernels stay at the AR intensity; grouping raises it by 1 / f_load
    assert sparse_attention_intensity(16, 16, "per_query", gqa_group=4) == 4.0
    assert sparse_attention_intensity(16, 16, "union", 4, 0.75, 4) == pytest.approx(4 / 0.4375)
    assert gemm_intensity(1, 4096, 4096) == pytest.approx(
        2 * 4096 * 4096 / (2 * (4096 + 4096 * 4096 + 4096))
    )


def test_sparsespec():
    assert attention_reduction(8, 0.05) == pytest.approx(9 / 1.4)
    assert self_spec_speedup(8, 0.05, 1.0, 1.0) == pytest.approx(attention_reduction(8, 0.05))
    assert self_spec_speedup(4, 0.1, 0.0, 0.5) < 1.0  # nothing accepted: pure overhead
    # seed 003: Qwen3-8B (36 layers, 4096 KV bytes/token/layer), batch 128 -> ~18 MB per step
    assert new_kv_bytes_per_step(128, 4096, 36) == pytest.approx(18.87e6, rel=1e-3)
    assert offload_hidden(18.87e6, 64e9, 16e-3)
    d = delayed_verification(10e-3, 3e-3, 4)
    assert d["sync_step_s"] == pytest.approx(13e-3)
    assert d["delayed_step_s"] == pytest.approx(10e-3)
    assert d["delayed_round_s"] == pytest.approx(60e-3) and d["sync_round_s"] == pytest.approx(
        65e-3
    )


def test_seed_formulas_stay_off_the_cost_path():
    """The formulas the step model does not price live in ``perfmodel.seed_formulas``; no module
    of the cost path (perfmodel, sim, planner, sweep) imports it, so none looks priced."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    users = [
        p.relative_to(root).as_posix()
        for pkg in ("perfmodel", "sim", "planner", "sweep", "engine", "calibration")
        for p in (root / pkg).rglob("*.py")
        if re.search(r"import seed_formulas|seed_formulas import", p.read_text())
    ]
    assert users == []
