import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ssvkit.perfmodel.seed_formulas import (
    piecewise_budget,
)
from ssvkit.perfmodel.sparse import (
    blocks_loaded_per_layer,
    fits_shared_memory,
    load_fraction,
    metadata_bytes,
    nsa_branch_tokens,
    union_blocks,
)


def test_load_fraction_reference_values():
    assert load_fraction(4, 0.75) == 0.4375
    assert load_fraction(4, 0.9) == pytest.approx(0.325)
    assert load_fraction(1, 0.3) == 1.0


@given(st.integers(1, 64), st.floats(0, 1), st.floats(0, 1))
def test_load_fraction_bounds_and_monotone(c, g1, g2):
    lo, hi = sorted((g1, g2))
    f_lo, f_hi = load_fraction(c, lo), load_fraction(c, hi)
    assert 1 / c - 1e-12 <= f_hi <= f_lo <= 1 + 1e-12


def test_load_fraction_rejects_bad_input():
    with pytest.raises(ValueError, match="group_size"):
        load_fraction(0, 0.5)
    with pytest.raises(ValueError, match="overlap"):
        load_fraction(2, 1.5)


def test_union_size_seed_example():
    # SSV: C = 4, n = 16, rho = 0.7 -> 30.4 blocks vs 64.
    assert union_blocks(16, 4, 0.7) == pytest.approx(30.4)
    assert union_blocks(16, 4, 0.0, num_blocks=40) == 40


def test_blocks_loaded_modes():
    assert blocks_loaded_per_layer(16, 16, "per_query") == 256
    assert blocks_loaded_per_layer(16, 16, "union", 4, 0.75) == pytest.approx(4 * 28)
    assert blocks_loaded_per_layer(16, 16, "shared", 4) == 64
    # a ragged last group of one query loads its own n blocks
    assert blocks_loaded_per_layer(17, 16, "union", 4, 0.75) == pytest.approx(4 * 28 + 16)
    # union with C = 1 or zero overlap is per-query
    assert blocks_loaded_per_layer(9, 8, "union", 1, 0.9) == blocks_loaded_per_layer(
        9, 8, "per_query"
    )
    assert blocks_loaded_per_layer(8, 8, "union", 4, 0.0) == 64
    with pytest.raises(ValueError, match="mode"):
        blocks_loaded_per_layer(4, 4, "exact")


def test_piecewise_budget_eq6():
    # L <= L0: no eviction, all ceil(L/B) blocks of every head
    assert piecewise_budget(3000, 4096, 0.1, 8, 64) == np.ceil(3000 / 64) * 8
    # ((32768 - 4096) * 0.1 + 4096) * 8 / 64
    assert piecewise_budget(32768, 4096, 0.1, 8, 64) == pytest.approx(870.4)
    with pytest.raises(ValueError, match="sparsity"):
        piecewise_budget(1000, 10, 1.0, 1, 1)


def test_nsa_branches_and_metadata():
    comp, sel, win = nsa_branch_tokens(65536, 16, 64, 512, 16)
    assert (comp, sel, win) == (4096, 1024, 512)
    assert nsa_branch_tokens(500, 16, 64, 512, 0) == (0, 500, 500)
    # mean keys: one 128-d bf16 vector per 64-token block and KV head
    assert metadata_bytes(65536, 64, 8, 128, "mean") == 1024 * 8 * 128 * 2
    assert metadata_bytes(65536, 64, 8, 128, "quest") == 2 * 1024 * 8 * 128 * 2


def test_shared_memory_feasibility():
    smem = 227 * 1024
    assert fits_shared_memory(8, 64, 16, 128, 4, smem)
    # SSV's resident union: C = 4, n = 16, 70% overlap -> 30.4 blocks of 32 KB: too large
    assert not fits_shared_memory(4, 64, 16, 128, 4, smem, resident_union=True, overlap=0.7)
    assert fits_shared_memory(2, 16, 4, 64, 1, smem, resident_union=True, overlap=0.9)
