"""ssvkit.perfmodel.repair_work: the repair kernel's work from its launch plan, hand-computed at
the tiny pair's (8 q / 2 KV heads, D = 64) and Llama-3.1-8B's (32 / 8, D = 128) heads on an
H100, the launch constants it copies from ``kernels/repair.py``, and the bytes the kernel sweep
records for the calls it timed."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from ssvkit.calibration import ceilings
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.prr_costs import repair_seconds
from ssvkit.perfmodel.repair_work import (
    BLOCK_N_MAX,
    NUM_STAGES,
    distinct_share,
    programs_per_sm,
    repair_call_work,
)

H100 = get_gpu("h100-sxm", measured=False)
SMEM = H100.smem_per_sm_bytes  # 228 KiB


def work(t, hq, hkv, d, b, blocks, block_size=64):
    return repair_call_work(t, hq, hkv, d, b, blocks, block_size, 132, SMEM)


def test_programs_per_sm_from_the_pipeline_smem():
    # 3 stages x (K + V) x 64 x D x 2 B: 96 KiB at D = 128 -> 2 per SM, 48 KiB at D = 64 -> 4.
    assert programs_per_sm(128, 64, SMEM) == 2
    assert programs_per_sm(64, 64, SMEM) == 4
    assert programs_per_sm(64, 16, SMEM) == 19  # 12 KiB tiles at block 16
    assert programs_per_sm(256, 64, 64 * 1024) == 1  # never below one


def test_chain_hand_computed():
    # Tiny pair, batch 1: 16 x 2 x 1 = 32 programs, one wave of 528 slots: the 32 blocks, each
    # tile weighing 2/3 at D = 64.
    assert work(16, 8, 2, 64, 1, 32).chain_tiles == pytest.approx(32 * 2 / 3)
    # Llama-8B, batch 16: 16 x 8 x 16 = 2048 programs over 264 slots -> 8 waves x 3 blocks.
    w = work(16, 32, 8, 128, 16, 3)
    assert (w.chain_tiles, w.waves) == (24, 8)
    # Blocks of 128 tokens are two 64-token tiles; no missed blocks, no chain.
    assert work(16, 8, 2, 64, 1, 5, 128).chain_tiles == pytest.approx(10 * 2 / 3)
    assert work(16, 8, 2, 64, 1, 0).chain_tiles == 0
    np.testing.assert_array_equal(work(np.array([1, 16]), 32, 8, 128, 4, 6).chain_tiles, [6, 12])


def test_flops_count_the_padded_rows_and_exponentials():
    # G = 4 query heads pad to a 16-row tile: 16 rows x 64 keys x 4 (128 + 64) FLOPs a block
    w = work(1, 32, 8, 128, 1, 2)
    assert w.flops == 8 * 2 * 64 * 16 * 4 * (128 + 64)


def test_requested_bytes_are_what_the_sweep_recorded():
    """The work's bytes of every repair row's call equal the bytes the kernel sweep recorded
    (``calibration.kernel_ops``), on both GPUs' geometries."""
    for gpu in ("h100-sxm", "h200"):
        spec = get_gpu(gpu, measured=False)
        rows = [r for r in ceilings.profile_rows(gpu) if r["op"] == "repair"]
        assert rows
        for r in rows:
            p = r["params"]
            blocks = p["missed_blocks"] if p["mode"] == "repair" else p["top_n"]
            heads = (p["num_q_heads"], p["num_kv_heads"], p["head_dim"])
            w = repair_call_work(
                p["num_query_tokens"],
                *heads,
                p["batch"],
                blocks,
                p["block_size"],
                spec.num_sms,
                spec.smem_per_sm_bytes,
            )
            assert float(w.requested_bytes) == r["unique_bytes"]


def test_constants_match_the_wrapper():
    src = (Path(__file__).parents[2] / "kernels" / "repair.py").read_text()
    assert f"num_stages={NUM_STAGES}" in src
    assert re.search(rf"block_n = min\(block_size, {BLOCK_N_MAX}\)", src)
    assert "grid = (t, num_kv_heads, bsz)" in src
    assert "block_m = max(16, triton.next_power_of_2(group))" in src


def test_repair_seconds_prices_a_missed_block_at_the_measured_class():
    """PRR's repair op is the measured repair class with its launch plan's chain: the cost of a
    missed block at batch 1 follows the committed H100 rows' slope (64K, 16 rows, 0 -> 32
    blocks, drawn as the rows' were), not the bytes of one block; rows whose blocks are all
    their own cost more."""
    rows = Path(__file__).resolve().parents[2] / "calibration/profiles/h100-sxm/kernel_bench.jsonl"
    measured = {}
    for line in rows.read_text().splitlines():
        r = json.loads(line)
        p = r["params"]
        key = (r["op"], r["timing"], p.get("mode"), p.get("batch"), p.get("context_len"))
        if key == ("repair", "graph", "repair", 1, 65536) and p["num_q_heads"] == 32:
            measured[p["missed_blocks"]] = r["median_s"]
    slope = (measured[32] - measured[0]) / 32
    pred = make_predictor(get_gpu("h100-sxm", measured=True))
    model = get_model("llama-3.1-8b")
    t0, t32, own = (
        float(repair_seconds(model, pred, 16, n, 64, 1, context_len=ctx))
        for n, ctx in ((0, 65536), (32, 65536), (32, None))
    )
    assert (t32 - t0) / 32 == pytest.approx(slope, rel=0.1)
    assert own > t32


def test_distinct_share_of_uniform_draws():
    # 16 rows of 32 blocks from 1024: 1024 (1 - (1 - 1/32)^16) / 512 distinct per request
    assert distinct_share(1024, 32, 16) == pytest.approx(1024 * (1 - (31 / 32) ** 16) / 512)
    assert distinct_share(1024, 32, 1) == 1.0  # one row's blocks are distinct
    assert distinct_share(1024, 0, 16) == 1.0  # nothing gathered
    assert distinct_share(8, 8, 4) == pytest.approx(0.25)  # every row takes every block
