"""sparse_verify (per_query / union / shared) and its group plan against fp32 references.

CPU: Triton interpreter, fp32 and fp16, small D, T and block. GPU (``gpu`` marker): bf16 at
D = 128, block 64, plus CUDA-graph capture of the wrapper.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import HAS_CUDA, assert_close, case_dtype
from ssvkit.kernels.arrivals import counter_buffers
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.sparse_launch import SparseVerifyConfig, choose_num_splits, plan_launch
from ssvkit.kernels.sparse_verify import reference_sparse_verify, sparse_verify
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.kernels.tree import ancestor_bitmask, batch_parents, traversal_order
from ssvkit.perfmodel.acceptance import chain_parents, full_tree_parents
from ssvkit.perfmodel.sparse_plan import merge_chunk

DEV = "cuda" if HAS_CUDA else "cpu"


def make_block_idx(prefix_lens, hkv, t, top_n, block_size, overlap, group_size, gen):
    """``[B, Hkv, t, top_n]`` ascending, ``-1`` padded. ``overlap``: ``random`` (independent
    draws), ``all`` (every row of a sequence/head picks the same blocks) or ``zero`` (the rows
    of a group of ``group_size`` consecutive rows pick disjoint blocks)."""
    bsz = len(prefix_lens)
    idx = torch.full((bsz, hkv, t, top_n), -1, dtype=torch.int32)
    for b, n in enumerate(prefix_lens):
        live = -(-n // block_size)
        for h in range(hkv):
            perm = torch.randperm(live, generator=gen)
            for i in range(t):
                if overlap == "all":
                    pick = perm[:top_n]
                elif overlap == "zero":
                    k = min(top_n, live // group_size)
                    pick = perm[(i % group_size) * k : (i % group_size + 1) * k]
                else:
                    pick = torch.randperm(live, generator=gen)[: top_n - (i % 2)]
                pick = pick.sort().values
                idx[b, h, i, : len(pick)] = pick.to(torch.int32)
    return idx


def make_case(
    prefix_lens,
    t,
    h,
    hkv,
    d,
    dtype,
    *,
    tree="tree",
    overlap="random",
    top_n=4,
    block_size=16,
    c=2,
    seed=0,
):
    """Random ragged inputs on ``DEV``; ``tree`` is ``chain`` or a binary ``tree``."""
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    t_max = max(prefix_lens) + t + 7  # not a multiple of the block
    q = torch.randn((bsz, t, h, d), generator=gen).to(dtype)
    k = torch.randn((bsz, hkv, t_max, d), generator=gen).to(dtype)
    v = torch.randn((bsz, hkv, t_max, d), generator=gen).to(dtype)
    if tree == "chain":
        parents = batch_parents(chain_parents(t), bsz)
    else:
        parents = batch_parents(full_tree_parents(2, 5)[:t], bsz)
    mask = ancestor_bitmask(parents)
    lens = torch.tensor(prefix_lens, dtype=torch.int32)
    idx = make_block_idx(prefix_lens, hkv, t, top_n, block_size, overlap, c, gen)
    order = torch.stack([torch.randperm(t, generator=gen) for _ in range(bsz)]).to(torch.int32)
    return tuple(x.to(DEV) for x in (q, k, v, lens, mask, idx, order))


# (prefix_lens, t, H, Hkv, D, dtype): ragged lengths (not block multiples), t in {1, 3, 16},
# G in {1, 4, 8}. The kernels' arithmetic is fp32 whatever the inputs' dtype: fp16 on one
# shape, for the casts of the loads and of the output.
SHAPES = [
    ([45, 70], 1, 2, 2, 16, torch.float32),
    ([99, 37], 3, 8, 2, 32, torch.float16),
    ([130], 16, 8, 1, 16, torch.float32),
    ([61, 83], 16, 4, 1, 16, torch.float32),
]


def shape_id(shape) -> str:
    return f"L{shape[0]}-t{shape[1]}-H{shape[2]}-kv{shape[3]}-{str(shape[5]).split('.')[-1]}"


# per_query is C = 1; C = 1 in the grouped modes is the same launch. C = 16 holds every draft row
# of a shape in one group (C >= t): one list a KV head, up to 128 packed rows a tile.
MODE_C = [
    ("per_query", 1),
    ("union", 2),
    ("union", 3),
    ("union", 4),
    ("shared", 2),
    ("shared", 3),
    ("shared", 4),
    ("union", 16),
    ("shared", 16),
]


@pytest.mark.parametrize("mode, c", MODE_C, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_reference(shape, mode, c):
    prefix_lens, t, h, hkv, d, dtype = shape
    dtype = case_dtype(dtype)
    tree = "chain" if t % 2 else "tree"
    case = make_case(prefix_lens, t, h, hkv, d, dtype, tree=tree, c=c, seed=t + h + c)
    q, k, v, lens, mask, idx, order = case
    kw = dict(mode=mode, group_size=c, order=order, block_size=16)
    with poisoned_allocations():
        o, lse = sparse_verify(q, k, v, lens, mask, idx, **kw)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    assert o.dtype == dtype and lse.shape == (len(prefix_lens), h, t)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


@pytest.mark.parametrize("c, num_splits", [(2, 1), (4, 3)])
@pytest.mark.parametrize("overlap", ["all", "zero", "random"])
def test_union_equals_per_query(overlap, c, num_splits):
    dtype = torch.float16
    case = make_case([300, 270], 8, 4, 1, 16, dtype, overlap=overlap, c=c, seed=c)
    q, k, v, lens, mask, idx, order = case
    cfg = SparseVerifyConfig(num_splits=num_splits)
    base = dict(block_size=16, config=cfg)
    o_pq, lse_pq = sparse_verify(q, k, v, lens, mask, idx, mode="per_query", **base)
    # Identity order for zero overlap: make_block_idx made groups of consecutive rows disjoint.
    grp = None if overlap == "zero" else order
    with poisoned_allocations():
        o_u, lse_u = sparse_verify(
            q, k, v, lens, mask, idx, mode="union", group_size=c, order=grp, **base
        )
    assert_close(lse_u, lse_pq, dtype, "lse")
    assert_close(o_u, o_pq, dtype, "o")
    plan = build_group_plan(idx, grp, c, "union")
    counts = plan.counts.long()
    if overlap == "all":
        assert torch.equal(counts, torch.full_like(counts, 4))
    elif overlap == "zero":
        assert torch.equal(counts, torch.full_like(counts, 4 * c))


@pytest.mark.parametrize("tile_blocks, num_splits", [(2, 1), (4, 3), (8, 2)])
@pytest.mark.parametrize("mode", ["per_query", "union", "shared"])
def test_gathered_tiles_equal_the_reference(mode, tile_blocks, num_splits):
    """Several listed blocks gathered into one K/V tile (``tile_blocks``) give the reference's
    attention at every mode, with split ranges that are no multiple of the tile, -1 pads,
    partial last blocks and NaN in every cache slot the call must not read."""
    dtype = torch.float32
    q, k, v, lens, mask, idx, order = make_case([301, 77], 7, 4, 2, 16, dtype, top_n=5, seed=9)
    kw = dict(mode=mode, group_size=3, order=order, block_size=16)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n + 7 :] = float("nan")
        v[b, :, n + 7 :] = float("nan")
    cfg = SparseVerifyConfig(tile_blocks=tile_blocks, num_splits=num_splits)
    with poisoned_allocations():
        o, lse = sparse_verify(q, k, v, lens, mask, idx, config=cfg, **kw)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("mode, c", [("per_query", 1), ("union", 3), ("shared", 2)])
def test_fused_merge_equals_the_merge_launch(mode, c, num_splits):
    """The last split program of a group merging its rows gives the merge launch's output and
    the reference's, with more splits than some lists have blocks (splits that see nothing),
    and leaves the arrival counters at zero for the next call."""
    dtype = torch.float32
    q, k, v, lens, mask, idx, order = make_case([301, 77], 7, 4, 2, 16, dtype, top_n=4, seed=3)
    kw = dict(mode=mode, group_size=c, order=order, block_size=16)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    outs = []
    for fused in (True, False):
        cfg = SparseVerifyConfig(num_splits=num_splits, fused_merge=fused)
        cc = 1 if mode == "per_query" else c
        la = plan_launch(q, k, idx, order, mode, c, cc, 16, None, None, cfg)
        assert (la.counters is not None) == fused  # one load, one wave: merged in the launch
        with poisoned_allocations():
            outs.append(sparse_verify(q, k, v, lens, mask, idx, config=cfg, **kw))
    for o, lse in outs:
        assert_close(lse, rlse, dtype, "lse")
        assert_close(o, ro, dtype, "o")
    assert_close(outs[0][1], outs[1][1], dtype, "lse")
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(q.device))


def test_fused_merge_of_several_loads_equals_the_reference(monkeypatch):
    """The kernel's merge also walks the partials a split at a time (several loads), which the
    launch plan leaves to a merge launch: forced here, it gives the reference's attention."""
    from ssvkit.kernels import sparse_launch
    from ssvkit.perfmodel import sparse_plan

    monkeypatch.setattr(sparse_launch, "merges_in_launch", lambda cfg, s, *a: s > 1)
    monkeypatch.setattr(sparse_plan, "MERGE_VALUES_PER_THREAD", 2)  # one split a load
    dtype = torch.float32
    q, k, v, lens, mask, idx, order = make_case([301, 77], 7, 4, 2, 16, dtype, top_n=4, seed=4)
    kw = dict(mode="union", group_size=3, order=order, block_size=16)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    cfg = SparseVerifyConfig(num_splits=5)
    assert plan_launch(q, k, idx, order, "union", 3, 3, 16, None, None, cfg).counters is not None
    with poisoned_allocations():
        o, lse = sparse_verify(q, k, v, lens, mask, idx, config=cfg, **kw)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(q.device))


