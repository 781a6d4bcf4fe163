"""ssvkit.perfmodel.nsa_plan: the NSA kernels' launch plan (hand-computed at the tiny pair's and
Llama-3.1-8B's heads on 132 SMs), and the step model's NSA ops carrying it.

The cross-check against the wrapper itself (``kernels.nsa_verify``) is in
``tests/kernels/test_nsa_verify.py`` (it needs torch)."""

import dataclasses

import numpy as np
import pytest
from ssvkit.calibration import ceilings
from ssvkit.perfmodel.calibrated import CalibratedPredictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.nsa_plan import (
    COMPRESSED_CTAS_PER_SM,
    WGMMA_ROW_COST,
    is_packed,
    merge_steps,
    mma_row_cost,
    num_splits,
    row_tiles,
    tile_packing,
    tile_rows_of,
)
from ssvkit.perfmodel.nsa_slots import (
    branch_tiles,
    compressed_capacity,
    launch_makespan,
    plan_slots,
    split_slots,
)
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.profiles import Profile, profile_path
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload

SMS = 132
# The engine's trained tiny target (engine/checkpoints/tiny-target/config.json).
TINY = ModelSpec(
    name="tiny-pair",
    family="llama",
    num_layers=8,
    hidden_size=512,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=640,
    vocab_size=256,
)


@pytest.mark.parametrize(
    ("t", "block_m", "tiles", "splits", "fused_reuse", "fused_refresh", "unfused"),
    [
        # 8 q / 2 KV heads: G_pad = 4; BLOCK_M = max(16, min(64, next_pow2(4 t)))
        (1, 16, 1, 64, 64, 64, 192),
        (3, 16, 1, 64, 64, 64, 192),
        (5, 32, 1, 64, 64, 64, 192),
        (12, 64, 1, 64, 64, 64, 192),
        (16, 64, 1, 64, 64, 64, 192),
        (17, 64, 2, 33, 33, 33, 99),  # two row tiles of 16 draft rows: 132 // 4 splits
        (64, 64, 4, 16, 16, 16, 48),
    ],
)
def test_tiny_heads_plan_hand_computed(
    t, block_m, tiles, splits, fused_reuse, fused_refresh, unfused
):
    bm, nt = row_tiles(t, 8, 2)
    assert (bm, nt) == (block_m, tiles)
    assert num_splits(t, 8, 2, 1, SMS) == splits
    assert merge_steps(t, 8, 2, 1, SMS, fused=True, refresh=False) == fused_reuse
    assert merge_steps(t, 8, 2, 1, SMS, fused=True, refresh=True) == fused_refresh
    assert merge_steps(t, 8, 2, 1, SMS, fused=False, refresh=False) == unfused
    assert merge_steps(t, 8, 2, 1, SMS, fused=False, refresh=True) == unfused


def test_full_grid_is_one_pass_except_the_refresh_split():
    """32 q / 8 KV heads, batch 16, t = 16: 128 programs fill the SMs, one fused pass (no
    merge), but a refresh call still splits three ways for its compressed partials."""
    assert num_splits(16, 32, 8, 16, SMS) == 1
    assert merge_steps(16, 32, 8, 16, SMS, fused=True, refresh=False) == 0
    assert merge_steps(16, 32, 8, 16, SMS, fused=True, refresh=True) == 3
    assert merge_steps(16, 32, 8, 16, SMS, fused=False, refresh=True) == 0
    # batch 1: 8 programs, 16 splits each
    assert merge_steps(16, 32, 8, 1, SMS, fused=False, refresh=False) == 48


def test_plan_is_vectorised_over_points():
    t = np.array([1.0, 5.0, 17.0])
    steps = merge_steps(
        t, 8, 2, np.array([1.0, 1.0, 1.0]), SMS, fused=np.array([1, 0, 1]), refresh=0
    )
    np.testing.assert_array_equal(steps, [64, 192, 33])
    np.testing.assert_array_equal(row_tiles(t, 8, 2)[0], [16, 32, 64])


def _nsa(tree: str, fusion: str = "none", refresh_every: int = 1, mode: str = "shared") -> Strategy:
    """An NSA strategy, by default with packed row tiles (the measured rows' geometry)."""
    return Strategy(
        name="nsa",
        tree=tree,
        attention="sparse",
        mode=mode,
        group_size=4,
        top_n=16,
        block_size=64,
        window=512,
        refresh_every=refresh_every,
        fusion=fusion,
    )


