"""The NSA merge folded into the forward launch (``NsaVerifyConfig(merge=...)``: ``last``, a
row tile's last program merges it; ``parallel``, merge programs of the launch wait for their
tile; ``auto``, the default, chooses) and the refresh path's top-n pick folded into its block
importance (``pick="folded"``), against the two-launch steps and the fp32 reference, and the
arrival counters they run on.

On the CPU the Triton interpreter runs a launch's programs one after another, so these tests
check the folded steps' arithmetic (every branch's slots, gates, ragged rows and prefixes,
padded head groups, several row tiles, the row schedules of ``rows_per_tile``), the ticket
order, that every output row is written, and that the counters are zero again after each call.
They cannot exercise the race between programs (the memory order of the partial stores and the
counters): only the GPU tests (``gpu`` marker) run programs concurrently.
"""

from __future__ import annotations

import contextlib

import pytest
import ssvkit.kernels.arrivals as arrivals
import ssvkit.kernels.nsa_steps as steps
import torch
from kernel_helpers import assert_close, case_dtype
from nsa_helpers import DEV, GPU_KW, NSA_KW, make_gpu_inputs, make_inputs
from ssvkit.kernels.nsa_launch import make_plan
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    nsa_verify,
    nsa_verify_unfused,
    reference_nsa_verify,
)
from ssvkit.kernels.timing import poisoned_allocations

# (prefix_lens, t, H, Hkv, D, dtype): several 16-row tiles with a ragged last one (t = 5,
# G = 4), a padded head group (G = 3) beside a second KV head, a prefix of 0 beside a longer one,
# one row per tile (t = 1). The kernels' arithmetic is fp32 whatever the inputs' dtype: fp16
# once, on the cheapest shape, for the casts of the loads and of the merged output.
SHAPES = [
    ([130], 5, 4, 1, 32, torch.float32),
    ([50, 0], 3, 6, 2, 16, torch.float32),
    ([150], 1, 4, 1, 16, torch.float16),
]


def shape_id(shape) -> str:
    return f"L{shape[0]}-t{shape[1]}-H{shape[2]}-kv{shape[3]}-{str(shape[5]).split('.')[-1]}"


def config(merge: str, num_splits: int = 5) -> NsaVerifyConfig:
    return NsaVerifyConfig(num_splits=num_splits, block_m=16, merge=merge)


def counters_are_zero() -> bool:
    """Every arrival counter of the device is back at 0."""
    bufs = arrivals.counter_buffers(torch.device(DEV))
    return bool(bufs) and all(int(b.abs().sum()) == 0 for b in bufs)


def fold_case(shape, refresh: bool, merge: str):
    path = "refresh" if refresh else "reuse"
    return pytest.param(shape, refresh, merge, id=f"{shape_id(shape)}-{path}-{merge}")


# Each shape on both paths and with both merge modes; the one-row shape with all four pairs.
FOLD_CASES = [
    fold_case(SHAPES[0], False, "last"),
    fold_case(SHAPES[0], True, "parallel"),
    fold_case(SHAPES[1], False, "parallel"),
    fold_case(SHAPES[1], True, "last"),
    *(fold_case(SHAPES[2], r, m) for r in (False, True) for m in ("last", "parallel")),
]


@pytest.mark.parametrize(("shape", "refresh", "merge"), FOLD_CASES)
def test_folded_merge_matches_the_merge_launch_and_the_reference(shape, refresh, merge):
    prefix_lens, t, h, hkv, d, dtype = shape
    dtype = case_dtype(dtype)
    args, idx = make_inputs(prefix_lens, t, h, hkv, d, dtype, seed=3 * t + h)
    block_idx = None if refresh else idx
    ro, ridx = reference_nsa_verify(*args, block_idx=block_idx, **NSA_KW)
    with poisoned_allocations():  # an output row no merge writes stays NaN
        o_fold, idx_fold = nsa_verify(*args, block_idx=block_idx, config=config(merge), **NSA_KW)
        assert counters_are_zero()
        o_sep, _ = nsa_verify(*args, block_idx=block_idx, config=config("separate"), **NSA_KW)
        o_unf, _ = nsa_verify_unfused(*args, block_idx=block_idx, config=config(merge), **NSA_KW)
    assert counters_are_zero()
    if refresh:
        assert torch.equal(idx_fold.cpu(), ridx.cpu())
    assert not torch.isnan(o_fold).any() and not torch.isnan(o_unf).any()
    assert_close(o_fold, ro, dtype, "o")
    assert_close(o_fold, o_sep, dtype, "o")
    assert_close(o_unf, ro, dtype, "o")


