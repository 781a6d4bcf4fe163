"""ssvkit.perfmodel.repair_plan: the repair kernel's serial chain per SM slot, hand-computed at the
tiny pair's (8 q / 2 KV heads, D = 64) and Llama-3.1-8B's (32 / 8, D = 128) heads on an H100,
and the launch constants it copies from ``kernels/repair.py``."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.costs import repair_seconds
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.repair_plan import BLOCK_N_MAX, NUM_STAGES, chain_tiles, programs_per_sm

H100 = get_gpu("h100-sxm", measured=False)
SMEM = H100.smem_per_sm_bytes  # 228 KiB


def test_programs_per_sm_from_the_pipeline_smem():
    # 3 stages x (K + V) x 64 x D x 2 B: 96 KiB at D = 128 -> 2 per SM, 48 KiB at D = 64 -> 4.
    assert programs_per_sm(128, 64, SMEM) == 2
    assert programs_per_sm(64, 64, SMEM) == 4
    assert programs_per_sm(64, 16, SMEM) == 19  # 12 KiB tiles at block 16
    assert programs_per_sm(256, 64, 64 * 1024) == 1  # never below one


def test_chain_tiles_hand_computed():
    # Tiny pair, batch 1: 16 x 2 x 1 = 32 programs, one wave of 528 slots: the 32 blocks.
    assert chain_tiles(16, 2, 1, 32, 64, 64, 132, SMEM) == 32
    # Llama-8B, batch 16: 16 x 8 x 16 = 2048 programs over 264 slots -> 8 waves x 3 blocks.
    assert chain_tiles(16, 8, 16, 3, 64, 128, 132, SMEM) == 24
    # Blocks of 128 tokens are two 64-token tiles; no missed blocks, no chain.
    assert chain_tiles(16, 2, 1, 5, 128, 64, 132, SMEM) == 10
    assert chain_tiles(16, 2, 1, 0, 64, 64, 132, SMEM) == 0
    np.testing.assert_array_equal(
        chain_tiles(np.array([1, 16]), 8, 4, 6, 64, 128, 132, SMEM), [6, 12]
    )


def test_constants_match_the_wrapper():
    src = (Path(__file__).parents[2] / "kernels" / "repair.py").read_text()
    assert f"num_stages={NUM_STAGES}" in src
    assert re.search(rf"block_n = min\(block_size, {BLOCK_N_MAX}\)", src)
    assert "grid = (t, num_kv_heads, bsz)" in src


def test_repair_seconds_prices_a_missed_block_at_the_measured_class():
    """PRR's repair op is the measured repair class with its serial chain: the cost of a missed
    block at batch 1 follows the committed H100 rows' slope (64K, 16 rows, 0 -> 32 blocks),
    not the bytes of one block."""
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
    t0, t32 = (float(repair_seconds(model, pred, 16, n, 64, 1)) for n in (0, 32))
    assert (t32 - t0) / 32 == pytest.approx(slope, rel=0.35)
