"""The engine on the real Triton kernels, run by Triton's CPU interpreter (fp32: the
interpreter's bf16 ``tl.dot`` is broken): the verify forward of each attention kind agrees with
the torch path, a short greedy decode gives the same tokens on both backends, and the fused
layer ops (qk norm, GLM's interleaved partial rotary) match the torch path through prefill and
verify."""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import HAS_CUDA, TINY, random_prompts, tiny_model
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels import linear as linear_kernel
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

pytestmark = pytest.mark.skipif(
    HAS_CUDA or os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU interpreter test (the GPU tests run the kernels for real)",
)

MODEL = tiny_model(seed=2)
PROMPTS = random_prompts([90, 61], seed=4)
KINDS = {
    "dense": AttentionConfig(),
    "sparse_union": AttentionConfig(
        kind="sparse",
        mode="union",
        group_size=3,
        top_n=2,
        block_size=16,
        window=32,
        refresh_every=2,
    ),
    "nsa": AttentionConfig(
        kind="nsa", top_n=2, block_size=16, window=32, comp_block=16, comp_stride=8, refresh_every=2
    ),
}
# NSA's row schedules: one draft row a tile (``per_query``, the default mode), tiles of C rows,
# and as many rows as a tile holds (``shared``).
NSA_KW = dict(top_n=2, block_size=16, window=32, comp_block=16, comp_stride=8, refresh_every=2)
KINDS["nsa_union"] = AttentionConfig(kind="nsa", mode="union", group_size=2, **NSA_KW)
KINDS["nsa_packed"] = AttentionConfig(kind="nsa", mode="shared", **NSA_KW)


@pytest.mark.parametrize("kind", list(KINDS))
def test_verify_forward_matches_the_torch_path(kind):
    attn = KINDS[kind]
    tree = DraftTree.from_spec("full:2x2", "position")
    tokens = torch.randint(0, 256, (2, tree.num_nodes), generator=torch.Generator().manual_seed(0))
    out = {}
    for backend in ("torch", "triton"):
        runner = ModelRunner(MODEL, batch=2, t_max=128, backend=backend)
        runner.prefill(PROMPTS)
        runner.prepare(attn)
        out[backend] = runner.tree_forward(tokens, tree, attn)[0]
    torch.testing.assert_close(out["triton"], out["torch"], atol=1e-4, rtol=1e-4)


def test_greedy_decode_is_the_same_on_triton_and_torch():
    s = Strategy(name="sd", tree="chain:2", drafter=DrafterSpec(kind="ngram"))
    tokens = {}
    for backend in ("torch", "triton"):
        runner = ModelRunner(MODEL, batch=2, t_max=128, backend=backend)
        eng = Engine(runner, s, DecodeConfig(max_new_tokens=6))
        tokens[backend] = eng.generate(PROMPTS).tokens
    assert tokens["triton"] == tokens["torch"]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_tree_decode_accepts_and_commits_as_the_torch_path(temperature):
    """Oracle drafts down a branching tree keep paths off label order, so the triton
    backend's acceptance step (``kernels.accept_commit``) moves kept entries: the tokens, the
    lengths equal the torch backend's and so does the committed KV, greedy and sampled, and a batch
    whose sequences stop at different rounds stops each at its budget."""
    s = Strategy(name="sd", tree="full:2x3", drafter=DrafterSpec(kind="ngram"))
    cfg = DecodeConfig(max_new_tokens=5, temperature=temperature, seed=3, oracle_acceptance=(0.8,))
    out = {}
    for backend in ("torch", "triton"):
        runner = ModelRunner(MODEL, batch=2, t_max=128, backend=backend)
        result = Engine(runner, s, cfg).generate(PROMPTS)
        lens = runner.cache.lens.tolist()
        kv = [runner.cache.kv[:, :, b, :, :n].clone() for b, n in enumerate(lens)]
        out[backend] = (result.tokens, lens, kv, result.mean_accepted())
    # The prefill's token and a first round that keeps 3 drafts (+ the bonus) fill one
    # sequence's 5 tokens: the second round decodes the other one alone.
    assert [r.sequences for r in result.rounds] == [[0, 1], [0]]
    assert out["triton"][:2] == out["torch"][:2]
    for got, want in zip(out["triton"][2], out["torch"][2], strict=True):
        # The fused rotary and KV store round apart from torch's: close, not bit-equal.
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert all(len(t) == cfg.max_new_tokens for t in out["triton"][0])
    assert out["triton"][3] > 1.0  # kept paths reach below the root's children


@pytest.mark.parametrize("mode", ["per_query", "union"])
def test_greedy_nsa_decode_with_a_row_schedule_is_the_reference_decode(mode):
    """Speculative NSA decoding with one draft row per row tile (or tiles of 2) emits the
    tokens of the same decode on the fp32 torch references, which have no row schedule. Five
    rows (a branching tree of depth 2: tiles of 2 leave a partial last tile). Two rounds (one
    token each: the random model rejects the drafts), each through a refresh layer and a layer
    reusing its selection: the second round runs on the caches the first committed."""
    s = Strategy(
        name="ssv",
        tree="best:4:2",
        drafter=DrafterSpec(kind="ngram"),
        attention="sparse",
        metadata="nsa",
        mode=mode,
        group_size=2,
        fusion="refresh_reuse",
        **NSA_KW,
    )
    assert AttentionConfig.from_strategy(s).rows_per_tile == (1 if mode == "per_query" else 2)
    tree = DraftTree.from_spec(s.tree)
    assert (tree.num_nodes, tree.max_depth) == (5, 2)
    tokens = {}
    for backend in ("torch", "triton"):
        runner = ModelRunner(MODEL, batch=2, t_max=128, backend=backend)
        eng = Engine(runner, s, DecodeConfig(max_new_tokens=3))
        result = eng.generate(PROMPTS)
        tokens[backend] = result.tokens
    assert len(result.rounds) == 2
    assert tokens["triton"] == tokens["torch"]


FAMILIES = {
    "qwen3": TINY.replace(model_type="qwen3"),  # per-head q/k RMSNorm
    "glm": TINY.replace(model_type="glm", qkv_bias=True, partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["library_linear", "streamed_linear"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_layer_ops_match_the_torch_path(family, streamed, monkeypatch):
    """The fused norms, rotary + KV store and SwiGLU give the torch path's logits, hidden states
    and cache, through prefill (equal-length prompts in rows 0 and 2: two runs of adjacent rows)
    and a verify forward; ``streamed``: the linear layers of the verify forward's 21 rows on the
    weight-streaming kernel (whatever their weights' size), GLM's q/k/v bias included: the verify
    forward then runs its residual adds, norms and SwiGLU in the projections' launches."""
    if streamed:
        monkeypatch.setattr(linear_kernel, "MIN_WEIGHT_BYTES", 0)
    model = tiny_model(FAMILIES[family], seed=6)
    prompts = random_prompts([12, 7, 12], seed=5)
    tree = DraftTree.from_spec("full:2x2", "position")
    tokens = torch.randint(0, 256, (3, tree.num_nodes), generator=torch.Generator().manual_seed(1))
    assert model.chains_norms(tokens.numel(), torch.device("cpu")) == streamed
    out = {}
    for backend in ("torch", "triton"):
        runner = ModelRunner(model, batch=3, t_max=32, backend=backend)
        last = runner.prefill(prompts)
        logits, hidden, _ = runner.tree_forward(tokens, tree, AttentionConfig(), return_hidden=True)
        out[backend] = (last, logits, hidden, runner.cache.kv.clone())
    for got, want in zip(out["triton"], out["torch"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
