"""ssvkit.perfmodel.select_work: block selection's work counts follow the launch plan the
kernels' wrapper makes (its tile, tiles-per-program, row-layout and warp choices mirrored
without torch), hand-computed at Llama-3.1-8B's heads on 132 SMs, and the step model's
selection op carries them."""

import dataclasses
import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from ssvkit.kernels import block_scores as sb
from ssvkit.kernels import top_blocks as tb
from ssvkit.perfmodel import pick_work as pk
from ssvkit.perfmodel import select_work as sw
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES
from ssvkit.perfmodel.columns import build_columns
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.selection_ops import select_plan_op
from ssvkit.perfmodel.strategy import Strategy, Workload

SMEM = 228 * 1024
DATA = Path(__file__).resolve().parents[2] / "validation" / "data"


def shape(**kw):
    base = dict(
        batch=16, t=16, num_q_heads=32, num_kv_heads=8, head_dim=128, context_len=131072, top_n=16
    )
    return sw.SelectShape(**{**base, **kw})


@pytest.mark.parametrize("num_tiles", [1, 100, 263, 264, 527, 528, 4223, 4224, 10**6])
def test_score_tiles_mirror_the_wrapper(num_tiles):
    with mock.patch.object(sb, "num_sms", return_value=132):
        assert sw.score_tiles(num_tiles, 132) == sb._score_tiles(num_tiles, torch.device("cpu"))


@pytest.mark.parametrize("nb", [1, 16, 129, 1025, 2048, 2049, 4096, 4200, 9000])
@pytest.mark.parametrize("top_n", [16, 64, 300])
def test_pick_layout_mirrors_top_blocks(nb, top_n):
    assert pk.row_layout(nb) == tb._row_layout(nb)
    meta = tb.threshold_meta(nb, top_n)
    chunk, tail, _ = tb._row_layout(nb)
    if meta is not None:
        rows = meta["TAIL_ROWS"] if meta["TAIL"] else 0
        assert pk.pick_row_elems(nb, top_n) == meta["CHUNK"] + rows * meta["GROUPS"]
    for rows in (1, 132, 133, 1056, 1057):
        with mock.patch.object(tb, "num_sms", return_value=132):
            assert pk.threshold_warps(rows, chunk, 132) == tb.threshold_warps(
                rows, chunk, torch.device("cpu")
            )


def test_score_tile_mirrors_the_wrapper():
    wide = set()
    for t in (1, 16, 17, 32, 33, 64):
        for kinds, method in ((1, "mean"), (2, "quest")):
            for d in (64, 128, 256):
                t_pad, block_nb, warps = sw.score_tile(t, kinds, d)
                assert t_pad == max(16, 1 << (t - 1).bit_length())
                assert (block_nb, 3) == sb._score_shapes(t_pad, d, method)[0]
                assert warps == sb.score_warps(t_pad, method)
                if t_pad == 32 and block_nb == 16:
                    wide.add((method, d))
    assert wide == {("quest", 128), ("quest", 256), ("mean", 256)}


def test_pick_sorts_mirror_the_threshold_picks_two_sorts():
    """The sorts counted are those of the kernel's plan: its group maxima and its candidates
    (``threshold_meta``), none where the rounds kernel serves the row; they grow with top_n."""
    for nb in (129, 2049, 4097, 9000):
        for top_n in (16, 64, 300):
            meta = tb.threshold_meta(nb, top_n)
            got = pk.pick_sorts(nb, top_n, 2)
            if meta is None:
                assert got == 0.0
            else:
                want = pk.sort_steps(meta["GROUPS"], 2) + pk.sort_steps(meta["CAP"], 2)
                assert got == want
    assert pk.pick_sorts(2049, 64, 1) > pk.pick_sorts(2049, 16, 1) > 0
    assert pk.sort_steps(64, 1) == 21 * 2  # 6 x 7 / 2 stages of two keys a lane


def test_threshold_warps_by_rows_and_chunk():
    # A row an SM: 4 warps (8 past 2048 blocks); many rows: 2 past 2048 blocks, else 2, then 1.
    assert [pk.threshold_warps(132, c, 132) for c in (512, 2048, 4096)] == [4, 4, 8]
    assert [pk.threshold_warps(1056, c, 132) for c in (512, 2048, 4096)] == [2, 2, 2]
    assert [pk.threshold_warps(1057, c, 132) for c in (512, 2048, 4096)] == [1, 1, 2]


def test_score_programs_walk_two_to_four_tiles():
    assert [sw.score_tiles(n, 132) for n in (1, 1052, 1053, 10**6)] == [2, 2, 4, 4]


