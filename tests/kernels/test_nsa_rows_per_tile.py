"""nsa_verify's row schedule (``NsaVerifyConfig.rows_per_tile``): one draft row per row tile
(``per_query``, seed 000's naive baseline), tiles of C rows (``union``) and the packed default
give the same attention, against the fp32 torch reference; the launch plan packs the rows as
``perfmodel.nsa_plan`` prices them.

CPU: Triton interpreter, fp32 (fp16 in one case), ragged prefixes with NaN past every
sequence's cache (a correct kernel never reads it). GPU (``gpu`` marker): bf16 at
Llama-3.1-8B's attention, and CUDA-graph capture of a per-query call.
"""

from __future__ import annotations

import numpy as np
import pytest
import ssvkit.kernels.nsa_launch as nl
import torch
from kernel_helpers import assert_close, case_dtype
from nsa_helpers import GPU_KW, NSA_KW, make_gpu_inputs, make_inputs
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    nsa_union_plan,
    nsa_verify,
    nsa_verify_unfused,
    reference_nsa_verify,
)
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.perfmodel import nsa_plan

# (prefix_lens, t, H, Hkv, D, tree, dtype): one row per tile at G = 4, 3 (padded to 4) and 1, so
# a tile's 16 MMA rows hold one draft row and padding head slots; t = 5 leaves a last tile of
# one row under rows_per_tile = 2 and 4; a prefix of 0 (no compressed token, no block) beside a
# longer one; two KV heads (G = 1). The kernels' arithmetic is fp32 whatever the inputs' dtype:
# fp16 once, for the casts of the loads and of the output.
CPU_SHAPES = [
    ([130], 3, 4, 1, 32, "tree", torch.float32),
    ([0, 45], 5, 3, 1, 16, "chain", torch.float16),
    ([99], 5, 2, 2, 16, "tree", torch.float32),
]


def shape_id(shape) -> str:
    return f"L{shape[0]}-t{shape[1]}-H{shape[2]}-kv{shape[3]}-{str(shape[6]).split('.')[-1]}"


@pytest.mark.parametrize("rows_per_tile", [1, 2, 4])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=shape_id)
def test_reuse_with_rows_per_tile_matches_reference(shape, rows_per_tile):
    prefix_lens, t, h, hkv, d, tree, dtype = shape
    dtype = case_dtype(dtype)
    args, idx = make_inputs(prefix_lens, t, h, hkv, d, dtype, tree=tree, seed=3 * t + h)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    assert torch.isfinite(ro).all()
    cfg = NsaVerifyConfig(rows_per_tile=rows_per_tile)
    split = NsaVerifyConfig(rows_per_tile=rows_per_tile, num_splits=4)
    with poisoned_allocations():
        o, used = nsa_verify(*args, block_idx=idx, config=cfg, **NSA_KW)
        o_split, _ = nsa_verify(*args, block_idx=idx, config=split, **NSA_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=idx, config=cfg, **NSA_KW)
    assert used is idx
    for out in (o, o_split, o_unfused):
        assert not torch.isnan(out).any()
        assert_close(out, ro, dtype, "o")


@pytest.mark.parametrize("fused", [True, False])
def test_refresh_with_one_row_per_tile_selects_and_attends_as_the_reference(fused):
    """The refresh path scores, picks and attends per tile: with one row a tile the indices
    must still be the reference's exactly (random data: no ties)."""
    args, _ = make_inputs([150, 61], 5, 4, 1, 16, torch.float32, tree="tree", seed=21)
    ro, ridx = reference_nsa_verify(*args, **NSA_KW)
    fn = nsa_verify if fused else nsa_verify_unfused
    with poisoned_allocations():
        o, idx = fn(*args, config=NsaVerifyConfig(rows_per_tile=1), **NSA_KW)
    assert torch.equal(idx.cpu(), ridx.cpu())
    assert not torch.isnan(o).any()
    assert_close(o, ro, torch.float32, "o")


def test_shared_context_tiles_match_reference(monkeypatch):
    """``context_tiles="shared"`` at one draft row a tile: the compressed branch runs on one
    tile of all five rows (its own launch, its partials merged from a buffer of their own), the
    other branches on the schedule's tiles; refresh and reuse, fused and unfused, attend as the
    reference and the refresh selects its blocks exactly."""
    import ssvkit.kernels.nsa_unfused as nu
    import ssvkit.kernels.nsa_verify as nv

    plans = []
    real = nv.context_plan
    for mod in (nv, nu):  # the fused call's and the unfused baseline's
        monkeypatch.setattr(
            mod, "context_plan", lambda *a, **k: plans.append(real(*a, **k)) or plans[-1]
        )
    args, idx = make_inputs([150, 61], 5, 4, 1, 16, torch.float32, tree="tree", seed=23)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    ro_refresh, ridx = reference_nsa_verify(*args, **NSA_KW)
    cfg = NsaVerifyConfig(rows_per_tile=1, context_tiles="shared", num_splits=4)
    with poisoned_allocations():
        outs = [
            fn(*args, block_idx=idx, config=cfg, **NSA_KW)[0]
            for fn in (nsa_verify, nsa_verify_unfused)
        ]
        fresh = [fn(*args, config=cfg, **NSA_KW) for fn in (nsa_verify, nsa_verify_unfused)]
    assert [p.num_tiles for p in plans] == [1] * 4  # every call took the shared tile
    for out in outs:
        assert not torch.isnan(out).any()
        assert_close(out, ro, torch.float32, "o")
    for out, used in fresh:
        assert torch.equal(used.cpu(), ridx.cpu())
        assert not torch.isnan(out).any()
        assert_close(out, ro_refresh, torch.float32, "o")


