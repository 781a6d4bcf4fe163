"""The two-stage top-n pick (``select_blocks(..., candidates=True)``, ``kernels.select_candidates``)
against the two launches on the same scores: the same blocks, ties, NaN scores, empty and short
prefixes and the position-relative rule included.

CPU: Triton interpreter, fp32, block 16 so that a row spans several score ranges. GPU (``gpu``
marker): bf16 at D = 128, 128K.
"""

from __future__ import annotations

import pytest
import ssvkit.kernels.select_blocks as sb
import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.select_candidates import MAX_RANGES, candidate_meta
from ssvkit.kernels.timing import poisoned_allocations

DEV = "cuda" if HAS_CUDA else "cpu"


def make_inputs(prefix_lens, t, h, hkv, d, seed, dtype=torch.float32):
    """Queries, a key cache 9 tokens longer than the longest prefix and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((len(prefix_lens), t, h, d), generator=gen).to(dtype)
    k = torch.randn((len(prefix_lens), hkv, max(prefix_lens) + 9, d), generator=gen).to(dtype)
    return q.to(DEV), k.to(DEV), torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)


class Counted:
    """A kernel stand-in that counts its launches and runs the kernel."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def both_paths(monkeypatch, q, meta, lens, **kw):
    """The selection by the two launches and by candidates (poisoned allocations), and how many
    candidate picks ran."""
    picks = Counted(sb.candidate_pick_kernel)
    monkeypatch.setattr(sb, "candidate_pick_kernel", picks)
    with poisoned_allocations():
        two = sb.select_blocks(q, meta, lens, **kw)
        cand = sb.select_blocks(q, meta, lens, candidates=True, **kw)
    return two, cand, picks.launches


@pytest.mark.parametrize("method", ["mean", "quest"])
@pytest.mark.parametrize(
    "lens, t, hkv, top_n, num_sink, num_local",
    [
        ([1500, 0, 310, 20], 3, 2, 4, 1, 1),  # ranges of 64 blocks, an empty and a short prefix
        ([2100], 16, 1, 16, 2, 1),  # t = 16 rows of a KV head, three ranges
        ([1300, 900], 1, 2, 12, 0, 2),
        ([1700], 5, 2, 9, 0, 0),  # nothing forced
    ],
)
def test_candidates_pick_what_the_two_launches_pick(
    monkeypatch, method, lens, t, hkv, top_n, num_sink, num_local
):
    q, k, lens_t = make_inputs(lens, t, 4 * hkv, hkv, 16, seed=top_n + t)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=(method,))
    kw = dict(top_n=top_n, method=method, num_sink=num_sink, num_local=num_local)
    two, cand, picks = both_paths(monkeypatch, q, meta, lens_t, **kw)
    assert picks == 1
    assert torch.equal(cand, two)


def test_candidate_ties_resolve_to_the_lower_block(monkeypatch):
    """Zero queries score every block alike: both paths take the lowest blocks."""
    q, k, lens = make_inputs([1800, 700], 2, 4, 2, 16, seed=3)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    zeros = torch.zeros_like(q)
    two, cand, picks = both_paths(monkeypatch, zeros, meta, lens, top_n=6, num_sink=1, num_local=1)
    assert picks == 1 and torch.equal(cand, two)
    assert cand[0, 0, 0].tolist() == [0, 1, 2, 3, 4, 112]  # 1800 tokens: 113 blocks


def test_a_nan_score_is_picked_as_the_two_launches_pick_it(monkeypatch):
    """A NaN key makes its block's mean and score NaN; both paths rank it alike."""
    q, k, lens = make_inputs([1600], 4, 4, 1, 16, seed=5)
    k[0, 0, 16 * 40 + 3, 2] = float("nan")
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    two, cand, picks = both_paths(monkeypatch, q, meta, lens, top_n=8, method="mean")
    assert picks == 1 and torch.equal(cand, two)