def test_two_launch_counts_hand_computed():
    # The threshold pick over whole rows.
    # 16 x 8 pairs, NB = ceil(131088 / 64) = 2049 blocks, 65 tiles of 32 a pair: 8320 tiles,
    # 4 a program (2080 programs >= 264), 17 programs a pair = 2176, 17 an SM; two mean tiles
    # of 32 x 128 x 4 B in flight, an 8 KiB query tile and a 2 KiB score tile -> 5 per SM: 3
    # waves of 10 warps (2.5 a sub-partition) and one of 4 warps, 8.5 alone-issue waves, of 4
    # tiles of half a unit each (a [16, 32, 128] tile over 2 warps).
    w = sw.select_call_work(
        shape(), fused=False, num_sms=132, smem_per_sm_bytes=SMEM, tile_pick=False
    )
    assert w.chain_tiles == (3 * 2.5 + 1) * 4 and w.tile_work == 0.5
    # 2048 rows of one warp, 16 rows an SM, 1 wave; 2048 + 2 x 64 elements over 1 warp.
    assert w.pick_rows == 2048
    assert w.pick_chain == 1 * (2048 + 2 * 64) / 1
    assert w.pick_tail_chain == 1 * (2 * 64) / 1
    assert w.launches == 2
    scores = 2048 * 2049 * 4
    meta = 128 * 2049 * 128 * 4
    queries = 2176 * 16 * 4 * 128 * 2
    assert w.requested_bytes == meta + queries + 2 * scores + 2048 * 16 * 4 + 2048 * 32 * 8
    # Deduplicated: each of the 128 pairs' 16 x 4 query rows once, not once per its 17 programs.
    assert w.unique_bytes == w.requested_bytes - queries + 128 * 16 * 4 * 128 * 2
    assert w.flops == 3 * 2 * 128 * 16 * 65 * 32 * 128
    # Each program loads its G = 4 query heads of [16, 128] together: one tile over 2 warps of
    # 32 lanes, 4 waves.
    assert w.query_chain == 4 * 16 * 128 / (2 * 32)


def test_tile_pick_counts_hand_computed():
    """The two launches' tile pick at batch 16, 128K, t = 16: 2049 blocks in 65 tiles of 32
    (the score tile's blocks), 14 regular picks and two edges gathered as 16 tiles, 32
    candidates; 2048 one-warp rows, 32 an SM, one wave."""
    plan = pk.tile_pick_plan(2049, 16, 1, 1, 32)
    assert plan == dict(TOP_N=16, TOP_N_PAD=16, W=32, NT_PAD=128, S_CAP=16, GROUPS=64, CAP=32)
    kw = dict(fused=False, num_sms=132, smem_per_sm_bytes=SMEM, tile_pick=True)
    w = sw.select_call_work(shape(), **kw)
    assert w.pick_chain == 16 * 32 and w.pick_tail_chain == 0
    # Bitonic sorts of 128 maxima (28 stages of 4 keys a lane) and 32 candidates (15 of 1).
    assert w.sort_chain == 28 * 4 + 15
    meta = 128 * 2049 * 128 * 4
    queries = 2176 * 16 * 4 * 128 * 2
    per_row = (2049 + 2 * 65 + 16 * 32 + 16 + 32) * 4 + 16 * 4
    assert w.requested_bytes == meta + queries + 2048 * per_row
    # A row shorter than the gathered tile reads only its own blocks.
    short = sw.select_call_work(shape(context_len=8192), **kw)
    assert short.pick_chain == 16 * 32
    # A top_n whose gathered tile passes a register chunk has no tile pick: the threshold
    # pick's rounds walk the row.
    assert pk.tile_pick_plan(2049, 256, 1, 1, 32) is None
    wide = sw.select_call_work(shape(top_n=256), **kw)
    assert wide.pick_chain == pk.pick_row_elems(2049, 256)


def test_the_tile_pick_pays_on_busy_sms_and_rows_longer_than_its_reads():
    """``tile_pick_pays``: 32-block tiles, top_n 16, one sink and one local block gather 16
    tiles (512 blocks). 128K (2,049 blocks, 2,176 values a row): 65 maxima + 512 < 2,049, so
    from 745 rows on 132 SMs (12,288 values an SM); 32K (513 blocks): 17 + 512 >= 513, never.
    The position-relative rule (no local block) gathers 32 tiles: 33 + 1,024 >= 1,025 at 64K."""
    assert pk.pick_row_elems(2049, 16) == 2176
    assert pk.tile_pick_pays(2048, 2049, 16, 1, 1, 32, 132)
    assert pk.tile_pick_pays(746, 2049, 16, 1, 1, 32, 132)
    assert not pk.tile_pick_pays(745, 2049, 16, 1, 1, 32, 132)
    assert not pk.tile_pick_pays(512, 2049, 16, 1, 1, 32, 132)
    assert pk.tile_pick_pays(512, 4097, 16, 1, 1, 32, 132)
    assert not pk.tile_pick_pays(4096, 513, 16, 1, 1, 32, 132)
    assert not pk.tile_pick_pays(4096, 1025, 16, 1, 0, 32, 132)
    assert pk.tile_pick_pays(2048, 2049, 16, 1, 0, 32, 132)
    assert not pk.tile_pick_pays(2048, 2049, 256, 1, 1, 32, 132)  # no tile pick plan


