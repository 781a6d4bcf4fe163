"""The work description of dense and sparse verification calls, from the kernels' own plan."""

import numpy as np
import pytest
from ssvkit.perfmodel.attention_plan import (
    DEFAULT_DENSE_CONFIG,
    DenseVerifyConfig,
    dense_resident_programs,
    dense_row_tiles,
    dense_verify_plan,
)
from ssvkit.perfmodel.attention_work import (
    dense_tile_costs,
    dense_verify_tiles,
    dense_verify_work,
    sparse_verify_work,
)
from ssvkit.perfmodel.physical import PhysicalFit
from ssvkit.perfmodel.sparse_plan import SparseVerifyConfig, merges_in_launch, sparse_merge_steps

SMEM = 228 * 1024


def test_dense_residency_sets_where_a_grid_splits():
    cfg = DEFAULT_DENSE_CONFIG
    # 3 stages of 64-key K and V tiles at D = 128: 96 KiB, two on Hopper, one on an A100.
    assert dense_resident_programs(64, 128, SMEM, cfg) == 2
    assert dense_resident_programs(64, 128, 164 * 1024, cfg) == 1
    assert dense_resident_programs(16, 64, SMEM, cfg) == 4
    assert dense_resident_programs(128, 128, SMEM, cfg) == 1  # 8 warps: the register file
    # 136 programs of 64 rows run at once two an SM: unsplit; of 128 rows, one an SM, a second
    # wave of four whole walks: split. On an A100 the 64-row grid splits too.
    assert dense_verify_plan(17, 16, 32, 8, 128, 65552, 132).num_splits == 1
    assert dense_verify_plan(17, 32, 32, 8, 128, 65568, 132).num_splits == 5
    small_smem = dense_verify_plan(17, 16, 32, 8, 128, 65552, 132, smem_per_sm_bytes=164 * 1024)
    assert small_smem.num_splits > 1


def test_dense_work_by_hand():
    # 8 q / 2 KV heads, t = 3: G = 4, 12 packed rows -> BLOCK_M 16, one row tile; batch 1,
    # 2 KV heads: 2 programs unsplit; 4096 + 3 positions = 65 tiles of 64, at most 16 splits;
    # a wave of 2 s programs on 132 SMs is best filled at 16, and 14 is the first within 85%.
    plan = dense_verify_plan(1, 3, 8, 2, 128, 4099, 132)
    assert (plan.block_m, plan.num_m_tiles) == (16, 1)
    w = dense_verify_work(1, 3, 4096, 8, 2, 128, 132, SMEM)
    assert w.num_splits == plan.num_splits == 14
    assert w.programs == 2 * 14
    assert w.rows_pad == 16 and w.row_cost == 16
    # smem a program: (3 stages x K and V x 64 + 16 query rows) x 128 x 2 B = 100 KB: 2 an SM
    assert w.resident == 2 and w.waves == 1
    assert w.tiles_per_program == 5  # ceil(ceil(4099 / 14) / 64)
    kv = 2 * 4099 * 2 * 128 * 2
    qo = 2 * 3 * 8 * 128 * 2
    assert w.unique_bytes == w.requested_bytes == kv + qo
    assert w.mma_flops == 2 * 65 * 64 * 16 * 128 * 4
    assert w.merge_bytes == 2 * 3 * 8 * 14 * 129 * 4 and w.launches == 2


def test_dense_row_tiles_reread_kv():
    # 32 q / 8 KV heads, t = 64: 256 rows in two 128-row (wgmma) tiles, each streams the KV.
    w = dense_verify_work(16, 64, 8192, 32, 8, 128, 132, SMEM)
    assert w.rows_pad == 128 and w.row_cost == 64
    qo = 2 * 16 * 64 * 32 * 128 * 2
    assert w.requested_bytes - qo == pytest.approx(2 * (w.unique_bytes - qo))