def test_step_model_nsa_ops_carry_the_launch_plan():
    """The tiny pair's verify forward at t = 12 and t = 17 rows: each NSA op carries, per
    call, the merge steps and row tile of the plan the kernels make on this GPU's SMs."""
    gpu = get_gpu("h100-sxm", measured=False)
    w = Workload(context_len=16384)
    pts = [(_nsa("chain:11"), w), (_nsa("chain:16"), w), (_nsa("chain:11", "refresh_reuse", 2), w)]
    c = build_columns(TINY, pts)
    p = predict_columns(TINY, c, RooflinePredictor(gpu, tp=c.tp))
    assert list(c.rows) == [12, 17, 12]
    unf = p.ops["verify.sparse_attention_refresh"]
    calls = np.asarray(unf.calls)
    assert calls[0] == calls[1] == TINY.num_layers and calls[2] == 0
    np.testing.assert_array_equal((unf.serial_steps / np.maximum(calls, 1))[:2], [192, 99])
    # 64-row tiles: wgmma, priced as 32 mma.sync rows (nsa_plan.mma_row_cost)
    np.testing.assert_array_equal((unf.tile_rows / np.maximum(calls, 1))[:2], [32, 32])
    reuse, refresh = (
        p.ops["verify.sparse_attention_fused"],
        p.ops["verify.sparse_attention_fused_refresh"],
    )
    assert float(reuse.calls[2]) == float(refresh.calls[2]) == TINY.num_layers / 2
    assert float(reuse.serial_steps[2]) == 64 * TINY.num_layers / 2
    assert float(refresh.serial_steps[2]) == 64 * TINY.num_layers / 2
    # Tensor parallelism halves the local heads: 4 q / 1 KV head per rank (t = 5: a 32-row
    # tile, one program per tile before splitting, 64 splits).
    c2 = build_columns(TINY, [(_nsa("chain:4"), dataclasses.replace(w, tp=2))])
    p2 = predict_columns(TINY, c2, RooflinePredictor(gpu, tp=c2.tp))
    op2 = p2.ops["verify.sparse_attention_refresh"]
    want = merge_steps(5, 4, 1, 1, SMS, fused=0, refresh=1)
    assert float(op2.serial_steps[0]) / TINY.num_layers == want == 192
    assert float(op2.tile_rows[0]) / TINY.num_layers == 32


def test_predictions_price_the_kernels_default_branch_streams():
    """The step model's unfused NSA ops carry the slot plan of the branches as
    ``NsaVerifyConfig``'s default runs them (side by side): fewer merge steps than in series."""
    from ssvkit.kernels.nsa_config import NsaVerifyConfig
    from ssvkit.perfmodel.nsa_plan import DEFAULT_BRANCH_STREAMS
    from ssvkit.perfmodel.nsa_work import nsa_work_arrays
    from ssvkit.perfmodel.ops import local_heads
    from ssvkit.perfmodel.sparse_ops import nsa_shape

    assert DEFAULT_BRANCH_STREAMS == NsaVerifyConfig().branch_streams
    gpu = get_gpu("h100-sxm", measured=False)
    c = build_columns(TINY, [(_nsa("chain:11"), Workload(context_len=16384))])
    p = predict_columns(TINY, c, RooflinePredictor(gpu, tp=c.tp))
    shape = nsa_shape(TINY, c, *local_heads(TINY, c.tp))
    assert shape["branch_streams"] == int(NsaVerifyConfig().branch_streams)
    kw = dict(fused=False, refresh=True, num_sms=gpu.num_sms)
    side = nsa_work_arrays(shape, **kw)["merge_steps"]
    series = nsa_work_arrays({**shape, "branch_streams": 0}, **kw)["merge_steps"]
    plan = p.ops["verify.sparse_attention_refresh"].slot_plan
    np.testing.assert_array_equal(plan.serial_steps / plan.calls, side)
    assert np.all(side < series)