def _pick_measurements():
    """The committed tile pick against the whole-row pick: one ``(row, record)`` per case."""
    for path in sorted(DATA.glob("select-picks-*.json")):
        record = json.loads(path.read_text())
        yield from ((row, record) for row in record["rows"])


def test_the_tile_pick_rule_agrees_with_the_committed_timings():
    """Each committed case where one pick is more than 1% faster (validation/data
    select-picks-*): ``tile_pick_pays`` chooses that pick for the case's rows, blocks, rule and
    score tile width. Within 1% either choice is right."""
    cases = decided = 0
    for row, rec in _pick_measurements():
        _, hkv, d = rec["heads"]
        t, rule = row["t"], row["rule"]
        nb = row["context_len"] // rec["block_size"] + 1
        width = sb.score_block_nb(max(16, pk.pow2(t)), d, row["method"])
        local = 1 if rule == "prefix" else 0
        rows = row["batch"] * hkv * t
        pays = pk.tile_pick_pays(rows, nb, row["top_n"], 1, local, width, rec["num_sms"])
        ratio = min(row["graph_s"]["tile"].values()) / row["graph_s"]["whole_rows"]
        cases += 1
        if abs(ratio - 1) > 0.01:
            decided += 1
            assert pays == (ratio < 1), (row["method"], rule, row["batch"], nb, t, ratio)
    assert cases >= 72 and decided >= 64


