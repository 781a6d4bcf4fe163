"""Prefill within a token budget and the memory a run needs (``engine.memory``), on the CPU:
chunked prefill and extend write the KV and give the last logits of one forward (fp32, ragged
lengths, batch > 1, chunk boundaries at odd places) and never run more than the budget's
tokens in one forward; the memory plan's items equal the tensors' sizes derived here from the
config, and ``max_batch`` is the largest batch that fits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from engine_helpers import TINY, random_prompts, tiny_model
from ssvkit.engine import memory
from ssvkit.engine.cache import KVCache
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.model import CausalLM
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy

MODEL = tiny_model(seed=3)
PROMPTS = random_prompts([157, 290, 93, 157, 157], seed=7)  # rows 3 and 4 share a length


class _Counting:
    """Wraps the model's forward to record the rows x tokens of each call."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, *args, **kwargs):
        self.calls.append(tuple(tokens.shape))
        return self.model(tokens, *args, **kwargs)


def _prefill(budget: int | None, prompts=PROMPTS):
    runner = ModelRunner(MODEL, batch=len(prompts), t_max=320, backend="torch")
    counter = _Counting(MODEL)
    runner.model = counter
    return runner, runner.prefill(prompts, token_budget=budget), counter.calls


@pytest.mark.parametrize("budget", [3, 37, 200, 311])
def test_chunked_prefill_equals_one_forward(budget):
    one, want, calls = _prefill(1 << 20)
    assert len(calls) == 4  # one forward per run of adjacent rows of one length
    runner, got, calls = _prefill(budget)
    assert all(rows * chunk <= budget for rows, chunk in calls)
    assert sum(rows * chunk for rows, chunk in calls) == sum(map(len, PROMPTS))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    for b, p in enumerate(PROMPTS):
        torch.testing.assert_close(
            runner.cache.kv[:, :, b, :, : len(p)], one.cache.kv[:, :, b, :, : len(p)]
        )
    assert runner.cache.lens.tolist() == [len(p) for p in PROMPTS]


def test_chunked_extend_equals_one_forward():
    tails = random_prompts([19, 0, 44, 19, 7], seed=9)
    whole = [p + t for p, t in zip(PROMPTS, tails, strict=True)]
    one, want, _ = _prefill(1 << 20, whole)
    runner, _, _ = _prefill(50)
    assert runner.extend(tails, token_budget=13) == sum(map(len, tails))
    for b, w in enumerate(whole):
        torch.testing.assert_close(
            runner.cache.kv[:, :, b, :, : len(w)], one.cache.kv[:, :, b, :, : len(w)]
        )
    assert runner.cache.lens.tolist() == [len(w) for w in whole]


def test_default_budget_follows_the_width_and_the_free_memory(monkeypatch):
    runner = ModelRunner(MODEL, batch=1, t_max=320, backend="torch")
    monkeypatch.setattr(memory, "free_memory", lambda device: 1 << 30)
    import ssvkit.engine.runner as runner_mod

    monkeypatch.setattr(runner_mod, "free_memory", lambda device: 1 << 30)
    per_token = (
        4
        * (
            3 * TINY.hidden_size
            + (TINY.num_q_heads + 2 * TINY.num_kv_heads) * TINY.head_dim
            + 2 * TINY.num_q_heads * TINY.head_dim
            + 3 * TINY.intermediate_size
        )
        + 2 * 4 * TINY.num_q_heads * 320
    )  # the CPU's SDPA keeps fp32 scores over t_max keys
    assert runner.prefill_budget() == (1 << 29) // per_token
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        runner.prefill(PROMPTS[:1], token_budget=0)


WIDE = ModelConfig(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=704,
    num_layers=3,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=32,
)
DRAFT = ModelConfig(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_layers=1,
    num_q_heads=2,
    num_kv_heads=1,
    head_dim=32,
)


def _plan(strategy, batch=3, available=1 << 34, draft=None, **kw):
    return memory.plan_memory(
        WIDE,
        strategy,
        batch=batch,
        context=500,
        t_max=600,
        available_bytes=available,
        elem_bytes=2,
        draft=draft,
        **kw,
    )


def _params(cfg: ModelConfig) -> int:
    """Weight elements of the built model: what ``num_params`` must count."""
    with torch.device("meta"):
        m = CausalLM(cfg, max_positions=8)
    return sum(p.numel() for p in m.parameters())