def test_merge_chunk_loads_every_split_that_fits_a_threads_values():
    assert merge_chunk(8, 16, 128, 4) == 8  # 16 x 8 x 128 fp32 over 128 threads: 128 each
    assert merge_chunk(5, 16, 128, 4) == 8  # padded to a power of two
    assert merge_chunk(2, 16, 128, 4) == 2
    assert merge_chunk(32, 16, 128, 4) == 8
    assert merge_chunk(8, 32, 128, 4) == 4
    assert merge_chunk(8, 128, 128, 8) == 2
    assert merge_chunk(8, 128, 256, 4) == 1


def test_tile_blocks_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="tile_blocks must be a power of two"):
        SparseVerifyConfig(tile_blocks=3)


def test_shared_uses_representative_blocks():
    """shared == per_query with every row's blocks replaced by its group's first member's."""
    dtype = torch.float32
    c, t = 4, 10  # the last group is partial
    case = make_case([120, 95], t, 4, 2, 16, dtype, top_n=3, c=c, seed=5)
    q, k, v, lens, mask, idx, order = case
    rep_idx = idx.clone()
    for b in range(idx.shape[0]):
        for pos in range(t):
            rep_idx[b, :, order[b, pos]] = idx[b, :, order[b, (pos // c) * c]]
    grouped = dict(group_size=c, order=order, block_size=16)
    o_s, lse_s = sparse_verify(q, k, v, lens, mask, idx, mode="shared", **grouped)
    o_r, lse_r = sparse_verify(q, k, v, lens, mask, rep_idx, mode="per_query", block_size=16)
    assert_close(lse_s, lse_r, dtype, "lse")
    assert_close(o_s, o_r, dtype, "o")
    o_u, _ = sparse_verify(q, k, v, lens, mask, idx, mode="union", **grouped)
    assert not torch.allclose(o_u, o_s)  # the approximation really changed the block sets


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("mode", ["per_query", "union", "shared"])
def test_empty_rows_give_zero_and_minus_inf(mode, num_splits):
    """No selected block and no visible tail entry: lse = -inf and o = 0, never NaN."""
    case = make_case([64, 0], 3, 4, 2, 16, torch.float16, tree="chain", top_n=2, seed=1)
    q, k, v, lens, mask, idx, order = case
    idx[0, :, 1] = -1  # row 1 of sequence 0 selects nothing ...
    mask[0, 1] = 0  # ... and sees no tail entry
    mask[1] = 0  # sequence 1 has an empty prefix and sees no tail at all
    cfg = SparseVerifyConfig(num_splits=num_splits)
    with poisoned_allocations():
        o, lse = sparse_verify(q, k, v, lens, mask, idx, mode=mode, block_size=16, config=cfg)
    assert torch.all(lse[0, :, 1] == float("-inf")) and torch.all(lse[1] == float("-inf"))
    assert torch.all(o[0, 1] == 0) and torch.all(o[1] == 0)
    assert torch.isfinite(o).all()
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, mode=mode, block_size=16)
    assert_close(lse, rlse, torch.float16, "lse")
    assert_close(o, ro, torch.float16, "o")


def test_unread_cache_is_never_touched():
    """NaN in every cache slot outside the prefix + tail, and in the tail of partial blocks."""
    dtype = torch.float32
    q, k, v, lens, mask, idx, order = make_case([77, 50], 5, 4, 2, 16, dtype, top_n=3, seed=3)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, block_size=16)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n + 5 :] = float("nan")
        v[b, :, n + 5 :] = float("nan")
    for mode in ("per_query", "union"):
        kw = dict(mode=mode, group_size=2, order=order, block_size=16)
        o, lse = sparse_verify(q, k, v, lens, mask, idx, **kw)
        assert_close(lse, rlse, dtype, "lse")
        assert_close(o, ro, dtype, "o")