@pytest.mark.parametrize(
    ("rows_per_tile", "refresh", "merge"),
    [(1, False, "last"), (1, True, "parallel"), (2, False, "parallel"), (2, True, "last")],
)
def test_folded_merge_merges_every_tile_of_a_row_schedule(rows_per_tile, refresh, merge):
    """With ``rows_per_tile`` rows a tile (1: the naive baseline's schedule, head slots padded
    to 16 MMA rows) a call has ``ceil(t / rows_per_tile)`` row tiles per (sequence, KV head),
    each with its own arrival counter: every tile is merged (a row no merge writes stays NaN),
    as the reference and the merge launch, and the counters are zero after the call; the merge
    covers a row's real head slots, not the padding. Each schedule runs with both merge modes
    and on both paths (every pair of the three choices once; the test above crosses path and
    merge mode)."""
    prefix_lens, t, h, hkv, d = [130], 5, 4, 1, 16
    args, idx = make_inputs(prefix_lens, t, h, hkv, d, torch.float32, seed=11)
    block_idx = None if refresh else idx
    ro, ridx = reference_nsa_verify(*args, block_idx=block_idx, **NSA_KW)
    cfg = NsaVerifyConfig(num_splits=5, merge=merge, rows_per_tile=rows_per_tile)
    plan = make_plan(
        args[0], args[1], args[5], config=cfg, num_sink=1, num_local=1, sm_scale=None, **NSA_KW
    )
    assert (plan.rows, plan.num_tiles) == (rows_per_tile, -(-t // rows_per_tile))
    layout = steps.merge_layout(plan, 5, 8, torch.device(DEV))
    assert layout.mode == {"last": 1, "parallel": 2}[merge]
    if rows_per_tile == 1:  # G = 4 real head slots of 16: one chunk of 4 MMA rows merges them
        assert (plan.group_pad, layout.rows, layout.chunks) == (16, 4, 1)
    separate = NsaVerifyConfig(num_splits=5, merge="separate", rows_per_tile=rows_per_tile)
    with poisoned_allocations():
        o_fold, idx_fold = nsa_verify(*args, block_idx=block_idx, config=cfg, **NSA_KW)
        assert counters_are_zero()
        o_sep, _ = nsa_verify(*args, block_idx=block_idx, config=separate, **NSA_KW)
        o_unf, _ = nsa_verify_unfused(*args, block_idx=block_idx, config=cfg, **NSA_KW)
    assert counters_are_zero()
    if refresh:
        assert torch.equal(idx_fold.cpu(), ridx.cpu())
    assert not torch.isnan(o_fold).any() and not torch.isnan(o_unf).any()
    assert_close(o_fold, ro, torch.float32, "o")
    assert_close(o_fold, o_sep, torch.float32, "o")
    assert_close(o_unf, ro, torch.float32, "o")


def test_auto_merges_in_the_last_program_or_in_merge_programs_by_the_tile():
    """Host-only, 132 SMs, Llama-3.1-8B attention: one draft row's tile is one load for its last
    program; 16 rows at batch 1 spread over merge programs (one per draft row); at batch 16 the
    tiles' last programs already merge side by side."""
    from ssvkit.kernels import nsa_launch as nl

    cfg, cpu = NsaVerifyConfig(merge="auto"), torch.device("cpu")

    def layout(batch, t):
        shape = dict(device="meta", dtype=torch.bfloat16)
        q = torch.empty((batch, t, 32, 128), **shape)
        k = torch.empty((batch, 8, 65536 + 64, 128), **shape)
        ck = torch.empty((batch, 8, 4095, 128), **shape)
        plan = nl.make_plan(q, k, ck, config=cfg, num_sink=1, num_local=1, sm_scale=None, **GPU_KW)
        return steps.merge_layout(plan, 16 if batch == 1 else 3, 16, cpu)

    one, sixteen, big = layout(1, 1), layout(1, 16), layout(16, 16)
    assert (one.mode, one.rows, one.slots_per_load) == (1, 4, 16)  # 16 slots x 4 rows: one load
    assert (sixteen.mode, sixteen.rows, sixteen.chunks) == (2, 4, 16)
    assert (big.mode, big.rows) == (1, 16)


def test_the_folded_call_launches_no_merge_kernel(monkeypatch):
    """The reuse and refresh calls and the unfused reuse baseline merge inside their forward
    launches; ``merge="separate"`` still launches the merge kernel."""

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("a merge launch")

    monkeypatch.setattr(steps, "nsa_merge_kernel", Refused())
    args, idx = make_inputs([90], 3, 4, 1, 16, torch.float32, seed=1)
    for merge in ("auto", "last", "parallel"):
        cfg = config(merge, num_splits=4)
        o, _ = nsa_verify(*args, block_idx=idx, config=cfg, **NSA_KW)
        nsa_verify(*args, config=cfg, **NSA_KW)
        nsa_verify_unfused(*args, block_idx=idx, config=cfg, **NSA_KW)
    with pytest.raises(AssertionError, match="a merge launch"):
        nsa_verify(*args, block_idx=idx, config=config("separate", num_splits=4), **NSA_KW)
    assert_close(o, reference_nsa_verify(*args, block_idx=idx, **NSA_KW)[0], torch.float32, "o")


def test_repeated_calls_share_one_counter_buffer_and_repeat_their_output():
    """A CUDA graph replays a call on the same buffers: the counters the first call used must be
    ready for the second, which then writes the same output (the merge reads the slots in a
    fixed order, whichever program is last)."""
    args, idx = make_inputs([120], 5, 4, 1, 16, torch.float32, seed=2)
    outs = []
    for merge in ("last", "parallel"):
        o1, _ = nsa_verify(*args, block_idx=idx, config=config(merge), **NSA_KW)
        buf = arrivals.arrival_counters(1, torch.device(DEV))
        o2, _ = nsa_verify(*args, block_idx=idx, config=config(merge), **NSA_KW)
        assert arrivals.arrival_counters(1, torch.device(DEV)) is buf
        assert torch.equal(o1, o2) and counters_are_zero()
        outs.append(o1)
    assert torch.equal(*outs)  # the same arithmetic in the same order, whoever merges


def test_each_lane_has_counters_of_its_own():
    dev = torch.device(DEV)
    main, side = arrivals.arrival_counters(8, dev), arrivals.arrival_counters(8, dev, lane=1)
    assert side.data_ptr() != main.data_ptr() and int(side.abs().sum()) == 0
    assert arrivals.arrival_counters(8, dev, lane=1) is side
    listed = arrivals.counter_buffers(dev)
    assert any(b is main for b in listed) and any(b is side for b in listed)
    with pytest.raises(ValueError, match="lane must be >= 0, got -1"):
        arrivals.arrival_counters(1, dev, lane=-1)


def test_arrival_counters_are_zeroed_kept_and_grown():
    dev = torch.device(DEV)
    small = arrivals.arrival_counters(3, dev)
    assert small.dtype == torch.int32 and small.numel() >= 3 and int(small.abs().sum()) == 0
    big = arrivals.arrival_counters(small.numel() + 1, dev)
    assert big.numel() > small.numel() and int(big.abs().sum()) == 0
    assert any(b is small for b in arrivals.counter_buffers(dev))  # a captured graph may hold it
    assert arrivals.arrival_counters(5, dev) is big
    with pytest.raises(ValueError, match="num"):
        arrivals.arrival_counters(-1, dev)


@pytest.mark.parametrize(
    "prefix_lens, t, h, hkv, source",
    [([520, 410, 0], 3, 4, 2, "stored"), ([530], 16, 4, 1, "computed")],
    ids=["ragged-t3-stored", "t16-computed"],
)
def test_folded_pick_selects_the_reference_blocks_in_one_launch(
    monkeypatch, prefix_lens, t, h, hkv, source
):
    """The refresh path's importance and top-n pick in one launch (``pick="folded"``): rows of
    more than 32 blocks (a chunk and a tail), so the threshold pick serves them, both score
    sources (one a shape), an empty prefix beside two KV heads, and 16 draft rows of 4 heads in
    one tile. Random data has no ties: the indices equal the reference's and the two launches'
    exactly."""
    import ssvkit.kernels.nsa_selection as selection
    from ssvkit.kernels.top_blocks import _row_layout, threshold_meta

    args, _ = make_inputs(prefix_lens, t, h, hkv, 16, torch.float32, seed=t)
    kw = dict(NSA_KW, top_n=6)
    ro, ridx = reference_nsa_verify(*args, **kw)
    folded = NsaVerifyConfig(block_j=16, score_source=source, pick="folded")
    separate = NsaVerifyConfig(block_j=16, score_source=source, pick="separate")
    with poisoned_allocations():
        o_two, idx_two = nsa_verify(*args, config=separate, **kw)
        monkeypatch.setattr(selection, "top_blocks", refused)
        o, idx = nsa_verify(*args, config=folded, **kw)
    nb_max = -(-args[1].shape[2] // kw["block_size"])
    assert threshold_meta(nb_max, kw["top_n"]) is not None and _row_layout(nb_max)[:2] == (32, 16)
    assert torch.equal(idx.cpu(), ridx.cpu()) and torch.equal(idx, idx_two)
    assert_close(o, ro, torch.float32, "o")
    assert torch.equal(o, o_two)
    assert counters_are_zero()


def refused(*args, **kwargs):
    raise AssertionError("a top-n launch")


class _ForkedBranches:
    """``kernels.branch_streams.Branches`` as on a GPU (its chains forked), run in order on the
    caller's stream, noting which fork each launch is made in."""

    slot = None

    def __init__(self, device, enabled=True):
        self.main = "caller's stream"

    @contextlib.contextmanager
    def fork(self, slot):
        _ForkedBranches.slot = slot
        try:
            yield
        finally:
            _ForkedBranches.slot = None

    def join(self):
        pass


@pytest.mark.parametrize("refresh", [False, True], ids=["reuse", "refresh"])
def test_unfused_branches_side_by_side_count_on_counters_of_their_own(monkeypatch, refresh):
    """Branches forked onto side streams run beside the call's other launches: a folded merge
    or pick there must not count on the counters a launch on another stream is using (one
    ticket sequence handed out between two grids leaves a waiting program waiting forever).
    Each fork's launches take a lane of their own, and the result is the one-stream call's."""
    import ssvkit.kernels.nsa_selection as selection
    import ssvkit.kernels.nsa_unfused as unfused

    args, idx = make_inputs([130, 60], 5, 4, 2, 16, torch.float32, seed=4)
    block_idx = None if refresh else idx
    cfg = NsaVerifyConfig(block_m=16, merge="parallel", pick="folded", branch_streams=False)
    o_one, idx_one = nsa_verify_unfused(*args, block_idx=block_idx, config=cfg, **NSA_KW)
    made = []

    def recorded(num, device, lane=0):
        buf = arrivals.arrival_counters(num, device, lane)
        made.append((_ForkedBranches.slot, lane, buf.data_ptr()))
        return buf

    monkeypatch.setattr(unfused, "Branches", _ForkedBranches)
    monkeypatch.setattr(steps, "arrival_counters", recorded)
    monkeypatch.setattr(selection, "arrival_counters", recorded)
    o, idx_side = nsa_verify_unfused(*args, block_idx=block_idx, config=cfg, **NSA_KW)
    assert {slot for slot, _, _ in made} >= {None, 0}  # the caller's launches and a fork's
    for slot, lane, _ in made:
        assert lane == (0 if slot is None else 1 + slot), made
    ptrs = {lane: {p for _, ln, p in made if ln == lane} for _, lane, _ in made}
    assert all(not (ptrs[a] & ptrs[b]) for a in ptrs for b in ptrs if a != b)
    assert torch.equal(o, o_one) and torch.equal(idx_side, idx_one)
    assert counters_are_zero()


def test_rejects_an_unknown_merge_or_pick():
    with pytest.raises(ValueError, match="merge"):
        NsaVerifyConfig(merge="folded")
    with pytest.raises(ValueError, match="pick"):
        NsaVerifyConfig(pick="later")


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 16])
def test_gpu_folded_merge_is_repeatable_and_matches_the_merge_launch(t):
    """Programs run concurrently here: a partial read before it is visible, or a counter left
    non-zero, shows as an output that differs between repeats or from the merge launch's."""
    args = make_gpu_inputs([4093, 700, 2500], t, seed=t)
    _, idx = nsa_verify(*args, **GPU_KW)
    kw = dict(GPU_KW, validate=False)
    separate = NsaVerifyConfig(merge="separate", pick="separate")
    for block_idx in (idx, None):
        o_sep, idx_sep = nsa_verify(*args, block_idx=block_idx, config=separate, **kw)
        for merge in ("last", "parallel"):
            cfg = NsaVerifyConfig(merge=merge)
            first, idx_first = nsa_verify(*args, block_idx=block_idx, config=cfg, **kw)
            for _ in range(20):
                o, _ = nsa_verify(*args, block_idx=block_idx, config=cfg, **kw)
                assert torch.equal(o, first)
            assert torch.equal(idx_first, idx_sep)
            assert_close(first, o_sep, torch.bfloat16, "o")
    torch.cuda.synchronize()
    assert counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("refresh", [False, True], ids=["reuse", "refresh"])
def test_gpu_unfused_folded_steps_side_by_side_are_repeatable(refresh):
    """The unfused baseline's branches on side streams with folded merges and pick: their
    launches run at the same time, each on its own counters, so every repeat finishes and
    gives the one-stream call's output bit for bit, with and without PDL."""
    args = make_gpu_inputs([4093, 700, 2500], 1, seed=3)
    _, idx = nsa_verify(*args, **GPU_KW)
    kw = dict(GPU_KW, block_idx=None if refresh else idx, validate=False)
    for pdl in (False, True):
        one = NsaVerifyConfig(merge="parallel", pick="folded", branch_streams=False, pdl=pdl)
        side = NsaVerifyConfig(merge="parallel", pick="folded", branch_streams=True, pdl=pdl)
        o_one, idx_one = nsa_verify_unfused(*args, config=one, **kw)
        for _ in range(50):
            o, idx_side = nsa_verify_unfused(*args, config=side, **kw)
            assert torch.equal(o, o_one) and torch.equal(idx_side, idx_one)
    torch.cuda.synchronize()
    assert counters_are_zero()