def test_dense_tiles_follow_the_row_tiles():
    # 32 q / 8 KV heads, G = 4: t = 16 packs 64 rows into a 64-row (wgmma) tile
    assert dense_verify_tiles(16, 32, 8, 128) == (1.0, 32)
    # t = 17: 68 rows run in one 128-row tile, as t = 32 does
    assert dense_verify_tiles(17, 32, 8, 128) == (pytest.approx(128 / 68), 64)
    assert dense_verify_tiles(32, 32, 8, 128) == (1.0, 64)
    # t = 1: 4 rows in a 16-row mma.sync tile; t = 8: 32 rows in a 64-row (wgmma) tile
    assert dense_verify_tiles(1, 32, 8, 128) == (4.0, 16)
    assert dense_verify_tiles(8, 32, 8, 128) == (2.0, 32)
    # t = 64: 256 rows in two 128-row tiles; at D = 256 tiles stop at 64 rows (four of them)
    assert dense_verify_tiles(64, 32, 8, 128) == (1.0, 64)
    assert dense_verify_tiles(17, 32, 8, 256) == (pytest.approx(128 / 68), 32)


def test_seventeen_to_thirty_two_rows_run_a_warpgroup_tile_up_to_head_dim_128():
    """17-32 packed rows take the 64-row wgmma tile at D <= 128 (the 32-row mma.sync tile is
    the slower one there), keep 32 at D = 256; 16 rows or fewer stay a 16-row tile; the
    earlier rule (``warpgroup_rows_from`` 33) runs them as a 32-row tile."""
    old = DenseVerifyConfig(warpgroup_rows_from=33)
    for g, t in ((4, 5), (4, 8), (8, 3), (8, 4), (16, 2)):
        hq = 8 * g
        for d in (64, 128):
            assert dense_row_tiles(t, hq, 8, d) == (64, 1), (g, t, d)
            assert dense_row_tiles(t, hq, 8, d, old) == (32, 1), (g, t, d)
        assert dense_row_tiles(t, hq, 8, 256) == (32, 1), (g, t)
    assert dense_row_tiles(4, 32, 8, 128) == (16, 1)
    assert dense_row_tiles(17, 32, 8, 128) == dense_row_tiles(17, 32, 8, 128, old) == (128, 1)
    with pytest.raises(ValueError, match="warpgroup_rows_from"):
        DenseVerifyConfig(warpgroup_rows_from=0)


def test_dense_tile_costs_vectorised_like_the_scalar():
    rows = np.array([16.0, 17.0, 1.0, 0.0, 4.5])  # a fractional row count rounds up
    factor, cost = dense_tile_costs(rows, 32, np.array([8, 8, 8, 8, 2]), 128)
    want = [
        dense_verify_tiles(16, 32, 8, 128),
        dense_verify_tiles(17, 32, 8, 128),
        dense_verify_tiles(1, 32, 8, 128),
        (1.0, 0.0),  # no rows: nothing to price
        dense_verify_tiles(5, 32, 2, 128),
    ]
    assert factor.tolist() == pytest.approx([w[0] for w in want])
    assert cost.tolist() == [w[1] for w in want]


def test_dense_plan_uses_the_row_tiles():
    for t in (1, 5, 16, 17, 33, 64):
        plan = dense_verify_plan(4, t, 32, 8, 128, 8192 + t, 132)
        assert (plan.block_m, plan.num_m_tiles) == dense_row_tiles(t, 32, 8, 128)


def test_sparse_work_by_hand():
    # per_query, batch 1, 8 KV heads, t = 16, top_n 16: 128 lists; 4-warp programs fill waves
    # of 264, so the lists split 2 ways (one wave of 256); rows 1 x 4 heads -> M_PAD 16.
    w = sparse_verify_work(1, 16, 32, 8, 128, "per_query", 1, 16, 64, 132, SMEM)
    assert w.num_splits == 2 and w.programs == 256 and w.rows_pad == 16
    assert w.tiles_per_program == 8 + 1  # half the list, and the tail on the last split
    # union of 4 queries: 4 groups; M_PAD 16; a group streams its mean union (40 blocks).
    u = sparse_verify_work(
        1, 16, 32, 8, 128, "union", 4, 16, 64, 132, SMEM, list_blocks=40, unique_kv_bytes=0
    )
    assert u.rows_pad == 16 and u.programs == 32 * u.num_splits
    assert u.num_splits > 1 and u.launches == 1 + 1  # the union plan kernel; merged in-launch
    launched = SparseVerifyConfig(fused_merge=False)
    u2 = sparse_verify_work(
        1, 16, 32, 8, 128, "union", 4, 16, 64, 132, SMEM, list_blocks=40, config=launched
    )
    assert u2.num_splits == u.num_splits and u2.launches == 1 + 1 + 1  # and the merge launch
    assert u.plan_compares == 0.5 * (6 * 7 / 2 + 3 * 6)  # 64 keys sorted over 4 warps
    # shared streams one list a group: fewer requested bytes than per_query
    s = sparse_verify_work(1, 16, 32, 8, 128, "shared", 4, 16, 64, 132, SMEM)
    assert s.requested_bytes < w.requested_bytes and s.plan_compares == 0


