"""Batched speculative decoding on the CPU: sequences of one batch with ragged prompts accept
different numbers of drafts per round, finish at different rounds, and each emits exactly the
greedy tokens it emits decoded alone, for every drafter and attention kind. The caches are
sized as ``ssvkit decode`` sizes them (longest prompt + new tokens + the verify tail + 1), so a
sequence that ran ahead would write past its cache."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from engine_helpers import random_prompts, tiny_model
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

TARGET = tiny_model(seed=3)
DRAFT = tiny_model(seed=3, noise=0.3)
PROMPTS = random_prompts([157, 290, 93], seed=7)
NEW = 24
DM = DrafterSpec(kind="draft_model", model="draft")
SPARSE = dict(attention="sparse", top_n=2, block_size=16, window=32, metadata="mean")
NSA = dict(
    attention="sparse",
    metadata="nsa",
    top_n=2,
    block_size=16,
    window=32,
    comp_block=16,
    comp_stride=8,
)

CASES = {
    "ar_dense": Strategy(name="ar_dense"),
    "ar_sparse": Strategy(name="ar_sparse", **SPARSE),
    "draft_model_dense": Strategy(name="sd", tree="best:8:4", drafter=DM),
    "ngram_dense": Strategy(name="sd", tree="full:2x3", drafter=DrafterSpec(kind="ngram")),
    "self_sparse": Strategy(
        name="sd",
        tree="chain:3",
        block_size=16,
        window=32,
        drafter=DrafterSpec(kind="self_sparse", sparsity_ratio=0.3),
    ),
    "per_query": Strategy(name="ssv", tree="full:2x2", drafter=DM, mode="per_query", **SPARSE),
    "union": Strategy(
        name="ssv",
        tree="full:2x2",
        drafter=DM,
        mode="union",
        group_size=3,
        refresh_every=2,
        **SPARSE,
    ),
    "shared": Strategy(
        name="ssv", tree="chain:4", drafter=DM, mode="shared", group_size=2, **SPARSE
    ),
    "nsa_ngram": Strategy(
        name="ssv", tree="chain:4", drafter=DrafterSpec(kind="ngram"), refresh_every=2, **NSA
    ),
}


def decode(strategy: Strategy, prompts: list[list[int]], *, backend: str = "torch", n: int = NEW):
    """Greedy decode of ``prompts`` as one batch, with caches of ``ssvkit decode``'s size."""
    tree = DraftTree.from_spec(strategy.tree, strategy.traversal)
    t_max = max(map(len, prompts)) + n + tree.num_nodes + 1
    b = len(prompts)
    target = ModelRunner(TARGET, batch=b, t_max=t_max, backend=backend)
    draft = ModelRunner(DRAFT, batch=b, t_max=t_max, backend=backend)
    eng = Engine(target, strategy, DecodeConfig(max_new_tokens=n), draft_runner=draft)
    return eng.generate(prompts)


@functools.cache
def alone(case: str) -> list[list[int]]:
    """``CASES[case]``'s greedy tokens of each prompt decoded alone, computed when a test first
    reads them (not at import, which every test worker would pay)."""
    return [decode(CASES[case], [p]).tokens[0] for p in PROMPTS]


@functools.cache
def batched(case: str):
    """``CASES[case]``'s decode of ``PROMPTS`` as one batch (deterministic: greedy), run once
    for the tests that read it."""
    return decode(CASES[case], PROMPTS)


@pytest.mark.parametrize("case", list(CASES))
def test_batched_greedy_output_equals_each_sequence_decoded_alone(case):
    res = batched(case)
    assert res.tokens == alone(case)
    assert all(len(t) == NEW for t in res.tokens)
    # Every round's emitted tokens add up to what each sequence generated (the first root is
    # the prefill's).
    for b in range(len(PROMPTS)):
        emitted = sum(
            e for r in res.rounds for s, e in zip(r.sequences, r.emitted, strict=True) if s == b
        )
        assert emitted == NEW - 1


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c].tree != "chain:0"])
def test_sequences_accept_and_finish_raggedly(case):
    """The batch really is ragged: some round accepts different counts across sequences, and
    some sequence finishes while another still generates (the state a fixed batch must
    survive: the finished one rides along and keeps nothing)."""
    res = batched(case)
    assert any(len(set(r.accepted)) > 1 for r in res.rounds)
    assert any(len(r.sequences) < len(PROMPTS) for r in res.rounds)
    assert [len(r.sequences) for r in res.rounds] == sorted(
        (len(r.sequences) for r in res.rounds), reverse=True
    )
    for r in res.rounds:
        assert all(0 < e <= a + 1 for a, e in zip(r.accepted, r.emitted, strict=True))


