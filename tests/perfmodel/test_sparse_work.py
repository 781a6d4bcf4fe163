"""ssvkit.perfmodel.sparse_work: a sparse verification call's work follows the launch plan its
wrapper makes (the same plan, on a grid of shapes), and a class fitted on that work prices a
longer serial walk higher at equal K/V bytes."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.sparse_plan import SparseVerifyConfig, sparse_tile_shape
from ssvkit.perfmodel.sparse_work import (
    SparseShape,
    grid_regime,
    group_lists,
    kernel_mode,
    launch_plan,
    num_lists,
    sparse_call_work,
    sparse_work_arrays,
    unique_blocks,
)

SMS, SMEM = 132, 228 * 1024
BLOCK_BYTES = 64 * 2 * 128 * 2  # one 64-token block's K and V at D = 128
SHAPE = SparseShape(
    batch=1,
    t=16,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    context_len=65536,
    mode="per_query",
    top_n=64,
)


def test_union_work_by_hand():
    """b16, 8 KV heads, t = 16, C = 4: 4 groups of 40 blocks (16 (1 + 3 x 0.5)), 512 lists
    on 264 slots: unsplit, 2 waves; the busiest program walks 40 blocks and the tail tile, the
    call 512 x 41 tiles over its 264 resident programs."""
    s = dataclasses.replace(SHAPE, batch=16, mode="union", group_size=4, top_n=16, overlap=0.5)
    w = sparse_call_work(s, num_sms=SMS, smem_per_sm_bytes=SMEM)
    assert launch_plan(s, SMS).num_splits == 1 and w.merge_steps == 0
    assert w.waves == 2 and w.row_cost == 16
    assert w.chain_tiles == pytest.approx(512 * 41 / 264)
    tail = 512 * 16 * 2 * 128 * 2
    io = 2 * 16 * 16 * 32 * 128 * 2 + 16 * 16 * 32 * 4 + 128 * 16 * 16 * 4 + 2 * 512 * 40 * 4
    assert w.requested_bytes == 512 * 40 * BLOCK_BYTES + tail + io
    # distinct: the union of 16 rows, 16 (1 + 15 x 0.5) = 136 blocks a (sequence, KV head)
    assert w.unique_bytes == 128 * 136 * BLOCK_BYTES + tail + io
    # One wave of 4 programs an SM slot, each sorting 4 x 16 keys over 4 warps (half a key a
    # thread): 6 x 7 / 2 compare-exchange steps and three scans of 6.
    assert w.plan_compares == 0.5 * (6 * 7 / 2 + 3 * 6)
    old = sparse_call_work(s, num_sms=SMS, smem_per_sm_bytes=SMEM, union_plan="compare")
    assert old.plan_compares == 4 * 4 * 16 * 16  # every member's ids against the group's
    assert w.row_waves == 2 * 16  # unsplit: two waves of 16-row tiles written once
    assert w.sm_tiles == pytest.approx(512 * 41 / 132)


def test_a_last_group_of_fewer_rows_holds_a_smaller_union():
    """t = 16 in groups of 3: five groups of 3 rows, 16 (1 + 2 x 0.5) = 32 blocks each, and one
    of 1 row, 16 blocks: a mean list of 176 / 6 blocks, the busiest program's list 32. A
    measured mean splits in the same ratio; groups of 4 are all alike."""
    s = dataclasses.replace(SHAPE, mode="union", group_size=3, top_n=16, overlap=0.5)
    assert group_lists(s) == pytest.approx((176 / 6, 32))
    assert group_lists(dataclasses.replace(s, list_blocks=22.0)) == pytest.approx(
        (22.0, 22.0 * 6 * 32 / 176)
    )
    four = dataclasses.replace(s, group_size=4)
    assert group_lists(four) == (40, 40)
    assert group_lists(dataclasses.replace(four, list_blocks=30.0)) == (30, 30)
    # the busiest program walks the whole groups' lists: more serial tiles than the mean's
    w3 = sparse_call_work(s, num_sms=SMS, smem_per_sm_bytes=SMEM)
    splits = launch_plan(s, SMS).num_splits
    assert w3.chain_tiles >= math.ceil(32 / splits) + 1


def test_split_programs_write_their_row_tiles_twice():
    """The batch-1 call splits its lists in two: its programs write fp32 partials (twice the
    bytes of the bf16 output) for the merge, so its row tiles count twice a wave."""
    w = sparse_call_work(SHAPE, num_sms=SMS, smem_per_sm_bytes=SMEM)
    assert launch_plan(SHAPE, SMS).num_splits == 2 and w.waves == 1
    assert w.row_waves == 2 * 16


def test_shared_reads_only_its_representatives_lists():
    """t = 16, C = 4, top_n 16 at overlap 0.5: the representatives are rows 0, 4, 8, 12, which
    share 0.5^4 of their blocks: 16 (1 + 3 (1 - 0.0625)) = 61 distinct blocks, not the 136 of
    all rows (nor the 64 blocks their four lists request); a measured union of the rows caps
    it."""
    s = dataclasses.replace(SHAPE, mode="shared", group_size=4, top_n=16, overlap=0.5)
    assert unique_blocks(s) == pytest.approx(16 * (1 + 3 * (1 - 0.5**4)))
    assert unique_blocks(dataclasses.replace(s, mode="union")) == pytest.approx(136)
    assert unique_blocks(dataclasses.replace(s, unique_blocks=40.0)) == 40.0


def test_a_group_of_one_runs_the_per_query_launch():
    """``union`` or ``shared`` with C = 1 (or one draft row) launch no plan and no masks: the
    per_query launch and work; arrays of mode codes (0 = per_query) map alike."""
    assert kernel_mode("union", 1, 16) == "per_query" and kernel_mode("shared", 4, 1) == (
        "per_query"
    )
    assert kernel_mode("union", 2, 16) == "union"
    assert kernel_mode(np.array([1, 2, 1]), np.array([1, 4, 4]), 16).tolist() == [0, 2, 1]
    one = dataclasses.replace(SHAPE, mode="union", group_size=1)
    pq = sparse_call_work(SHAPE, num_sms=SMS)
    assert sparse_call_work(dataclasses.replace(one, mode="per_query"), num_sms=SMS) == pq


def test_grid_regime_is_lists_against_sms():
    """Fewer group lists than SMs: ``few_lists``; a list an SM or more: ``many_lists``."""
    lists = num_lists(np.array([1, 1, 2, 16]), 8, 16, np.array([1, 4, 8, 4]))
    assert lists.tolist() == [128, 32, 32, 512]
    assert grid_regime(lists, 132).tolist() == ["few_lists", "few_lists", "few_lists", "many_lists"]
    assert grid_regime(np.array([131, 132]), 132).tolist() == ["few_lists", "many_lists"]


def test_more_serial_tiles_at_equal_kv_bytes_is_priced_higher():
    """The batch-1 call split in two walks half the tiles a program; the same call unsplit
    streams the same K/V bytes (and no partials) but each program walks twice the tiles in
    series, so a class with a chain cost prices it higher."""
    split = sparse_call_work(SHAPE, num_sms=SMS, smem_per_sm_bytes=SMEM)
    one = sparse_call_work(
        SHAPE, num_sms=SMS, smem_per_sm_bytes=SMEM, config=SparseVerifyConfig(num_splits=1)
    )
    assert launch_plan(SHAPE, SMS).num_splits == 2
    assert one.requested_bytes < split.requested_bytes  # the split call adds its partials
    assert one.chain_tiles == 65 and split.chain_tiles == 33
    cls = ClassFit(
        "sparse_verify/per_query",
        2e-6,
        (8.0,),
        (0.9,),
        (9.0,),
        (0.5,),
        0.5,
        t_depth_s=1e-6,
        t_step_s=1e-7,
        t_depth_row_s=1e-8,
        l2_bytes_per_flop=2.0 * 4.5e12 / 7.5e14,
        slot_plan=True,
    )

    def price(w):
        return float(
            cls.call_time_s(
                w.requested_bytes,
                w.mma_flops,
                4.5e12,
                7.5e14,
                w.unique_bytes,
                w.chain_tiles,
                w.merge_steps,
                w.row_cost,
                (w.waves,),
            )
        )

    assert price(one) > 1.5 * price(split)


def test_group_size_and_geometry_change_the_row_tile():
    """C x G packed rows padded to the MMA tile, counted per warpgroup: G = 4 packs C = 3 into
    16 rows, C = 5 into 32 (one warpgroup); G = 16 packs C = 4 into 64 rows and C = 8 into 128,
    both on 8 warps: two warpgroups of 32 rows, or of 64 wgmma rows that count half."""
    rows = {}
    for c, hq, hkv in ((3, 32, 8), (5, 32, 8), (4, 32, 2), (8, 32, 2)):
        s = dataclasses.replace(SHAPE, mode="union", group_size=c, num_q_heads=hq, num_kv_heads=hkv)
        rows[c] = sparse_call_work(s, num_sms=SMS, smem_per_sm_bytes=SMEM).row_cost
    assert rows == {3: 16, 5: 32, 4: 32, 8: 32}


def test_row_cost_counts_rows_of_128_dimensions():
    """The same row tile at D = 64 issues half the MMAs of D = 128 a K/V tile: half the row
    cost; the rows a slot writes in series (``row_waves``) count whole at either D."""
    work = {
        d: sparse_call_work(
            dataclasses.replace(SHAPE, head_dim=d), num_sms=SMS, smem_per_sm_bytes=SMEM
        )
        for d in (64, 128)
    }
    assert work[64].row_cost == work[128].row_cost / 2 == 8
    assert work[64].row_waves / work[64].waves == work[128].row_waves / work[128].waves


def test_wgmma_tiles_count_their_flops_at_their_rate():
    """A tile a warpgroup issues as wgmma (64 rows a warpgroup: G = 16, C = 8 on 8 warps) counts
    half its FLOPs against the mma.sync tiles of C = 2 (32 rows on 4 warps), whose padded
    FLOPs count whole: the compute term prices both at one rate."""
    flops = {}
    for c in (2, 8):
        s = dataclasses.replace(
            SHAPE, mode="union", group_size=c, num_q_heads=32, num_kv_heads=2, overlap=1.0
        )
        w = sparse_call_work(s, num_sms=SMS, smem_per_sm_bytes=SMEM)
        tiles = s.batch * s.num_kv_heads * s.num_groups * (64 + 1)
        flops[c] = w.mma_flops / (tiles * 64 * 128 * 4)
    assert flops == {2: 32, 8: 128 * 0.5}


def test_arrays_equal_the_scalar_work():
    shape = dict(
        batch=np.array([1, 4, 16, 0]),
        t=16,
        num_q_heads=np.array([32, 16, 40, 32]),
        num_kv_heads=np.array([8, 2, 8, 8]),
        head_dim=np.array([128, 64, 128, 128]),
        context_len=32768,
        group_size=3,
        top_n=32,
        overlap=0.7,
    )
    w = sparse_work_arrays(shape, "union", num_sms=SMS)
    for i, (b, hq, hkv, d) in enumerate([(1, 32, 8, 128), (4, 16, 2, 64), (16, 40, 8, 128)]):
        s = SparseShape(b, 16, hq, hkv, d, 32768, "union", group_size=3, top_n=32, overlap=0.7)
        one = sparse_call_work(s, num_sms=SMS)
        assert w["chain_tiles"][i] == one.chain_tiles
        assert w["requested_bytes"][i] == one.requested_bytes
        assert w["plan_compares"][i] == one.plan_compares
    assert w["requested_bytes"][3] == 0  # no batch, no work


@pytest.mark.parametrize("bad", [dict(mode="grouped"), dict(t=0), dict(overlap=1.5)])
def test_bad_shape_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        dataclasses.replace(SHAPE, **bad)


def test_the_plan_is_the_wrappers_plan_on_a_grid():
    """``launch_plan`` equals what ``kernels.sparse_launch.plan_launch`` launches (splits, row
    tile, warps, stages, programs) over batches, draft widths, geometries, modes, group sizes
    and top-n (meta tensors: the plan reads shapes only)."""
    torch = pytest.importorskip("torch")
    from ssvkit.kernels.group_plan import GroupPlan
    from ssvkit.kernels.sparse_launch import plan_launch
    from ssvkit.perfmodel.sparse_plan import SparseVerifyConfig as Config

    meta = torch.device("meta")
    grid = itertools.product(
        (1, 3, 16, 48),
        (4, 16, 23),
        ((32, 8, 128), (16, 2, 64), (40, 8, 128), (32, 2, 128)),
        (("per_query", 1), ("union", 3), ("union", 8), ("shared", 5)),
        (16, 64),
    )
    for b, t, (hq, hkv, d), (mode, c), top_n in grid:
        q = torch.empty((b, t, hq, d), dtype=torch.bfloat16, device=meta)
        k = torch.empty((b, hkv, 4096 + t, d), dtype=torch.bfloat16, device=meta)
        idx = torch.empty((b, hkv, t, top_n), dtype=torch.int32, device=meta)
        cc = 1 if mode == "per_query" else min(c, t)
        groups = -(-t // cc)
        plan = None
        if mode == "union":
            lists = torch.empty((b, hkv, groups, cc * top_n), dtype=torch.int32, device=meta)
            counts = torch.empty((b, hkv, groups), dtype=torch.int32, device=meta)
            plan = GroupPlan(mode, cc, groups, lists, lists, counts, None)
        la = plan_launch(q, k, idx, None, mode, c, cc, 64, None, plan, Config())
        shape = SparseShape(b, t, hq, hkv, d, 4096, mode, group_size=c, top_n=top_n)
        mine = launch_plan(shape, SMS)
        got = (la.num_splits, la.m_pad, la.num_warps, la.num_stages)
        assert got == (mine.num_splits, mine.m_pad, mine.num_warps, mine.num_stages)
        assert b * hkv * la.plan.num_groups * la.num_splits == mine.programs


@pytest.mark.parametrize("gpu", ["h200", "h100-sxm"])
def test_metadata_strategies_are_priced_by_the_committed_sparse_verify_classes(gpu):
    """A mean-key union strategy's attention at batch 1 and 8 is priced by the committed
    profile's ``sparse_verify/union/<regime>`` classes, not by the roofline."""
    from ssvkit.perfmodel.calibrated import make_predictor
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.perfmodel.step import build_columns, predict_columns
    from ssvkit.perfmodel.strategy import Strategy, Workload

    model = get_model("llama-3.1-8b")
    s = dataclasses.replace(Strategy.from_name("ssv"), metadata="mean", mode="union", group_size=4)
    c = build_columns(model, [(s, Workload(context_len=32768, batch=b)) for b in (1, 8)])
    predictor = make_predictor(get_gpu(gpu))
    p = predict_columns(model, c, predictor)
    for i, regime in enumerate(("few_lists", "many_lists")):  # 32 and 256 group lists
        op = p.ops[f"verify.sparse_verify_union_{regime}"]
        assert op.kernel == f"sparse_verify/union/{regime}"
        seconds, family, _ = predictor.price(op)
        assert family == "sparse_verify" and seconds[i] > 0 and seconds[1 - i] == 0


