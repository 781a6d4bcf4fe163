"""Block metadata, block scores and top-n selection against fp32 torch references.

CPU: Triton interpreter, fp16/fp32, small D, T and block. GPU (``gpu`` marker): bf16 at
D = 128, block 64, plus CUDA-graph capture of ``update`` and ``select_blocks``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ssvkit.kernels.top_blocks as top_blocks_mod
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import HAS_CUDA
from ssvkit.kernels import offline_compile
from ssvkit.kernels.block_metadata import BlockMetadata, reference_block_metadata
from ssvkit.kernels.select_blocks import block_scores, select_blocks
from ssvkit.kernels.select_reference import (
    reference_block_scores,
    reference_select_blocks,
    topn_from_scores,
)
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.kernels.top_blocks import empty_scores, top_blocks

CPU_DTYPES = [torch.float16, torch.float32]
DEV = "cuda" if HAS_CUDA else "cpu"
SCORE_TOL = {torch.float32: 1e-4, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def make_inputs(prefix_lens, t, h, hkv, d, dtype, seed, slack=9):
    gen = torch.Generator().manual_seed(seed)
    t_max = max(prefix_lens) + slack  # not a multiple of the block
    q = torch.randn((len(prefix_lens), t, h, d), generator=gen).to(dtype)
    k = torch.randn((len(prefix_lens), hkv, t_max, d), generator=gen).to(dtype)
    return q.to(DEV), k.to(DEV), torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)


def live_blocks(prefix_lens, block_size):
    return [-(-int(n) // block_size) for n in prefix_lens]


def assert_metadata_matches(meta, k, lens, block_size):
    ref = reference_block_metadata(k, lens, block_size)
    for b, nb in enumerate(live_blocks(lens.tolist(), block_size)):
        for name in ("mean", "kmin", "kmax"):
            got, want = meta.values(name)[b, :, :nb], ref[name][b, :, :nb]
            # Two bf16 parts hold an fp32 value within 2^-17 of it.
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_metadata_matches_reference(dtype, block_size):
    _, k, lens = make_inputs([75, 1, 0, 128], 1, 2, 2, 16, dtype, seed=0)
    with poisoned_allocations():
        meta = BlockMetadata.build(k, lens, block_size, kinds=("mean", "quest"))
    assert meta.kinds == ("mean", "quest") and meta.num_blocks == -(-k.shape[2] // block_size)
    assert_metadata_matches(meta, k, lens, block_size)


def test_metadata_refuses_tensors_that_are_not_its_parts():
    """Summaries of another layout (fp32 ``[B, Hkv, NB, D]``) or of mismatched shapes fail in
    one line naming the tensor, and the fp32 values survive the round trip through parts."""
    x = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="BlockMetadata.mean must be"):
        BlockMetadata(16, x, None, None)
    with pytest.raises(ValueError, match="kmin and kmax"):
        BlockMetadata.from_values(16, kmin=x)
    parts = BlockMetadata.from_values(16, mean=x).mean
    with pytest.raises(ValueError, match="BlockMetadata.kmin"):
        BlockMetadata(16, parts, parts[:, :1], parts[:, :1])
    meta = BlockMetadata.from_values(16, mean=x, kmin=x - 1, kmax=x + 1)
    assert meta.shape == (1, 2, 5, 16) and meta.kinds == ("mean", "quest")
    torch.testing.assert_close(meta.values("kmax"), x + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["mean", "quest"])
def test_a_nan_key_reaches_its_block_summary_and_score(method):
    """A NaN key makes its block's summaries NaN (the min/max reductions would skip it; the bf16
    parts' rounding must not carry it into a finite value), so the block's scores are NaN and
    the other blocks' finite, as the fp32 reference has them."""
    q, k, lens = make_inputs([64, 64], 2, 4, 2, 16, torch.float32, seed=5)
    k[1, 0, 20, 3] = float("nan")  # block 1 of sequence 1, head 0
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    ref = reference_block_metadata(k, lens, 16)
    for name in ("mean",) if method == "mean" else ("kmin", "kmax"):
        vals = meta.values(name)
        assert vals[1, 0, 1, 3].isnan() and ref[name][1, 0, 1, 3].isnan()
        assert vals.isnan().sum() == 1
    s = block_scores(q, meta, lens, method=method)
    want = reference_block_scores(q, k, lens, 16, method=method)
    assert torch.equal(s.isnan(), want.isnan()) and s[1, 0, :, 1].isnan().all()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    old=st.lists(st.integers(0, 90), min_size=2, max_size=2),
    delta=st.lists(st.integers(-20, 40), min_size=2, max_size=2),
)
def test_incremental_update_equals_rebuild(old, delta):
    """Appends (verification rounds) and shrinks (rolled-back tails), ragged per sequence."""
    new = [min(max(o + dl, 0), 120) for o, dl in zip(old, delta, strict=True)]
    _, k, _ = make_inputs([120, 120], 1, 2, 2, 16, torch.float32, seed=sum(old), slack=3)
    old_t = torch.tensor(old, dtype=torch.int32, device=DEV)
    new_t = torch.tensor(new, dtype=torch.int32, device=DEV)
    meta = BlockMetadata.build(k, old_t, 16, kinds=("mean", "quest"))
    meta.update(k, old_t, new_t)
    assert_metadata_matches(meta, k, new_t, 16)


