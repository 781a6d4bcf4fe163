"""nsa_verify (fused reuse path, refresh path, unfused baseline) and compress_kv against their
fp32 torch references.

CPU: Triton interpreter, fp16/fp32, D in {16, 32}, T of a few hundred. GPU (``gpu`` marker):
bf16 at Llama-3.1-8B's attention geometry, plus CUDA-graph capture of both paths (which fails
if a wrapper synchronises with the host).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import ssvkit.kernels.nsa_launch as nl
import ssvkit.kernels.nsa_selection as selection
import ssvkit.kernels.nsa_steps as steps
import ssvkit.kernels.nsa_verify as nv
import ssvkit.kernels.top_blocks as top_blocks_mod
import torch
from kernel_helpers import HAS_CUDA, assert_close, case_dtype
from nsa_helpers import (
    CPU_DTYPES,
    DEV,
    GPU_KW,
    NSA_KW,
    make_gpu_inputs,
    make_inputs,
    random_block_idx,
)
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    compress_kv,
    nsa_verify,
    nsa_verify_unfused,
    reference_compress_kv,
    reference_nsa_verify,
    update_compressed_kv,
)
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.perfmodel.nsa_plan import comp_tile_keys

# (prefix_lens, t, H, Hkv, D, tree, dtype): T not a multiple of 16, a prefix of 0 and one
# shorter than a compression window, t in {1, 3, 16}, G in {1, 3 (padded to 4), 4}, two KV
# heads, a tile of 64 packed rows, and 16 chained draft rows in one 16-row tile (G = 1). The
# split runs use 16-row tiles, so t = 16 with G = 4 spans four row tiles there. The kernels'
# arithmetic is fp32 whatever the inputs' dtype: fp16 once, for the casts of the loads and of
# the output.
CPU_SHAPES = [
    ([130], 3, 4, 1, 32, "tree", torch.float32),
    ([0, 45, 9], 1, 2, 2, 16, "chain", torch.float32),
    ([150], 16, 4, 1, 16, "tree", torch.float16),
    ([99, 61], 16, 1, 1, 16, "chain", torch.float32),
    ([50, 33], 3, 3, 1, 16, "tree", torch.float32),
]
SPLIT_CONFIG = NsaVerifyConfig(num_splits=5, block_m=16)


def shape_id(shape) -> str:
    return f"L{shape[0]}-t{shape[1]}-H{shape[2]}-kv{shape[3]}-{str(shape[6]).split('.')[-1]}"


@pytest.mark.parametrize("shape", CPU_SHAPES, ids=shape_id)
def test_reuse_fused_split_and_unfused_match_reference(shape):
    prefix_lens, t, h, hkv, d, tree, dtype = shape
    dtype = case_dtype(dtype)
    args, idx = make_inputs(prefix_lens, t, h, hkv, d, dtype, tree=tree, seed=t + h)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    assert torch.isfinite(ro).all()
    with poisoned_allocations():
        o, used = nsa_verify(*args, block_idx=idx, config=NsaVerifyConfig(num_splits=1), **NSA_KW)
        o_split, _ = nsa_verify(*args, block_idx=idx, config=SPLIT_CONFIG, **NSA_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=idx, **NSA_KW)
    assert used is idx and o.dtype == dtype and o.shape == args[0].shape
    assert_close(o, ro, dtype, "o")
    assert_close(o_split, ro, dtype, "o")
    assert_close(o_unfused, ro, dtype, "o")
    assert_close(o, o_unfused, dtype, "o")
    if dtype == torch.float16:  # the unfused baseline split (one merge per branch), once
        # on the CPU: four row tiles of 16 rows; its branch streams are the caller's there
        config = dataclasses.replace(SPLIT_CONFIG, branch_streams=True)
        with poisoned_allocations():
            o_unfused_split, _ = nsa_verify_unfused(*args, block_idx=idx, config=config, **NSA_KW)
        assert_close(o_unfused_split, ro, dtype, "o")


@pytest.mark.parametrize(
    ("shape", "num_splits", "source"),
    [
        (CPU_SHAPES[0], 1, "stored"),
        (CPU_SHAPES[0], 4, "computed"),
        (CPU_SHAPES[1], 1, "computed"),
        (CPU_SHAPES[1], 4, "stored"),
        (CPU_SHAPES[2], 1, "stored"),
        (CPU_SHAPES[2], 4, "computed"),
        (CPU_SHAPES[0], 4, "band"),
        (CPU_SHAPES[1], 1, "band"),
        (CPU_SHAPES[2], 1, "band"),
    ],
    ids=lambda x: f"L{x[0]}-t{x[1]}-H{x[2]}" if isinstance(x, tuple) else str(x),
)
def test_refresh_selects_reference_blocks(shape, num_splits, source):
    """Random data has no ties, so the indices must equal the reference's exactly, whether the
    block scoring reads the compressed scores the compressed launch stored or computes them
    (mapped onto the blocks by the overlap matrix or, "band", by ``kernels.nsa_band_scores``).
    Each shape runs with and without splits and with both score sources, and each split count
    with both sources."""
    dtype = torch.float16 if HAS_CUDA else torch.float32
    prefix_lens, t, h, hkv, d, tree, _ = shape
    args, _ = make_inputs(prefix_lens, t, h, hkv, d, dtype, tree=tree, seed=11 * t)
    ro, ridx = reference_nsa_verify(*args, **NSA_KW)
    # Several score programs per tile; with splits, several row tiles too.
    cfg = NsaVerifyConfig(
        num_splits=num_splits,
        block_j=16,
        block_m=64 if num_splits == 1 else 16,
        score_source="computed" if source == "band" else source,
        score_map="band" if source == "band" else "matrix",
    )
    with poisoned_allocations():
        o, idx = nsa_verify(*args, config=cfg, **NSA_KW)
        o_unfused, idx_unfused = nsa_verify_unfused(*args, config=cfg, **NSA_KW)
    assert idx.dtype == torch.int32 and idx.shape == (len(prefix_lens), hkv, t, NSA_KW["top_n"])
    assert torch.equal(idx.cpu(), ridx.cpu()) and torch.equal(idx_unfused.cpu(), ridx.cpu())
    assert_close(o, ro, dtype, "o")
    assert_close(o_unfused, ro, dtype, "o")


WGMMA_TILE = NsaVerifyConfig(warpgroup_rows_from=17)


def test_tile_packing_pads_17_to_32_rows_to_a_wgmma_tile_when_asked():
    """Under ``warpgroup_rows_from`` 17 a 32-row tile takes 64 rows at head dims up to 128,
    its draft rows kept and its head slots doubled; 16- and 64-row tiles, the default and
    D = 256 are unchanged."""
    default = NsaVerifyConfig()
    assert nl.tile_packing(6, 4, default, 128) == (8, 4, 32)
    assert nl.tile_packing(6, 4, WGMMA_TILE, 128) == (8, 8, 64)
    assert nl.tile_packing(2, 16, WGMMA_TILE, 64) == (2, 32, 64)
    assert nl.tile_packing(3, 4, WGMMA_TILE, 128) == nl.tile_packing(3, 4, default, 128)
    assert nl.tile_packing(3, 4, default, 128) == (4, 4, 16)
    assert nl.tile_packing(16, 4, WGMMA_TILE, 128) == (16, 4, 64)
    assert nl.tile_packing(6, 4, dataclasses.replace(WGMMA_TILE, block_m=32), 128) == (8, 4, 32)
    # Past D = 128 a 64-row tile's shared memory does not fit: the 32-row tile stays, where
    # the wide-head cap is off; with it (the default), 16 rows x 256 dims is the most a tile
    # holds, so 8 draft rows of 2 head slots.
    no_cap = dataclasses.replace(WGMMA_TILE, wide_tile_elems=0)
    assert nl.tile_packing(32, 2, no_cap, 256) == (16, 2, 32)
    assert nl.tile_packing(32, 2, WGMMA_TILE, 256) == (8, 2, 16)


def test_wide_heads_cap_a_tile_at_16_rows_of_256_dims():
    """Above D = 128 a tile holds at most ``wide_tile_elems / D`` MMA rows (16 at 256) but
    always one head group; at D <= 128 the cap changes nothing."""
    cfg = NsaVerifyConfig()
    assert nl.tile_packing(32, 2, cfg, 256) == (8, 2, 16)
    assert nl.tile_packing(64, 1, cfg, 256) == (16, 1, 16)
    assert nl.tile_packing(32, 4, cfg, 256) == (4, 4, 16)
    assert nl.tile_packing(4, 32, cfg, 256) == (1, 32, 32)  # one head group a tile
    assert nl.tile_packing(32, 2, cfg, 192) == (8, 2, 16)  # 4096 // 192 -> 16 rows
    assert nl.tile_packing(16, 4, cfg, 128) == (16, 4, 64)
    assert nl.tile_packing(32, 2, cfg, 128) == (16, 2, 32)
    assert nl.tile_packing(32, 2, dataclasses.replace(cfg, wide_tile_elems=8192), 256) == (
        16,
        2,
        32,
    )
    with pytest.raises(ValueError, match="wide_tile_elems must be >= 0, got -1"):
        NsaVerifyConfig(wide_tile_elems=-1)
    with pytest.raises(ValueError, match="warpgroup_rows_from"):
        NsaVerifyConfig(warpgroup_rows_from=0)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_a_wgmma_padded_tile_matches_the_reference(dtype):
    """Six draft rows of a group of 4 (a 32-row tile, padded to 64 rows): the fused and
    unfused reuse paths and the refresh path's output and selection match the reference."""
    dtype = case_dtype(dtype)
    args, idx = make_inputs([130, 70], 6, 4, 1, 16, dtype, tree="tree", seed=17)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    ro_refresh, ridx = reference_nsa_verify(*args, **NSA_KW)
    split = dataclasses.replace(WGMMA_TILE, num_splits=3)
    with poisoned_allocations():
        o, _ = nsa_verify(*args, block_idx=idx, config=WGMMA_TILE, **NSA_KW)
        o_split, _ = nsa_verify(*args, block_idx=idx, config=split, **NSA_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=idx, config=WGMMA_TILE, **NSA_KW)
        o_refresh, picked = nsa_verify(*args, config=WGMMA_TILE, **NSA_KW)
    for out in (o, o_split, o_unfused):
        assert_close(out, ro, dtype, "o")
    assert torch.equal(picked.cpu(), ridx.cpu())
    assert_close(o_refresh, ro_refresh, dtype, "o")