def test_triton_interpreter_batched_equals_alone():
    """On the Triton kernels (CPU interpreter), a ragged batch -- its first round accepts
    different counts, then one sequence decodes on alone -- emits what each sequence emits
    decoded alone."""
    s = dataclasses.replace(CASES["union"], tree="chain:2", group_size=2)
    short = random_prompts([40, 21], seed=7)
    alone = [decode(s, [p], backend="triton", n=4).tokens[0] for p in short]
    res = decode(s, short, backend="triton", n=4)
    assert res.tokens == alone
    assert len(set(res.rounds[0].accepted)) > 1
    assert any(len(r.sequences) < len(short) for r in res.rounds)


def test_a_cache_too_small_for_the_tail_is_refused_before_decoding():
    s = CASES["draft_model_dense"]
    b, n = len(PROMPTS), 8
    short = max(map(len, PROMPTS)) + n + 2  # room for a chain of 3, not for 8 nodes
    target = ModelRunner(TARGET, batch=b, t_max=short, backend="torch")
    draft = ModelRunner(DRAFT, batch=b, t_max=short, backend="torch")
    eng = Engine(target, s, DecodeConfig(max_new_tokens=n), draft_runner=draft)
    with pytest.raises(ValueError, match=r"need \d+ cache positions; the cache holds"):
        eng.generate(PROMPTS)
    assert int(target.cache.lens.max()) == 0  # nothing was prefilled


def test_a_switch_to_a_tree_the_cache_cannot_hold_is_refused():
    class Grow:
        def after_round(self, stats):
            return dataclasses.replace(CASES["draft_model_dense"], tree="best:40:6")

    s = CASES["draft_model_dense"]
    t_max = max(map(len, PROMPTS)) + 8 + 9 + 1
    target = ModelRunner(TARGET, batch=3, t_max=t_max, backend="torch")
    draft = ModelRunner(DRAFT, batch=3, t_max=t_max, backend="torch")
    cfg = DecodeConfig(max_new_tokens=8)
    eng = Engine(target, s, cfg, controller=Grow(), draft_runner=draft)
    with pytest.raises(ValueError, match="verify tail of 41"):
        eng.generate(PROMPTS)


def test_cli_decodes_a_batch_with_an_ngram_chain(capsys):
    from ssvkit.cli import main
    from ssvkit.cli.decode_report import report_text

    args = [
        "decode",
        "--model",
        "tiny",
        "--context",
        "1K",
        "--batch",
        "3",
        "--strategy",
        "sd_dense",
        "--drafter-kind",
        "ngram",
        "--tree",
        "chain:4",
        "--device",
        "cpu",
        "--backend",
        "torch",
        "--max-new-tokens",
        "16",
        "--json",
    ]
    assert main(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tokens_per_s"]["value"] > 0
    # The full-batch rounds (every sequence decoding, none finishing) leave out the tail whose
    # rounds carry finished sequences; the text shows their tokens/s beside the prediction.
    full = rep["full_batch"]
    assert 0 < full["rounds"] < rep["rounds"] and full["tokens_per_s"]["value"] > 0
    line = next(x for x in report_text(rep).splitlines() if "full-batch rounds" in x)
    assert f"({full['rounds']} of {rep['rounds']} rounds" in line
    # The prediction is at the full-batch rounds' acceptance, not the whole run's.
    assert rep["fitted_alpha"]["provenance"].endswith("of the full-batch rounds")
    predicted = rep["prediction"]["tokens_per_round"] - 1
    assert predicted == pytest.approx(full["mean_accepted"]["value"], abs=1e-3)
