"""dense_verify and merge_partials against their fp32 torch references.

CPU: Triton interpreter, fp16/fp32, small D and T. GPU (``gpu`` marker): bf16 at D = 128, plus
CUDA-graph capture of the wrapper (which fails if the wrapper synchronises with the host).
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA, assert_close
from ssvkit.kernels.dense_verify import (
    DenseVerifyConfig,
    choose_num_splits,
    dense_verify,
    plan_dense_verify,
    reference_dense_verify,
)
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.merge import merge_blocks, merge_partials, reference_merge_partials
from ssvkit.kernels.timing import poisoned_allocations
from ssvkit.kernels.tree import ancestor_bitmask, batch_parents
from ssvkit.perfmodel.acceptance import chain_parents

CPU_DTYPES = [torch.float16, torch.float32]


def random_parents(bsz: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """A random branching tree per sequence: ``parents[i]`` uniform in ``[-1, i)``."""
    p = torch.empty((bsz, t), dtype=torch.int32)
    for i in range(t):
        p[:, i] = torch.randint(-1, i, (bsz,), generator=gen) if i else -1
    return p


def make_inputs(prefix_lens, t, num_q_heads, num_kv_heads, head_dim, dtype, device, *, tree, seed):
    """Random ragged inputs; the cache holds ``max(prefix) + t`` positions plus slack that is
    not a multiple of any tile, filled with random values the kernel must not read."""
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    t_max = max(prefix_lens) + t + 5
    q = torch.randn((bsz, t, num_q_heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((bsz, num_kv_heads, t_max, head_dim), generator=gen).to(dtype)
    v = torch.randn((bsz, num_kv_heads, t_max, head_dim), generator=gen).to(dtype)
    parents = (
        batch_parents(chain_parents(t), bsz) if tree == "chain" else random_parents(bsz, t, gen)
    )
    mask = ancestor_bitmask(parents)
    lens = torch.tensor(prefix_lens, dtype=torch.int32)
    return tuple(x.to(device) for x in (q, k, v, lens, mask))


# (prefix_lens, t, H, Hkv, D): T not a multiple of any tile, lengths 0 and 1, G in {1, 4, 8},
# G * t = 264 rows (several row tiles) and t = 64 (bit 63, the int64 sign bit, in the tree mask).
CPU_SHAPES = [
    ([37, 0, 1], 1, 2, 2, 16),
    ([99, 19], 3, 8, 2, 32),
    ([61, 5], 6, 8, 2, 32),  # 24 packed rows: a 64-row tile, 40 of its rows masked
    ([130, 1], 16, 8, 1, 16),
    ([70], 33, 8, 1, 16),
    ([50, 2], 64, 2, 2, 16),
]


@pytest.mark.parametrize("tree", ["chain", "tree"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: f"L{s[0]}-t{s[1]}-H{s[2]}-kv{s[3]}")
def test_matches_reference(shape, dtype, tree):
    if HAS_CUDA and dtype == torch.float32:
        pytest.skip("fp32 is a CPU-interpreter dtype")
    prefix_lens, t, h, hkv, d = shape
    dev = "cuda" if HAS_CUDA else "cpu"
    args = make_inputs(prefix_lens, t, h, hkv, d, dtype, dev, tree=tree, seed=len(prefix_lens) + t)
    with poisoned_allocations():
        o, lse = dense_verify(*args)
    ro, rlse = reference_dense_verify(*args)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


@pytest.mark.parametrize("num_splits", [2, 5])
def test_splits_and_merge_match_reference(num_splits):
    """Forced splits: short sequences leave whole splits empty (lse = -inf partials)."""
    dtype = torch.float16
    dev = "cuda" if HAS_CUDA else "cpu"
    args = make_inputs([200, 0, 3], 4, 4, 1, 16, dtype, dev, tree="tree", seed=num_splits)
    with poisoned_allocations():
        o, lse = dense_verify(*args, num_splits=num_splits, sm_scale=0.3)
    ro, rlse = reference_dense_verify(*args, sm_scale=0.3)
    assert_close(lse, rlse, dtype, "lse")
    assert_close(o, ro, dtype, "o")


def test_empty_rows_give_neg_inf_lse_and_zero_o():
    """Prefix 0 and a row that sees no tail entry: nothing to attend, never NaN."""
    dtype = torch.float32
    dev = "cuda" if HAS_CUDA else "cpu"
    if HAS_CUDA:
        dtype = torch.float16
    q, k, v, lens, _ = make_inputs([0, 40], 3, 4, 2, 16, dtype, dev, tree="chain", seed=3)
    mask = torch.tensor([[0, 2, 3], [1, 0, 7]], dtype=torch.int64, device=dev)
    for splits in (1, 3):
        with poisoned_allocations():
            o, lse = dense_verify(q, k, v, lens, mask, num_splits=splits)
        assert torch.isneginf(lse[0, :, 0]).all()  # seq 0, row 0: empty prefix, no tail bit
        assert (o[0, 0] == 0).all()
        assert torch.isfinite(lse[0, :, 1:]).all() and torch.isfinite(lse[1]).all()
        assert not torch.isnan(o).any()
        ro, rlse = reference_dense_verify(q, k, v, lens, mask)
        assert_close(lse, rlse, dtype, "lse")
        assert_close(o, ro, dtype, "o")


def test_merge_partials_ignores_empty_splits():
    gen = torch.Generator().manual_seed(0)
    dev = "cuda" if HAS_CUDA else "cpu"
    o_part = torch.randn((2, 3, 5, 16), generator=gen).to(dev)
    lse_part = torch.randn((2, 3, 5), generator=gen).to(dev)
    lse_part[0, 0] = float("-inf")  # a row no split saw
    lse_part[1, :, 2] = float("-inf")  # one empty split per row ...
    o_part[1, :, 2] = float("nan")  # ... whose partial is garbage
    o, lse = merge_partials(o_part, lse_part)
    ro, rlse = reference_merge_partials(o_part, lse_part)
    assert torch.isneginf(lse[0, 0]) and (o[0, 0] == 0).all()
    assert_close(lse, rlse, torch.float32, "lse")
    assert_close(o, ro, torch.float32, "o")


@pytest.mark.parametrize(
    "num_splits, lead",
    [(s, (3, 7)) for s in (1, 3, 16, 21)]
    + [(1, (2, 1107)), (3, (2, 1107)), (16, (3, 89))]
    + [(21, (3, 89))],
)
def test_merge_partials_rows_of_any_split_count(num_splits, lead):
    """Split counts below, at and past one load of splits (``merge.MAX_BLOCK_S``), an empty
    split among them; with few rows (a program a row) and with enough rows for programs of
    several rows, whose last program's rows are partly empty (2214 rows in programs of 16 or 8
    at few splits, 267 in programs of 2 at many)."""
    dev = "cuda" if HAS_CUDA else "cpu"
    rows = lead[0] * lead[1]
    _, _, block_r = merge_blocks(num_splits, rows, num_sms(torch.device(dev)))
    assert (block_r == 1) == (rows < 100) and (block_r == 1 or rows % block_r)
    gen = torch.Generator().manual_seed(num_splits)
    o_part = torch.randn((*lead, num_splits, 32), generator=gen).to(dev)
    lse_part = torch.randn((*lead, num_splits), generator=gen).to(dev)
    lse_part[1, 5, -1] = float("-inf")
    o_part[1, 5, -1] = float("nan")
    o, lse = merge_partials(o_part, lse_part)
    ro, rlse = reference_merge_partials(o_part, lse_part)
    assert not torch.isnan(o).any()
    assert_close(lse, rlse, torch.float32, "lse")
    assert_close(o, ro, torch.float32, "o")


def test_merge_partials_writes_strided_destinations():
    dev = "cuda" if HAS_CUDA else "cpu"
    o_part = torch.randn((2, 3, 4, 2, 16), device=dev)
    lse_part = torch.randn((2, 3, 4, 2), device=dev)
    o_out = torch.full((2, 3, 4, 16), float("nan"), device=dev, dtype=torch.float16)
    lse_store = torch.full((2, 4, 3), float("nan"), device=dev)
    merge_partials(o_part, lse_part, o_out=o_out, lse_out=lse_store.permute(0, 2, 1))
    ro, rlse = reference_merge_partials(o_part, lse_part)
    assert_close(lse_store.permute(0, 2, 1), rlse, torch.float32, "lse")
    assert_close(o_out, ro, torch.float16, "o")


def test_split_heuristic_fills_the_gpu_and_respects_bounds():
    cfg = DenseVerifyConfig()
    assert choose_num_splits(8, 1024, 264, cfg) > 16  # B=1, Hkv=8: split to fill 132 SMs x 2
    assert choose_num_splits(512, 1024, 264, cfg) == 1  # already several waves
    assert choose_num_splits(8, 4, 264, cfg) == 1  # too short to split
    assert choose_num_splits(8, 1024, 264, cfg) <= cfg.max_splits
    # A grid just past what the SMs hold would run a second wave of a few whole walks: split.
    assert choose_num_splits(136, 1025, 132, cfg, resident_slots=132) > 1
    assert choose_num_splits(136, 1025, 132, cfg, resident_slots=264) == 1  # all at once
    assert choose_num_splits(1536, 1025, 132, cfg, resident_slots=132) == 1  # last wave 64% full
    plan = plan_dense_verify(1, 16, 32, 8, 128, 65552, torch.device("cpu"))
    assert plan.block_m == 64 and plan.num_m_tiles == 1 and plan.num_splits > 1
    # Batch 17 of 32 rows: 136 row tiles of 128 rows, one an SM on 132 SMs.
    assert plan_dense_verify(17, 32, 32, 8, 128, 65568, torch.device("cpu")).num_splits > 1
    assert plan_dense_verify(16, 32, 32, 8, 128, 65568, torch.device("cpu")).num_splits == 1
    plan = plan_dense_verify(1, 64, 32, 8, 128, 65600, torch.device("cpu"))
    assert plan.block_m == 128 and plan.num_m_tiles == 2


def _valid_args():
    return make_inputs([20, 5], 3, 4, 2, 16, torch.float16, "cpu", tree="chain", seed=0)


@pytest.mark.parametrize(
    ("mutate", "name"),
    [
        (lambda a: (a[0].int(), *a[1:]), "q"),
        (lambda a: (a[0].bfloat16(), *a[1:]), "q"),
        (lambda a: (a[0][0], *a[1:]), "q"),
        (lambda a: (a[0], a[1][..., :8].contiguous(), *a[2:]), "k_cache"),
        (lambda a: (a[0], a[1].transpose(2, 3).contiguous().transpose(2, 3), *a[2:]), "k_cache"),
        (lambda a: (a[0], a[1], a[2].float(), *a[3:]), "v_cache"),
        (
            lambda a: (
                a[0],
                a[1][:, :1].repeat(1, 3, 1, 1),
                a[2][:, :1].repeat(1, 3, 1, 1),
                *a[3:],
            ),
            "heads",
        ),
        (lambda a: (*a[:3], a[3].long(), a[4]), "prefix_lens"),
        (lambda a: (*a[:3], a[3] + 100, a[4]), "prefix_lens"),
        (lambda a: (*a[:3], a[3] - 30, a[4]), "prefix_lens"),
        (lambda a: (*a[:4], a[4].int()), "tree_mask"),
        (lambda a: (*a[:4], a[4][:, :2]), "tree_mask"),
        (lambda a: (*a[:4], a[4] | 8), "tree_mask"),
    ],
)
def test_rejects_bad_inputs(mutate, name):
    args = mutate(_valid_args())
    with pytest.raises(ValueError, match=name):
        dense_verify(*args)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan")])
def test_rejects_a_softmax_scale_not_above_zero(scale):
    with pytest.raises(ValueError, match="sm_scale must be > 0"):
        dense_verify(*_valid_args(), sm_scale=scale)


def test_rejects_too_many_draft_rows():
    q, k, v, lens, _ = make_inputs([3], 65, 2, 1, 16, torch.float16, "cpu", tree="chain", seed=1)
    with pytest.raises(ValueError, match="t=65"):
        dense_verify(q, k, v, lens, torch.zeros((1, 65), dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 16, 64])
def test_gpu_bf16_matches_reference(t):
    args = make_inputs(
        [4093, 17, 1, 2500], t, 32, 8, 128, torch.bfloat16, "cuda", tree="tree", seed=t
    )
    with poisoned_allocations():
        o, lse = dense_verify(*args)
    ro, rlse = reference_dense_verify(*args)
    assert_close(lse, rlse, torch.bfloat16, "lse")
    assert_close(o, ro, torch.bfloat16, "o")


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    """Capturing fails on any host synchronisation; replay must track new input values."""
    args = make_inputs([3000, 700], 8, 32, 8, 128, torch.bfloat16, "cuda", tree="tree", seed=7)
    q, k, v, lens, mask = args
    dense_verify(q, k, v, lens, mask, validate=False)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = dense_verify(q, k, v, lens, mask, validate=False)
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.tensor([1200, 3005], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    ro, rlse = reference_dense_verify(q, k, v, lens, mask)
    assert_close(lse, rlse, torch.bfloat16, "lse")
    assert_close(o, ro, torch.bfloat16, "o")