@pytest.mark.parametrize("method", ["mean", "quest"])
def test_candidates_follow_the_position_relative_rule(monkeypatch, method):
    """Each row's own candidates under the position-relative rule: rows of one sequence at
    different positions rank different block ranges."""
    lens = [1900, 600, 40]
    q, k, lens_t = make_inputs(lens, 5, 4, 2, 16, seed=7)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=(method,))
    positions = (lens_t.long()[:, None] - 300 + 70 * torch.arange(5, device=DEV)[None, :]).clamp(
        min=0
    )
    kw = dict(top_n=10, method=method, num_sink=1, num_local=0, positions=positions, window=64)
    two, cand, picks = both_paths(monkeypatch, q, meta, lens_t, **kw)
    assert picks == 1 and torch.equal(cand, two)


def test_a_shape_the_candidates_do_not_serve_runs_the_two_launches(monkeypatch):
    """top_n 64 keeps 64 candidates a range, wider than a 32-block score tile: the scores are
    written and picked as without ``candidates``."""
    q, k, lens = make_inputs([2500, 300], 2, 4, 2, 16, seed=9)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    two, cand, picks = both_paths(monkeypatch, q, meta, lens, top_n=64)
    assert picks == 0 and torch.equal(cand, two)


def test_candidate_meta_serves_ranges_of_whole_slices_and_bounded_rows():
    assert candidate_meta(17, 32, 16) == dict(CAND_N=16, RUNS=32)
    assert candidate_meta(3, 32, 5) == dict(CAND_N=16, RUNS=4)
    assert candidate_meta(1, 32, 17) == dict(CAND_N=32, RUNS=1)
    assert candidate_meta(4, 16, 17) is None  # a 16-block tile holds no 32 best
    assert candidate_meta(MAX_RANGES, 32, 16) is not None
    assert candidate_meta(MAX_RANGES + 1, 32, 16) is None


@pytest.mark.parametrize("warps", [1, 2, 4])
def test_every_pick_warp_count_picks_the_same_blocks(warps):
    """``pick_warps`` sets the pick's warps on every path; the blocks do not change."""
    q, k, lens = make_inputs([1500, 410], 4, 8, 2, 16, seed=11)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    want = sb.select_blocks(q, meta, lens, top_n=12)
    with poisoned_allocations():
        cand = sb.select_blocks(q, meta, lens, top_n=12, candidates=True, pick_warps=warps)
        two = sb.select_blocks(q, meta, lens, top_n=12, pick_warps=warps)
        one = sb.select_blocks(q, meta, lens, top_n=12, fused=True, pick_warps=warps)
    assert torch.equal(cand, want) and torch.equal(two, want) and torch.equal(one, want)


@pytest.mark.parametrize("warps", [0, 3, -2])
def test_a_pick_warp_count_not_a_power_of_two_is_refused(warps):
    q, k, lens = make_inputs([300], 1, 4, 1, 16, seed=1)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    with pytest.raises(ValueError, match=f"pick_warps must be a power of two >= 1, got {warps}"):
        sb.select_blocks(q, meta, lens, top_n=4, candidates=True, pick_warps=warps)


def test_candidates_and_one_launch_exclude_each_other():
    q, k, lens = make_inputs([300], 1, 4, 1, 16, seed=1)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    with pytest.raises(ValueError, match="exclude each other"):
        sb.select_blocks(q, meta, lens, top_n=4, fused=True, candidates=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("batch, t, method", [(1, 1, "mean"), (16, 16, "mean"), (4, 16, "quest")])
def test_gpu_candidates_pick_what_the_two_launches_pick(monkeypatch, batch, t, method):
    """bf16 at Llama-3.1-8B attention, 128K: the same blocks as the two launches, repeatably."""
    lens = [131072 - 97 * i for i in range(batch)]
    q, k, lens_t = make_inputs(lens, t, 32, 8, 128, seed=batch + t, dtype=torch.bfloat16)
    meta = BlockMetadata.build(k, lens_t, 64, kinds=(method,))
    two, cand, picks = both_paths(monkeypatch, q, meta, lens_t, top_n=16, method=method)
    again = sb.select_blocks(q, meta, lens_t, top_n=16, method=method, candidates=True)
    assert picks == 1 and torch.equal(cand, two) and torch.equal(again, cand)
