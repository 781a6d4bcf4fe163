"""GPU-only engine tests (marked ``gpu``; skipped without CUDA): the verify step under CUDA graphs
equals eager execution, and bf16 greedy speculative decoding is token-identical to greedy
autoregressive decoding on a random model (and on the trained tiny pair when it is present).

The random model scales its residual branches (o_proj, down_proj) by 0.5 so that its greedy
choices are not near-ties that bf16 rounding differences between a t-row verify GEMM and a
1-row decode GEMM could flip; every token is still a function of the whole context.

In fp32 (IEEE dots in the Triton kernels, TF32 off in cuBLAS) those differences shrink to ~1e-7
relative: there greedy speculative decoding must equal greedy AR exactly, for dense and for
exact (union) sparse attention, on the random model and on the trained pair. In bf16 every
case must equal AR up to a near-tie: where the two first differ, the AR step's logits of the
two tokens lie close (``_margin`` on the random model, ``BF16_TIE`` on the trained pair).
``sparse_verify`` splits a union list and a one-row list into different parts, so their bf16
outputs differ in the last bits; the union lists are ascending like the one-row lists, so a
row's selected blocks are accumulated in the same order in both. The sparse cases hold only
while no such difference flips a near-tied block score (a changed selection moves the logits by
more than a near-tie); a guarantee would need batch-invariant GEMMs and attention reductions,
which the engine does not have.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import GPU_TINY, random_prompts, tiny_model
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import TINY_DRAFT, TINY_TARGET, build_model, resolve_source
from ssvkit.engine.corpus import corpus_sample
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels import linear as linear_kernel
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CFG = GPU_TINY
SPARSE = dict(attention="sparse", top_n=8, block_size=64, window=128, metadata="mean")
ATTN = {
    "dense": AttentionConfig(),
    "sparse_union": AttentionConfig(
        kind="sparse",
        mode="union",
        group_size=4,
        top_n=8,
        block_size=64,
        window=128,
        refresh_every=2,
    ),
    "sparse_shared": AttentionConfig(
        kind="sparse", mode="shared", group_size=4, top_n=8, block_size=64, window=128
    ),
    "nsa": AttentionConfig(kind="nsa", top_n=8, block_size=64, window=128, refresh_every=2),
    "nsa_union": AttentionConfig(
        kind="nsa", mode="union", group_size=4, top_n=8, block_size=64, window=128
    ),
    "nsa_packed": AttentionConfig(kind="nsa", mode="shared", top_n=8, block_size=64, window=128),
}


def _model(seed: int = 0, noise: float = 0.0, dtype=torch.bfloat16):
    m = tiny_model(CFG, seed=seed, max_positions=4096, noise=noise, device="cuda")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                p.mul_(0.5)
    return m.to(dtype)


MODEL = _model() if torch.cuda.is_available() else None
PROMPTS = random_prompts([1500, 1203], vocab=512)


@pytest.mark.parametrize("kind", list(ATTN))
def test_verify_step_under_cuda_graphs_equals_eager(kind):
    attn = ATTN[kind]
    runner = ModelRunner(MODEL, batch=2, t_max=2048, backend="triton", use_graphs=True)
    runner.prefill(PROMPTS)
    runner.prepare(attn)
    tree = DraftTree.from_spec("full:2x3", "position")
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # the graph is captured once and replayed with new inputs
        tokens = torch.randint(0, 512, (2, tree.num_nodes), generator=gen).cuda()
        eager = runner.tree_forward(tokens, tree, attn)[0].clone()
        graphed = runner.graphs(
            ("verify", tree, attn), lambda tok: runner.tree_forward(tok, tree, attn)[0], (tokens,)
        )
        torch.testing.assert_close(graphed, eager, atol=1e-3, rtol=1e-3)
        assert torch.equal(graphed.argmax(-1), eager.argmax(-1))
    assert len(runner.graphs) == 1


def _generate(model, strategy, prompts, *, graphs=True, n=96, draft=None, temperature=0.0):
    t_max = max(map(len, prompts)) + n + 70
    runner = ModelRunner(
        model, batch=len(prompts), t_max=t_max, backend="triton", use_graphs=graphs
    )
    drunner = None
    if draft is not None:
        drunner = ModelRunner(
            draft, batch=len(prompts), t_max=t_max, backend="triton", use_graphs=graphs
        )
    cfg = DecodeConfig(max_new_tokens=n, temperature=temperature)
    return Engine(runner, strategy, cfg, draft_runner=drunner).generate(prompts)


# Two logits of a near-tie: within 2^-5 of the larger (eight bf16 ulps), relative.
BF16_TIE = 2.0**-5


def _ar_step_logits(model, strategy, prompt, tokens, i):
    """The AR step's logits ``[V]`` for token ``i`` of ``tokens`` (decoded after ``prompt``):
    the prompt and ``tokens[:i - 1]`` prefilled, then one step of ``tokens[i - 1]`` under the
    strategy's attention."""
    attn = AttentionConfig.from_strategy(strategy)
    runner = ModelRunner(model, batch=1, t_max=len(prompt) + i + 8, backend="triton")
    runner.prefill([prompt + tokens[: i - 1]])
    runner.prepare(attn)
    tail = torch.tensor([[tokens[i - 1]]], device="cuda")
    tree = DraftTree.from_spec("chain:0", "position")
    return runner.tree_forward(tail, tree, attn)[0][0, -1].float()