def test_paired_launch_is_the_two_launches(monkeypatch):
    """``context_tiles="paired"`` at two draft rows a tile: a reuse call on shared compressed
    tiles runs its two forward
    steps as one launch, bit for bit the output of the two launches ("shared": each program
    runs the same code on the same slots) and the reference's attention; a refresh call keeps
    its launches."""
    import ssvkit.kernels.nsa_verify as nv

    calls = []
    real = nv.launch_pair
    monkeypatch.setattr(nv, "launch_pair", lambda *a, **k: calls.append(1) or real(*a, **k))
    args, idx = make_inputs([150, 33], 5, 4, 1, 16, torch.float32, tree="tree", seed=29)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    base = NsaVerifyConfig(rows_per_tile=2, num_splits=4, context_tiles="shared")
    with poisoned_allocations():
        o_two, _ = nsa_verify(*args, block_idx=idx, config=base, **NSA_KW)
        assert not calls
        cfg = NsaVerifyConfig(rows_per_tile=2, num_splits=4, context_tiles="paired")
        o_one, _ = nsa_verify(*args, block_idx=idx, config=cfg, **NSA_KW)
        assert len(calls) == 1
        nsa_verify(*args, config=cfg, **NSA_KW)
    assert len(calls) == 1
    assert not torch.isnan(o_one).any()
    assert torch.equal(o_one, o_two)
    assert_close(o_one, ro, torch.float32, "o")


def test_shared_context_tiles_need_fewer_tiles_and_the_separate_merge():
    """The compressed branch keeps the call's tiles where sharing saves none (a packed call)
    or the merge is folded; the setting is checked."""
    q, k, ck = _meta_inputs(17, 32, 8)
    kw = dict(num_sink=1, num_local=1, sm_scale=None, **GPU_KW)
    for rows, merge, tiles in ((4, "separate", 2), (0, "separate", None), (4, "last", None)):
        cfg = NsaVerifyConfig(rows_per_tile=rows, context_tiles="shared", merge=merge)
        shared = nl.context_plan(nl.make_plan(q, k, ck, config=cfg, **kw), q, k, ck, cfg, **kw)
        assert (shared and shared.num_tiles) == tiles
    with pytest.raises(
        ValueError, match="context_tiles must be one of per_tile, shared, paired, got 'x'"
    ):
        NsaVerifyConfig(context_tiles="x")


def test_one_row_per_tile_streams_each_rows_own_blocks():
    """A per-query call's union plan is every row's own block list (no union kernel, no member
    bits): ``t`` tiles of one row; the packed plan of the same call has one tile of all rows."""
    args, idx = make_inputs([130, 90], 5, 4, 1, 16, torch.float32, seed=6)
    q, k = args[0], args[1]
    bs = NSA_KW["block_size"]
    one = nsa_union_plan(q, k, idx, block_size=bs, config=NsaVerifyConfig(rows_per_tile=1))
    assert one.num_groups == 5 and one.member_mask is None and one.block_lists is idx
    packed = nsa_union_plan(q, k, idx, block_size=bs)
    assert packed.num_groups == 1 and packed.member_mask is not None
    o_one, _ = nsa_verify(*args, block_idx=idx, config=NsaVerifyConfig(rows_per_tile=1), **NSA_KW)
    o_packed, _ = nsa_verify(*args, block_idx=idx, union=packed, **NSA_KW)
    assert_close(o_one, o_packed, torch.float32, "o")


