"""repair against its fp32 reference; repair(partial) then repair(missed) == attention over the
union. CPU: Triton interpreter, fp16/fp32. GPU (``gpu`` marker): bf16, D = 128, graph capture.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA, assert_close
from ssvkit.kernels.repair import reference_repair, repair
from ssvkit.kernels.timing import poisoned_allocations

CPU_DTYPES = [torch.float16, torch.float32]
DEV = "cuda" if HAS_CUDA else "cpu"


def make_qkv(prefix_lens, t, num_q_heads, num_kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    t_max = max(prefix_lens) + t + 3
    q = torch.randn((bsz, t, num_q_heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((bsz, num_kv_heads, t_max, head_dim), generator=gen).to(dtype)
    v = torch.randn((bsz, num_kv_heads, t_max, head_dim), generator=gen).to(dtype)
    lens = torch.tensor(prefix_lens, dtype=torch.int32)
    return tuple(x.to(DEV) for x in (q, k, v, lens))


def split_blocks(prefix_lens, num_kv_heads, t, block_size, width, seed):
    """Per (b, kv head, row): a random predicted set and a disjoint missed set, ragged, -1
    padded at the end, each at most ``width`` wide. Returns (predicted, missed, union)."""
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    shape = (bsz, num_kv_heads, t, width)
    pred = torch.full(shape, -1, dtype=torch.int32)
    miss = torch.full(shape, -1, dtype=torch.int32)
    union = torch.full((*shape[:3], 2 * width), -1, dtype=torch.int32)
    for b, length in enumerate(prefix_lens):
        nb = -(-length // block_size)
        for h in range(num_kv_heads):
            for i in range(t):
                perm = torch.randperm(nb, generator=gen)
                n_pred = int(torch.randint(0, min(width, nb) + 1, (), generator=gen))
                n_miss = int(torch.randint(0, min(width, nb - n_pred) + 1, (), generator=gen))
                pred[b, h, i, :n_pred] = perm[:n_pred]
                miss[b, h, i, :n_miss] = perm[n_pred : n_pred + n_miss]
                union[b, h, i, : n_pred + n_miss] = perm[: n_pred + n_miss]
    return pred.to(DEV), miss.to(DEV), union.to(DEV)


def empty_state(q):
    """The state of an empty set: lse = -inf, and an o full of NaN that must be ignored."""
    bsz, t, h, _ = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((bsz, h, t), float("-inf"), dtype=torch.float32, device=q.device)
    return o, lse


# (prefix_lens, t, H, Hkv, D, block_size): partial last blocks, lengths 0 and 1, G in {1, 4, 8}
CPU_SHAPES = [
    ([37, 0, 1], 1, 2, 2, 16, 16),
    ([99, 130], 3, 8, 2, 32, 32),
    ([150, 61], 16, 8, 1, 16, 16),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: f"L{s[0]}-t{s[1]}-H{s[2]}-kv{s[3]}")
def test_partial_then_repair_equals_union(shape, dtype):
    if HAS_CUDA and dtype == torch.float32:
        pytest.skip("fp32 is a CPU-interpreter dtype")
    prefix_lens, t, h, hkv, d, bs = shape
    q, k, v, lens = make_qkv(prefix_lens, t, h, hkv, d, dtype, seed=t)
    pred, miss, union = split_blocks(prefix_lens, hkv, t, bs, width=4, seed=t + 1)
    kw = dict(prefix_lens=lens, block_size=bs)
    with poisoned_allocations():
        o_p, lse_p = repair(q, k, v, *empty_state(q), pred, **kw)  # attention over pred
        o_u, lse_u = repair(q, k, v, o_p, lse_p, miss, **kw)  # + missed = union
    ro_p, rlse_p = reference_repair(q, k, v, *empty_state(q), pred, **kw)
    assert_close(lse_p, rlse_p, dtype, "lse")
    assert_close(o_p, ro_p, dtype, "o")
    ro_u, rlse_u = reference_repair(q, k, v, *empty_state(q), union, **kw)
    assert_close(lse_u, rlse_u, dtype, "lse")
    assert_close(o_u, ro_u, dtype, "o")
    # The reference merge agrees with the one-pass repair from the same partial state.
    ro_m, rlse_m = reference_repair(q, k, v, o_p, lse_p, miss, **kw)
    assert_close(lse_u, rlse_m, dtype, "lse")
    assert_close(o_u, ro_m, dtype, "o")


@pytest.mark.parametrize("width", [0, 3])
def test_nothing_missed_returns_the_state(width):
    """M = 0, or every slot -1: the output is the input state (empty rows stay empty)."""
    dtype = torch.float16
    q, k, v, lens = make_qkv([40, 7], 3, 4, 1, 16, dtype, seed=5)
    o = torch.randn_like(q)
    lse = torch.randn((2, 4, 3), device=DEV)
    lse[1, :, 2] = float("-inf")
    o[1, 2] = 0
    missed = torch.full((2, 1, 3, width), -1, dtype=torch.int32, device=DEV)
    with poisoned_allocations():
        o_new, lse_new = repair(q, k, v, o, lse, missed, prefix_lens=lens, block_size=16)
    assert_close(lse_new, lse, dtype, "lse")
    assert_close(o_new, o, dtype, "o")


def test_interior_padding_and_partial_last_block():
    """-1 between real entries is skipped; positions past prefix_lens in the last block are
    masked even though the cache holds (random) values there."""
    dtype = torch.float32 if not HAS_CUDA else torch.float16
    q, k, v, lens = make_qkv([50, 33], 2, 4, 2, 16, dtype, seed=9)
    idx = torch.tensor(
        [
            [[[3, -1, 0, -1], [-1, -1, 1, -1]], [[-1, 2, -1, 3], [0, 1, 2, 3]]],
            [[[2, -1, -1, 0], [-1, -1, -1, -1]], [[1, -1, 2, -1], [-1, 0, -1, -1]]],
        ],
        dtype=torch.int32,
        device=DEV,
    )
    o0, lse0 = empty_state(q)
    with poisoned_allocations():
        o, lse = repair(q, k, v, o0, lse0, idx, prefix_lens=lens, block_size=16)
    ro, rlse = reference_repair(q, k, v, o0, lse0, idx, prefix_lens=lens, block_size=16)
    assert torch.isneginf(lse[1, :2, 1]).all() and (o[1, 1, :2] == 0).all()  # all -1 row
    assert not torch.isnan(o).any()
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


def _valid():
    q, k, v, lens = make_qkv([40, 20], 2, 4, 2, 16, torch.float16, seed=0)
    o = torch.randn_like(q)
    lse = torch.randn((2, 4, 2), device=DEV)
    idx = torch.tensor([0, 1, -1], dtype=torch.int32, device=DEV).repeat(2, 2, 2, 1)
    return dict(q=q, k_cache=k, v_cache=v, o=o, lse=lse, missed_idx=idx, prefix_lens=lens)


@pytest.mark.parametrize(
    ("field", "change", "name"),
    [
        ("missed_idx", lambda x: x.long(), "missed_idx"),
        ("missed_idx", lambda x: x[:, :1], "missed_idx"),
        ("missed_idx", lambda x: x.transpose(2, 3).contiguous().transpose(2, 3), "missed_idx"),
        ("missed_idx", lambda x: torch.where(x == 1, 5, x), "missed_idx"),  # block 5 >= 40/16
        ("missed_idx", lambda x: torch.where(x == -1, -2, x), "missed_idx"),
        ("missed_idx", lambda x: torch.where(x == -1, 0, x), "missed_idx"),  # duplicate 0
        ("o", lambda x: x.float(), "o "),
        ("o", lambda x: x.transpose(0, 1).contiguous().transpose(0, 1), "o "),
        ("lse", lambda x: x.half(), "lse"),
        ("lse", lambda x: x[:, :, :1], "lse"),
        ("q", lambda x: x.int(), "q"),
        ("k_cache", lambda x: x[:, :, :, :8].contiguous(), "k_cache"),
        ("prefix_lens", lambda x: x.long(), "prefix_lens"),
    ],
)
def test_rejects_bad_inputs(field, change, name):
    kw = _valid()
    kw[field] = change(kw[field])
    with pytest.raises(ValueError, match=name):
        repair(**kw, block_size=16)


def test_rejects_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        repair(**_valid(), block_size=24)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan")])
def test_rejects_a_softmax_scale_not_above_zero(scale):
    with pytest.raises(ValueError, match="sm_scale must be > 0"):
        repair(**_valid(), block_size=16, sm_scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 4, 8])
def test_gpu_bf16_partial_then_repair_equals_union(group):
    dtype = torch.bfloat16
    prefix_lens, t, hkv = [4093, 129, 1000], 16, 2
    q, k, v, lens = make_qkv(prefix_lens, t, hkv * group, hkv, 128, dtype, seed=group)
    pred, miss, union = split_blocks(prefix_lens, hkv, t, 64, width=12, seed=group)
    kw = dict(prefix_lens=lens, block_size=64)
    with poisoned_allocations():
        o_p, lse_p = repair(q, k, v, *empty_state(q), pred, **kw)
        o_u, lse_u = repair(q, k, v, o_p, lse_p, miss, **kw)
    ro_u, rlse_u = reference_repair(q, k, v, *empty_state(q), union, **kw)
    assert_close(lse_u, rlse_u, dtype, "lse")
    assert_close(o_u, ro_u, dtype, "o")


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    dtype = torch.bfloat16
    prefix_lens = [3000, 700]
    q, k, v, lens = make_qkv(prefix_lens, 4, 32, 8, 128, dtype, seed=3)
    _, miss, _ = split_blocks(prefix_lens, 8, 4, 64, width=8, seed=4)
    o = torch.randn_like(q)
    lse = torch.randn((2, 32, 4), device="cuda")
    kw = dict(prefix_lens=lens, block_size=64, validate=False)
    repair(q, k, v, o, lse, miss, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_new, lse_new = repair(q, k, v, o, lse, miss, **kw)
    q.copy_(torch.randn_like(q))
    miss.copy_(torch.roll(miss, 1, dims=-1))
    graph.replay()
    torch.cuda.synchronize()
    ro, rlse = reference_repair(q, k, v, o, lse, miss, prefix_lens=lens, block_size=64)
    assert_close(lse_new, rlse, dtype, "lse")
    assert_close(o_new, ro, dtype, "o")
