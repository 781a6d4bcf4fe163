"""The position-relative block pick (``kernels.top_blocks.relative_slots``) of
``top_blocks`` and ``select_blocks`` against its definition and the fp32 torch reference.

CPU: Triton interpreter, fp32, small rows. GPU (``gpu`` marker): bf16 at D = 128, 128K.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.select_blocks import block_scores, select_blocks
from ssvkit.kernels.select_reference import topn_from_scores
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.kernels.top_blocks import top_blocks

DEV = "cuda" if HAS_CUDA else "cpu"


def make_inputs(prefix_lens, t, h, hkv, d, dtype, seed):
    """Queries, a key cache 9 tokens longer than the longest prefix and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((len(prefix_lens), t, h, d), generator=gen).to(dtype)
    k = torch.randn((len(prefix_lens), hkv, max(prefix_lens) + 9, d), generator=gen).to(dtype)
    return q.to(DEV), k.to(DEV), torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)


def exact_relative_blocks(scores, lens, positions, block_size, top_n, num_sink, window):
    """The position-relative rule by its definition: per row, the ``top_n`` best of the live
    blocks that end before the window ``[p - window, p)`` (the first ``num_sink`` forced,
    ties to the lower block) ascending and ``-1`` padded, then the ``window // block_size + 1``
    blocks from the window's first on that begin before ``p`` and inside the prefix."""
    b_, h_, t_, nb_max = scores.shape
    slots = window // block_size + 1
    out = torch.full((b_, h_, t_, top_n + slots), -1, dtype=torch.int32)
    for b in range(b_):
        live = -(-int(lens[b]) // block_size)
        for h, r in itertools.product(range(h_), range(t_)):
            p = int(positions[b, r])
            lo = max(p - window, 0) // block_size
            nb = min(live, nb_max, lo)
            row = scores[b, h, r, :nb].tolist()
            order = sorted(range(nb), key=lambda j: (j >= num_sink, -row[j], j))[:top_n]
            out[b, h, r, : len(order)] = torch.tensor(sorted(order), dtype=torch.int32)
            for s in range(slots):
                blk = lo + s
                if blk * block_size < p and blk < live:
                    out[b, h, r, top_n + s] = blk
    return out


def relative_inputs(nb_max, t, seed, pattern="randn"):
    """Scores of three sequences and their rows' positions: a long prefix (rows after it), a
    shorter one, and one shorter than the window (no candidates, a partial window)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn((3, 2, t, nb_max), generator=gen)
    if pattern == "few_values":
        scores = torch.randint(0, 3, scores.shape, generator=gen).float()
    lens = torch.tensor([16 * nb_max - 5, 16 * (nb_max // 2) + 3, 50], dtype=torch.int32)
    positions = lens.long()[:, None] + torch.arange(t)[None, :]
    return scores, lens, positions


@pytest.mark.parametrize(
    "nb_max, top_n, pattern",
    [(300, 16, "randn"), (300, 8, "few_values"), (40, 48, "randn"), (5000, 16, "randn")],
)
def test_relative_pick_matches_the_definition(nb_max, top_n, pattern):
    """The threshold pick (300 blocks), the rounds kernel (top_n beyond the row's chunk, a
    row beyond one register chunk) and the torch reference all follow the rule."""
    scores, lens, positions = relative_inputs(nb_max, 3, nb_max + top_n, pattern)
    want = exact_relative_blocks(scores, lens, positions, 16, top_n, 2, 64)
    kw = dict(block_size=16, top_n=top_n, num_sink=2, num_local=0, window=64)
    with poisoned_allocations():
        got = top_blocks(scores.to(DEV), lens.to(DEV), positions=positions.to(DEV), **kw)
    assert torch.equal(got.cpu(), want)
    assert (want[2, :, :, :top_n] == -1).all()  # the short sequence has no candidates
    if pattern == "randn":  # torch.topk may order ties otherwise
        ref = topn_from_scores(scores, lens, positions=positions, **kw)
        assert torch.equal(ref, want)


def _both_launches_and_reference(q, meta, lens, block_size, *, top_n, method, positions, window):
    """The relative pick in two launches and in one (outputs poisoned first), and the fp32
    reference pick of the kernel's own block scores under the same rule (one sink block)."""
    kw = dict(num_sink=1, num_local=0, positions=positions, window=window)
    with poisoned_allocations():
        two = select_blocks(q, meta, lens, top_n=top_n, method=method, **kw)
        one = select_blocks(q, meta, lens, top_n=top_n, method=method, fused=True, **kw)
    scores = block_scores(q, meta, lens, method=method)
    return two, one, topn_from_scores(scores, lens, block_size, top_n=top_n, **kw)


@pytest.mark.parametrize("method", ["mean", "quest"])
def test_select_blocks_relative_one_and_two_launches(method):
    q, k, lens = make_inputs([700, 333, 90], 5, 4, 2, 16, torch.float32, seed=11)
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    positions = lens.long()[:, None] + torch.arange(5, device=DEV)[None, :]
    two, one, want = _both_launches_and_reference(
        q, meta, lens, 16, top_n=6, method=method, positions=positions, window=48
    )
    assert two.shape == (3, 2, 5, 6 + 48 // 16 + 1)
    assert torch.equal(two, want) and torch.equal(one, want)


def test_relative_pick_rejects_bad_arguments():
    q, k, lens = make_inputs([200, 90], 2, 4, 2, 16, torch.float32, seed=4)
    meta = BlockMetadata.build(k, lens, 16)
    pos = lens.long()[:, None] + torch.arange(2, device=DEV)[None, :]
    with pytest.raises(ValueError, match="num_local=1 does not apply"):
        select_blocks(q, meta, lens, top_n=4, positions=pos, window=32)
    with pytest.raises(ValueError, match=r"positions must be \[2, 2\] int64"):
        select_blocks(q, meta, lens, top_n=4, num_local=0, positions=pos.int(), window=32)
    with pytest.raises(ValueError, match="window must be >= 0, got -1"):
        select_blocks(q, meta, lens, top_n=4, num_local=0, positions=pos, window=-1)
    with pytest.raises(ValueError, match="exclude each other"):
        select_blocks(
            q, meta, lens, top_n=4, num_local=0, positions=pos, window=32, first_token_only=True
        )


@pytest.mark.gpu
@pytest.mark.parametrize("t, method", [(1, "mean"), (16, "mean"), (16, "quest")])
def test_gpu_relative_select_follows_its_scores(t, method):
    """bf16 at D = 128 and 128K: under the position-relative rule the two launches and the
    one launch pick what the reference pick makes of the kernel's own scores, and the window's
    blocks follow each row's picks."""
    q, k, lens = make_inputs([130000, 5000, 300], t, 32, 8, 128, torch.bfloat16, seed=t)
    meta = BlockMetadata.build(k, lens, 64, kinds=(method,))
    pos = lens.long()[:, None] + torch.arange(t, device="cuda")[None, :]
    two, one, want = _both_launches_and_reference(
        q, meta, lens, 64, top_n=16, method=method, positions=pos, window=512
    )
    assert torch.equal(two, want) and torch.equal(one, want)
    assert (two[2, :, :, :16] == -1).all()  # 300 tokens: no block ends before the window