def _first_difference(a, b):
    for s, (x, y) in enumerate(zip(a, b, strict=True)):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            if u != v:
                return f"sequence {s} differs first at token {i}: {u} vs {v}"
    return None


DRAFT = _model(seed=0, noise=0.3) if torch.cuda.is_available() else None


CASES = {
    "dense_ngram_tree": (
        Strategy(name="sd", tree="full:3x2", drafter=DrafterSpec(kind="ngram")),
        Strategy(name="ar"),
    ),
    "dense_draft_model": (
        Strategy(name="sd", tree="best:16:6", drafter=DrafterSpec(kind="draft_model", model="d")),
        Strategy(name="ar"),
    ),
    "union_sparse": (
        Strategy(
            name="ssv",
            tree="full:2x3",
            mode="union",
            group_size=4,
            refresh_every=2,
            drafter=DrafterSpec(kind="draft_model", model="d"),
            **SPARSE,
        ),
        Strategy(name="ar", refresh_every=2, **SPARSE),
    ),
    "self_sparse": (
        Strategy(
            name="self",
            tree="chain:4",
            drafter=DrafterSpec(kind="self_sparse", sparsity_ratio=0.2),
            block_size=64,
            window=128,
        ),
        Strategy(name="ar"),
    ),
}


def _margin(model, prompt, prefix, u, v) -> float:
    """|logit(u) - logit(v)| after ``prompt + prefix`` from a bf16 dense prefill: the near-tie
    test (sparse strategies see nearly every block of these 1.2-1.5K-token prompts)."""
    runner = ModelRunner(model, batch=1, t_max=len(prompt) + len(prefix) + 64, backend="triton")
    logits = runner.prefill([list(prompt) + list(prefix)])[0].float()
    return float((logits[u] - logits[v]).abs())


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_greedy_speculative_equals_autoregressive(case):
    """On a random model the logits are nearly flat, so bf16 can order two tokens differently
    in a t-row verify pass and a 1-row AR step. Exact equality holds up to the first
    divergence, and that divergence must be a near-tie of the AR logits (the trained-pair test
    below asks for exact equality)."""
    spec, ar = CASES[case]
    got = _generate(MODEL, spec, PROMPTS, draft=DRAFT)
    want = _generate(MODEL, ar, PROMPTS, graphs=False)
    assert got.mean_accepted() > 0
    for s, (x, y) in enumerate(zip(got.tokens, want.tokens, strict=True)):
        i = next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
        if i is None:
            continue
        margin = _margin(MODEL, PROMPTS[s], y[:i], x[i], y[i])
        assert margin < 0.05, f"sequence {s} differs at token {i} with AR margin {margin:.3f}"


def test_graphs_do_not_change_the_tokens():
    spec = CASES["union_sparse"][0]
    with_graphs = _generate(MODEL, spec, PROMPTS, draft=DRAFT, n=48)
    without = _generate(MODEL, spec, PROMPTS, draft=DRAFT, n=48, graphs=False)
    assert with_graphs.tokens == without.tokens


def test_runners_serve_a_second_engine_under_graphs():
    """Two Engines, one after the other, on the same runners: the second replays the draft
    level graphs the first captured (regression: they read the first drafter's freed plan
    tensors, a device-side index assert at 16K in the planner evaluation)."""
    spec = CASES["dense_draft_model"][0]
    t_max = max(map(len, PROMPTS)) + 48 + 70
    runners = [
        ModelRunner(m, batch=len(PROMPTS), t_max=t_max, backend="triton", use_graphs=True)
        for m in (MODEL, DRAFT)
    ]
    cfg = DecodeConfig(max_new_tokens=48)
    first = Engine(runners[0], spec, cfg, draft_runner=runners[1]).generate(PROMPTS)
    torch.cuda.empty_cache()
    junk = [torch.randint(-(2**30), 2**30, (1 << 20,), device="cuda") for _ in range(8)]
    second = Engine(runners[0], spec, cfg, draft_runner=runners[1]).generate(PROMPTS)
    del junk
    assert second.tokens == first.tokens


