"""Draft trees (flattening, level order), the KV cache's commit/rollback and its summaries."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import TINY
from ssvkit.engine.cache import KVCache
from ssvkit.engine.drafter import LevelPlan
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.block_metadata import reference_block_metadata
from ssvkit.kernels.nsa_compress import reference_compress_kv
from ssvkit.kernels.tree import ancestor_bitmask


@pytest.mark.parametrize("spec", ["chain:0", "chain:5", "full:2x3", "full:3x2", "best:16:6"])
@pytest.mark.parametrize("order", ["bfs", "dfs", "position"])
def test_tree_flattening_is_topological_and_keeps_the_shape(spec, order):
    tree = DraftTree.from_spec(spec, order)
    base = DraftTree.from_spec(spec, "bfs")
    assert tree.parents[0] == -1 and all(p < i for i, p in enumerate(tree.parents))
    assert sorted(tree.depth) == sorted(base.depth)
    # Each node keeps its number of children and its sibling rank set.
    assert sorted(len(c) for c in tree.children) == sorted(len(c) for c in base.children)
    for kids in tree.children:
        assert [tree.rank[c] for c in kids] == list(range(len(kids)))
    if order == "dfs" and spec == "full:2x3":
        assert tree.parents[:4] == (-1, 0, 1, 2)  # depth-first: a whole branch first
    mask = tree.tensors(2, "cpu").mask
    expect = ancestor_bitmask(torch.tensor([tree.parents] * 2, dtype=torch.int32))
    assert torch.equal(mask, expect)
    plan = LevelPlan.build(tree)
    depths = [plan.dtree.depth[k] for k in range(tree.num_nodes)]
    assert depths == sorted(depths)  # level order: nodes up to any depth are a prefix
    assert [tree.depth[v] for v in plan.to_verify] == depths


def test_tree_spec_errors():
    with pytest.raises(ValueError, match="at most 64"):
        DraftTree.from_spec("full:4x3", "bfs")
    with pytest.raises(ValueError, match="chain:K"):
        DraftTree.from_spec("star:3", "bfs")
    with pytest.raises(ValueError, match="parents"):
        DraftTree.from_parents([-1, 2, 0])


def _cache(batch=2, t_max=96):
    c = KVCache(TINY, batch, t_max, dtype=torch.float32, device="cpu", use_triton=False)
    c.kv.copy_(torch.randn(c.kv.shape, generator=torch.Generator().manual_seed(0)))
    return c


def test_commit_compacts_the_path_and_rolls_back_the_rest():
    c = _cache()
    c.set_lens(torch.tensor([40, 17]))
    c.require_blocks(16, ("mean", "quest"))
    c.require_compressed(16, 8)
    before = c.kv.clone()
    # Tail of 6 nodes; sequence 0 keeps nodes 0, 2, 5; sequence 1 keeps only its root.
    path = torch.tensor([[0, 2, 5], [0, 9, 9]])
    count = torch.tensor([3, 1], dtype=torch.int32)
    c.commit(path, count)
    assert c.lens.tolist() == [43, 18]
    for j, src in enumerate([0, 2, 5]):
        assert torch.equal(c.kv[:, :, 0, :, 40 + j], before[:, :, 0, :, 40 + src])
    assert torch.equal(c.kv[:, :, 1, :, 17], before[:, :, 1, :, 17])
    # The prefix is untouched, and everything past the new length is dead (ignored).
    assert torch.equal(c.kv[:, :, :, :, :17], before[:, :, :, :, :17])
    for layer in range(TINY.num_layers):
        ref = reference_block_metadata(c.k(layer), c.lens, 16)
        for name in ("mean", "kmax"):
            assert torch.allclose(c.meta[layer].values(name), ref[name], rtol=1e-5, atol=1e-6)
        ck, _, n = reference_compress_kv(
            c.k(layer), c.v(layer), c.lens, comp_block=16, comp_stride=8
        )
        assert torch.allclose(c.comp[layer][0], ck, atol=1e-6)
        assert torch.equal(c.comp_lens, n.to(torch.int32))


def test_summaries_rebuild_in_place():
    c = _cache()
    c.require_blocks(16, ("mean",))
    ptr = c.meta[0].mean.data_ptr()
    c.set_lens(torch.tensor([50, 33]))
    assert c.meta[0].mean.data_ptr() == ptr  # captured graphs keep reading the same tensor
    want = reference_block_metadata(c.k(0), c.lens, 16)["mean"]
    assert torch.allclose(c.meta[0].values("mean"), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="kinds"):
        c.require_blocks(16, ("nsa",))


def test_drafters_on_one_runner_share_the_plans_its_graphs_read():
    """Level graphs are keyed on the runner, so the plan tensors they index with must be the
    runner's too: a later drafter gets the very tensors an earlier one's graphs captured."""
    from engine_helpers import tiny_model
    from ssvkit.engine.draft_model import ModelDrafter
    from ssvkit.engine.runner import ModelRunner

    runner = ModelRunner(tiny_model(), batch=1, t_max=64, backend="torch")
    tree = DraftTree.from_spec("full:2x3", "position")
    a = ModelDrafter(runner, 0.0).expander.plan(tree)
    b = ModelDrafter(runner, 0.0).expander.plan(tree)
    assert a[2] is b[2] and all(x[0] is y[0] for x, y in zip(a[1], b[1], strict=True))
    other = ModelRunner(tiny_model(), batch=1, t_max=64, backend="torch")
    assert ModelDrafter(other, 0.0).expander.plan(tree)[2] is not a[2]


def test_commit_moves_rows_of_the_flat_cache_in_one_gather_and_one_scatter():
    """torch splits an indexing launch until each part spans under 2^31 bytes, so indexing the
    6-D cache by (sequence, position) costs up to 2 L launches each way on a large cache; the
    commit indexes the cache as rows of ``D`` elements, whose launches span one row."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith(("index.", "index_put")):
                self.calls.append((func.__name__, args[0].dim(), len(args[1])))
            return func(*args, **(kwargs or {}))

    c = _cache(batch=3)
    c.set_lens(torch.tensor([40, 17, 5]))
    with Record() as rec:
        c.commit(torch.tensor([[0, 2, 5], [0, 9, 9], [0, 1, 3]]), torch.tensor([3, 1, 2]))
    assert sorted(rec.calls) == [("index.Tensor", 2, 1), ("index_put_.default", 2, 1)]