def _meta_inputs(t, h, hkv, context=4096):
    shape = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty((1, t, h, 128), **shape)
    k = torch.empty((1, hkv, context + 64, 128), **shape)
    ck = torch.empty((1, hkv, (context - 32) // 16 + 1, 128), **shape)
    return q, k, ck


def _plan(t, h, hkv, rows_per_tile, context=4096):
    q, k, ck = _meta_inputs(t, h, hkv, context)
    cfg = NsaVerifyConfig(rows_per_tile=rows_per_tile)
    return nl.make_plan(q, k, ck, config=cfg, num_sink=1, num_local=1, sm_scale=None, **GPU_KW)


@pytest.mark.parametrize(
    ("t", "h", "hkv", "rows_per_tile", "rows", "group_pad", "block_m", "tiles"),
    [
        (17, 32, 8, 0, 16, 4, 64, 2),  # packed: 16 rows x 4 heads
        (17, 32, 8, 1, 1, 16, 16, 17),  # per query: 1 row, head slots padded to 16 MMA rows
        (17, 32, 8, 4, 4, 4, 16, 5),  # union C = 4
        (17, 32, 8, 2, 2, 8, 16, 9),
        (17, 8, 8, 1, 1, 16, 16, 17),  # G = 1
        (3, 32, 8, 8, 4, 4, 16, 1),  # a tile never holds more than the next power of two of t
        (12, 64, 2, 1, 1, 32, 32, 12),  # G = 32 fills 16 MMA rows alone
    ],
)
def test_plan_packs_rows_per_tile_as_the_step_model_prices_them(
    t, h, hkv, rows_per_tile, rows, group_pad, block_m, tiles
):
    p = _plan(t, h, hkv, rows_per_tile)
    assert (p.rows, p.group_pad, p.block_m, p.num_tiles) == (rows, group_pad, block_m, tiles)
    assert p.block_m // p.group_pad == p.rows  # the kernels' ROWS: exactly the tile's rows
    bm, tl = nsa_plan.row_tiles(t, h, hkv, rows_per_tile)
    assert (float(bm), float(tl)) == (block_m, tiles)


def test_rows_per_tile_rounds_down_to_a_power_of_two():
    with pytest.raises(ValueError, match="rows_per_tile must be >= 0, got -1"):
        NsaVerifyConfig(rows_per_tile=-1)
    assert [_plan(17, 32, 8, r).rows for r in (3, 6, 7, 31)] == [2, 4, 4, 16]
    assert [float(nsa_plan.row_tiles(17, 32, 8, r)[1]) for r in (3, 6, 7, 31)] == [9, 5, 5, 2]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("context_tiles", ["per_tile", "shared"])
@pytest.mark.parametrize("rows_per_tile", [1, 4])
@pytest.mark.parametrize("t", [5, 17])
def test_gpu_bf16_rows_per_tile_matches_reference(t, rows_per_tile, context_tiles):
    args = make_gpu_inputs([4093, 700, 2500], t, seed=40 + t)
    ro, ridx = reference_nsa_verify(*args, **GPU_KW)
    cfg = NsaVerifyConfig(rows_per_tile=rows_per_tile, context_tiles=context_tiles)
    with poisoned_allocations():
        o, idx = nsa_verify(*args, config=cfg, **GPU_KW)
        o_reuse, _ = nsa_verify(*args, block_idx=ridx.int(), config=cfg, **GPU_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=ridx.int(), config=cfg, **GPU_KW)
        o_packed, _ = nsa_verify(*args, block_idx=ridx.int(), **GPU_KW)
    agree = (idx == ridx).all(-1)  # bf16 near-ties: compare where the selections agree
    assert agree.float().mean() > 0.9
    rows = agree.transpose(1, 2).repeat_interleave(4, 2)  # [B, t, H]
    assert_close(o[rows], ro[rows], torch.bfloat16, "o")
    ro_reuse, _ = reference_nsa_verify(*args, block_idx=ridx, **GPU_KW)
    for out in (o_reuse, o_unfused, o_packed):
        assert_close(out, ro_reuse, torch.bfloat16, "o")


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_tile", [1, 4])
def test_gpu_paired_launch_is_the_two_launches_and_captures(rows_per_tile):
    """bf16 at Llama-3.1-8B's attention, t = 17: the paired reuse launch gives the two
    launches' output bit for bit, in a CUDA graph too."""
    args = make_gpu_inputs([4093, 700, 2500], 17, seed=57)
    _, idx = nsa_verify(*args, **GPU_KW)
    kw = dict(GPU_KW, block_idx=idx, validate=False)
    two = NsaVerifyConfig(rows_per_tile=rows_per_tile, context_tiles="shared")
    one = NsaVerifyConfig(rows_per_tile=rows_per_tile, context_tiles="paired")
    with poisoned_allocations():
        o_two, _ = nsa_verify(*args, config=two, **kw)
        o_one, _ = nsa_verify(*args, config=one, **kw)
    assert torch.equal(o_one, o_two)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, _ = nsa_verify(*args, config=one, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_two)


@pytest.mark.gpu
@pytest.mark.parametrize("context_tiles", ["per_tile", "shared"])
@pytest.mark.parametrize("refresh", [False, True])
def test_gpu_cuda_graph_capture_one_row_per_tile(refresh, context_tiles):
    """A per-query call synchronises with nothing either; replay tracks new inputs."""
    args = make_gpu_inputs([3000, 700], 9, seed=8)
    cfg = NsaVerifyConfig(rows_per_tile=1, context_tiles=context_tiles)
    _, idx = nsa_verify(*args, config=cfg, **GPU_KW)
    kw = dict(GPU_KW, block_idx=None if refresh else idx, validate=False, config=cfg)
    nsa_verify(*args, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, _ = nsa_verify(*args, **kw)
    args[0].copy_(torch.randn_like(args[0]))
    graph.replay()
    torch.cuda.synchronize()
    o_eager, _ = nsa_verify(*args, **kw)
    torch.testing.assert_close(o_graph, o_eager, atol=0, rtol=0)
    assert not np.isnan(o_eager.float().cpu().numpy()).any()