@pytest.mark.skipif(profile_path("h100-sxm") is None, reason="no committed H100 profile")
def test_calibrated_nsa_time_orders_the_plans_as_their_rows_do():
    """At the tiny pair's heads, the committed H100 rows of the fused reuse call at t = 12 (one
    packed tile) and t = 17 (two tiles) order the two plans; the calibrated prediction orders
    them the same way, and still grows with the context at a fixed plan."""
    gpu = get_gpu("h100-sxm")
    profile = Profile.load(profile_path("h100-sxm"), gpu="h100-sxm")

    def verify_attention_s(tree, context_len):
        c = build_columns(
            TINY, [(_nsa(tree, "refresh_reuse", 8), Workload(context_len=context_len))]
        )
        p = predict_columns(TINY, c, CalibratedPredictor(gpu, profile, tp=c.tp))
        return float(p.op_seconds["verify.sparse_attention_fused"][0])

    def measured_s(t):
        return np.median(
            [
                r["median_s"]
                for r in ceilings.profile_rows("h100-sxm")
                if r["op"] == "nsa_verify"
                and r["timing"] == "graph"
                and (r["params"]["num_q_heads"], r["params"]["batch"]) == (8, 1)
                and (r["params"]["impl"], r["params"]["mode"]) == ("fused", "reuse")
                and (r["params"]["context_len"], r["params"]["num_query_tokens"]) == (16384, t)
            ]
        )

    faster = measured_s(12) < measured_s(17)
    assert (verify_attention_s("chain:11", 16384) < verify_attention_s("chain:16", 16384)) == faster
    assert verify_attention_s("chain:11", 30720) >= verify_attention_s("chain:11", 8192)
    assert verify_attention_s("chain:2", 16384) < verify_attention_s("chain:4", 16384)


@pytest.mark.parametrize(
    ("t", "rows_per_tile", "block_m", "tiles", "splits"),
    [
        # 8 q / 2 KV heads: one draft row a tile is t tiles of 16 MMA rows (4 heads padded)
        (17, 1, 16, 17, 3),
        (12, 1, 16, 12, 5),
        (17, 4, 16, 5, 13),  # union C = 4
        (17, 3, 16, 9, 7),  # C = 3 packs 2 rows a tile (a power of two)
        (17, 16, 64, 2, 33),  # C = 16: the packed tiles
        (17, 32, 64, 2, 33),  # never more than the packed tile holds
        (1, 1, 16, 1, 64),  # one row: the packed call
    ],
)
def test_row_schedule_sets_the_tiles_hand_computed(t, rows_per_tile, block_m, tiles, splits):
    bm, nt = row_tiles(t, 8, 2, rows_per_tile)
    assert (bm, nt) == (block_m, tiles)
    assert num_splits(t, 8, 2, 1, SMS, rows_per_tile) == splits  # 132 // (2 KV heads x tiles)
    packed = tiles == row_tiles(t, 8, 2)[1]
    assert bool(is_packed(t, 8, 2, rows_per_tile)) == packed


def test_per_query_nsa_loads_every_rows_own_blocks_and_union_tiles_their_unions():
    """Selected bytes of one NSA call at 32K (no cap binds): one draft row a tile streams
    t x top_n blocks, tiles of C rows ceil(t / C) unions of n (1 + (C - 1)(1 - gamma)) blocks,
    the packed schedule one union of all t rows (what the measured rows count); the compressed
    tokens and the window are counted once whatever the schedule."""
    gpu = get_gpu("h100-sxm", measured=False)
    w = Workload(context_len=32768, overlap=0.75)
    modes = [("per_query", "chain:16"), ("union", "chain:16"), ("shared", "chain:16")]
    c = build_columns(TINY, [(_nsa(tree, mode=m), w) for m, tree in modes])
    p = predict_columns(TINY, c, RooflinePredictor(gpu, tp=c.tp))
    n, bs, t = 16, 64, 17
    union = lambda rows: n * (1 + (rows - 1) * 0.25)  # noqa: E731
    blocks = [t * n, 4 * union(4) + union(1), union(17)]
    kv_tok = 2 * TINY.num_kv_heads * TINY.head_dim * 2
    comp, win = 32768 // 16, 512
    qo = 2 * t * TINY.num_q_heads * TINY.head_dim * 2 + t * TINY.num_q_heads * 4
    gates = t * TINY.num_q_heads * 3 * 4
    for i, b in enumerate(blocks):
        op = "verify.sparse_attention_refresh" + ("_per_query" if i == 0 else "")
        want = kv_tok * (comp + b * bs + win + t) + qo + gates
        got = float(p.ops[op].bytes[i]) / TINY.num_layers
        assert got == pytest.approx(want)
    # Only the one-row schedule takes the per-query op (and class); the others keep theirs.
    assert np.asarray(p.ops["verify.sparse_attention_refresh_per_query"].calls).tolist() == [
        TINY.num_layers,
        0,
        0,
    ]