def test_group_size_three_is_a_point_of_the_model():
    # C = 3 of 4 heads: 12 rows padded to 16, ceil(16 / 3) = 6 groups, each streaming its
    # union and the 16-row tail; priced by the same constants as C = 2 and 4.
    fit = PhysicalFit(2e-6, 1e-6, 0.9, 0.2, 2.0 * 3e12 / 7e14, 0.5, 1e-6, 2e-8, 1e-10)
    kw = dict(list_blocks=48.0, unique_kv_bytes=0.0)
    w = sparse_verify_work(16, 16, 32, 8, 128, "union", 3, 32, 64, 132, SMEM, **kw)
    assert w.rows_pad == 16 and w.programs == 16 * 8 * 6 * w.num_splits
    other = 2 * 16 * 16 * 32 * 128 * 2 + 16 * 8 * 16 * 32 * 4
    assert w.requested_bytes == 16 * 8 * 6 * (48 * 64 + 16) * 512 + other
    times = {
        c: float(
            fit.call_time_s(
                sparse_verify_work(16, 16, 32, 8, 128, "union", c, 32, 64, 132, SMEM, **kw),
                3e12,
                7e14,
            )
        )
        for c in (2, 3, 4)
    }
    assert times[2] > times[3] > times[4] > 0  # fewer groups stream fewer lists of equal size


@pytest.mark.parametrize("op", ["dense", "sparse"])
def test_more_context_more_bytes_more_time(op):
    fit = PhysicalFit(2e-6, 1e-6, 0.9, 0.2, 2.0 * 3e12 / 7e14, 0.5, 1e-6, 2e-8, 1e-10)
    last_b = last_t = 0.0
    for ctx in (2048, 8192, 32768, 131072):
        if op == "dense":
            w = dense_verify_work(4, 8, ctx, 32, 8, 128, 132, SMEM)
        else:  # more context: more blocks selected at a fixed share of the context
            w = sparse_verify_work(4, 16, 32, 8, 128, "per_query", 1, ctx // 1024, 64, 132, SMEM)
        t = float(fit.call_time_s(w, 3e12, 7e14))
        assert w.requested_bytes > last_b and t > last_t
        last_b, last_t = w.requested_bytes, t


def test_split_rule_is_checked():
    with pytest.raises(ValueError, match="split_rule"):
        sparse_verify_work(1, 16, 32, 8, 128, "per_query", 1, 16, 64, 132, SMEM, split_rule="x")


def test_a_split_call_merges_in_its_launch_where_one_load_and_one_wave_hold_it():
    fused, launched = SparseVerifyConfig(), SparseVerifyConfig(fused_merge=False)
    # 8 splits of 16 packed rows at D = 128 and 4 warps: one load; 256 programs: one wave.
    assert merges_in_launch(fused, 8, 256, 16, 128, 4, 132)
    assert not merges_in_launch(launched, 8, 256, 16, 128, 4, 132)
    assert not merges_in_launch(fused, 1, 256, 16, 128, 4, 132)  # unsplit: nothing to merge
    assert not merges_in_launch(fused, 16, 256, 16, 128, 4, 132)  # two loads
    assert not merges_in_launch(fused, 4, 256, 64, 128, 4, 132)  # 64 rows: two splits a load
    assert not merges_in_launch(fused, 2, 528, 16, 128, 4, 132)  # two waves
    assert sparse_merge_steps(8, True) == 0  # one load in the epilogue
    assert sparse_merge_steps(8, False) == 1  # a merge launch reads 8 partials a row at once
    assert sparse_merge_steps(18, False) == 2  # 16 a step
    assert sparse_merge_steps(1, False) == 0