def test_sampling_under_graphs_runs():
    spec = CASES["dense_draft_model"][0]
    res = _generate(MODEL, spec, PROMPTS, draft=DRAFT, n=48, temperature=1.0)
    assert all(len(t) == 48 and max(t) < 512 for t in res.tokens)
    assert res.timer == "cuda-events"
    assert all(r.step_s["verify"] > 0 for r in res.rounds)


def test_sampling_is_paired_by_seed_whether_or_not_the_run_captures():
    """At temperature 1, a decode that captures its graphs (the first on fresh runners) and the
    same decode replaying them draw the same numbers: the same seed, the same text (the
    capture's warm-up runs and the capture itself advance the generator; ``GraphRunner`` puts
    its state back). A run with another seed decodes another text."""
    spec = CASES["dense_draft_model"][0]
    t_max = max(map(len, PROMPTS)) + 48 + 70
    runners = [
        ModelRunner(m, batch=len(PROMPTS), t_max=t_max, backend="triton", use_graphs=True)
        for m in (MODEL, DRAFT)
    ]

    def run(seed):
        cfg = DecodeConfig(max_new_tokens=48, temperature=1.0, seed=seed)
        return Engine(runners[0], spec, cfg, draft_runner=runners[1]).generate(PROMPTS).tokens

    capturing = run(0)
    assert len(runners[0].graphs) and len(runners[1].graphs)
    assert run(0) == capturing
    assert run(1) != capturing


def test_position_uniforms_outlive_the_engine_that_captured():
    """Sampling with deterministic drafts reads each position's uniform from a buffer that the
    acceptance graph captured by address: it lives with the target runner, so a later Engine's
    replay reads its own seed's uniforms (regression: an Engine-owned buffer left replays
    reading the first Engine's freed one -- degenerate text and a device-side assert in the
    planner evaluation). Replays equal an eager decode of the same seed."""
    spec = Strategy(name="ng", tree="chain:4", drafter=DrafterSpec(kind="ngram"))
    t_max = max(map(len, PROMPTS)) + 48 + 70

    def runner(graphs):
        return ModelRunner(
            MODEL, batch=len(PROMPTS), t_max=t_max, backend="triton", use_graphs=graphs
        )

    shared = runner(True)

    def run(seed, target=shared):
        cfg = DecodeConfig(max_new_tokens=48, temperature=1.0, seed=seed)
        return Engine(target, spec, cfg).generate(PROMPTS).tokens

    first = run(0)
    assert len(shared.graphs)
    torch.cuda.empty_cache()
    junk = [torch.rand(1 << 20, device="cuda") for _ in range(8)]
    again, other = run(0), run(1)
    del junk
    assert again == first
    assert other != first
    assert other == run(1, runner(False))


def test_append_captures_at_start_and_equals_extend():
    """A draft model's start captures every ``append`` chunk graph (a later catch-up replays
    only); under graphs ``append`` writes what ``extend`` writes (bf16 rounding apart)."""
    from ssvkit.engine.draft_model import ModelDrafter
    from ssvkit.engine.runner import APPEND_CHUNKS

    t_max = max(map(len, PROMPTS)) + 200
    runner = ModelRunner(DRAFT, batch=len(PROMPTS), t_max=t_max, backend="triton", use_graphs=True)
    ModelDrafter(runner, 1.0).start(PROMPTS)
    assert all(("append", s) in runner.graphs for s in APPEND_CHUNKS)
    n = len(runner.graphs)
    lens = runner.cache.lens.clone()
    tails = random_prompts([77, 5], vocab=512, seed=3)
    runner.append(tails)
    assert len(runner.graphs) == n
    got = runner.cache.kv.float().clone()
    runner.cache.set_lens(lens)
    runner.extend(tails)
    want = [len(p) + len(t) for p, t in zip(PROMPTS, tails, strict=True)]
    assert runner.cache.lens.tolist() == want
    for b, (p, t) in enumerate(zip(PROMPTS, tails, strict=True)):
        a, e = got[:, :, b, :, : len(p) + len(t)], runner.cache.kv[:, :, b, :, : len(p) + len(t)]
        assert torch.isfinite(a).all()
        assert (a - e.float()).abs().max() <= 2e-2 * e.float().abs().max()