def test_group_plan_is_the_deduplicated_union():
    gen = torch.Generator().manual_seed(0)
    t, c, top_n = 7, 3, 5
    idx = make_block_idx([200, 90], 2, t, top_n, 16, "random", c, gen).to(DEV)
    order = torch.stack([torch.randperm(t, generator=gen) for _ in range(2)]).int().to(DEV)
    with poisoned_allocations():
        plan = build_group_plan(idx, order, c, "union")
    assert plan.num_groups == 3 and plan.block_lists.shape == (2, 2, 3, c * top_n)
    for b in range(2):
        for h in range(2):
            for g in range(3):
                members = order[b, g * c : (g + 1) * c].tolist()
                sets = [set(idx[b, h, i].tolist()) - {-1} for i in members]
                n = int(plan.counts[b, h, g])
                lst = plan.block_lists[b, h, g].tolist()
                bits = plan.member_mask[b, h, g].tolist()
                assert lst[:n] == sorted(set().union(*sets))  # ascending
                assert lst[n:] == [-1] * (c * top_n - n) and bits[n:] == [0] * (c * top_n - n)
                for blk, m in zip(lst[:n], bits[:n], strict=True):
                    assert m == sum(1 << j for j, s in enumerate(sets) if blk in s)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(1, 5),
    t=st.integers(1, 9),
    top_n=st.integers(1, 6),
    order_name=st.sampled_from(["bfs", "dfs", "position"]),
    seed=st.integers(0, 2**16),
)
def test_union_equals_per_query_property(c, t, top_n, order_name, seed):
    """Any group size, tree order and overlap: union mode is exact."""
    gen = torch.Generator().manual_seed(seed)
    parents = full_tree_parents(2, 4)[:t]
    order = torch.tensor([traversal_order(parents, order_name)], dtype=torch.int32)
    lens = [int(torch.randint(1, 120, (1,), generator=gen))]
    q = torch.randn((1, t, 4, 16), generator=gen)
    k = torch.randn((1, 2, lens[0] + t + 3, 16), generator=gen)
    v = torch.randn((1, 2, lens[0] + t + 3, 16), generator=gen)
    idx = make_block_idx(lens, 2, t, top_n, 16, "random", c, gen)
    mask = ancestor_bitmask(torch.tensor([parents], dtype=torch.int32))
    args = tuple(x.to(DEV) for x in (q, k, v, torch.tensor(lens, dtype=torch.int32), mask, idx))
    o_pq, lse_pq = sparse_verify(*args, mode="per_query", block_size=16)
    kw = dict(mode="union", group_size=c, order=order.to(DEV), block_size=16)
    o_u, lse_u = sparse_verify(*args, **kw)
    assert_close(lse_u, lse_pq, torch.float32, "lse")
    assert_close(o_u, o_pq, torch.float32, "o")


