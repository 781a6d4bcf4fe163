"""Programmatic dependent launch (``kernels.pdl``) of the NSA chain (``NsaVerifyConfig(pdl=
True)``: compressed pass, block scoring, pick, union plan, selected/window forward, merge) and
of select_blocks' two launches (``select_blocks(pdl=True)``), against the same calls without it
and the fp32 references.

The interpreter runs launches one after another: ``pdl_gate`` is a no-op there, and these tests
run the kernels' ``PDL`` variants (their prologues moved ahead of the wait), check that every
launch of a call goes through the call's one chain (the first an ordinary launch, the rest
dependents) and that the outputs are bitwise those of the calls without PDL. Launches that
overlap run only on the GPU (``gpu`` marker).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import ssvkit.kernels.pdl as pdl
import torch
from kernel_helpers import HAS_CUDA, assert_close
from nsa_helpers import DEV, GPU_KW, NSA_KW, make_gpu_inputs, make_inputs
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    nsa_verify,
    nsa_verify_unfused,
    reference_nsa_verify,
)
from ssvkit.kernels.select_blocks import block_scores, select_blocks
from ssvkit.kernels.timing import poisoned_allocations
from test_select_blocks import exact_top_blocks
from test_select_blocks import make_inputs as select_inputs


@pytest.fixture
def launches(monkeypatch):
    """Every ``LaunchChain.meta`` call: (chain, its ``PDL``, whether it is a dependent)."""
    seen = []
    meta = pdl.LaunchChain.meta

    def spy(self):
        dependent = self._launched
        out = meta(self)
        seen.append((id(self), out["PDL"], dependent))
        return out

    monkeypatch.setattr(pdl.LaunchChain, "meta", spy)
    return seen


def one_chain(seen) -> tuple[int, bool]:
    """The launch count and ``PDL`` of the one chain ``seen`` holds; the first launch is the
    only one that is not a dependent."""
    assert len({chain for chain, _, _ in seen}) == 1
    assert [dependent for _, _, dependent in seen] == [False] + [True] * (len(seen) - 1)
    assert len({flag for _, flag, _ in seen}) == 1
    return len(seen), seen[0][1]


def test_a_chain_makes_every_launch_but_the_first_a_dependent(monkeypatch):
    monkeypatch.setattr(pdl, "INTERPRETED", False)  # the launch option as on the GPU
    chain = pdl.LaunchChain(True)
    assert [chain.meta() for _ in range(3)] == [
        {"PDL": True},
        {"PDL": True, "launch_pdl": True},
        {"PDL": True, "launch_pdl": True},
    ]
    off = pdl.LaunchChain(False)
    assert [off.meta() for _ in range(2)] == [{"PDL": False}, {"PDL": False}]
    assert pdl.chain_for(chain) is chain
    assert pdl.chain_for(None, True).meta() == {"PDL": True}


def test_pdl_is_refused_where_launches_cannot_be_dependents(monkeypatch):
    pdl.check_pdl(torch.device(DEV))  # the interpreter, or the GPU the GPU tests run on
    monkeypatch.setattr(pdl, "INTERPRETED", False)
    with pytest.raises(ValueError, match="CUDA device"):
        pdl.check_pdl(torch.device("cpu"))
    args, idx = make_inputs([40, 33], 2, 4, 2, 16, torch.float32, seed=0)
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="pdl"):
            nsa_verify(*args, block_idx=idx, config=NsaVerifyConfig(pdl=True), **NSA_KW)
    monkeypatch.setattr(pdl, "HAS_GDC", False)
    with pytest.raises(ValueError, match="gdc_wait"):
        pdl.check_pdl(torch.device("cuda"))


# (prefix_lens, t, H, Hkv, D): 16-row tiles of 4 draft rows (G = 4), a ragged last tile and a
# prefix shorter than a compression window; one draft row (no union plan launch). One KV head
# each: a call's launches and their chain do not depend on the number of heads.
SHAPES = [([77, 9], 5, 4, 1, 32), ([150], 1, 4, 1, 16)]
# Kernel launches of one call with multi-row tiles: the refresh path (compressed pass, scoring,
# pick, union plan, forward, merge), the reuse path building its union, the unfused refresh
# (compressed pass, scoring, pick, its merge, then per branch forward and merge, the union plan
# before the selected one's), the unfused reuse (the same without the selection). A tile of one
# row streams its row's blocks: no union plan launch.
LAUNCHES = {
    (nsa_verify, True): 6,
    (nsa_verify, False): 3,
    (nsa_verify_unfused, True): 9,
    (nsa_verify_unfused, False): 7,
}


@pytest.mark.parametrize("fn", [nsa_verify, nsa_verify_unfused], ids=["fused", "unfused"])
@pytest.mark.parametrize("refresh", [False, True], ids=["reuse", "refresh"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"L{s[0]}-t{s[1]}-H{s[2]}-kv{s[3]}")
def test_nsa_with_pdl_is_the_call_without_it(launches, shape, refresh, fn):
    if HAS_CUDA:
        pytest.skip("fp32 is a CPU-interpreter dtype; the GPU tests below run launches overlapped")
    prefix_lens, t, h, hkv, d = shape
    args, idx = make_inputs(prefix_lens, t, h, hkv, d, torch.float32, seed=5 * t + h)
    block_idx = None if refresh else idx
    ro, ridx = reference_nsa_verify(*args, block_idx=block_idx, **NSA_KW)
    outs = {}
    for on in (False, True):
        launches.clear()
        cfg = NsaVerifyConfig(num_splits=5, block_m=16, pdl=on)
        with poisoned_allocations():  # a row written by no launch stays NaN
            outs[on] = fn(*args, block_idx=block_idx, config=cfg, **NSA_KW)
        assert one_chain(launches) == (LAUNCHES[(fn, refresh)] - (t == 1), on)
    (o_off, idx_off), (o_on, idx_on) = outs[False], outs[True]
    assert torch.equal(o_on, o_off) and torch.equal(idx_on, idx_off)
    assert not torch.isnan(o_on).any()
    if refresh:
        assert torch.equal(idx_on.cpu(), ridx.cpu())
    assert_close(o_on, ro, torch.float32, "o")


@pytest.mark.parametrize("refresh", [False, True], ids=["reuse", "refresh"])
@pytest.mark.parametrize("merge, pick", [("last", "folded"), ("parallel", "separate")])
def test_folded_steps_with_pdl_are_the_calls_without_it(merge, pick, refresh):
    """The folded merge and pick wait before their first ticket: the same output, and the
    arrival counters are zero again."""
    import ssvkit.kernels.arrivals as arrivals
    from ssvkit.kernels.top_blocks import threshold_meta

    if HAS_CUDA:
        pytest.skip("fp32 is a CPU-interpreter dtype; the GPU tests below run the default steps")
    # A prefix of more than 32 blocks (rows the folded pick serves) beside an empty one.
    args, idx = make_inputs([520, 0], 3, 4, 1, 16, torch.float32, seed=4)
    block_idx = None if refresh else idx
    kw = dict(NSA_KW, top_n=6) if refresh else NSA_KW
    assert threshold_meta(-(-args[1].shape[2] // kw["block_size"]), 6) is not None
    outs = []
    for on in (False, True):
        cfg = NsaVerifyConfig(num_splits=5, block_j=16, merge=merge, pick=pick, pdl=on)
        with poisoned_allocations():
            outs.append(nsa_verify(*args, block_idx=block_idx, config=cfg, **kw))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    ro, _ = reference_nsa_verify(*args, block_idx=outs[1][1], **kw)
    assert_close(outs[1][0], ro, torch.float32, "o")
    assert all(int(b.abs().sum()) == 0 for b in arrivals.counter_buffers(torch.device(DEV)))


@pytest.mark.parametrize("fused", [False, True], ids=["two_launch", "one_launch"])
@pytest.mark.parametrize("method", ["mean", "quest"])
def test_select_blocks_with_pdl_picks_what_it_picks_without(launches, method, fused):
    lens = [700, 17, 0]
    q, k, lens_t = select_inputs(lens, 3, 4, 1, 16, torch.float32, seed=8)
    meta = BlockMetadata.build(k, lens_t, 16, kinds=(method,))
    kw = dict(top_n=6, method=method, num_sink=1, num_local=1, fused=fused)
    picks = {}
    for on in (False, True):
        launches.clear()
        with poisoned_allocations():
            picks[on] = select_blocks(q, meta, lens_t, pdl=on, **kw)
        assert one_chain(launches) == (1 if fused else 2, on)
    assert torch.equal(picks[True], picks[False])
    scores = block_scores(q, meta, lens_t, method=method).cpu()
    assert torch.equal(picks[True].cpu(), exact_top_blocks(scores, lens_t.cpu(), 16, 6, 1, 1))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_gpu_nsa_with_pdl_is_repeatable_and_bitwise_the_call_without_it(t):
    """Launches overlap here: a dependent that read its producer's output before the wait, or
    stored before it, shows as an output that differs between repeats or from the call without
    PDL (the same arithmetic)."""
    args = make_gpu_inputs([4093, 700, 2500], t, seed=t)
    kw = dict(GPU_KW, validate=False)
    _, idx = nsa_verify(*args, **kw)
    steps = (NsaVerifyConfig(), NsaVerifyConfig(merge="parallel", pick="folded"))
    for fn, off, block_idx in itertools.product(
        (nsa_verify, nsa_verify_unfused), steps, (idx, None)
    ):
        on = dataclasses.replace(off, pdl=True)
        o_off, idx_off = fn(*args, block_idx=block_idx, config=off, **kw)
        for _ in range(20):
            o_on, idx_on = fn(*args, block_idx=block_idx, config=on, **kw)
            assert torch.equal(o_on, o_off) and torch.equal(idx_on, idx_off)


@pytest.mark.gpu
@pytest.mark.parametrize("refresh", [False, True])
def test_gpu_nsa_with_pdl_in_a_cuda_graph(refresh):
    """A captured chain of dependent launches replays on new inputs as the call without PDL."""
    args = make_gpu_inputs([3000, 700], 8, seed=7)
    _, idx = nsa_verify(*args, **GPU_KW)
    kw = dict(GPU_KW, block_idx=None if refresh else idx, validate=False)
    on = NsaVerifyConfig(pdl=True)
    nsa_verify(*args, config=on, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, idx_graph = nsa_verify(*args, config=on, **kw)
    for seed in range(3):
        args[0].copy_(torch.randn(args[0].shape, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        o_off, idx_off = nsa_verify(*args, **kw)
        assert torch.equal(o_graph, o_off) and torch.equal(idx_graph, idx_off)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_select_blocks_with_pdl_in_a_cuda_graph(fused):
    q, k, lens = select_inputs([130000, 5000, 77], 16, 32, 8, 128, torch.bfloat16, seed=3)
    meta = BlockMetadata.build(k, lens, 64, kinds=("mean",))
    off = select_blocks(q, meta, lens, top_n=16, fused=fused)
    for _ in range(20):
        assert torch.equal(select_blocks(q, meta, lens, top_n=16, fused=fused, pdl=True), off)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx = select_blocks(q, meta, lens, top_n=16, fused=fused, pdl=True)
    q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(idx, select_blocks(q, meta, lens, top_n=16, fused=fused))