def test_a_wide_head_capped_tile_matches_the_reference():
    """D = 256, 12 draft rows of a group of 2: the default cap gives tiles of 8 draft rows (16
    MMA rows, two row tiles) in place of one of 16 rows; the fused and unfused reuse paths and
    the refresh path's output and selection match the reference."""
    args, idx = make_inputs([130, 70], 12, 4, 2, 256, torch.float32, tree="tree", seed=23)
    assert nl.tile_packing(12, 2, NsaVerifyConfig(), 256) == (8, 2, 16)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    ro_refresh, ridx = reference_nsa_verify(*args, **NSA_KW)
    with poisoned_allocations():
        o, _ = nsa_verify(*args, block_idx=idx, **NSA_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=idx, **NSA_KW)
        o_refresh, picked = nsa_verify(*args, **NSA_KW)
    for out in (o, o_unfused):
        assert_close(out, ro, torch.float32, "o")
    assert torch.equal(picked.cpu(), ridx.cpu())
    assert_close(o_refresh, ro_refresh, torch.float32, "o")


def test_refresh_forces_sink_and_local_blocks_and_pads():
    args, _ = make_inputs([200, 20], 3, 4, 2, 16, torch.float32, seed=5)
    kw = dict(NSA_KW, top_n=5, num_sink=2, num_local=2)
    _, idx = nsa_verify(*args, **kw)
    idx = idx.cpu()
    nb = -(-200 // 16)
    for row in idx[0].reshape(-1, 5).tolist():
        assert row == sorted(row) and {0, 1, nb - 2, nb - 1} <= set(row)
    # A 20-token prefix has 2 blocks: both chosen, the other slots padded at the end.
    assert (idx[1, ..., :2] == torch.tensor([0, 1], dtype=torch.int32)).all()
    assert (idx[1, ..., 2:] == -1).all()


@pytest.mark.parametrize("branch", [0, 1, 2])
def test_zero_gate_removes_its_branch(branch):
    """With g_x = 0, changing only what branch x reads leaves the output bit-identical."""
    prefix_lens, t = [130], 3
    args, idx = make_inputs(prefix_lens, t, 2, 1, 16, torch.float16, seed=2)
    q, k, v, lens, mask, ck, cv, gates = args
    gates = gates.clone()
    gates[..., branch] = 0
    if branch == 0:  # compressed tokens
        alt = (q, k, v, lens, mask, torch.randn_like(ck), torch.randn_like(cv), gates)
        alt_idx = idx
    elif branch == 1:  # selected blocks
        alt, alt_idx = (q, k, v, lens, mask, ck, cv, gates), idx.flip(2).contiguous()
    else:  # the draft tail is only in the window branch
        v2 = v.clone()
        for b, length in enumerate(prefix_lens):
            v2[b, :, length : length + t] = torch.randn_like(v2[b, :, length : length + t])
        alt, alt_idx = (q, k, v2, lens, mask, ck, cv, gates), idx
    for fn in (nsa_verify, nsa_verify_unfused):
        o1, _ = fn(q, k, v, lens, mask, ck, cv, gates, block_idx=idx, **NSA_KW)
        o2, _ = fn(*alt, block_idx=alt_idx, **NSA_KW)
        assert torch.equal(o1, o2)
    gates[..., branch] = 1  # and the change is visible when the gate is open
    o1, _ = nsa_verify(q, k, v, lens, mask, ck, cv, gates, block_idx=idx, **NSA_KW)
    o2, _ = nsa_verify(*alt[:-1], gates, block_idx=alt_idx, **NSA_KW)
    assert not torch.equal(o1, o2)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_empty_branches_give_zero_not_nan(num_splits):
    """No compressed token (prefix < comp_block), no selected block, no window prefix tokens,
    and a query row that sees nothing at all: every branch must contribute 0, never NaN."""
    args, _ = make_inputs([0, 10], 2, 4, 1, 16, torch.float32, tree="chain", seed=4)
    q, k, v, lens, _, ck, cv, gates = args
    mask = torch.tensor([[0, 2], [1, 3]], dtype=torch.int64, device=DEV)  # seq 0 row 0 is blind
    idx = torch.full((2, 1, 2, 4), -1, dtype=torch.int32, device=DEV)
    kw = dict(NSA_KW, window=0)
    cfg = NsaVerifyConfig(num_splits=num_splits)
    with poisoned_allocations():
        o, _ = nsa_verify(
            q, k, v, lens, mask, ck, cv, gates, block_idx=idx, validate=False, config=cfg, **kw
        )
        o_ref_path, ridx = nsa_verify(
            q, k, v, lens, mask, ck, cv, gates, validate=False, config=cfg, **kw
        )
    assert not torch.isnan(o).any() and not torch.isnan(o_ref_path).any()
    assert (o[0, 0] == 0).all()
    ro, _ = reference_nsa_verify(q, k, v, lens, mask, ck, cv, gates, block_idx=idx, **kw)
    assert_close(o, ro, torch.float32, "o")
    assert (ridx[0] == -1).all() and (ridx[1, ..., 0] == 0).all()


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_compress_kv_and_incremental_update_match_reference(dtype):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn((2, 3, 101, 16), generator=gen).to(dtype).to(DEV)
    v = torch.randn((2, 3, 101, 16), generator=gen).to(dtype).to(DEV)
    kw = dict(comp_block=12, comp_stride=5)
    old = torch.tensor([11, 60], dtype=torch.int32, device=DEV)
    new = torch.tensor([27, 65], dtype=torch.int32, device=DEV)
    ck, cv, cl = compress_kv(k, v, old, **kw)
    rk, rv, rl = reference_compress_kv(k, v, old, **kw)
    assert cl.tolist() == rl.tolist() == [0, 10]
    assert_close(ck, rk, dtype, "o")
    assert_close(cv, rv, dtype, "o")
    cl = update_compressed_kv(k, v, ck, cv, cl, new, max_new_tokens=16, **kw)
    rk, rv, rl = reference_compress_kv(k, v, new, **kw)
    assert cl.tolist() == rl.tolist() == [4, 11]
    assert_close(ck, rk, dtype, "o")
    assert_close(cv, rv, dtype, "o")


def test_compress_kv_and_update_take_every_layer_in_one_call():
    gen = torch.Generator().manual_seed(4)
    kv = torch.randn((3, 2, 2, 2, 90, 16), generator=gen).to(DEV)  # [L, 2, B, Hkv, T, D]
    k_all, v_all = kv[:, 0], kv[:, 1]  # strided views, as the engine's cache holds them
    kw = dict(comp_block=8, comp_stride=4)
    old = torch.tensor([9, 40], dtype=torch.int32, device=DEV)
    new = torch.tensor([30, 44], dtype=torch.int32, device=DEV)
    ck, cv, cl = compress_kv(k_all, v_all, old, **kw)
    assert ck.shape == (3, 2, 2, 21, 16) and cl.tolist() == [1, 9]
    cl = update_compressed_kv(k_all, v_all, ck, cv, cl, new, max_new_tokens=21, **kw)
    assert cl.tolist() == [6, 10]
    for layer in range(3):
        rk, rv, _ = reference_compress_kv(kv[layer, 0], kv[layer, 1], new, **kw)
        assert_close(ck[layer], rk, torch.float32, "o")
        assert_close(cv[layer], rv, torch.float32, "o")


def _valid():
    args, idx = make_inputs([40, 21], 3, 4, 2, 16, torch.float16, seed=9)
    return list(args), idx


def _with(i, fn):
    def mutate(args, idx):
        args[i] = fn(args[i])
        return args, idx

    return mutate


BAD_INPUTS = [
    (_with(0, lambda q: q.int()), {}, "q"),
    (_with(0, lambda q: q[0]), {}, "q"),
    (_with(1, lambda k: k.repeat(1, 1, 1, 2)), {}, "k_cache"),
    (_with(1, lambda k: k.float()), {}, "k_cache"),
    (_with(2, lambda v: v[:, :, :-1]), {}, "v_cache"),
    (_with(0, lambda q: q[:, :, :3].contiguous()), {}, "heads"),
    (_with(3, lambda x: x.long()), {}, "prefix_lens"),
    (_with(3, lambda x: x + 100), {}, "prefix_lens"),
    (_with(4, lambda x: x.int()), {}, "tree_mask"),
    (_with(4, lambda x: x | 8), {}, "tree_mask"),
    (_with(5, lambda x: x[..., :8]), {}, "comp_k"),
    (_with(5, lambda x: x[:, :, :2]), {}, "comp_k"),
    (_with(6, lambda x: x.float()), {}, "comp_v"),
    (_with(7, lambda x: x[..., :2]), {}, "gates"),
    (lambda a, i: (a, i.long()), {}, "block_idx"),
    (lambda a, i: (a, i[..., :2].contiguous()), {}, "block_idx"),
    (lambda a, i: (a, i + 5), {}, "block_idx"),
    (lambda a, i: (a, torch.zeros_like(i)), {}, "duplicate"),
    (lambda a, i: (a, i), {"block_size": 24}, "block_size"),
    (lambda a, i: (a, i), {"comp_stride": 20}, "comp_stride"),
    (lambda a, i: (a, i), {"num_sink": 3, "num_local": 2}, "num_sink"),
    (lambda a, i: (a, i), {"window": -1}, "window"),
]


@pytest.mark.parametrize(("mutate", "kw", "name"), BAD_INPUTS)
def test_rejects_bad_inputs(mutate, kw, name):
    args, idx = mutate(*_valid())
    for fn in (nsa_verify, nsa_verify_unfused):
        with pytest.raises(ValueError, match=name):
            fn(*args, block_idx=idx, **dict(NSA_KW, **kw))


def test_rejects_bad_config_and_compress_args():
    with pytest.raises(ValueError, match="block_m"):
        NsaVerifyConfig(block_m=24)
    with pytest.raises(ValueError, match="expected_overlap"):
        NsaVerifyConfig(expected_overlap=1.5)
    with pytest.raises(ValueError, match="score_source"):
        NsaVerifyConfig(score_source="cached")
    with pytest.raises(ValueError, match="score_map must be one of matrix, band, got 'x'"):
        NsaVerifyConfig(score_map="x")
    k = torch.zeros((1, 1, 32, 16))
    with pytest.raises(ValueError, match="comp_stride"):
        compress_kv(k, k, torch.zeros(1, dtype=torch.int32), comp_block=4, comp_stride=8)
    with pytest.raises(ValueError, match="prefix_lens"):
        compress_kv(k, k, torch.zeros(1), comp_block=4, comp_stride=2)


def test_slots_fill_132_sms_by_work(monkeypatch):
    """Host-only: the slot sizing the benchmark geometry gets on an H100/H200 (132 SMs)."""
    monkeypatch.setattr(nl, "num_sms", lambda index: 132)
    cfg, cuda = NsaVerifyConfig(), torch.device("cuda", 0)

    def plan(batch, t, context=65536):
        shape = dict(device="meta", dtype=torch.bfloat16)
        q = torch.empty((batch, t, 32, 128), **shape)
        k = torch.empty((batch, 8, context + 64, 128), **shape)
        ck = torch.empty((batch, 8, (context - 32) // 16 + 1, 128), **shape)
        return nl.make_plan(q, k, ck, config=cfg, num_sink=1, num_local=1, sm_scale=None, **GPU_KW)

    p = plan(1, 16)
    assert (p.block_m, p.rows, p.num_tiles) == (64, 16, 1)  # 4 heads x 16 rows, one tile
    c, s, w = nl.plan_slots(p, cuda, cfg)
    work = p.branch_tiles(cfg.expected_overlap)  # ~64 compressed, ~88 selected, 9 window tiles
    assert c > w >= 1 and s > w
    assert 132 - 3 * p.programs <= p.programs * (c + s + w) <= 132  # one wave, not more
    assert max(n / k for n, k in zip(work, (c, s, w), strict=True)) >= cfg.min_tiles_per_slot
    rc, rs, rw = nl.refresh_slots(p, cuda, cfg)  # two launches, each a wave of its own
    assert rc > c and rs + rw > s + w and p.programs * max(rc, rs + rw) <= 132
    assert nl.plan_slots(plan(16, 16), cuda, cfg) == (1, 1, 1)  # 128 programs fill a wave already
    c, s, w = nl.plan_slots(plan(16, 16), cuda, cfg, (False, True, False))  # alone: ~one wave
    assert c == w == 0 and 1 <= s <= 2
    p64 = plan(1, 64)
    assert p64.num_tiles == 4 and sum(nl.plan_slots(p64, cuda, cfg)) <= cfg.max_splits
    big = plan(1, 16, context=1 << 20)  # a million tokens: capped at max_splits slots
    assert sum(nl.plan_slots(big, cuda, cfg)) <= cfg.max_splits
    forced = NsaVerifyConfig(num_splits=6)
    assert (
        sum(nl.plan_slots(p, cuda, forced)) in (5, 6, 7)
        and min(nl.plan_slots(p, cuda, forced)) >= 1
    )


def test_union_plan_is_the_ascending_union_with_member_bits():
    gen = torch.Generator().manual_seed(3)
    idx = random_block_idx([300, 90], 2, 11, 6, 16, gen).to(DEV)  # -1 holes, overlapping rows
    plan = steps.union_plan(idx, 4, 20)
    assert plan.group_size == 4 and plan.num_groups == 3
    for b in range(2):
        for h in range(2):
            for g in range(3):
                rows = idx[b, h, 4 * g : 4 * g + 4].tolist()
                want = sorted({x for row in rows for x in row if x >= 0})
                n = int(plan.counts[b, h, g])
                assert plan.block_lists[b, h, g, :n].tolist() == want
                for blk, bits in zip(want, plan.member_mask[b, h, g, :n].tolist(), strict=True):
                    assert bits == sum(1 << r for r, row in enumerate(rows) if blk in row)
    single = steps.union_plan(idx[:, :, :1].contiguous(), 4, 20)  # one row: its own list
    assert single.member_mask is None and single.block_lists.shape[2] == 1


@pytest.mark.parametrize("chunk", [64, top_blocks_mod.TOPK_CHUNK])
def test_top_blocks_match_torch_topk_and_resolve_ties_to_the_lower_block(monkeypatch, chunk):
    monkeypatch.setattr(top_blocks_mod, "TOPK_CHUNK", chunk)  # 64: a row in five chunks
    gen = torch.Generator().manual_seed(8)
    nb_max, top_n = 300, 16
    scores = torch.randn((2, 2, 3, nb_max), generator=gen).to(DEV)
    scores[0, 0, 0, 10:20] = 0.5  # a tie across the cut
    scores[0, 0, 1, 60:70] = scores[0, 0, 1].max()  # a tie at the top, across a chunk edge
    scores[0, 1, 2] = 0.0  # every block tied
    scores[1, 1, 0] = -scores[1, 1, 0].abs()  # negative scores only
    lens = torch.tensor([64 * 300 - 5, 700], dtype=torch.int32, device=DEV)
    q = torch.empty((2, 3, 4, 16), device="meta")
    k = torch.empty((2, 2, 64 * nb_max, 16), device="meta")
    kw = dict(GPU_KW, top_n=top_n, block_size=64)
    plan = nl.make_plan(
        q, k, k, config=nv.DEFAULT_CONFIG, num_sink=2, num_local=1, sm_scale=None, **kw
    )
    got = selection.select_top_blocks(scores, lens, plan).cpu()
    for b, length in enumerate(lens.tolist()):
        nb = -(-length // 64)
        for h in range(2):
            for r in range(3):
                s = scores[b, h, r, :nb].cpu().clone()
                s[:2], s[nb - 1] = float("inf"), float("inf")
                # the order of (score descending, block ascending)
                order = sorted(range(nb), key=lambda j: (-float(s[j]), j))[:top_n]
                want = sorted(order) + [-1] * (top_n - len(order))
                assert got[b, h, r].tolist() == want


def test_a_union_plan_of_other_rows_is_refused():
    args, idx = make_inputs([150], 16, 4, 1, 16, torch.float32, seed=1)
    wrong = steps.union_plan(idx, 2, 20)
    with pytest.raises(ValueError, match="union_plan"):
        nsa_verify(*args, block_idx=idx, union=wrong, **NSA_KW)
    right = nv.nsa_union_plan(args[0], args[1], idx, block_size=NSA_KW["block_size"])
    o1, _ = nsa_verify(*args, block_idx=idx, union=right, **NSA_KW)
    o2, _ = nsa_verify(*args, block_idx=idx, **NSA_KW)
    assert torch.equal(o1, o2)


def test_a_refresh_returns_the_union_plan_of_its_selection():
    args, _ = make_inputs([150], 5, 4, 1, 16, torch.float32, seed=2)
    o, idx, union = nsa_verify(*args, return_union=True, **NSA_KW)
    o_plain, idx_plain = nsa_verify(*args, **NSA_KW)
    assert torch.equal(o, o_plain) and torch.equal(idx, idx_plain)
    built = nv.nsa_union_plan(args[0], args[1], idx, block_size=NSA_KW["block_size"])
    assert union.group_size == built.group_size and torch.equal(union.counts, built.counts)
    for b, h, g in np.ndindex(*built.counts.shape):
        n = int(built.counts[b, h, g])
        assert torch.equal(union.block_lists[b, h, g, :n], built.block_lists[b, h, g, :n])
        assert torch.equal(union.member_mask[b, h, g, :n], built.member_mask[b, h, g, :n])
    o_reuse, _ = nsa_verify(*args, block_idx=idx, union=union, **NSA_KW)
    assert torch.equal(o_reuse, nsa_verify(*args, block_idx=idx, **NSA_KW)[0])


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 64])
def test_gpu_bf16_matches_reference(t):
    args = make_gpu_inputs([4093, 700, 2500], t, seed=t)
    ro, ridx = reference_nsa_verify(*args, **GPU_KW)
    with poisoned_allocations():
        o, idx = nsa_verify(*args, **GPU_KW)
        o_reuse, _ = nsa_verify(*args, block_idx=ridx.int(), **GPU_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=ridx.int(), **GPU_KW)
    # bf16 q and compressed keys make near-ties possible: compare where the selections agree.
    agree = (idx == ridx).all(-1)  # [B, Hkv, t]
    assert agree.float().mean() > 0.9
    rows = agree.transpose(1, 2).repeat_interleave(4, 2)  # [B, t, H]
    assert_close(o[rows], ro[rows], torch.bfloat16, "o")
    ro_reuse, _ = reference_nsa_verify(*args, block_idx=ridx, **GPU_KW)
    assert_close(o_reuse, ro_reuse, torch.bfloat16, "o")
    assert_close(o_unfused, ro_reuse, torch.bfloat16, "o")


@pytest.mark.gpu
@pytest.mark.parametrize("refresh", [False, True])
def test_gpu_cuda_graph_capture(refresh):
    """Capturing fails on any host synchronisation; replay must track new input values."""
    args = make_gpu_inputs([3000, 700], 8, seed=7)
    _, idx = nsa_verify(*args, **GPU_KW)
    block_idx = None if refresh else idx
    kw = dict(GPU_KW, block_idx=block_idx, validate=False)
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


@pytest.mark.gpu
@pytest.mark.parametrize("refresh", [False, True])
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_unfused_branch_streams_give_the_one_stream_result(refresh, pdl):
    """The unfused baseline's branches side by side (``branch_streams``) give what one stream
    gives, bit for bit, eagerly and from a captured graph whose inputs change after capture."""
    args = make_gpu_inputs([5000, 700, 2900], 8, seed=11)
    _, idx = nsa_verify(*args, **GPU_KW)
    kw = dict(GPU_KW, block_idx=None if refresh else idx, validate=False)
    one = NsaVerifyConfig(pdl=pdl)
    side = NsaVerifyConfig(pdl=pdl, branch_streams=True)
    with poisoned_allocations():
        o_one, idx_one = nsa_verify_unfused(*args, config=one, **kw)
        o_side, idx_side = nsa_verify_unfused(*args, config=side, **kw)
    torch.testing.assert_close(o_side, o_one, atol=0, rtol=0)
    assert torch.equal(idx_side, idx_one)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, _ = nsa_verify_unfused(*args, config=side, **kw)
    args[0].copy_(torch.randn_like(args[0]))
    graph.replay()
    torch.cuda.synchronize()
    o_eager, _ = nsa_verify_unfused(*args, config=one, **kw)
    torch.testing.assert_close(o_graph, o_eager, atol=0, rtol=0)


def test_refresh_stores_compressed_scores_when_fewer_bytes_move():
    """Host-only: at Llama-3.1-8B attention (4 query heads per KV head, D = 128, bf16) the stored
    scores (8 bytes per real row and compressed token) beat re-reading a 256-byte key below 8
    draft rows; the config forces either source."""
    from ssvkit.kernels.nsa_selection import stores_comp_scores

    def plan(t, **cfg):
        shape = dict(device="meta", dtype=torch.bfloat16)
        q = torch.empty((1, t, 32, 128), **shape)
        k = torch.empty((1, 8, 4096, 128), **shape)
        ck = torch.empty((1, 8, 255, 128), **shape)
        config = NsaVerifyConfig(**cfg)
        return nl.make_plan(
            q, k, ck, config=config, num_sink=1, num_local=1, sm_scale=None, **GPU_KW
        )

    key_bytes = 128 * 2
    assert [stores_comp_scores(plan(t), key_bytes) for t in (1, 4, 7, 8, 16)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert stores_comp_scores(plan(16, score_source="stored"), key_bytes)
    assert not stores_comp_scores(plan(1, score_source="computed"), key_bytes)


def test_the_band_scores_every_block_as_the_overlap_matrix():
    """``score_map="band"``: the block importance of every row and block, blocks past the
    compressed tokens and a prefix with none among them, equals the overlap matrix's (fp32 in
    the interpreter: the two sum in another order); the band's geometry, and None where the
    block size is no multiple of the stride."""
    from ssvkit.kernels.nsa_band_scores import band_geometry
    from ssvkit.kernels.nsa_launch import make_plan, plan_slots
    from ssvkit.kernels.nsa_selection import compressed_block_scores
    from ssvkit.kernels.nsa_steps import alloc_partials, launch_fwd

    args, _ = make_inputs([150, 9, 61], 5, 8, 2, 16, torch.float32, tree="tree", seed=31)
    q, k, ck = args[0], args[1], args[5]
    kw = dict(num_sink=1, num_local=1, sm_scale=None, **NSA_KW)
    scores = []
    for score_map in ("matrix", "band"):
        cfg = NsaVerifyConfig(block_j=16, score_source="computed", score_map=score_map)
        plan = make_plan(q, k, ck, config=cfg, **kw)
        slots = plan_slots(plan, q.device, cfg, (True, False, False))
        with poisoned_allocations():
            part = alloc_partials(plan, slots[0], q.device)
            launch_fwd(plan, args, None, part, slots=slots)
            scores.append(compressed_block_scores(plan, args, part, slots[0]))
    assert not torch.isnan(scores[1]).any()
    torch.testing.assert_close(scores[1], scores[0], atol=1e-6, rtol=1e-5)
    assert scores[1][1].abs().sum() == 0  # 9 tokens: no compressed token yet
    assert band_geometry(64, 32, 16, 64) == (4, 1, 15)
    assert band_geometry(16, 16, 8, 16) == (2, 1, 7)
    assert band_geometry(64, 48, 24, 64) is None and band_geometry(64, 32, 16, 4) is None


# A prefix of 1,100 tokens: 136 compressed tokens, a whole 128-key tile and a ragged one.
WIDE_SHAPES = [*CPU_SHAPES[:3], ([1100, 70], 2, 2, 1, 16, "chain", torch.float32)]


@pytest.mark.parametrize("shape", WIDE_SHAPES, ids=shape_id)
def test_a_wider_compressed_tile_gives_the_same_result(shape):
    """``comp_block_n`` 128 (a launch of the compressed branch alone on 128-key tiles, past the
    selection block) selects the same blocks and matches the reference on both paths."""
    prefix_lens, t, h, hkv, d, tree, dtype = shape
    dtype = case_dtype(dtype)
    args, _ = make_inputs(prefix_lens, t, h, hkv, d, dtype, tree=tree, seed=3 * t + 1)
    ro, ridx = reference_nsa_verify(*args, **NSA_KW)
    cfg = NsaVerifyConfig(comp_block_n=128, num_splits=2, block_m=16)
    with poisoned_allocations():
        o, idx = nsa_verify(*args, config=cfg, **NSA_KW)
        o_unfused, idx_unfused = nsa_verify_unfused(*args, config=cfg, **NSA_KW)
    assert torch.equal(idx.cpu(), ridx.cpu()) and torch.equal(idx_unfused.cpu(), ridx.cpu())
    assert_close(o, ro, dtype, "o")
    assert_close(o_unfused, ro, dtype, "o")


def test_the_compressed_tile_is_capped_by_its_elements():
    assert comp_tile_keys(128, 64, 128) == 128
    assert comp_tile_keys(128, 64, 256) == 64
    assert comp_tile_keys(256, 64, 96) == 128
    assert comp_tile_keys(64, 16, 64) == 64
    assert comp_tile_keys(16, 64, 128) == 64
    assert comp_tile_keys(0, 16, 32) == 16  # the default: the other launches' tile
    with pytest.raises(ValueError, match="comp_block_n"):
        NsaVerifyConfig(comp_block_n=96)
