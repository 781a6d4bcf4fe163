"""ssvkit.perfmodel.nsa_work: the NSA call's work follows the kernels' slot plan, and the
calibrated classes fitted on it price that plan (hand-computed at Llama-3.1-8B's heads)."""

import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.nsa_plan import forward_warps, tile_packing
from ssvkit.perfmodel.nsa_shape import NsaShape, forward_launches, live_launches
from ssvkit.perfmodel.nsa_slots import plan_slots, slot_counts, split_slots
from ssvkit.perfmodel.nsa_work import (
    launch_part,
    nsa_call_work,
    nsa_work_arrays,
    side_by_side,
    union_plan_work,
)

SMS, SMEM = 132, 228 * 1024
SHAPE = NsaShape(
    batch=1, t=17, num_q_heads=32, num_kv_heads=8, head_dim=128, context_len=32768, overlap=0.3
)


def test_seventeen_rows_at_group_four_pack_sixteen_plus_one():
    assert tile_packing(17, 4) == (16, 4, 64)
    assert tile_packing(17, 4, 1) == (1, 16, 16)
    assert tile_packing(17, 1) == (16, 1, 16)  # a tile holds at most 16 draft rows


def test_slots_fill_one_wave_and_split_by_work():
    # 8 programs on 132 SMs: 16 slots; 32 + 16 + 9 tiles at 2 a slot at least
    assert slot_counts((32, 16, 9), 8, SMS) == (9, 5, 2)
    assert slot_counts((32, 16, 9), 128, SMS) == (1, 1, 1)  # one slot a branch at least
    assert split_slots(16, (32, 16, 9), (True, True, True)) == (9, 4, 3)
    assert split_slots(3, (100, 1, 1), (True, True, True)) == (1, 1, 1)


def test_union_tile_walks_its_blocks_in_one_slot_at_batch_four():
    """b4: 64 programs leave 2 slots a tile, raised to one a branch: the 16-row tile's union
    (16 (1 + 15 x 0.7) = 184 blocks at overlap 0.3) is one program's chain."""
    w = nsa_call_work(
        dataclasses.replace(SHAPE, batch=4),
        fused=True,
        refresh=False,
        num_sms=SMS,
        smem_per_sm_bytes=SMEM,
    )
    assert w.chain_tiles == 184
    assert w.merge_steps == 3 and w.row_cost == 32


def test_twice_the_serial_tiles_at_equal_bytes_is_priced_higher():
    """Per-query tiles at batch 4 split each tile's blocks over few slots; the same bytes cut
    over more slots (batch 1, fewer programs) walk a shorter chain, and the class prices the
    longer chain higher at equal bytes."""
    cls = ClassFit(
        "nsa_verify/reuse/fused",
        1e-6,
        (6.0, 9.0),
        (0.8, 0.8),
        (6.0, 12.0),
        (0.5, 0.5),
        0.3,
        t_depth_s=1e-6,
        t_depth_row_s=1e-8,
        slot_plan=True,
    )
    short = nsa_call_work(SHAPE, fused=True, refresh=False, num_sms=SMS, smem_per_sm_bytes=SMEM)
    long_ = nsa_call_work(
        dataclasses.replace(SHAPE, batch=4),
        fused=True,
        refresh=False,
        num_sms=SMS,
        smem_per_sm_bytes=SMEM,
    )
    assert long_.chain_tiles >= 2 * short.chain_tiles
    args = (short.requested_bytes, 1e9, 4e12, 7e14, short.unique_bytes)
    t_short = cls.call_time_s(*args, short.chain_tiles, 0, short.row_cost)
    t_long = cls.call_time_s(*args, long_.chain_tiles, 0, long_.row_cost)
    assert t_long > 1.5 * t_short


def test_refresh_adds_a_launch_and_pick_rows():
    given = dataclasses.replace(SHAPE, union_given=1)
    reuse = nsa_call_work(given, fused=True, refresh=False, num_sms=SMS, smem_per_sm_bytes=SMEM)
    fresh = nsa_call_work(given, fused=True, refresh=True, num_sms=SMS, smem_per_sm_bytes=SMEM)
    assert fresh.pick_rows == 8 * 17 and reuse.pick_rows == 0
    # The compressed launch, then selected + window; a refresh builds its union plan (one wave)
    # whatever it is given, the reuse call streams the plan it is handed.
    assert reuse.waves == 1 and fresh.waves == 3
    assert fresh.requested_bytes > reuse.requested_bytes


