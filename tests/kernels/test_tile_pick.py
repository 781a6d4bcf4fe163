"""The tile pick (``kernels.tile_pick_kernels``): the top-n pick from the scores and the maxima
of their tiles, against the pick's definition and the whole-row pick, on ragged rows, forced
blocks, both pick rules, ties that leave too many tiles or too many candidates, and NaN; and the
maxima the scoring writes beside its scores (``block_scores.scores_and_tile_max``)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.block_scores import block_scores, scores_and_tile_max
from ssvkit.kernels.select_blocks import select_blocks
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.kernels.top_blocks import TileMax, top_blocks
from test_select_blocks import exact_top_blocks, make_inputs

DEV = "cuda" if HAS_CUDA else "cpu"


def ordered(scores: torch.Tensor) -> torch.Tensor:
    """fp32 scores as the int32 that orders like them."""
    bits = scores.contiguous().view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def tile_max_of(scores: torch.Tensor, width: int) -> TileMax:
    """The maxima of ``scores``' tiles of ``width`` blocks, as the scoring writes them."""
    b, h, t, nb = scores.shape
    tiles = -(-nb // width)
    padded = scores.new_full((b, h, t, tiles * width), float("-inf"))
    padded[..., :nb] = scores
    return TileMax(ordered(padded).view(b, h, t, tiles, width).amax(-1).contiguous(), width)


def patterned(shape, pattern: str, width: int, gen: torch.Generator) -> torch.Tensor:
    scores = torch.randn(shape, generator=gen)
    if pattern == "runs":  # neighbouring blocks score alike, as attention does
        scores = scores.cumsum(-1)
    elif pattern == "tied":  # every maximum ties: more tiles than the pick gathers
        scores[:] = 0.0
    elif pattern == "few_values":
        scores = torch.randint(0, 3, shape, generator=gen).float()
    elif pattern == "clustered":  # each tile one value: the gathered tiles pass CAP candidates
        tiles = torch.randn((*shape[:-1], -(-shape[-1] // width)), generator=gen)
        scores = tiles.repeat_interleave(width, -1)[..., : shape[-1]].contiguous()
    return scores


@pytest.mark.parametrize(
    "nb_max, top_n, width, num_sink, num_local, pattern",
    [
        (2049, 16, 32, 1, 1, "randn"),
        (2049, 16, 32, 1, 1, "runs"),
        (300, 16, 16, 1, 1, "randn"),
        (300, 16, 16, 2, 3, "clustered"),
        (1000, 8, 32, 1, 1, "tied"),
        (1000, 16, 16, 0, 0, "few_values"),
        (129, 32, 16, 2, 1, "randn"),  # fewer pure tiles than picks
        (40, 16, 32, 1, 1, "randn"),  # one tile, an edge
        (5000, 32, 32, 1, 2, "randn"),  # a row longer than the whole-row picks hold
    ],
)
def test_tile_pick_matches_the_definition(nb_max, top_n, width, num_sink, num_local, pattern):
    gen = torch.Generator().manual_seed(nb_max + top_n + width)
    scores = patterned((3, 1, 2, nb_max), pattern, width, gen)
    lens = torch.tensor([64 * nb_max, 64 * (nb_max // 3) + 5, 64 * 17], dtype=torch.int32)
    kw = dict(block_size=64, top_n=top_n, num_sink=num_sink, num_local=num_local)
    tile_max = tile_max_of(scores, width)
    with poisoned_allocations():
        got = top_blocks(
            scores.to(DEV),
            lens.to(DEV),
            tile_max=TileMax(tile_max.values.to(DEV), width),
            **kw,
        )
    assert torch.equal(got.cpu(), exact_top_blocks(scores, lens, 64, top_n, num_sink, num_local))


@pytest.mark.parametrize("pattern", ["randn", "clustered", "tied"])
def test_tile_pick_under_the_position_relative_rule_is_the_whole_row_pick(pattern):
    gen = torch.Generator().manual_seed(5)
    nb_max, width, window = 700, 32, 512
    scores = patterned((2, 2, 3, nb_max), pattern, width, gen).to(DEV)
    lens = torch.tensor([64 * nb_max, 64 * 200 + 3], dtype=torch.int32, device=DEV)
    positions = torch.tensor([[100, 30000, 44799], [0, 9000, 12803]], device=DEV)
    kw = dict(block_size=64, top_n=16, num_local=0, positions=positions, window=window)
    want = top_blocks(scores, lens, **kw)
    tile_max = tile_max_of(scores.cpu(), width)
    with poisoned_allocations():
        got = top_blocks(scores, lens, tile_max=TileMax(tile_max.values.to(DEV), width), **kw)
    assert torch.equal(got, want)


def test_a_nan_score_ranks_as_in_the_whole_row_pick():
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn((1, 2, 2, 900), generator=gen)
    scores[0, 0, 0, 333] = float("nan")
    scores[0, 1, 1, 5] = float("nan")
    lens = torch.tensor([64 * 900], dtype=torch.int32)
    want = top_blocks(scores.to(DEV), lens.to(DEV), block_size=64, top_n=16)
    tile_max = tile_max_of(scores, 32)
    got = top_blocks(
        scores.to(DEV),
        lens.to(DEV),
        block_size=64,
        top_n=16,
        tile_max=TileMax(tile_max.values.to(DEV), 32),
    )
    assert torch.equal(got, want)
    assert 333 in got[0, 0, 0].tolist()


@pytest.mark.parametrize("method", ["mean", "quest"])
def test_the_scoring_writes_each_tiles_maximum_beside_its_scores(method):
    q, k, lens = make_inputs([3000, 700], 3, 8, 2, 32, torch.float32, seed=4)
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    scores, tile_max = scores_and_tile_max(q, meta, lens, method=method)
    assert torch.equal(scores, block_scores(q, meta, lens, method=method))
    want = tile_max_of(scores.cpu(), tile_max.width).values
    assert torch.equal(tile_max.values.cpu(), want)
    # Tiles past a sequence's prefix hold -inf: the lowest ordered score but NaN's.
    assert int(tile_max.values[1, 0, 0, -1]) == int(ordered(torch.tensor([float("-inf")])))


def test_tile_max_of_another_shape_is_refused():
    scores = torch.randn((1, 2, 1, 100), device=DEV)
    lens = torch.tensor([6400], dtype=torch.int32, device=DEV)
    bad = TileMax(torch.zeros((1, 2, 1, 3), dtype=torch.int32, device=DEV), 32)
    with pytest.raises(ValueError, match=r"tile_max must be \[1, 2, 1, 4\] int32"):
        top_blocks(scores, lens, block_size=64, top_n=8, tile_max=bad)


@pytest.mark.parametrize("method", ["mean", "quest"])
def test_select_blocks_with_the_tile_pick_picks_what_it_picks_without(method):
    q, k, lens = make_inputs([5000, 1500, 90], 4, 8, 2, 32, torch.float32, seed=8)
    meta = BlockMetadata.build(k, lens, 16, kinds=(method,))
    for kw in (dict(top_n=12), dict(top_n=8, num_sink=2, num_local=0, first_token_only=True)):
        want = select_blocks(q, meta, lens, method=method, **kw)
        with poisoned_allocations():
            got = select_blocks(q, meta, lens, method=method, tile_pick=True, **kw)
        assert torch.equal(got, want)
    positions = (lens.long()[:, None] - 4 + torch.arange(4, device=DEV)[None, :]).clamp(min=0)
    kw = dict(top_n=12, num_local=0, positions=positions, window=64)
    want = select_blocks(q, meta, lens, method=method, **kw)
    assert torch.equal(select_blocks(q, meta, lens, method=method, tile_pick=True, **kw), want)


def test_select_blocks_takes_the_tile_pick_where_it_pays(monkeypatch):
    """By default ``select_blocks`` asks ``perfmodel.pick_work.tile_pick_pays`` about its score
    rows (B x Hkv x t), row length, top_n, forced blocks and the scoring's tile width, scores
    with the tiles' maxima where it says so, and picks the same blocks either way."""
    from ssvkit.kernels import select_blocks as sb_mod

    q, k, lens = make_inputs([5000, 1500, 90], 4, 8, 2, 32, torch.float32, seed=9)
    meta = BlockMetadata.build(k, lens, 16, kinds=("mean",))
    asked, with_maxima = [], []
    real_scores = sb_mod.scores_and_tile_max

    def spy(*a, **kw):
        with_maxima.append(True)
        return real_scores(*a, **kw)

    monkeypatch.setattr(sb_mod, "scores_and_tile_max", spy)
    want = select_blocks(q, meta, lens, top_n=12, tile_pick=False)
    for pays in (False, True):
        monkeypatch.setattr(sb_mod, "tile_pick_pays", lambda *a, p=pays: asked.append(a) or p)
        with poisoned_allocations():
            assert torch.equal(select_blocks(q, meta, lens, top_n=12), want)
        assert len(with_maxima) == int(pays)
    width = sb_mod.score_block_nb(16, 32, "mean")
    assert asked[0] == (3 * 2 * 4, meta.num_blocks, 12, 1, 1, width, sb_mod.num_sms(q.device))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_gpu_tile_pick_at_llama_geometry_is_the_whole_row_pick(t):
    """bf16 scoring at D = 128 with its tile maxima, 2,049-block rows, in and out of a CUDA
    graph: the compiled kernels' reductions, scans and scratch round trips."""
    q, k, lens = make_inputs([131072, 5000, 77], t, 32, 8, 128, torch.bfloat16, seed=t)
    meta = BlockMetadata.build(k, lens, 64, kinds=("mean",))
    want = select_blocks(q, meta, lens, top_n=16)
    for _ in range(5):
        assert torch.equal(select_blocks(q, meta, lens, top_n=16, tile_pick=True), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx = select_blocks(q, meta, lens, top_n=16, tile_pick=True, pdl=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(idx, want)