def _valid_args():
    return list(make_case([40, 33], 3, 4, 2, 16, torch.float16, tree="chain", top_n=2))


@pytest.mark.parametrize(
    "name, mutate, kw",
    [
        ("k_cache", lambda a: a.__setitem__(1, a[1].float()), {}),
        ("q", lambda a: a.__setitem__(0, a[0].transpose(1, 2).contiguous().transpose(1, 2)), {}),
        ("q", lambda a: a.__setitem__(0, a[0].to(torch.int32)), {}),
        ("v_cache", lambda a: a.__setitem__(2, a[2][:, :, :-1]), {}),
        ("prefix_lens", lambda a: a.__setitem__(3, a[3].long()), {}),
        ("tree_mask", lambda a: a.__setitem__(4, a[4].int()), {}),
        ("block_idx", lambda a: a.__setitem__(5, a[5][:, :1]), {}),
        ("block_idx", lambda a: a[5].__setitem__((0, 0, 0, 0), 99), {}),
        ("block_idx", lambda a: a[5].__setitem__((1, 0, 2, 0), -2), {}),
        ("block_idx", lambda a: a[5][0, 1, 1].copy_(torch.tensor([1, 1])), {}),
        ("order", lambda a: a[6].__setitem__((0, 0), a[6][0, 1]), {"mode": "union"}),
        ("group_size", lambda a: None, {"group_size": 0}),
        ("mode", lambda a: None, {"mode": "exact"}),
        ("block_size", lambda a: None, {"block_size": 24}),
    ],
)
def test_wrapper_rejects_bad_inputs(name, mutate, kw):
    a = _valid_args()
    mutate(a)
    q, k, v, lens, mask, idx, order = a
    kw = {"block_size": 16, "order": order, "group_size": 2, **kw}
    with pytest.raises(ValueError, match=name) as err:
        sparse_verify(q, k, v, lens, mask, idx, **kw)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_blocks", [1, 2, 4])