def test_a_call_that_builds_its_union_plan_pays_its_launch():
    kw = dict(fused=True, refresh=False, num_sms=SMS)
    launches = live_launches(SHAPE, fused=True, refresh=False)
    # 16 + 1 rows a (sequence, KV head): one program per row tile, one wave
    waves, nbytes = union_plan_work(SHAPE, launches, **kw)
    nb_max = -(-(32768 + 17) // 64)
    assert waves == 1
    assert nbytes == 8 * 2 * (2 * nb_max * 4 + 2 * 16 * 16 * 4 + 4) + 8 * 17 * 16 * 4
    built = nsa_call_work(SHAPE, **kw, smem_per_sm_bytes=SMEM)
    given = nsa_call_work(dataclasses.replace(SHAPE, union_given=1), **kw, smem_per_sm_bytes=SMEM)
    assert built.waves == given.waves + 1
    assert built.requested_bytes == given.requested_bytes + nbytes
    assert built.unique_bytes == given.unique_bytes + nbytes
    # A tile of one draft row streams its own picks: no plan to build.
    one = dataclasses.replace(SHAPE, t=1)
    assert union_plan_work(one, live_launches(one, fused=True, refresh=False), **kw) == (0, 0)
    per_row = dataclasses.replace(SHAPE, rows_per_tile=1, shared_context=1)
    rows = live_launches(per_row, fused=True, refresh=False)
    assert union_plan_work(per_row, rows, **kw) == (0, 0)
    # The unfused baseline builds it on every call, handed a plan or not.
    unfused = dataclasses.replace(SHAPE, union_given=1)
    rows = live_launches(unfused, fused=False, refresh=False)
    assert union_plan_work(unfused, rows, fused=False, refresh=False, num_sms=SMS)[0] == 1


def test_arrays_match_the_scalar_count():
    shape = {f: getattr(SHAPE, f) for f in NsaShape.__slots__}
    shape["batch"] = np.array([1, 4, 1])
    out = nsa_work_arrays(shape, fused=False, refresh=True, num_sms=SMS, smem_per_sm_bytes=SMEM)
    one = nsa_call_work(SHAPE, fused=False, refresh=True, num_sms=SMS, smem_per_sm_bytes=SMEM)
    assert out["chain_tiles"][0] == out["chain_tiles"][2] == one.chain_tiles
    assert out["chain_tiles"][1] != one.chain_tiles


def test_bad_shape_is_refused():
    with pytest.raises(ValueError, match="overlap"):
        dataclasses.replace(SHAPE, overlap=1.5)
    with pytest.raises(ValueError, match="tile_plan"):
        dataclasses.replace(SHAPE, tile_plan=3)
    with pytest.raises(ValueError, match="tile_plan"):
        tile_packing(17, 4, 0, "wide")


def test_the_fit_plan_keeps_seventeen_rows_in_one_tile_at_sixteens_chain():
    """ "fixed" packs 17 rows as 16 + 1 in tiles of 64 MMA rows, whose 8 slots a tile leave
    the full tile twice t = 16's chain; "fit" packs them in one tile of 128 MMA rows (twice the
    wgmma rows a key tile) with the slots its makespan sizing gives (``nsa_slots.plan_slots``)."""
    fit = dataclasses.replace(SHAPE, tile_plan=1)
    assert tile_packing(17, 4, 0, "fit") == (32, 4, 128)
    (launch,) = forward_launches(fit, fused=True, refresh=False)
    assert (launch.rows, launch.block_m) == ([17], 128)
    part, n = launch_part(fit, launch, SMS, SMEM)
    # The host's key tiles at its assumed overlap 0.7: 2047 compressed tokens, a union of
    # 16 (1 + 16 x 0.3) = 92.8 blocks, 512 + 17 window and tail tokens.
    host = (32, 93, 9)
    assert n == sum(plan_slots(host, (True,) * 3, 8, SMS, tile_plan="fit"))
    one, two = (
        nsa_call_work(s, fused=True, refresh=False, num_sms=SMS, smem_per_sm_bytes=SMEM)
        for s in (SHAPE, fit)
    )
    assert (one.chain_tiles, two.chain_tiles) == (32, 16)
    assert two.row_cost == 2 * one.row_cost == 64
    assert two.waves == one.waves == 2  # the union plan's launch, then the forward


def test_a_heads_selected_blocks_are_unique_once_whatever_its_row_tiles():
    """The unique bytes count the union of all 17 draft rows' selections once per (sequence,
    KV head), whether the rows stream them as one draft row a tile or as packed tiles (16 + 1
    rows): the tiles of a head walk their ascending lists side by side and hit L2 on the blocks
    they share. Overlap 0.3 puts 16 (1 + 16 x 0.7) = 195.2 -> 196 blocks in that union, 0.5
    puts 144: 52 blocks a head apart (the slot plan sizes at the host's assumed overlap, so
    nothing else moves)."""
    kw = dict(fused=True, refresh=False, num_sms=SMS, smem_per_sm_bytes=SMEM)
    block_bytes = 64 * 2 * 128 * 2  # one selected block's K and V
    for rows_per_tile in (0, 1):
        shape = dataclasses.replace(SHAPE, rows_per_tile=rows_per_tile)
        low = nsa_call_work(dataclasses.replace(shape, overlap=0.5), **kw)
        high = nsa_call_work(shape, **kw)
        assert high.unique_bytes - low.unique_bytes == 8 * 52 * block_bytes
        assert high.unique_bytes < high.requested_bytes


def test_shared_compressed_tiles_stream_the_compressed_tokens_once_per_packed_tile():
    """One draft row a tile over 17 rows at 128K: per tile, each of the 17 tiles streams the
    8,191 compressed tokens; shared, the two packed tiles (16 + 1 rows) do, in a launch of
    their own before the selected and window launch. The packed schedule has no other tiles to
    share with, so the setting leaves it as it is."""
    naive = dataclasses.replace(SHAPE, context_len=131072, rows_per_tile=1)
    kw = dict(fused=True, num_sms=SMS, smem_per_sm_bytes=SMEM)
    comp_tile_bytes = 128 * 64 * 2 * 128 * 2  # 128 tiles of 64 compressed tokens, K and V
    for refresh in (False, True):
        per_tile = nsa_call_work(naive, refresh=refresh, **kw)
        shared = nsa_call_work(dataclasses.replace(naive, shared_context=1), refresh=refresh, **kw)
        saved = per_tile.requested_bytes - shared.requested_bytes
        partials = shared.unique_bytes - per_tile.unique_bytes  # the packed tiles' partials
        assert saved + partials == pytest.approx(8 * (17 - 2) * comp_tile_bytes)
        assert 0 < partials < 0.05 * saved
        assert shared.chain_tiles < per_tile.chain_tiles
    packed = dataclasses.replace(SHAPE, context_len=131072)
    for refresh in (False, True):
        assert nsa_call_work(packed, refresh=refresh, **kw) == nsa_call_work(
            dataclasses.replace(packed, shared_context=1), refresh=refresh, **kw
        )


def test_paired_launches_count_one_launch_where_one_wave_holds_them():
    """``shared_context`` 2 ("paired"): a fused reuse call of unions of four over 17 rows at
    128K, batch 1, runs its compressed and its selected and window launches as one (their
    programs fit one wave of two an SM): one launch's waves, the two launches' busiest slices
    one after the other (an SM walks a program of each kind in turn), the same bytes. At batch
    16 one row a tile, the programs need more than one
    wave: two launches, as "shared"; refresh and unfused calls keep theirs."""
    kw = dict(num_sms=SMS, smem_per_sm_bytes=SMEM)
    ssv = dataclasses.replace(SHAPE, context_len=131072, t=17, rows_per_tile=4, shared_context=1)
    shared = nsa_call_work(ssv, fused=True, refresh=False, **kw)
    paired = nsa_call_work(
        dataclasses.replace(ssv, shared_context=2), fused=True, refresh=False, **kw
    )
    assert paired.waves == shared.waves - 1
    assert paired.chain_tiles == shared.chain_tiles == 16 + 25
    assert (paired.requested_bytes, paired.unique_bytes, paired.mma_flops, paired.merge_steps) == (
        shared.requested_bytes,
        shared.unique_bytes,
        shared.mma_flops,
        shared.merge_steps,
    )
    big = dataclasses.replace(ssv, batch=16, context_len=65536, rows_per_tile=1)
    for shape, fused, refresh in ((big, True, False), (ssv, True, True), (ssv, False, False)):
        two = nsa_call_work(shape, fused=fused, refresh=refresh, **kw)
        one = nsa_call_work(
            dataclasses.replace(shape, shared_context=2), fused=fused, refresh=refresh, **kw
        )
        assert one == two


def test_launches_of_unlike_warp_counts_are_not_paired():
    """Under "fit" a packed tile of 17 rows at group four is 128 MMA rows on 8 warps, the
    schedule's tiles of four rows 16 on 4: the kernel runs the two launches apart
    (``kernels.nsa_verify._pairs``), so "paired" counts what "shared" does; at 16 rows both
    launches have 4 warps and pair as under "fixed"."""
    kw = dict(num_sms=SMS, smem_per_sm_bytes=SMEM)
    assert forward_warps(128, "fit") == 8 and forward_warps(128, "fixed") == 4
    assert forward_warps(64, "fit") == forward_warps(16, "fit") == 4
    for t, apart in ((17, True), (16, False)):
        fit = dataclasses.replace(
            SHAPE, context_len=131072, t=t, rows_per_tile=4, shared_context=1, tile_plan=1
        )
        shared = nsa_call_work(fit, fused=True, refresh=False, **kw)
        paired = nsa_call_work(
            dataclasses.replace(fit, shared_context=2), fused=True, refresh=False, **kw
        )
        assert (paired == shared) is apart


def test_a_refresh_call_counts_its_block_scoring():
    """The scoring reads each compressed-launch tile's keys again at 16 packed rows (8 bytes
    a real row and token to store the scores would be 8 x 16 x 4 = 512 > 256 bytes of key), and
    stores the scores at one row (8 x 1 x 4 = 32 < 256): a refresh call carries that on top of
    the reuse call's bytes, besides its pick's score rows and its second launch's partials."""
    from ssvkit.perfmodel.nsa_work import block_score_work

    nc = (SHAPE.context_len - 32) // 16 + 1
    comp = forward_launches(SHAPE, fused=True, refresh=True)[0]
    assert comp.branches == (True, False, False) and comp.rows == [16, 1]
    assert block_score_work(SHAPE, comp) == (8 * 2 * nc * 256, 8 * 2 * nc * 64 * 128 * 2)
    one = dataclasses.replace(SHAPE, t=1)
    comp1 = forward_launches(one, fused=True, refresh=True)[0]
    assert block_score_work(one, comp1) == (8 * 8.0 * 1 * 4 * nc, 0.0)


def _streams(shape: NsaShape, *, fused: bool, refresh: bool):
    """The call in series and with its branches side by side (``branch_streams``)."""
    kw = dict(fused=fused, refresh=refresh, num_sms=SMS, smem_per_sm_bytes=SMEM)
    one = nsa_call_work(shape, **kw)
    return one, nsa_call_work(dataclasses.replace(shape, branch_streams=1), **kw)


def _same_work_overlapped(one, side) -> None:
    assert (side.requested_bytes, side.unique_bytes, side.mma_flops) == (
        one.requested_bytes,
        one.unique_bytes,
        one.mma_flops,
    )
    assert (side.row_cost, side.pick_rows) == (one.row_cost, one.pick_rows)
    assert side.chain_tiles <= one.chain_tiles and side.waves <= one.waves
    assert side.merge_steps <= one.merge_steps


def test_unfused_reuse_branches_side_by_side_share_the_sms():
    """Batch 1, 17 rows at 32K: the compressed, selected and window launches (busiest slices
    4, 23 and 2 tiles; 8, 8 and 5 slots; 128 + 128 + 80 programs, two an SM) each fill less
    than the GPU. In series: 4 + 23 + 2 tiles, three waves, 8 + 8 + 5 merge slots; side by side
    one part: 23 tiles, two waves (336 programs over 264), the longest merge's 8 slots. Either
    way the union plan's launch comes first (one wave more). At batch 16 and 64 the launches
    fill the SMs: never more than in series."""
    one, side = _streams(SHAPE, fused=False, refresh=False)
    _same_work_overlapped(one, side)
    assert (one.chain_tiles, one.waves, one.merge_steps) == (29, 4, 21)
    assert (side.chain_tiles, side.waves, side.merge_steps) == (23, 3, 8)
    for batch, context_len in ((16, 32768), (64, 131072)):
        shape = dataclasses.replace(SHAPE, batch=batch, context_len=context_len)
        _same_work_overlapped(*_streams(shape, fused=False, refresh=False))


def test_unfused_refresh_runs_the_selected_launch_after_the_others():
    """A refresh call's selection waits for the compressed launch: the compressed and window
    launches share the SMs (4 tiles), then the selected launch adds its 23; the window merge
    (5 slots) counts whole, the compressed merge beside the selected one the longer of their 8
    and 8."""
    one, side = _streams(SHAPE, fused=False, refresh=True)
    _same_work_overlapped(one, side)
    comp, sel, win = (
        launch_part(SHAPE, x, SMS, SMEM) for x in forward_launches(SHAPE, fused=False, refresh=True)
    )
    first = side_by_side(comp[0], win[0])
    first_chain = max(first.busiest, first.key_tiles / (SMS * first.resident))
    assert first_chain == 4 and sel[0].busiest == 23
    assert side.chain_tiles == first_chain + sel[0].busiest > first_chain
    assert side.merge_steps == win[1] + max(comp[1], sel[1]) == 5 + 8
    assert side.waves == 3 and one.waves == 4  # the union plan's launch included
    reuse = _streams(SHAPE, fused=False, refresh=False)[1]
    assert side.chain_tiles > reuse.chain_tiles  # not all three as one part
    shape = dataclasses.replace(SHAPE, batch=16)
    _same_work_overlapped(*_streams(shape, fused=False, refresh=True))


@pytest.mark.parametrize("refresh", [False, True])
@pytest.mark.parametrize("shared_context", [0, 2])
def test_fused_calls_ignore_branch_streams(refresh, shared_context):
    shape = dataclasses.replace(SHAPE, shared_context=shared_context, rows_per_tile=4)
    one, side = _streams(shape, fused=True, refresh=refresh)
    assert side == one


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("refresh", [True, False])
@pytest.mark.parametrize("branch_streams", [0, 1])
def test_a_call_without_the_compressed_branch_does_less_of_every_kind_of_work(
    fused, refresh, branch_streams
):
    """``comp_stride`` 0 switches the compressed branch off (the step model's NSA parts): no
    compressed tokens, no launch of that branch alone, no block scoring over them; the other
    branches' work stays."""
    s = dataclasses.replace(SHAPE, branch_streams=branch_streams, overlap=0.5)
    off = dataclasses.replace(s, comp_stride=0)
    w = nsa_call_work(s, fused=fused, refresh=refresh, num_sms=SMS, smem_per_sm_bytes=SMEM)
    w0 = nsa_call_work(off, fused=fused, refresh=refresh, num_sms=SMS, smem_per_sm_bytes=SMEM)
    for name in ("requested_bytes", "unique_bytes", "chain_tiles", "waves", "mma_flops"):
        assert getattr(w0, name) <= getattr(w, name), name
    assert w0.unique_bytes < w.unique_bytes and w0.mma_flops < w.mma_flops
    assert w0.pick_rows == w.pick_rows
    live = live_launches(off, fused=fused, refresh=refresh)
    assert not any(la.branches[0] for la in live)
    # fused reuse: its one launch less the branch; fused refresh and unfused: one launch fewer
    assert len(live) == len(forward_launches(s, fused=fused, refresh=refresh)) - (
        not fused or refresh
    )
    assert live_launches(s, fused=fused, refresh=refresh) == forward_launches(
        s, fused=fused, refresh=refresh
    )


def test_a_negative_compressed_stride_is_refused():
    with pytest.raises(ValueError, match="comp_stride must be >= 0, got -1"):
        dataclasses.replace(SHAPE, comp_stride=-1)


def test_fit_slots_keeps_the_fixed_tiles_and_sizes_their_slots_by_makespan():
    """Batch 4, t = 16: one 64-row tile a KV head under every plan. "fixed" stays in one
    wave, 4 slots a tile, so a slot walks 92 key tiles; "fit_slots" and "fit" take 8 slots
    (a second wave allowed), a 32-tile chain. At t = 17 "fit_slots" keeps "fixed"'s 16 + 1
    rows and 64-row tiles where "fit" packs one 128-row tile."""
    b4 = dataclasses.replace(SHAPE, batch=4, t=16)
    work = {
        plan: nsa_call_work(
            dataclasses.replace(b4, tile_plan=plan),
            fused=True,
            refresh=False,
            num_sms=SMS,
            smem_per_sm_bytes=SMEM,
        )
        for plan in (0, 1, 2)
    }
    assert [work[p].chain_tiles for p in (0, 1, 2)] == [92, 32, 32]
    assert work[2] == work[1]
    t17 = dataclasses.replace(SHAPE, tile_plan=2)
    (launch,) = forward_launches(t17, fused=True, refresh=False)
    assert (launch.rows, launch.block_m) == ([16, 1], 64)
