"""Prefill reuse (``ModelRunner.prefill``): a runner that prefills the prompts its cache already
holds intact reuses that prefill, and a run of ``generate`` calls with other strategies on one
runner -- dense, per-query sparse, union, NSA, the oracle drafter and its reference pass --
decodes exactly what a fresh runner per call decodes, with the same KV, the same cache summaries
and the same oracle probes; anything that may have written below the prompts (another prefill,
a length set lower and an extend from there, changed weights, another explicit budget) forces a
real prefill."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import random_prompts, tiny_model
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.kernels.tree import MAX_TREE_NODES
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

TARGET = tiny_model(seed=3)
PROMPTS = random_prompts([157, 290, 93], seed=7)
NEW = 12
T_MAX = max(map(len, PROMPTS)) + NEW + MAX_TREE_NODES + 1
NGRAM = DrafterSpec(kind="ngram")
SPARSE = dict(attention="sparse", top_n=2, block_size=16, window=32, metadata="mean")
NSA = dict(SPARSE, metadata="nsa", comp_block=16, comp_stride=8)

# (strategy, oracle acceptance): the campaign's order within a group, with two oracle runs of
# one attention whose trees differ in depth (the deeper first, so the second takes its
# reference from the first's).
RUNS = [
    (Strategy(name="ar_dense"), None),
    (Strategy(name="ar_sparse", **SPARSE), None),
    (Strategy(name="sd_dense", tree="chain:5", drafter=NGRAM), (0.8,)),
    (Strategy(name="sd_dense", tree="full:2x3", drafter=NGRAM), (0.6,)),
    (Strategy(name="per_query", tree="full:2x2", drafter=NGRAM, **SPARSE), (0.7,)),
    (
        Strategy(
            name="union", tree="full:2x2", drafter=NGRAM, mode="union", group_size=3, **SPARSE
        ),
        (0.7,),
    ),
    (Strategy(name="nsa", tree="chain:4", drafter=NGRAM, refresh_every=2, **NSA), (0.7,)),
    (Strategy(name="ar_nsa", **NSA), None),
]


def _runner(model=TARGET) -> ModelRunner:
    return ModelRunner(model, batch=len(PROMPTS), t_max=T_MAX, backend="torch")


def _generate(runner: ModelRunner, strategy: Strategy, oracle):
    cfg = DecodeConfig(
        max_new_tokens=NEW, record_stats=strategy.is_sparse, oracle_acceptance=oracle
    )
    return Engine(runner, strategy, cfg).generate(PROMPTS)


def _state(runner: ModelRunner) -> dict:
    """The committed KV of every sequence, the lengths and every cache summary."""
    cache = runner.cache
    lens = cache.lens.tolist()
    out = {"lens": lens, **{f"kv{b}": cache.kv[:, :, b, :, :n] for b, n in enumerate(lens)}}
    for layer, meta in enumerate(cache.meta or ()):
        for name in ("mean", "kmin", "kmax"):
            if getattr(meta, name) is not None:
                out[f"meta{layer}.{name}"] = getattr(meta, name)
    for name in ("comp_k", "comp_v", "comp_lens"):
        if getattr(cache, name) is not None:
            out[name] = getattr(cache, name)
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def _same(a: dict, b: dict) -> list[str]:
    """The keys whose values differ (bitwise for tensors)."""
    assert a.keys() == b.keys()
    return [
        k for k, v in a.items() if not (torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k])
    ]


def _decodes(monkeypatch) -> list[str]:
    """The strategy of every ``Engine.generate`` call from now on, in order (an oracle run's
    reference pass is one)."""
    calls: list[str] = []
    own = Engine.generate

    def generate(self, prompts):
        calls.append(self.strategy.name)
        return own(self, prompts)

    monkeypatch.setattr(Engine, "generate", generate)
    return calls


def test_generate_calls_on_one_runner_decode_what_fresh_runners_decode(monkeypatch):
    fresh = []
    for strategy, oracle in RUNS:
        runner = _runner()
        res = _generate(runner, strategy, oracle)
        fresh.append((res, _state(runner), runner.prefills))
    calls = _decodes(monkeypatch)
    shared = _runner()
    for i, (strategy, oracle) in enumerate(RUNS):
        res = _generate(shared, strategy, oracle)
        want, state, prefills = fresh[i]
        assert prefills == 1  # a fresh oracle run prefilled once: its decode reused its reference's
        assert res.tokens == want.tokens, strategy.name
        assert [r.accepted for r in res.rounds] == [r.accepted for r in want.rounds]
        assert [r.oracle_probes for r in res.rounds] == [r.oracle_probes for r in want.rounds]
        assert _same(_state(shared), state) == [], strategy.name
        assert res.prefill_reused == (i > 0 or oracle is not None)
        assert res.prefill_forward_s is not None and res.prefill_forward_s > 0
    assert shared.prefills == 1
    # The second sd_dense run takes its reference from the first's (same attention and settings,
    # a shallower tree): it decodes once, the other oracle runs twice.
    names = [s.name for s, _ in RUNS]
    assert calls.count("sd_dense") == 3
    assert calls.count("per_query") == calls.count("union") == calls.count("nsa") == 2
    assert calls.count("ar_dense") == names.count("ar_dense")


def test_a_reused_prefill_returns_the_logits_and_summaries_of_a_real_one():
    union = dataclasses.replace(RUNS[5][0], tree="chain:0")
    runner = _runner()
    _generate(runner, union, None)  # decodes past the prompts, with block metadata
    first = runner.prefill(PROMPTS)
    assert runner.prefill_reused
    again = _runner()
    again.prepare(Engine(again, union, DecodeConfig()).attn)
    real = again.prefill(PROMPTS)
    assert not again.prefill_reused
    assert torch.equal(first, real)
    assert _same(_state(runner), _state(again)) == []


def _invalidate_by_lower_lens_and_extend(runner):
    lower = torch.tensor([len(p) - 20 for p in PROMPTS], dtype=torch.int32)
    runner.cache.set_lens(lower)
    runner.extend([[1] * 10 for _ in PROMPTS])  # writes below the prompts' lengths


def _invalidate_by_weights(runner):
    with torch.no_grad():
        next(runner.model.parameters()).mul_(1.0)  # same values, a new version


@pytest.mark.parametrize(
    "invalidate",
    [
        lambda r: r.prefill(random_prompts([157, 290, 93], seed=8)),
        lambda r: r.prefill(PROMPTS[:2] + [PROMPTS[2][:-1]]),
        _invalidate_by_lower_lens_and_extend,
        _invalidate_by_weights,
    ],
    ids=["other_prompts", "other_lengths", "lower_lens_then_extend", "weights_updated"],
)
def test_whatever_may_have_written_below_the_prompts_forces_a_real_prefill(invalidate):
    model = tiny_model(seed=3)
    runner = _runner(model)
    runner.prefill(PROMPTS)
    invalidate(runner)
    before = runner.prefills
    logits = runner.prefill(PROMPTS)
    assert not runner.prefill_reused and runner.prefills == before + 1
    fresh = _runner(model)
    assert torch.equal(logits, fresh.prefill(PROMPTS))
    assert _same(_state(runner), _state(fresh)) == []


def test_commits_and_lengths_at_or_past_the_prompts_keep_the_prefill():
    runner = _runner()
    runner.prefill(PROMPTS)
    runner.extend([[5] * 7 for _ in PROMPTS])  # past the prompts: the decode's kind of write
    runner.cache.set_lens(torch.tensor([len(p) + 3 for p in PROMPTS], dtype=torch.int32))
    runner.prefill(PROMPTS)
    assert runner.prefill_reused and runner.prefills == 1


def test_an_explicit_budget_or_reuse_false_runs_it_again():
    runner = _runner()
    runner.prefill(PROMPTS, token_budget=64)
    runner.prefill(PROMPTS, token_budget=64)
    assert runner.prefill_reused
    runner.prefill(PROMPTS, token_budget=128)
    assert not runner.prefill_reused and runner.prefills == 2
    runner.prefill(PROMPTS, token_budget=128, reuse=False)
    assert not runner.prefill_reused and runner.prefills == 3
    assert runner.prefill_memo(PROMPTS) == {}
    assert runner.prefill_memo(PROMPTS[::-1]) is None


def test_triton_interpreter_reuse_decodes_what_a_fresh_runner_decodes():
    """The Triton path's summaries (the kernels' block metadata and compressed tokens) after a
    reused prefill, on the CPU interpreter: a dense run, then an NSA run with union row tiles
    reusing its prefill. Its one decode round commits the 24th token of the shorter sequence,
    which completes a compression window: the decode extends the summaries the reuse built."""
    prompts = random_prompts([40, 23], seed=7)
    new = 2  # the prefill's token and one round's
    t_max = 40 + new + MAX_TREE_NODES + 1
    runs = [RUNS[0][0], dataclasses.replace(RUNS[7][0], mode="union", group_size=2)]

    def generate(runner, strategy):
        return Engine(runner, strategy, DecodeConfig(max_new_tokens=new)).generate(prompts)

    shared = ModelRunner(TARGET, batch=2, t_max=t_max, backend="triton")
    for strategy in runs:
        fresh = ModelRunner(TARGET, batch=2, t_max=t_max, backend="triton")
        assert generate(shared, strategy).tokens == generate(fresh, strategy).tokens
        assert _same(_state(shared), _state(fresh)) == []
    assert shared.prefills == 1
    # (24 - comp_block 16) // comp_stride 8 + 1 = 2 windows, one more than the prompt's 23 hold.
    assert shared.cache.lens.tolist() == [41, 24] and shared.cache.comp_lens.tolist() == [4, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_reuse_under_graphs_decodes_what_fresh_runners_decode():
    """On the GPU (bf16, Triton kernels, CUDA graphs): dense, union and NSA runs with the oracle
    on one runner, the first prefilling, emit and accept what fresh runners do."""
    from engine_helpers import GPU_TINY

    model = tiny_model(GPU_TINY, device="cuda", max_positions=2048, dtype=torch.bfloat16)
    prompts = random_prompts([1100, 900], vocab=512, seed=5)
    sparse = dict(SPARSE, top_n=4, block_size=64, window=128)
    runs = [
        (Strategy(name="ar_dense"), None),
        (Strategy(name="union", tree="full:2x2", mode="union", group_size=4, **sparse), (0.8,)),
        (Strategy(name="nsa", tree="chain:4", **dict(sparse, metadata="nsa")), (0.7,)),
    ]
    t_max = 1100 + 24 + MAX_TREE_NODES + 1

    def generate(runner, strategy, oracle):
        strategy = dataclasses.replace(strategy, drafter=NGRAM)
        cfg = DecodeConfig(max_new_tokens=24, oracle_acceptance=oracle)
        return Engine(runner, strategy, cfg).generate(prompts)

    def runner():
        return ModelRunner(model, batch=2, t_max=t_max, backend="triton", use_graphs=True)

    shared = runner()
    for strategy, oracle in runs:
        want = generate(runner(), strategy, oracle)
        got = generate(shared, strategy, oracle)
        assert got.tokens == want.tokens, strategy.name
        assert [r.accepted for r in got.rounds] == [r.accepted for r in want.rounds]
    assert shared.prefills == 1