@pytest.mark.parametrize("mode", ["per_query", "union", "shared"])
def test_gpu_bf16_matches_reference(mode, tile_blocks):
    dtype = torch.bfloat16
    case = make_case([3000, 1337], 16, 32, 8, 128, dtype, top_n=16, block_size=64, c=4)
    q, k, v, lens, mask, idx, order = case
    kw = dict(mode=mode, group_size=4, order=order, block_size=64)
    cfg = SparseVerifyConfig(tile_blocks=tile_blocks)
    with poisoned_allocations():
        o, lse = sparse_verify(q, k, v, lens, mask, idx, config=cfg, **kw)
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


@pytest.mark.gpu
@pytest.mark.parametrize("fused_merge", [True, False])
@pytest.mark.parametrize("mode", ["per_query", "union", "shared"])
def test_gpu_cuda_graph_capture(mode, fused_merge):
    """The wrapper (plan + kernel + merge) captures and replays with new values in place."""
    dtype = torch.bfloat16
    case = make_case([5000], 8, 32, 8, 128, dtype, top_n=16, block_size=64, c=4, seed=1)
    q, k, v, lens, mask, idx, order = case
    kw = dict(mode=mode, group_size=4, order=order, block_size=64)
    cfg = SparseVerifyConfig(num_splits=4, fused_merge=fused_merge)
    fast = dict(validate=False, config=cfg)
    sparse_verify(q, k, v, lens, mask, idx, **kw, **fast)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = sparse_verify(q, k, v, lens, mask, idx, **kw, **fast)
    q.copy_(torch.randn_like(q))
    idx.copy_(idx.flip(2))
    graph.replay()
    torch.cuda.synchronize()
    ro, rlse = reference_sparse_verify(q, k, v, lens, mask, idx, **kw)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


def test_split_plan_ends_the_waves_of_walks_soonest():
    cfg, cpu = SparseVerifyConfig(), torch.device("cpu")  # 132 SMs
    # (lists, list blocks, warps): 4-warp programs fill waves of 264, 8-warp ones of 132
    assert choose_num_splits(cfg, 256, 32, 4, cpu) == 1  # one full wave
    assert choose_num_splits(cfg, 2048, 32, 4, cpu) == 1  # eight waves: splitting adds waves
    assert choose_num_splits(cfg, 128, 16, 4, cpu) == 2  # batch 1: split until the wave is full
    assert choose_num_splits(cfg, 16, 128, 4, cpu) == 16  # a union list's bound, C = 8
    assert choose_num_splits(cfg, 16, 128, 8, cpu) == 8  # ... of 8-warp programs
    assert choose_num_splits(cfg, 4, 16, 4, cpu) == 16  # never more splits than blocks
    assert choose_num_splits(cfg, 384, 288, 4, cpu) == 2  # long walks: 3 waves of half lists
    assert choose_num_splits(cfg, 1, 1024, 4, cpu) == cfg.max_splits
    assert choose_num_splits(SparseVerifyConfig(num_splits=3), 256, 32, 4, cpu) == 3
    with pytest.raises(ValueError, match="program_blocks"):
        SparseVerifyConfig(program_blocks=-1.0)