@pytest.mark.parametrize("streamed", [False, True], ids=["library_linear", "streamed_linear"])
@pytest.mark.parametrize("case", ["dense_draft_model", "union_sparse"])
def test_fp32_greedy_speculative_equals_autoregressive_exactly(case, streamed, monkeypatch):
    """In fp32 (IEEE dots in the kernels, no TF32 in cuBLAS) the t-row and 1-row paths differ
    by ~1e-7 relative, far below the gaps between block scores or logits: greedy speculative
    decoding must match greedy AR token for token, sparse union selection included;
    ``streamed``: every linear layer of few rows on ``kernels.linear``'s weight-streaming
    kernel, whatever its weight's size."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    if streamed:
        monkeypatch.setattr(linear_kernel, "MIN_WEIGHT_BYTES", 0)
    spec, ar = CASES[case]
    model = _model(dtype=torch.float32)
    draft = _model(seed=0, noise=0.3, dtype=torch.float32)
    got = _generate(model, spec, PROMPTS, draft=draft)
    want = _generate(model, ar, PROMPTS, graphs=False)
    assert got.mean_accepted() > 0
    assert got.tokens == want.tokens, _first_difference(got.tokens, want.tokens)


@pytest.mark.parametrize("fused", [True, False])
def test_bf16_nsa_row_schedules_give_the_packed_verify_logits(fused):
    """The row schedule packs draft rows into tiles; it does not change what a row attends to
    (the NSA kernels take bf16/fp16 only, so no fp32 decode here: the CPU interpreter's decode
    test checks the tokens). One row a tile (``per_query``) and tiles of 4 (``union``) give the
    packed tiles' verify logits within bf16 rounding and the same argmax wherever the packed
    top two are apart, through a refresh and a reuse layer."""
    kw = dict(kind="nsa", top_n=8, block_size=64, window=128, refresh_every=2, fused=fused)
    runner = ModelRunner(MODEL, batch=2, t_max=2048, backend="triton")
    runner.prefill(PROMPTS)
    tree = DraftTree.from_spec("full:2x3", "position")
    tokens = torch.randint(0, 512, (2, tree.num_nodes), generator=torch.Generator().manual_seed(3))
    logits = {}
    for mode, c in (("shared", 1), ("per_query", 1), ("union", 4)):
        attn = AttentionConfig(mode=mode, group_size=c, **kw)
        runner.prepare(attn)
        logits[mode] = runner.tree_forward(tokens.cuda(), tree, attn)[0].float()
    want = logits["shared"]
    top2 = want.topk(2, dim=-1).values
    apart = (top2[..., 0] - top2[..., 1]) > 0.05
    assert int(apart.sum()) >= 5  # of 2 x 15 rows: the argmax check below is not empty
    for mode in ("per_query", "union"):
        got = logits[mode]
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)
        assert torch.equal(got.argmax(-1)[apart], want.argmax(-1)[apart]), mode


@pytest.mark.skipif(not (TINY_TARGET / "config.json").is_file(), reason="no trained tiny pair")
@pytest.mark.parametrize(
    "case, dtype",
    [
        ("dense", torch.bfloat16),
        ("union", torch.bfloat16),
        ("dense", torch.float32),
        ("union", torch.float32),
    ],
)
def test_trained_pair_greedy_speculative_equals_autoregressive(case, dtype, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    target = build_model(resolve_source("tiny"), max_positions=8192, device="cuda", dtype=dtype)
    draft = build_model(
        resolve_source(str(TINY_DRAFT)), max_positions=8192, device="cuda", dtype=dtype
    )
    prompts = [corpus_sample(4096)]
    sparse = dict(SPARSE, top_n=16) if case == "union" else {}
    spec = Strategy(
        name="sd",
        tree="best:16:6",
        mode="union",
        group_size=4,
        drafter=DrafterSpec(kind="draft_model", model="d"),
        **sparse,
    )
    ar = Strategy(name="ar", **sparse)
    got = _generate(target, spec, prompts, draft=draft, n=256)
    want = _generate(target, ar, prompts, graphs=False, n=256)
    assert got.mean_accepted() > 1.0
    if case == "dense" or dtype == torch.float32 or got.tokens == want.tokens:
        assert got.tokens == want.tokens, _first_difference(got.tokens, want.tokens)
        return
    # bf16 union: a near-tie at the first difference (module docstring)
    pairs = zip(got.tokens[0], want.tokens[0], strict=True)
    i = next(k for k, (u, v) in enumerate(pairs) if u != v)
    assert i > 0, "differs at the first token"
    logits = _ar_step_logits(target, ar, prompts[0], want.tokens[0], i)
    u, v = logits[got.tokens[0][i]], logits[want.tokens[0][i]]
    top2 = logits.topk(2).values
    assert min(u, v) >= top2[1] and abs(u - v) <= BF16_TIE * max(abs(u), abs(v)), (
        _first_difference(got.tokens, want.tokens),
        float(u),
        float(v),
    )


BATCHED = {
    "draft_model_tree": CASES["dense_draft_model"][0],
    "ngram_chain": Strategy(name="sd", tree="chain:4", drafter=DrafterSpec(kind="ngram")),
    "union_sparse": CASES["union_sparse"][0],
    "shared_sparse": Strategy(
        name="ssv",
        tree="full:2x2",
        mode="shared",
        group_size=2,
        drafter=DrafterSpec(kind="draft_model", model="d"),
        **SPARSE,
    ),
    "self_sparse": CASES["self_sparse"][0],
}
NSA_NGRAM = Strategy(
    name="ssv",
    tree="chain:4",
    drafter=DrafterSpec(kind="ngram"),
    attention="sparse",
    metadata="nsa",
    top_n=8,
    block_size=64,
    window=128,
    refresh_every=2,
)
RAGGED = random_prompts([1500, 700, 1203], vocab=512, seed=5)


def _batched(model, draft, spec, prompts, n=64):
    """Greedy decode of ``prompts`` as one batch under CUDA graphs, with caches of ``ssvkit
    decode``'s size (longest prompt + new tokens + the verify tail + 1)."""
    tree = DraftTree.from_spec(spec.tree, spec.traversal)
    t_max = max(map(len, prompts)) + n + tree.num_nodes + 1
    runners = [
        ModelRunner(m, batch=len(prompts), t_max=t_max, backend="triton", use_graphs=True)
        for m in (model, draft)
    ]
    cfg = DecodeConfig(max_new_tokens=n)
    return Engine(runners[0], spec, cfg, draft_runner=runners[1]).generate(prompts)