def test_wgmma_tiles_cost_half_a_row_each():
    """Below 64 rows the tile is mma.sync rows (16 at t = 1-3, 32 at t = 5, 8 q / 2 KV heads);
    a 64-row tile (t >= 9) takes the wgmma path at WGMMA_ROW_COST per row, so it costs a
    program less than twice a 32-row tile (measured: about the same)."""
    t = np.array([1, 3, 5, 9, 12, 17])
    np.testing.assert_array_equal(row_tiles(t, 8, 2)[0], [16, 16, 32, 64, 64, 64])
    np.testing.assert_array_equal(mma_row_cost(t, 8, 2), [16, 16, 32, 32, 32, 32])
    assert WGMMA_ROW_COST == 0.5
    # Llama-3.1-8B's heads at t = 16: G_pad = 4, a 64-row tile; at t = 1 a 16-row one
    assert float(mma_row_cost(16, 32, 8)) == 32 and float(mma_row_cost(1, 32, 8)) == 16


# (q heads, KV heads): Llama-3.1-8B (G = 4), a group of 7 padded to 8, one KV head per query
# head (G_pad 1: the 16-row cap binds under "fixed").
GEOMETRIES = [(32, 8), (28, 4), (8, 8)]
KW_GPU = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)


def _wrapper_plan(batch, t, hq, hkv, context, cfg):
    """kernels.nsa_launch's plan and slots of one call on a 132-SM GPU (meta tensors)."""
    torch = pytest.importorskip("torch")
    import ssvkit.kernels.nsa_launch as nl

    shape = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty((batch, t, hq, 128), **shape)
    k = torch.empty((batch, hkv, context + t, 128), **shape)
    ck = torch.empty((batch, hkv, (context - 32) // 16 + 1, 128), **shape)
    plan = nl.make_plan(q, k, ck, config=cfg, num_sink=1, num_local=1, sm_scale=None, **KW_GPU)
    cuda = torch.device("cuda", 0)
    return plan, nl.plan_slots(plan, cuda, cfg), nl.refresh_slots(plan, cuda, cfg)


@pytest.mark.parametrize("tile_plan", ["fixed", "fit", "fit_slots"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("wide_tile_elems", [0, 4096])
def test_tile_packing_equals_the_wrappers_at_every_head_dim(tile_plan, head_dim, wide_tile_elems):
    """``tile_packing`` at a head dim and wide-head cap equals ``kernels.nsa_launch``'s for
    head groups 1-32, t = 1..64 and rows_per_tile 0, 1, 4, 8."""
    import ssvkit.kernels.nsa_launch as nl

    for group in (1, 2, 3, 4, 8, 16, 32):
        for r in (0, 1, 4, 8):
            cfg = nl.NsaVerifyConfig(
                tile_plan=tile_plan, rows_per_tile=r, wide_tile_elems=wide_tile_elems
            )
            for t in range(1, 65):
                want = nl.tile_packing(t, group, cfg, head_dim)
                got = tile_packing(t, group, r, tile_plan, head_dim, wide_tile_elems)
                assert got == want, f"{tile_plan} D{head_dim} G{group} r{r} t{t}"
                if wide_tile_elems and group <= 16 and tile_plan != "fit_slots":
                    block_m, rows, _ = tile_rows_of(t, group, 1, r, tile_plan, head_dim)
                    got_of = (min(int(rows), t), int(block_m))
                    assert got_of == (min(want[0], t), want[2]), f"rows_of G{group} r{r} t{t}"


@pytest.mark.parametrize("tile_plan", ["fixed", "fit", "fit_slots"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}q{g[1]}kv")
def test_mirror_equals_the_wrappers_plan(monkeypatch, tile_plan, geometry):
    """Row tiles (``tile_rows_of``, ``tile_packing``) and slots (``plan_slots`` of
    ``branch_tiles``) equal ``kernels.nsa_launch``'s for t = 1..64, batch 1, 4, 16 and
    rows_per_tile 0, 1, 4."""
    import ssvkit.kernels.nsa_launch as nl

    monkeypatch.setattr(nl, "num_sms", lambda index: SMS)
    hq, hkv = geometry
    context = 32768
    for batch in (1, 4, 16):
        for r in (0, 1, 4):
            cfg = nl.NsaVerifyConfig(tile_plan=tile_plan, rows_per_tile=r)
            for t in range(1, 65):
                plan, slots, rslots = _wrapper_plan(batch, t, hq, hkv, context, cfg)
                block_m, rows, tiles = tile_rows_of(t, hq, hkv, r, tile_plan)
                where = f"{tile_plan} b{batch} t{t} r{r}"
                assert (plan.block_m, plan.num_tiles) == (block_m, tiles), where
                assert min(plan.rows, t) == min(rows, t), where
                packing = (plan.rows, plan.group_pad, plan.block_m)
                assert tile_packing(t, hq // hkv, r, tile_plan) == packing, where
                work = branch_tiles(
                    t,
                    int(rows),
                    nc_max=(context - 32) // 16 + 1,
                    nb_max=-(-(context + t) // 64),
                    top_n=16,
                    block_size=64,
                    block_n=64,
                    window=512,
                    overlap=cfg.expected_overlap,
                )
                programs = batch * hkv * int(tiles)
                mirror = [
                    plan_slots(work, on, programs, SMS, tile_plan=tile_plan)
                    for on in ((True, True, True), (True, False, False), (False, True, True))
                ]
                assert slots == mirror[0], where
                assert rslots == (mirror[1][0], *mirror[2][1:]), where


def test_fit_plan_keeps_t17_one_tile_and_its_programs_short():
    """Llama-3.1-8B's heads at 128K, batch 1: under "fixed" t = 17 is two tiles (16 + 1 rows)
    of 8 slots, which the kernel splits (5, 2, 1) on the full tile: its selected programs
    stream 3x the key tiles of t = 16's; "fit" keeps one 128-row tile and t = 16's slices."""
    ctx = 131072
    args = dict(nc_max=(ctx - 32) // 16 + 1, nb_max=ctx // 64 + 1, top_n=16, block_size=64)
    args.update(block_n=64, window=512, overlap=0.7)

    def longest(t, plan):
        _, rows, tiles = tile_rows_of(t, 32, 8, 0, plan)
        work = branch_tiles(t, int(rows), **args)
        slots = plan_slots(work, (True,) * 3, 8 * int(tiles), SMS, tile_plan=plan)
        units = tuple(int(np.ceil(w)) for w in work)
        split = split_slots(sum(slots), units, (True,) * 3)
        return max(-(-u // k) for u, k in zip(units, split, strict=True)), int(tiles)

    assert longest(16, "fixed") == (15, 1) == longest(16, "fit")
    assert longest(17, "fixed") == (45, 2)
    fit17, tiles = longest(17, "fit")
    assert tiles == 1 and fit17 <= 16


def _work_128k(t: int, rows: int) -> tuple[float, float, float]:
    """``branch_tiles`` of a row tile of ``rows`` of ``t`` draft rows at 128K, NSA's published
    geometry, overlap 0.7."""
    return branch_tiles(
        t,
        rows,
        nc_max=8191,
        nb_max=2049,
        top_n=16,
        block_size=64,
        block_n=64,
        window=512,
        overlap=0.7,
    )


def test_fit_slots_may_start_a_second_wave():
    """Four-row tiles at t = 17 (5 tiles x 8 KV heads = 40 programs): one wave leaves 3 slots,
    one a branch, so one program streams all 128 compressed tiles; "fit" takes more slots
    (a second wave of short programs) and its longest program is a quarter of that."""
    work = _work_128k(4, 4)
    fixed = plan_slots(work, (True,) * 3, 40, SMS)
    fit = plan_slots(work, (True,) * 3, 40, SMS, tile_plan="fit")
    assert fixed == (1, 1, 1)
    assert 40 * sum(fit) > SMS and fit[0] >= 4
    assert launch_makespan([10.0] * 3, 40, SMS) == 10.0  # 120 programs: one wave
    assert launch_makespan([10.0] * 4, 40, SMS) == 20.0  # 160: 28 start a second wave
    with pytest.raises(ValueError, match="tile_plan"):
        tile_rows_of(17, 32, 8, 0, "wide")


def test_a_lone_compressed_launch_of_one_slot_a_tile_takes_two_programs_an_sm():
    """Batch 16 at 8 KV heads, t = 1: 128 row tiles on 132 SMs. One wave gives the compressed
    branch alone one slot a tile; sized for two programs an SM it takes two. With all branches,
    or with few tiles (batch 1: 16 slots already), the sizing is unchanged."""
    work = _work_128k(1, 1)
    alone = (True, False, False)
    assert compressed_capacity(alone, 128, SMS, 2) == 2 * SMS
    assert plan_slots(work, alone, 128, SMS) == (2, 0, 0)
    assert plan_slots(work, alone, 128, SMS, compressed_ctas=1) == (1, 0, 0)
    assert plan_slots(work, alone, 8, SMS) == plan_slots(work, alone, 8, SMS, compressed_ctas=1)
    assert plan_slots(work, (True,) * 3, 128, SMS) == (1, 1, 1)
    for programs in (SMS // 2, SMS + 1):  # half a wave, or past one: unchanged
        assert compressed_capacity(alone, programs, SMS, 2) == SMS
    assert COMPRESSED_CTAS_PER_SM == 2