@pytest.mark.parametrize("method", ["mean", "quest"])
@pytest.mark.parametrize("t, h, hkv", [(1, 2, 2), (3, 8, 2), (16, 8, 1)])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_block_scores_match_reference(dtype, t, h, hkv, method):
    q, k, lens = make_inputs([100, 7, 70], t, h, hkv, 32, dtype, seed=t * h)
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    with poisoned_allocations():
        s = block_scores(q, meta, lens, method=method)
    ref = reference_block_scores(q, k, lens, 16, method=method)
    assert s.shape == (3, hkv, t, meta.num_blocks) and s.dtype == torch.float32
    assert torch.equal(torch.isneginf(s), torch.isneginf(ref))  # dead blocks, nothing else
    tol = SCORE_TOL[dtype]
    torch.testing.assert_close(s, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("method", ["mean", "quest"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_head_of_256_is_scored_in_two_halves(method, fused):
    """Past 128 columns the score loop sums two half-head products: the scores equal the fp32
    reference's, every column counts (a second half dropped or read at the first half's
    columns would not), and the pick is the reference's."""
    q, k, lens = make_inputs([130, 61, 97], 5, 4, 2, 256, torch.float32, seed=11)
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    with poisoned_allocations():
        s = block_scores(q, meta, lens, method=method)
    ref = reference_block_scores(q, k, lens, 16, method=method)
    torch.testing.assert_close(s, ref, atol=1e-4, rtol=1e-4)
    half = q.clone()
    half[..., 128:] = 0
    ref_half = reference_block_scores(half, k, lens, 16, method=method)
    live = ~torch.isneginf(ref)
    assert (s[live] - ref_half[live]).abs().max() > 1.0
    idx = select_blocks(q, meta, lens, top_n=4, method=method, fused=fused)
    assert_selection_valid(idx.cpu(), ref.cpu(), lens.cpu(), 16, 4, 1, 1)


def assert_selection_valid(idx, scores, lens, block_size, top_n, num_sink, num_local, tol=1e-5):
    """Ascending, -1 only at the end, the forced blocks present, and every pick at least as good
    as every block left out (up to ``tol``: ties in the scores the kernel computed)."""
    for b, nb in enumerate(live_blocks(lens.tolist(), block_size)):
        want = min(top_n, nb)
        forced = {j for j in range(nb) if j < num_sink or j >= nb - num_local}
        for h in range(idx.shape[1]):
            for i in range(idx.shape[2]):
                row = idx[b, h, i].tolist()
                picks = row[:want]
                assert row[want:] == [-1] * (top_n - want)
                assert picks == sorted(set(picks)) and all(0 <= j < nb for j in picks)
                assert forced <= set(picks)
                rest = [j for j in range(nb) if j not in set(picks)]
                free = [j for j in picks if j not in forced]
                if rest and free:
                    s = scores[b, h, i]
                    assert s[free].min() >= s[rest].max() - tol


@pytest.mark.parametrize("method", ["mean", "quest"])
@pytest.mark.parametrize("top_n, num_sink, num_local", [(4, 1, 1), (3, 0, 2), (12, 2, 1)])
def test_select_blocks(method, top_n, num_sink, num_local):
    q, k, lens = make_inputs([150, 20, 61], 3, 8, 2, 16, torch.float16, seed=top_n)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean", "quest"))
    kw = dict(top_n=top_n, method=method, num_sink=num_sink, num_local=num_local)
    idx = select_blocks(q, meta, lens, **kw)
    assert idx.shape == (3, 2, 3, top_n) and idx.dtype == torch.int32
    ref_scores = reference_block_scores(q, k, lens, 16, method=method).cpu()
    assert_selection_valid(idx.cpu(), ref_scores, lens.cpu(), 16, top_n, num_sink, num_local)
    ref = reference_select_blocks(q, k, lens, 16, **kw)
    assert (idx == ref).float().mean() > 0.95  # equal but for rare near-ties


def test_top_blocks_pad_empty_and_short_prefixes():
    scores = torch.randn((3, 1, 2, 8), generator=torch.Generator().manual_seed(1)).to(DEV)
    lens = torch.tensor([0, 20, 128], dtype=torch.int32, device=DEV)  # 0, 2 and 8 live blocks
    with poisoned_allocations():
        idx = top_blocks(scores, lens, block_size=16, top_n=4, num_sink=1, num_local=1).cpu()
    assert (idx[0] == -1).all()
    assert idx[1].tolist() == [[[0, 1, -1, -1], [0, 1, -1, -1]]]
    for r in range(2):  # sink and local forced, the two best of blocks 1..6 between them
        best = sorted((torch.topk(scores[2, 0, r, 1:7].cpu(), 2).indices + 1).tolist())
        assert idx[2, 0, r].tolist() == [0, *best, 7]


def test_reference_pick_ignores_scores_past_the_prefix():
    """Rows hold scores past their live blocks (another sequence's longer prefix): neither
    the reference nor the kernel picks them, and a row of fewer live blocks than top_n pads
    with -1."""
    scores = torch.randn((2, 1, 3, 40), generator=torch.Generator().manual_seed(5)).to(DEV)
    scores[..., 30:] += 100.0  # the best scores lie past the shorter prefix
    lens = torch.tensor([40 * 16, 29 * 16 - 3], dtype=torch.int32, device=DEV)
    want = topn_from_scores(scores, lens, 16, top_n=8)
    assert (want[1] < 29).all() and want[1].min() >= 0
    assert torch.equal(top_blocks(scores, lens, block_size=16, top_n=8), want)
    short = topn_from_scores(
        scores, torch.tensor([80, 640], dtype=torch.int32, device=DEV), 16, top_n=8
    )
    assert short[0, 0, 0].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]


def test_top_blocks_row_layout_keeps_ragged_rows_in_registers():
    from ssvkit.kernels.top_blocks import TOPK_CHUNK, _row_layout

    assert _row_layout(2048) == (2048, 0, 1)
    assert _row_layout(2049) == (2048, 16, 1)  # a 128K cache plus the draft: not 4096 keys
    assert _row_layout(3000) == (2048, 1024, 1)
    assert _row_layout(2 * TOPK_CHUNK + 1) == (TOPK_CHUNK, 0, 3)  # walked in chunks


def exact_top_blocks(scores, lens, block_size, top_n, num_sink, num_local):
    """The pick by its definition: ``top_n`` best of (score descending, block ascending) with
    the forced blocks first, written ascending and ``-1`` padded."""
    b_, h_, t_, nb_max = scores.shape
    out = torch.full((b_, h_, t_, top_n), -1, dtype=torch.int32)
    for b in range(b_):
        nb = min(-(-int(lens[b]) // block_size), nb_max)
        for h, r in itertools.product(range(h_), range(t_)):
            row = scores[b, h, r, :nb].tolist()
            forced = [j < num_sink or j >= nb - num_local for j in range(nb)]
            order = sorted(range(nb), key=lambda j: (not forced[j], -row[j], j))[:top_n]
            out[b, h, r, : len(order)] = torch.tensor(sorted(order), dtype=torch.int32)
    return out


def adversarial_scores(nb_max, groups):
    """Scores that defeat the strided groups of the threshold pick: every group but one holds
    only high scores and that one a single middling score, so its maximum (the threshold) lets
    nearly the whole row through as candidates and the kernel falls back to its rounds."""
    j = torch.arange(nb_max)
    g = j % groups
    s = torch.where(g < groups // 2 - 1, 50.0, 10.0)
    s[groups // 2 - 1] = 20.0
    return s + 1e-3 * torch.rand(nb_max, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    "nb_max, top_n, pattern",
    [
        (300, 16, "randn"),
        (2049, 16, "randn"),  # a 128K cache plus the draft: a tail beside the groups
        (2049, 64, "runs"),
        (129, 64, "tied"),
        (20, 64, "randn"),  # fewer blocks than top_n: the rounds kernel
        (3000, 32, "few_values"),
        (1024, 16, "adversarial"),
        (5000, 16, "randn"),  # beyond one register chunk: the rounds kernel
    ],
)
def test_top_blocks_match_the_definition(nb_max, top_n, pattern):
    gen = torch.Generator().manual_seed(nb_max + top_n)
    scores = torch.randn((3, 1, 2, nb_max), generator=gen)
    if pattern == "runs":  # neighbouring blocks score alike, as attention does
        scores = scores.cumsum(-1)
    elif pattern == "tied":
        scores[:] = 0.0
    elif pattern == "few_values":
        scores = torch.randint(0, 3, scores.shape, generator=gen).float()
    elif pattern == "adversarial":
        groups = top_blocks_mod.GROUPS_PER_PICK * 16
        scores[:] = adversarial_scores(nb_max, groups)
    lens = torch.tensor([64 * nb_max, 64 * (nb_max // 3) + 5, 64 * 17], dtype=torch.int32)
    with poisoned_allocations():
        got = top_blocks(scores.to(DEV), lens.to(DEV), block_size=64, top_n=top_n, num_local=2)
    assert torch.equal(got.cpu(), exact_top_blocks(scores, lens, 64, top_n, 1, 2))


@pytest.mark.parametrize(
    "nb_max, top_n, num_sink, num_local, pattern",
    [
        (300, 4, 2, 2, "randn"),  # forced blocks fill every slot
        (2049, 16, 3, 0, "few_values"),  # ties among the candidates, no local block
        (2049, 16, 0, 5, "randn"),
        (1024, 16, 4, 4, "adversarial"),  # the rounds with forced blocks beside them
    ],
)
def test_top_blocks_forced_blocks_beside_the_pick(nb_max, top_n, num_sink, num_local, pattern):
    gen = torch.Generator().manual_seed(nb_max + num_sink)
    scores = torch.randn((2, 1, 3, nb_max), generator=gen)
    if pattern == "few_values":
        scores = torch.randint(0, 3, scores.shape, generator=gen).float()
    elif pattern == "adversarial":
        scores[:] = adversarial_scores(nb_max, top_blocks_mod.GROUPS_PER_PICK * 16)
    lens = torch.tensor([64 * nb_max, 64 * 6 + 1], dtype=torch.int32)
    kw = dict(block_size=64, top_n=top_n, num_sink=num_sink, num_local=num_local)
    with poisoned_allocations():
        got = top_blocks(scores.to(DEV), lens.to(DEV), **kw)
    want = exact_top_blocks(scores, lens, 64, top_n, num_sink, num_local)
    assert torch.equal(got.cpu(), want)


def test_score_rows_are_aligned_and_read_in_place():
    scores = top_blocks_mod.empty_scores(2, 3, 5, 2049, torch.device(DEV))
    assert scores.shape == (2, 3, 5, 2049) and scores.stride(2) % top_blocks_mod.ROW_ALIGN == 0
    assert top_blocks_mod._aligned_rows(scores) is scores
    packed = torch.randn((2, 3, 5, 2049), device=DEV)  # rows 2049 floats apart: copied
    copied = top_blocks_mod._aligned_rows(packed)
    assert copied.stride(2) == scores.stride(2) and torch.equal(copied, packed)


def test_first_token_only_selects_for_every_row():
    q, k, lens = make_inputs([200, 90], 16, 4, 2, 16, torch.float32, seed=3)
    meta = BlockMetadata.build(k, lens, 16)
    idx = select_blocks(q, meta, lens, top_n=5, first_token_only=True)
    row0 = select_blocks(q[:, :1].contiguous(), meta, lens, top_n=5)
    assert torch.equal(idx, row0.expand(-1, -1, 16, -1))
    own = select_blocks(q, meta, lens, top_n=5)
    assert not torch.equal(idx, own)  # the rule really overrides the other rows' picks
    assert torch.equal(idx, reference_select_blocks(q, k, lens, 16, top_n=5, first_token_only=True))


def test_selection_feeds_sparse_verify():
    """select_blocks output is a valid sparse_verify input (validate=True checks it)."""
    from ssvkit.kernels.sparse_verify import reference_sparse_verify, sparse_verify
    from ssvkit.kernels.tree import ancestor_bitmask, batch_parents
    from ssvkit.perfmodel.acceptance import chain_parents

    q, k, lens = make_inputs([100, 45], 4, 4, 2, 16, torch.float32, seed=9)
    v = torch.randn_like(k)
    meta = BlockMetadata.build(k, lens, 16)
    idx = select_blocks(q, meta, lens, top_n=4)
    mask = ancestor_bitmask(batch_parents(chain_parents(4), 2, device=DEV))
    o, lse = sparse_verify(q, k, v, lens, mask, idx, mode="union", group_size=2, block_size=16)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, block_size=16)
    torch.testing.assert_close(o, ro, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, rlse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("method", ["mean", "quest"])
@pytest.mark.parametrize(
    "lens, t, hkv, top_n, num_sink, num_local",
    [
        ([600, 0, 310], 3, 2, 4, 1, 1),  # an empty prefix beside others, two KV heads
        ([700, 17], 16, 1, 12, 2, 1),  # t = 16 rows per KV head, a 2-block prefix below top_n
        ([400], 1, 2, 3, 0, 2),
        ([20, 40], 2, 2, 64, 1, 1),  # top_n past every row: the two-launch path serves it
    ],
)
def test_one_launch_select_picks_what_the_two_launches_pick(
    monkeypatch, method, lens, t, hkv, top_n, num_sink, num_local
):
    """The one-launch selection (scores, then each row's pick once its scores have arrived)
    against the two launches and the pick's definition on the same scores, ties included. The
    interpreter runs programs one after another, so this checks the ticket order, the arithmetic
    and the counters' reset, not concurrent programs (the GPU tests do)."""
    import ssvkit.kernels.arrivals as arrivals
    import ssvkit.kernels.block_scores as bs
    import ssvkit.kernels.select_blocks as sb

    q, k, lens_t = make_inputs(lens, t, 4 * hkv, hkv, 16, torch.float32, seed=top_n + t)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=(method,))
    kw = dict(top_n=top_n, method=method, num_sink=num_sink, num_local=num_local)
    with poisoned_allocations():
        two = select_blocks(q, meta, lens_t, fused=False, **kw)
        scores = block_scores(q, meta, lens_t, method=method)
    monkeypatch.setattr(bs, "block_scores_kernel", Refused("scores"))
    one_launch = sb.threshold_meta(meta.num_blocks, top_n) is not None
    with poisoned_allocations():
        if one_launch:
            one = select_blocks(q, meta, lens_t, fused=True, **kw)
        else:
            with pytest.raises(AssertionError, match="scores"):
                select_blocks(q, meta, lens_t, fused=True, **kw)
            one = two
    assert torch.equal(one, two)
    want = exact_top_blocks(scores.cpu(), lens_t.cpu(), 16, top_n, num_sink, num_local)
    assert torch.equal(one.cpu(), want)
    counters = arrivals.counter_buffers(torch.device(DEV))
    assert counters or not one_launch
    assert all(int(b.abs().sum()) == 0 for b in counters)


class Refused:
    """A kernel stand-in that refuses to launch."""

    def __init__(self, name):
        self.name = name

    def __getitem__(self, grid):
        raise AssertionError(f"a {self.name} launch")


class SharedMemoryBound:
    """A score kernel that fails to load, as Triton does on the GPU, while its shape asks for
    more than ``limit`` of (BLOCK_NB x stages) or more than ``rows`` padded rows; within both,
    the kernel itself."""

    def __init__(self, kernel, limit, rows=64):
        self.kernel, self.limit, self.rows, self.tried = kernel, limit, rows, []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.tried.append((meta["BLOCK_NB"], meta["NUM_STAGES"]))
            if meta["BLOCK_NB"] * meta["NUM_STAGES"] > self.limit or meta["T_PAD"] > self.rows:
                from triton.runtime.errors import OutOfResources

                raise OutOfResources(1, 0, "shared memory")
            return self.kernel[grid](*args, **meta)

        return launch


@pytest.mark.parametrize("fused", [False, True])
def test_a_score_shape_that_does_not_fit_falls_back_to_one_that_does(monkeypatch, fused):
    """A launch whose score tile and pipeline outgrow the SM's shared memory (head dimension
    256, quest, past 16 rows on an H200) is retried at fewer stages, then narrower tiles, and
    picks what the fitting shape picks; later calls start from the shape that fitted."""
    import ssvkit.kernels.block_scores as bs
    import ssvkit.kernels.select_blocks as sb

    q, k, lens_t = make_inputs([300, 170], 20, 8, 2, 16, torch.float32, seed=3)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=("quest",))
    kw = dict(top_n=4, method="quest", fused=fused)
    want = select_blocks(q, meta, lens_t, **kw)
    owner, name = (sb, "select_kernel") if fused else (bs, "block_scores_kernel")
    bound = SharedMemoryBound(getattr(owner, name), limit=16 * 2)
    monkeypatch.setattr(owner, name, bound)
    monkeypatch.setattr(bs, "_FITTED_SHAPE", {})
    assert torch.equal(select_blocks(q, meta, lens_t, **kw), want)
    assert bound.tried == [(32, 3), (32, 2), (16, 2)]
    bound.tried.clear()
    assert torch.equal(select_blocks(q, meta, lens_t, **kw), want)
    assert bound.tried == [(16, 2)]
    monkeypatch.setattr(bound, "limit", 0)
    monkeypatch.setattr(bs, "_FITTED_SHAPE", {})
    error = ValueError if fused else bs.OutOfResources
    with pytest.raises(error, match="fused=False" if fused else "shared memory"):
        select_blocks(q, meta, lens_t, **kw)
    bound.tried.clear()
    with pytest.raises(error):  # remembered: no shape is tried again
        select_blocks(q, meta, lens_t, **kw)
    assert bound.tried == []


def test_score_at_a_chosen_shape_scores_what_the_rule_scores():
    """``score_at`` (the score-tile benchmark's launch) at any tile, stages and warps gives the
    scores ``block_scores`` gives at the rule's shape; a tile that is no MMA width is refused."""
    import ssvkit.kernels.block_scores as bs

    q, k, lens = make_inputs([300, 170], 20, 8, 2, 128, torch.float32, seed=6)
    meta = BlockMetadata.build(k, lens, 16, kinds=("quest",))
    want = block_scores(q, meta, lens, method="quest")
    assert bs._score_shapes(32, 128, "quest")[0] == (16, 3)  # 2 x 128 columns past 16 rows
    assert bs._score_shapes(32, 64, "quest")[0] == (32, 3)
    for block_nb, stages, warps in ((32, 3, 4), (16, 1, 2)):
        kw = dict(method="quest", block_nb=block_nb, stages=stages, num_warps=warps)
        with poisoned_allocations():
            got, _ = bs.score_at(q, meta, lens, **kw)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="block_nb must be"):
        bs.score_at(q, meta, lens, method="quest", block_nb=24, stages=3, num_warps=4)


def test_scores_past_32_rows_that_fit_no_shape_are_scored_in_two_parts(monkeypatch):
    """Past 32 rows at head dimension 256 quest's query operands alone outgrow the SM: the
    scores of the first 32 rows and of the rest are two launches into one score tensor, the
    same scores (to rounding) and picks as one launch; the one-launch selection refuses in one
    line."""
    import ssvkit.kernels.block_scores as bs
    import ssvkit.kernels.select_blocks as sb

    q, k, lens_t = make_inputs([300, 170], 45, 8, 2, 16, torch.float32, seed=4)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=("quest",))
    want = block_scores(q, meta, lens_t, method="quest")
    picks = select_blocks(q, meta, lens_t, top_n=4, method="quest")
    bound = SharedMemoryBound(bs.block_scores_kernel, limit=64, rows=32)
    monkeypatch.setattr(bs, "block_scores_kernel", bound)
    monkeypatch.setattr(bs, "_FITTED_SHAPE", {})
    with poisoned_allocations():
        got = block_scores(q, meta, lens_t, method="quest")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # other tiles, other sums
    assert torch.equal(select_blocks(q, meta, lens_t, top_n=4, method="quest"), picks)
    monkeypatch.setattr(sb, "select_kernel", SharedMemoryBound(sb.select_kernel, 64, rows=32))
    with pytest.raises(ValueError, match="head_dim 16 with 45 rows"):
        select_blocks(q, meta, lens_t, top_n=4, method="quest", fused=True)


def test_one_launch_ties_resolve_to_the_lower_block():
    """Every block of a row scores the same (zero queries): the pick is the lowest blocks."""
    import ssvkit.kernels.select_blocks as sb

    q, k, lens = make_inputs([400, 300], 4, 4, 2, 16, torch.float32, seed=5)
    meta = BlockMetadata.build(k, lens, 16)
    assert sb.threshold_meta(meta.num_blocks, 5) is not None  # the one-launch path
    zeros = torch.zeros_like(q)
    idx = select_blocks(zeros, meta, lens, top_n=5, num_sink=0, num_local=0, fused=True)
    assert (idx.cpu() == torch.arange(5, dtype=torch.int32)).all()


def wide_heads(d):
    """Query, metadata and lengths at head dimension ``d``."""
    q, k, lens = make_inputs([40, 33], 2, 4, 2, d, torch.float16, seed=0)
    return q, BlockMetadata.build(k, lens, 16), lens


@pytest.mark.parametrize(
    "name, call",
    [
        ("kinds", lambda q, k, lens, m: BlockMetadata.build(k, lens, 16, kinds=("nsa",))),
        ("block_size", lambda q, k, lens, m: BlockMetadata.build(k, lens, 24)),
        ("k_cache", lambda q, k, lens, m: BlockMetadata.build(k.transpose(2, 3), lens, 16)),
        ("prefix_lens", lambda q, k, lens, m: BlockMetadata.build(k, lens.long(), 16)),
        ("new_lens", lambda q, k, lens, m: m.update(k, lens, lens[:1])),
        ("method", lambda q, k, lens, m: block_scores(q, m, lens, method="nsa")),
        ("quest", lambda q, k, lens, m: block_scores(q, m, lens, method="quest")),
        ("q", lambda q, k, lens, m: block_scores(q.int(), m, lens)),
        ("q", lambda q, k, lens, m: block_scores(q[:, :, :3], m, lens)),
        ("head dim", lambda q, k, lens, m: block_scores(*wide_heads(512), method="mean")),
        ("top_n", lambda q, k, lens, m: select_blocks(q, m, lens, top_n=0)),
        ("num_sink", lambda q, k, lens, m: select_blocks(q, m, lens, top_n=2, num_sink=2)),
    ],
)
def test_wrappers_reject_bad_inputs(name, call):
    q, k, lens = make_inputs([40, 33], 2, 4, 2, 16, torch.float16, seed=0)
    meta = BlockMetadata.build(k, lens, 16)
    with pytest.raises(ValueError, match=name) as err:
        call(q, k, lens, meta)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["mean", "quest"])
def test_gpu_bf16_select_matches_reference(method):
    q, k, lens = make_inputs([5000, 1234], 16, 32, 8, 128, torch.bfloat16, seed=0)
    meta = BlockMetadata.build(k, lens, 64, kinds=(method,))
    s = block_scores(q, meta, lens, method=method)
    ref = reference_block_scores(q, k, lens, 64, method=method)
    torch.testing.assert_close(s, ref, atol=1e-3, rtol=1e-3)
    idx = select_blocks(q, meta, lens, top_n=16, method=method)
    # bf16x3 scores on the GPU: ~2^-16 relative, at most a few 1e-5 at these magnitudes.
    assert_selection_valid(idx.cpu(), ref.cpu(), lens.cpu(), 64, 16, 1, 1, tol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "fused"), [(23, False), (23, True), (45, False), (45, True)])
def test_gpu_wide_heads_select_past_16_rows(t, fused):
    """Quest at head dimension 256 past 16 rows, the widest score operands: the launch runs at
    the first score shape that fits the SM's shared memory and selects what the reference
    scores give, in one launch and in two."""
    q, k, lens = make_inputs([9000, 4321], t, 8, 4, 256, torch.bfloat16, seed=t)
    meta = BlockMetadata.build(k, lens, 64, kinds=("quest",))
    s = block_scores(q, meta, lens, method="quest")
    ref = reference_block_scores(q, k, lens, 64, method="quest")
    torch.testing.assert_close(s, ref, atol=1e-3, rtol=1e-3)
    idx = select_blocks(q, meta, lens, top_n=16, method="quest", fused=fused)
    assert_selection_valid(idx.cpu(), ref.cpu(), lens.cpu(), 64, 16, 1, 1, tol=1e-4)


def test_top_blocks_pick_the_same_at_any_warps_and_refuse_others():
    gen = torch.Generator().manual_seed(3)
    scores = empty_scores(1, 2, 3, 150, torch.device(DEV))
    scores.copy_(torch.randn(scores.shape, generator=gen))
    lens = torch.tensor([150 * 16 - 5], dtype=torch.int32, device=DEV)
    want = top_blocks(scores, lens, block_size=16, top_n=8)
    for w in (1, 2, 8):
        assert torch.equal(top_blocks(scores, lens, block_size=16, top_n=8, num_warps=w), want)
    with pytest.raises(ValueError, match="num_warps"):
        top_blocks(scores, lens, block_size=16, top_n=8, num_warps=3)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [129, 2049])
def test_gpu_top_blocks_pick_the_same_at_every_warp_count(blocks):
    """The registers of one row split over 1-8 warps: a reduction across warps that lost a
    group or a candidate shows as another pick."""
    gen = torch.Generator(device="cuda").manual_seed(blocks)
    scores = empty_scores(2, 8, 16, blocks, torch.device("cuda"))
    scores.copy_(torch.randn(scores.shape, generator=gen, device="cuda"))
    lens = torch.tensor([blocks * 64, blocks * 64 - 700], dtype=torch.int32, device="cuda")
    want = topn_from_scores(scores, lens, 64, top_n=16)
    for w in (1, 2, 4, 8):
        got = top_blocks(scores, lens, block_size=64, top_n=16, num_warps=w)
        assert torch.equal(got, want), w


@pytest.mark.gpu
@pytest.mark.parametrize("t, top_n", [(1, 16), (16, 64)])
def test_gpu_one_launch_select_is_repeatable_and_equals_two_launches(t, top_n):
    """Programs run concurrently here: a pick that read a score before it was visible, or a
    counter left non-zero, shows as a selection that differs between repeats or from the two
    launches'."""
    q, k, lens = make_inputs([130000, 5000, 77], t, 32, 8, 128, torch.bfloat16, seed=t)
    meta = BlockMetadata.build(k, lens, 64, kinds=("mean",))
    two = select_blocks(q, meta, lens, top_n=top_n, fused=False)
    for _ in range(20):
        assert torch.equal(select_blocks(q, meta, lens, top_n=top_n, fused=True), two)


@pytest.mark.gpu
def test_gpu_cuda_graph_update_and_select():
    """update + select_blocks capture in one graph; replay sees the new lengths and keys."""
    q, k, lens = make_inputs([3000, 2000], 8, 32, 8, 128, torch.bfloat16, seed=1, slack=200)
    meta = BlockMetadata.build(k, lens, 64, kinds=("mean", "quest"))
    old, new = lens.clone(), lens.clone()
    select_blocks(q, meta, new, top_n=16, method="quest")  # compile outside the capture
    meta.update(k, old, new)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta.update(k, old, new)
        idx = select_blocks(q, meta, new, top_n=16, method="quest")
    new.add_(torch.tensor([9, 65], dtype=torch.int32, device=DEV))
    k[:, :, 3000:3100].normal_()
    graph.replay()
    torch.cuda.synchronize()
    ref_meta = BlockMetadata.build(k, new, 64, kinds=("mean", "quest"))
    assert_metadata_matches(meta, k, new, 64)
    assert torch.equal(idx, select_blocks(q, ref_meta, new, top_n=16, method="quest"))


@pytest.mark.skipif(not offline_compile.available(), reason="Triton has no ptxas here")
def test_the_selection_kernels_compile_for_hopper():
    """The interpreter runs code Triton's compiler rejects: every selection kernel, at the
    narrowest and the widest score operands, also compiles for sm_90 (in a process of its own,
    whose kernels are not the interpreter's)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("select_compile_cases.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "compiled 22"