@pytest.mark.parametrize("case", list(BATCHED))
def test_fp32_batched_decode_under_graphs_equals_each_sequence_alone(case, monkeypatch):
    """Three sequences of ragged prompts in one batch: each stops at its own round (the others
    go on) and emits exactly what it emits decoded alone (regression: a sequence that ran ahead
    wrote past its cache, a device-side assert in ``KVCache.write``)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = _model(dtype=torch.float32)
    draft = _model(seed=0, noise=0.3, dtype=torch.float32)
    got = _batched(model, draft, BATCHED[case], RAGGED)
    alone = [_batched(model, draft, BATCHED[case], [p]).tokens[0] for p in RAGGED]
    assert got.tokens == alone, _first_difference(got.tokens, alone)


@pytest.mark.parametrize("spec", [NSA_NGRAM, *BATCHED.values()], ids=["nsa", *BATCHED])
def test_bf16_batched_decode_under_graphs_finishes_every_sequence(spec):
    """bf16 (the NSA kernels' dtypes): the batch decodes to the end, every sequence emits its
    tokens."""
    got = _batched(MODEL, DRAFT, spec, RAGGED)
    assert [len(t) for t in got.tokens] == [64] * 3
    assert all(0 <= x < 512 for t in got.tokens for x in t)
    emitted = [0, 0, 0]
    for r in got.rounds:
        for b, e in zip(r.sequences, r.emitted, strict=True):
            emitted[b] += e
    assert emitted == [63] * 3


def test_chunked_prefill_equals_one_forward_on_cuda():
    """Prefill in chunks of a small token budget (causal attention aligned to the last key,
    run by flash attention without a mask) writes the KV and gives the last logits of one
    forward per prompt, ragged lengths and rows that share a length included (bf16
    rounding apart)."""
    prompts = random_prompts([1500, 1203, 1500], vocab=512, seed=4)
    whole = ModelRunner(MODEL, batch=3, t_max=1600, backend="triton")
    chunked = ModelRunner(MODEL, batch=3, t_max=1600, backend="triton")
    want = whole.prefill(prompts, token_budget=1 << 20)
    got = chunked.prefill(prompts, token_budget=1000)
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
    for b, p in enumerate(prompts):
        a = chunked.cache.kv[:, :, b, :, : len(p)].float()
        e = whole.cache.kv[:, :, b, :, : len(p)].float()
        assert (a - e).abs().max() <= 2e-2 * e.abs().max()