def test_resident_items_are_the_tensors_sizes():
    mean = Strategy(name="m", attention="sparse", metadata="mean")
    plan = _plan(mean)
    assert plan.weights_bytes == 2 * _params(WIDE)
    cache = KVCache(WIDE, 3, 600, dtype=torch.bfloat16, device="meta", use_triton=False)
    assert plan.kv_bytes == cache.kv.numel() * 2
    nb = math.ceil(600 / mean.block_size)
    meta = BlockMetadata.from_values(mean.block_size, mean=torch.empty(3, 2, nb, 32))
    assert plan.summaries_bytes == WIDE.num_layers * meta.mean.numel() * meta.mean.element_size()
    quest = _plan(Strategy(name="q", attention="sparse", metadata="quest"))
    assert quest.summaries_bytes == 2 * plan.summaries_bytes
    nsa_strategy = BASELINES["ssv"]  # NSA: compressed keys and values
    assert nsa_strategy.metadata == "nsa"
    nsa = _plan(nsa_strategy)
    windows = (600 - nsa_strategy.comp_block) // nsa_strategy.comp_stride + 1
    assert nsa.summaries_bytes == 2 * WIDE.num_layers * 3 * 2 * windows * 32 * 2
    assert _plan(BASELINES["sd_dense"]).summaries_bytes == 0


def test_transient_items_and_the_draft_share():
    sd = BASELINES["sd_dense"]
    rows = DraftTree.from_spec(sd.tree, sd.traversal).num_nodes
    plan = _plan(sd)
    per_token = 2 * (3 * 256 + (8 + 4) * 32 + 2 * 8 * 32 + 3 * 704)
    assert memory.prefill_bytes_per_token(WIDE, 2) == per_token
    assert plan.verify_bytes == 3 * rows * (1000 * (2 + 4 + 4) + per_token)
    # Plenty of memory: the whole batch's prompts in one forward, plus the last logits.
    assert plan.prefill_tokens == 3 * 500
    assert plan.prefill_bytes == 1500 * per_token + 3 * 1000 * (2 + 4)
    assert plan.need_bytes == plan.resident_bytes + max(plan.prefill_bytes, plan.verify_bytes)
    assert plan.draft_bytes == 0  # n-gram drafting: no draft model
    drafted = dataclasses.replace(sd, drafter=DrafterSpec(kind="draft_model", model="d"))
    with_draft = _plan(drafted, draft=DRAFT)
    assert with_draft.draft_bytes == 2 * _params(DRAFT) + 2 * 1 * 3 * 1 * 600 * 32 * 2
    sparse = _plan(BASELINES["sd_sparse_naive"])
    nb = math.ceil(600 / 64)
    assert sparse.verify_bytes == plan.verify_bytes + 3 * 2 * rows * nb * 4


def test_a_tight_memory_shrinks_the_prefill_budget_then_refuses():
    sd = BASELINES["sd_dense"]
    roomy = _plan(sd)
    per_token = memory.prefill_bytes_per_token(WIDE, 2)
    # Room for 1200 prefill tokens at PREFILL_SHARE past the resident tensors.
    tight = roomy.resident_bytes + int(1200 * per_token / memory.PREFILL_SHARE) + per_token
    plan = _plan(sd, available=tight)
    assert plan.prefill_tokens == 1200 and plan.fits
    # Less room than the smallest budget's activations: the plan counts that budget, refused.
    short = roomy.resident_bytes + 900 * per_token
    refused = _plan(sd, available=short)
    assert refused.prefill_tokens == memory.MIN_PREFILL_TOKENS and not refused.fits
    msg = refused.refusal()
    assert msg.startswith("batch 3 at context 500 needs ") and "GiB available" in msg
    assert f"prefill at {memory.MIN_PREFILL_TOKENS} tokens" in msg


def test_max_batch_is_the_largest_that_fits():
    sd = BASELINES["ssv"]
    available = 200 << 20
    best = memory.max_batch(WIDE, 500, sd, available, t_max=600)
    assert best > 1

    def fits(b):
        return _plan(sd, batch=b, available=available).fits

    assert fits(best) and not fits(best + 1)
    assert memory.max_batch(WIDE, 500, sd, 1 << 20, t_max=600) == 0
