"""The ``union`` group plan built inside the pick's launch (``top_blocks_planned``,
``select_blocks_planned``): the plan ``build_group_plan`` makes of the same picks, for groups
that do not divide the rows, under both pick rules, with the arrival counters left at zero.

CPU: Triton interpreter, fp32, small rows. GPU (``gpu`` marker): 128K rows of Llama-3.1-8B's
8 KV heads, in a CUDA graph replayed twice.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.arrivals import counter_buffers
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.select_blocks import select_blocks, select_blocks_planned
from ssvkit.kernels.top_blocks import empty_scores, top_blocks, top_blocks_planned

DEV = "cuda" if HAS_CUDA else "cpu"
PLAN_FIELDS = ("block_lists", "member_mask", "counts")


def random_scores(b, hkv, t, nb, seed):
    gen = torch.Generator().manual_seed(seed)
    out = empty_scores(b, hkv, t, nb, torch.device(DEV))
    out.copy_(torch.randn((b, hkv, t, nb), generator=gen).to(DEV))
    return out


def assert_plan_of(plan, idx, group_size):
    """``plan`` equals ``build_group_plan``'s of ``idx``, and every counter is back at zero."""
    want = build_group_plan(idx, None, group_size, "union")
    assert plan is not None and plan.mode == "union" and plan.order is None
    assert (plan.group_size, plan.num_groups) == (want.group_size, want.num_groups)
    for f in PLAN_FIELDS:
        assert torch.equal(getattr(plan, f), getattr(want, f)), f
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(torch.device(DEV)))


@pytest.mark.parametrize(
    "b, hkv, t, nb, top_n, c, relative",
    [
        (2, 2, 7, 40, 4, 3, True),  # 7 rows in groups of 3: the last group has one row
        (1, 3, 5, 33, 6, 2, False),
        (2, 1, 4, 70, 8, 4, True),
        (1, 2, 3, 20, 4, 8, False),  # a group wider than the rows: one group of 3
    ],
)
def test_the_pick_builds_the_union_plan_of_its_rows(b, hkv, t, nb, top_n, c, relative):
    scores = random_scores(b, hkv, t, nb, seed=t * nb)
    lens = torch.tensor([nb * 16 - 5, nb * 16 - 40][:b], dtype=torch.int32, device=DEV)
    kw = dict(block_size=16, top_n=top_n, num_sink=1, num_local=0 if relative else 1)
    if relative:
        pos = lens[:, None].long() + torch.arange(t, device=DEV)[None, :]
        kw |= dict(positions=pos.contiguous(), window=40)
    idx, plan = top_blocks_planned(scores, lens, group_size=c, **kw)
    assert torch.equal(idx, top_blocks(scores, lens, **kw))
    assert_plan_of(plan, idx, min(c, t))


def test_rows_the_rounds_kernel_picks_get_the_same_plan_from_a_plan_launch():
    """top_n past the threshold pick's: the rounds kernel picks, a plan launch follows."""
    scores = random_scores(1, 2, 5, 600, seed=3)
    lens = torch.tensor([600 * 16], dtype=torch.int32, device=DEV)
    idx, plan = top_blocks_planned(scores, lens, block_size=16, top_n=300, group_size=2)
    assert_plan_of(plan, idx, 2)


def test_no_plan_for_groups_of_one_and_bad_group_sizes_refused():
    scores = random_scores(1, 1, 4, 30, seed=5)
    lens = torch.tensor([30 * 16], dtype=torch.int32, device=DEV)
    assert top_blocks_planned(scores, lens, block_size=16, top_n=4)[1] is None
    one_row = random_scores(1, 1, 1, 30, seed=6)
    assert top_blocks_planned(one_row, lens, block_size=16, top_n=4, group_size=4)[1] is None
    for bad in (0, 32):
        with pytest.raises(ValueError, match=f"group_size must be in \\[1, 31\\], got {bad}"):
            top_blocks_planned(scores, lens, block_size=16, top_n=4, group_size=bad)


def test_select_blocks_planned_is_select_blocks_and_its_plan():
    """Both launch plans of the selection (two launches: the plan in the pick's launch; one
    launch: a plan launch after it) give the picks of ``select_blocks`` and their plan."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn((2, 6, 4, 16), generator=gen).to(DEV)
    k = torch.randn((2, 2, 700, 16), generator=gen).to(DEV)
    lens = torch.tensor([690, 400], dtype=torch.int32, device=DEV)
    meta = BlockMetadata.build(k, lens, 16)
    pos = lens[:, None].long() + torch.arange(6, device=DEV)[None, :]
    kw = dict(top_n=5, num_local=0, positions=pos.contiguous(), window=48)
    for fused in (False, True):
        idx, plan = select_blocks_planned(q, meta, lens, fused=fused, group_size=4, **kw)
        assert torch.equal(idx, select_blocks(q, meta, lens, fused=fused, **kw))
        assert_plan_of(plan, idx, 4)


@pytest.mark.gpu
def test_gpu_the_pick_builds_the_plan_in_a_replayed_graph():
    """128K rows (2049 blocks) of 8 KV heads, 16 rows in groups of four and of three (the
    last group of one row), under the position-relative rule, captured in a CUDA graph and
    replayed twice on fresh scores: each replay's plan is ``build_group_plan``'s of its picks,
    and the counters are zero after."""
    lens = torch.tensor([131072, 100000], dtype=torch.int32, device=DEV)
    pos = (lens[:, None].long() + torch.arange(16, device=DEV)[None, :]).contiguous()
    kw = dict(block_size=64, top_n=16, num_sink=1, num_local=0, positions=pos, window=512)
    for c in (4, 3):
        scores = random_scores(2, 8, 16, 2049, seed=c)
        top_blocks_planned(scores, lens, group_size=c, **kw)  # compiles, sizes the counters
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            idx, plan = top_blocks_planned(scores, lens, group_size=c, **kw)
        for seed in (1, 2):
            scores.copy_(random_scores(2, 8, 16, 2049, seed=10 * c + seed))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(idx, top_blocks(scores, lens, **kw))
            assert_plan_of(plan, idx, c)