@pytest.mark.parametrize(
    ("group_size", "num_q_heads", "num_kv_heads", "head_dim", "m_pad", "warps"),
    [
        (4, 32, 8, 128, 16, 4),
        (8, 32, 8, 128, 32, 4),
        (8, 16, 2, 64, 64, 4),  # 64 x 64: 32 accumulator registers a thread on 4 warps
        (4, 32, 2, 128, 64, 4),  # 64 x 128: 64
        (8, 32, 2, 128, 128, 8),  # 128 x 128 would spill on 4 warps
        (8, 16, 1, 64, 128, 8),  # 128 rows: their score tiles take as many registers again
        (8, 8, 4, 256, 16, 4),
    ],
)
def test_warps_follow_the_accumulator(
    group_size, num_q_heads, num_kv_heads, head_dim, m_pad, warps
):
    """A program takes 4 warps up to an fp32 accumulator of 64 x 128 elements and 64 packed
    rows, else 8."""
    got = sparse_tile_shape(
        SparseVerifyConfig(), group_size, num_q_heads, num_kv_heads, 64, head_dim
    )
    assert got[:2] == (m_pad, warps)
    assert (
        sparse_tile_shape(
            SparseVerifyConfig(num_warps=2), group_size, num_q_heads, num_kv_heads, 64, head_dim
        )[1]
        == 2
    )
