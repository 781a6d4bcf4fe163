"""``kernels.accept_commit`` against the torch path it replaces: the greedy walk
(``engine.acceptance.accept_greedy``), the cut at each sequence's remaining tokens and the packed
host read (``engine.accept_graph.cut_to_remaining``), the committed lengths, and the move of the
kept entries (``engine.cache.KVCache.commit``), on random trees, budgets and caches; on the GPU
also from a captured CUDA graph whose inputs change after capture."""

from __future__ import annotations

import pytest
import torch
from ssvkit.engine.accept_graph import cut_to_remaining
from ssvkit.engine.acceptance import AcceptedPath, accept_greedy
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.accept import reference_accept_sampled
from ssvkit.kernels.accept_commit import accept_commit, move_kept

SPECS = ["chain:0", "chain:5", "full:2x3", "full:3x2", "best:16:6", "full:2x5"]


def _round(spec: str, seed: int, batch: int = 5, vocab: int = 7):
    """A tree, drafts that match the target's argmax at their parent about 70% of the time
    (so paths of every depth occur), the target's logits and random budgets and lengths."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.from_spec(spec, "bfs")
    t = tree.num_nodes
    logits = torch.randn(batch, t, vocab, generator=g)
    argmax = logits.argmax(-1)
    tokens = torch.randint(0, vocab, (batch, t), generator=g)
    parents = torch.tensor([max(p, 0) for p in tree.parents])
    planted = torch.rand(batch, t, generator=g) < 0.7
    tokens = torch.where(planted, argmax[:, parents], tokens)
    remaining = torch.randint(0, tree.max_depth + 3, (batch,), generator=g, dtype=torch.int32)
    lens = torch.randint(3, 20, (batch,), generator=g, dtype=torch.int32)
    return tree, tokens, logits, remaining, lens


@pytest.mark.parametrize("enable", [1, 0])
@pytest.mark.parametrize("spec", SPECS)
def test_greedy_accept_commit_is_the_torch_path(spec, enable, device):
    tree, tokens, logits, remaining, lens = _round(spec, seed=len(spec) + enable)
    tt = tree.tensors(tokens.shape[0], "cpu")
    on = torch.tensor([enable], dtype=torch.int32)
    ref_remaining = remaining.clone()
    ref, ref_packed = cut_to_remaining(accept_greedy(tt, tokens, logits), tokens, ref_remaining, on)
    dt = tree.tensors(tokens.shape[0], device)
    greedy = (logits.argmax(-1).to(device), dt.parents, dt.depth, dt.mask)
    new_lens, remaining_d = lens.clone().to(device), remaining.clone().to(device)
    out = accept_commit(
        tokens.to(device), remaining_d, on.to(device), new_lens, tree.max_depth, greedy=greedy
    )
    path, kept, bonus, packed, old = (x.cpu() for x in out)
    remaining, new_lens = remaining_d.cpu(), new_lens.cpu()
    assert torch.equal(path, ref.path)
    assert torch.equal(kept, ref.count) and kept.dtype == torch.int32
    assert torch.equal(bonus, ref.bonus)
    assert torch.equal(packed, ref_packed)
    assert torch.equal(remaining, ref_remaining)
    assert torch.equal(old, lens) and torch.equal(new_lens, lens + ref.count)
    if enable:  # the case exercises cuts and, below a root alone, paths past the root
        assert (packed[:, 0] < packed[:, -1]).any()
        assert tree.max_depth == 0 or (packed[:, -1] > 1).any()


@pytest.mark.parametrize("spec", ["chain:4", "full:2x3"])
def test_a_sampled_walk_is_cut_and_packed_as_the_torch_path(spec, device):
    tree, tokens, logits, remaining, lens = _round(spec, seed=3)
    tt = tree.tensors(tokens.shape[0], "cpu")
    g = torch.Generator().manual_seed(4)
    u = torch.rand(tokens.shape[0], tree.max_depth + 1, generator=g)
    walk = reference_accept_sampled(tokens, logits, None, tt.children, tree.max_depth, 1.0, u)
    on = torch.ones(1, dtype=torch.int32)
    ref_remaining = remaining.clone()
    ref, ref_packed = cut_to_remaining(AcceptedPath(*walk), tokens, ref_remaining, on)
    remaining_d, lens_d = remaining.clone().to(device), lens.clone().to(device)
    walk_d = tuple(x.to(device) for x in walk)
    out = accept_commit(
        tokens.to(device), remaining_d, on.to(device), lens_d, tree.max_depth, sampled=walk_d
    )
    packed, kept, bonus = (out[i].cpu() for i in (3, 1, 2))
    assert torch.equal(packed, ref_packed) and torch.equal(kept, ref.count)
    assert torch.equal(bonus, ref.bonus) and torch.equal(remaining_d.cpu(), ref_remaining)


@pytest.mark.parametrize("shape", [(2, 3, 2, 40, 16), (1, 4, 3, 33, 24)])
def test_move_kept_is_the_cache_commit(shape, device):
    """The kept entries land on consecutive tail positions, the rest of the cache untouched;
    a path that keeps entries out of label order is moved as the gather/scatter moves it."""
    layers, batch, heads, t_max, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kv = torch.randn(layers, 2, batch, heads, t_max, d, generator=g).to(dtype)
    p = 4
    base = torch.randint(0, t_max - 12, (batch,), generator=g, dtype=torch.int32)
    steps = torch.randint(0, 3, (batch, p), generator=g)
    steps[:, 0] = 0
    path = torch.cumsum(steps + (torch.arange(p) > 0), dim=1)  # strictly increasing, root 0
    kept = torch.randint(1, p + 1, (batch,), generator=g, dtype=torch.int32)
    expect = kv.clone()
    for b in range(batch):
        for j in range(int(kept[b])):
            pos = int(base[b]) + j
            expect[:, :, b, :, pos] = kv[:, :, b, :, int(base[b]) + int(path[b, j])]
    assert not torch.equal(expect, kv)  # something moves
    kv = kv.to(device)
    move_kept(kv, path.to(device), kept.to(device), (base + kept).to(device))
    assert torch.equal(kv.cpu(), expect)


@pytest.mark.gpu
def test_gpu_captured_step_follows_new_inputs():
    """Both launches captured in one CUDA graph (no host synchronisation), replayed on
    drafts, budgets and lengths written after the capture, give the eager results."""
    tree, tokens, logits, remaining, lens = _round("full:2x3", seed=11, batch=8)
    dev = torch.device("cuda")
    dt = tree.tensors(tokens.shape[0], dev)
    kv = torch.randn(2, 2, 8, 2, 64, 128, device=dev, dtype=torch.bfloat16)
    static = [x.to(dev) for x in (tokens, logits.argmax(-1), remaining, lens)]
    on = torch.ones(1, dtype=torch.int32, device=dev)

    def step(tok, argmax, rem, ln):
        greedy = (argmax, dt.parents, dt.depth, dt.mask)
        out = accept_commit(tok, rem, on, ln, tree.max_depth, greedy=greedy)
        move_kept(kv, out[0], out[1], ln)
        return out

    step(*[x.clone() for x in static])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    kv0 = kv.clone()
    with torch.cuda.graph(graph):
        captured = step(*static)
    kv.copy_(kv0)
    fresh = _round("full:2x3", seed=12, batch=8)
    for dst, src in zip(static, (fresh[1], fresh[2].argmax(-1), fresh[3], fresh[4]), strict=True):
        dst.copy_(src)
    graph.replay()
    got = [x.clone() for x in captured] + [kv.clone(), static[2].clone(), static[3].clone()]
    kv.copy_(kv0)
    eager_in = [x.to(dev) for x in (fresh[1], fresh[2].argmax(-1), fresh[3], fresh[4])]
    want = list(step(*eager_in)) + [kv.clone(), eager_in[2], eager_in[3]]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_bad_arguments_are_refused():
    tokens = torch.zeros(2, 3, dtype=torch.int64)
    lens, rem, on = (torch.zeros(2, dtype=torch.int32) for _ in range(3))
    with pytest.raises(ValueError, match="exactly one"):
        accept_commit(tokens, rem, on[:1], lens, 1)
    with pytest.raises(ValueError, match="int64"):
        accept_commit(tokens.int(), rem, on[:1], lens, 1, sampled=(tokens, lens, lens))
    with pytest.raises(ValueError, match="depth must be in"):
        accept_commit(tokens, rem, on[:1], lens, 3, sampled=(tokens, lens, lens))
    with pytest.raises(ValueError, match="remaining must be"):
        accept_commit(tokens, rem.long(), on[:1], lens, 1, sampled=(tokens, lens, lens))
    with pytest.raises(ValueError, match="path must be"):
        move_kept(torch.zeros(1, 2, 2, 1, 8, 4), tokens[:1], lens, lens)