def test_the_two_launches_take_the_pick_that_pays():
    """``select_call_work``'s default prices the pick ``tile_pick_pays`` chooses: the tile
    pick at batch 16, 128K, t = 16 (2,048 rows), the threshold pick at batch 1 (128 rows)."""
    kw = dict(fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    for s, tiled in ((shape(), True), (shape(batch=1), False)):
        auto = sw.select_call_work(s, **kw)
        assert auto == sw.select_call_work(s, **kw, tile_pick=tiled)
        assert auto != sw.select_call_work(s, **kw, tile_pick=not tiled)


def test_the_pick_tail_is_the_rows_past_the_chunk():
    """A row of 1,025 + 1,024 blocks (96K and 16 rows) is a chunk of 1,024 and a tail tile of
    1,024 (16 group rows of 64); one of 2,049 a chunk of 2,048 and two group rows; a row that
    the rounds kernel walks has no tail."""
    assert pk.pick_tail_elems(1537, 16) == 1024 and pk.pick_row_elems(1537, 16) == 2048
    assert pk.pick_tail_elems(2049, 16) == 2 * 64
    assert pk.pick_tail_elems(2048, 16) == 0
    assert pk.pick_tail_elems(9000, 16) == 0
    w = sw.select_call_work(
        shape(batch=1, context_len=96 * 1024),
        fused=False,
        num_sms=132,
        smem_per_sm_bytes=SMEM,
    )
    # 128 rows on 132 SMs: 4 warps a row, one wave.
    assert w.pick_tail_chain == 1024 / 4 and w.pick_chain == 2048 / 4


def test_warps_past_four_an_sm_share_its_sub_partitions():
    # 3 programs of 2 warps an SM, 2 resident: a wave of 4 warps issues alone, one of 2 too.
    assert sw.shared_waves(3, 2, 2) == 2.0
    # 8 resident programs of 2 warps: 16 warps share 4 sub-partitions, four times one's time.
    assert sw.shared_waves(8, 8, 2) == 4.0 and sw.shared_waves(9, 8, 2) == 5.0


def test_the_query_scratch_grows_with_the_rows():
    # Mean, 32 blocks of 128: two 16 KiB tiles in flight, 8, 16, 32 KiB of query tile and 2, 4,
    # 8 KiB of score tile at 16, 32, 64 rows.
    assert sw.score_shared_bytes(16, 32, 128, 1) == 2 * 16384 + 8192 + 2048
    # Each resident program also takes the 1 KiB the runtime reserves a block.
    assert [sw.resident_score_programs(32, 128, 1, 2, SMEM, t) for t in (16, 32, 64)] == [
        SMEM // (43008 + 1024),
        SMEM // (53248 + 1024),
        SMEM // (73728 + 1024),
    ]
    # 28 KiB programs: 7 an SM of 228 KiB, not 8.
    assert sw.resident_score_programs(32, 64, 1, 2, SMEM, 32) == 7


def test_warpgroup_tiles_keep_one_more_metadata_tile_where_it_fits():
    # 64 rows over 4 warps: a warpgroup MMA reads its operand from shared memory, so the
    # pipeline keeps 3 metadata tiles, not 2 (the compiled kernels' shared memory,
    # validation/data/score-tiles-h200.json: 118,784 B for block means at D = 256).
    tile, fixed = 16 * 256 * 4, 64 * 256 * 4 + 64 * 16 * 4
    assert sw.score_shared_bytes(64, 16, 256, 1, warps=2) == 2 * tile + fixed == 102400
    assert sw.score_shared_bytes(64, 16, 256, 1, warps=4) == 3 * tile + fixed == 118784
    assert sw.score_shared_bytes(32, 16, 256, 1, warps=4) == 2 * 16 * 256 * 4 + 32 * 256 * 4 + 2048
    # So one such program an SM, not two.
    assert sw.resident_score_programs(16, 256, 1, 4, SMEM, 64) == 1
    # Quest at D = 256: a third tile would outgrow 227 KiB, and the pipeline keeps two.
    assert sw.score_shared_bytes(64, 16, 256, 2, warps=4, smem_per_sm_bytes=SMEM) == 200704


def test_one_launch_fits_where_its_smallest_score_shape_does():
    # One stage still passes one tile through shared memory.
    assert sw.score_shared_bytes(64, 16, 256, 2, stages=1) == 16 * 256 * 8 + 64 * 256 * 8 + 4096
    # Every shape of at most 64 rows fits 227 KiB; quest at 256 wide heads past 32 rows
    # outgrows 128 KiB.
    assert sw.one_launch_fits(64, 256, 2, SMEM)
    small = 128 * 1024
    assert not sw.one_launch_fits(40, 256, 2, small) and sw.one_launch_fits(32, 256, 2, small)
    assert sw.one_launch_fits(64, 256, 1, small) and sw.one_launch_fits(64, 128, 2, small)


def test_query_averaging_waits_for_one_query_tile_whatever_the_group():
    # The group's loads are in flight together: the prologue counts one [T_PAD, D] tile a
    # lane, 16 x 128 over 2 warps' 64 lanes in each of 4 waves, at any group size; the bytes
    # still grow.
    g4 = sw.select_call_work(shape(), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    g16 = sw.select_call_work(
        shape(num_q_heads=128), fused=False, num_sms=132, smem_per_sm_bytes=SMEM
    )
    assert g16.chain_tiles == g4.chain_tiles and g16.flops == g4.flops
    assert g16.query_chain == g4.query_chain == 4 * 16 * 128 / 64
    assert g16.requested_bytes > g4.requested_bytes


def test_counts_follow_the_plan():
    two = sw.select_call_work(shape(), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    # Quest reads two tensors a tile: twice the tile's work, half the resident programs.
    quest = sw.select_call_work(shape(kinds=2), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    # 17 programs an SM, 2 resident of 4 warps: 8 waves of 8 warps and one of 4, 17 alone-issue
    # waves (8.5 at mean), of 4 tiles of twice the work over twice the warps (half a unit
    # each).
    assert two.chain_tiles == 8.5 * 4 and quest.chain_tiles == 17 * 4
    assert two.tile_work == quest.tile_work == 0.5
    # One launch: the pick programs hold the scoring's shared memory, 5 an SM, so 4 waves,
    # and take the scoring's 2 warps, more than the pick's 1.
    one = sw.select_call_work(shape(), fused=True, num_sms=132, smem_per_sm_bytes=SMEM)
    assert one.launches == 1 and one.pick_chain == 4 * (2048 + 2 * 64) / 2
    # 32 draft rows pad to a 32-row tile of twice the work, whose 16 KiB query and 4 KiB score
    # tiles leave 4 programs an SM: 4 waves of 8 warps (2 a sub-partition) and one of 2 warps.
    t32 = sw.select_call_work(shape(t=32), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    assert t32.chain_tiles == (4 * 2 + 1) * 4 and t32.tile_work == 1.0


def test_arrays_match_scalar_calls_and_count_nothing_off():
    out = sw.select_work_arrays(
        {
            "batch": np.array([16, 0]),
            "t": 16,
            "num_q_heads": 32,
            "num_kv_heads": 8,
            "head_dim": 128,
            "context_len": 131072,
            "top_n": 16,
            "block_size": 64,
            "kinds": 1,
        },
        fused=False,
        num_sms=132,
        smem_per_sm_bytes=SMEM,
    )
    w = sw.select_call_work(shape(), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    assert out["chain_tiles"][0] == w.chain_tiles and out["pick_chain"][0] == w.pick_chain
    assert out["tile_work"][0] == w.tile_work
    assert out["requested_bytes"][1] == 0


def test_bad_shape_is_refused():
    with pytest.raises(ValueError, match="kinds"):
        shape(kinds=3)
    with pytest.raises(ValueError, match="num_q_heads"):
        shape(num_q_heads=12, num_kv_heads=8)
    with pytest.raises(ValueError, match="num_local must be >= 0, got -1"):
        shape(num_local=-1)


def test_one_launch_scores_at_the_more_warps_of_the_two_steps():
    # Batch 1: 128 rows pick at 4 warps (a row an SM), the mean scoring takes 2; the one launch
    # runs its score programs at 4, which share each program's query loads (264 programs, one
    # wave either way).
    one = sw.select_call_work(shape(batch=1), fused=True, num_sms=132, smem_per_sm_bytes=SMEM)
    two = sw.select_call_work(shape(batch=1), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    assert two.query_chain == 1 * 16 * 128 / (2 * 32)
    assert one.query_chain == two.query_chain / 2
    # Its 4 warps halve each tile's work a warp issues, and a wave of its programs shares the
    # sub-partitions twice as densely: the same work in series.
    assert one.tile_work == two.tile_work / 2 and one.chain_tiles == 2 * two.chain_tiles


def test_sixty_four_rows_walk_more_tiles_of_less_work_than_thirty_two():
    # 64 rows: 16-block tiles over 4 warps, half a unit each; 32 rows: 32-block tiles over 2
    # warps, a unit each. Twice the tiles a program, and its 4 warps share the sub-partitions
    # more densely: more than twice the tiles in series, each of half the work, so a fixed
    # cost a tile (its loads' wait, its barriers) weighs more at 64 rows.
    t32 = sw.select_call_work(shape(t=32), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    t64 = sw.select_call_work(shape(t=64), fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    assert (t32.tile_work, t64.tile_work) == (1.0, 0.5)
    assert t64.chain_tiles > 2 * t32.chain_tiles


def test_the_engine_rule_gathers_twice_the_tiles():
    """Under the engine's position-relative rule (no forced local block) the tile pick gathers
    32 tiles of 32 blocks at top_n 16: at 64K (1,025 blocks) that is a whole row, so 2,048
    rows take the threshold pick there, where the prefix rule's 16 tiles take the tile pick;
    at 128K both take it, the relative rule walking twice the gathered blocks."""
    kw = dict(fused=False, num_sms=132, smem_per_sm_bytes=SMEM)
    prefix64, rel64 = shape(context_len=65536), shape(context_len=65536, num_local=0)
    assert sw.select_call_work(prefix64, **kw) == sw.select_call_work(
        prefix64, **kw, tile_pick=True
    )
    assert sw.select_call_work(rel64, **kw) == sw.select_call_work(rel64, **kw, tile_pick=False)
    rel128 = sw.select_call_work(shape(num_local=0), **kw)
    assert rel128.pick_chain == 2 * sw.select_call_work(shape(), **kw).pick_chain


def test_the_step_models_selection_takes_the_engines_rule():
    """The step model's selection op (``perfmodel.selection_ops``) counts the engine's call:
    the position-relative rule, so at batch 16, 64K and 17 rows the threshold pick."""
    llama = get_model("llama-3.1-8b")
    s = dataclasses.replace(
        Strategy.from_name("ssv"), metadata="mean", mode="per_query", group_size=1
    )
    c = build_columns(llama, [(s, Workload(context_len=65536, batch=16))])
    t = int(c.rows[0])
    op = select_plan_op(llama, c, c.rows, 32, 8, np.ones(1), 132, "select_blocks/mean/two_launch")
    want = sw.select_call_work(
        shape(context_len=65536, t=t, num_local=0),
        fused=False,
        num_sms=132,
        smem_per_sm_bytes=DEFAULT_SMEM_PER_SM_BYTES,
    )
    assert op.stage_counts[0][0] == want.pick_chain
    assert op.bytes[0] == want.requested_bytes
    assert op.dedup_bytes[0] == want.unique_bytes < want.requested_bytes
