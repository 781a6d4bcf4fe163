"""Pipelined rounds (``engine.pipeline``): where nothing on the host decides the next round, the
loop issues round r + 1 before it reads round r, and the decode is the serial loop's decode --
the same tokens, rounds, acceptance and final cache -- with every read after the next issue."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import random_prompts, tiny_model
from ssvkit.engine import pipeline
from ssvkit.engine.controller import KeepStrategy
from ssvkit.engine.draft_model import ModelDrafter, SelfSparseDrafter
from ssvkit.engine.loop import Engine
from ssvkit.engine.ngram import NgramDrafter
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.timing import StepTimer
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel import loop_host
from ssvkit.perfmodel.columns import DRAFTER_CODES
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

TARGET = tiny_model(seed=5)
DRAFT = tiny_model(seed=5, noise=0.3)
PROMPTS = random_prompts([131, 77, 202], seed=11)
SPARSE = dict(attention="sparse", top_n=2, block_size=16, window=32, metadata="mean")
SELF_SPARSE = Strategy(
    name="sd",
    tree="chain:3",
    block_size=16,
    window=32,
    drafter=DrafterSpec(kind="self_sparse", sparsity_ratio=0.3),
)
PIPELINED = {
    "ar_dense": Strategy(name="ar_dense"),
    "ar_sparse": Strategy(name="ar_sparse", **SPARSE),
    "self_sparse": SELF_SPARSE,
}


def engine(strategy, *, new=12, backend="torch", controller=None, **settings) -> Engine:
    tree = DraftTree.from_spec(strategy.tree, strategy.traversal)
    t_max = max(map(len, PROMPTS)) + new + tree.num_nodes + 1
    target = ModelRunner(TARGET, batch=len(PROMPTS), t_max=t_max, backend=backend)
    draft = ModelRunner(DRAFT, batch=len(PROMPTS), t_max=t_max, backend=backend)
    cfg = DecodeConfig(max_new_tokens=new, **settings)
    return Engine(target, strategy, cfg, draft_runner=draft, controller=controller)


def rounds_of(res) -> list[tuple]:
    """Each round's decode (no timings)."""
    return [(r.context_lens, r.accepted, r.emitted, r.sequences, r.warmup) for r in res.rounds]


def serial_and_pipelined(strategy, **kw):
    out = []
    for on in (False, True):
        eng = engine(strategy, pipeline=on, **kw)
        res = eng.generate(PROMPTS)
        out.append((eng, res, eng.target.cache.lens.tolist()))
    return out


@pytest.mark.parametrize("case", list(PIPELINED))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_pipelined_rounds_decode_what_serial_rounds_decode(case, temperature):
    (se, sr, slens), (pe, pr, plens) = serial_and_pipelined(
        PIPELINED[case], temperature=temperature
    )
    assert sr.serial_reason == "the decode settings ask for a serial loop" and sr.loop == "serial"
    assert pr.serial_reason is None and pr.loop == "pipelined"
    assert pr.tokens == sr.tokens
    assert rounds_of(pr) == rounds_of(sr)
    assert plens == slens  # a round issued past the end kept nothing
    assert all(r.wall_s > 0 for r in pr.rounds)


@pytest.mark.parametrize("new", [1, 2, 3, 7])
def test_pipelined_rounds_end_where_serial_rounds_end(new):
    """Short decodes: no round at all, one, or a last round that may end the decode early (a
    chain keeps up to four tokens a round)."""
    for strategy in (PIPELINED["ar_dense"], SELF_SPARSE):
        (_, sr, slens), (_, pr, plens) = serial_and_pipelined(strategy, new=new)
        assert pr.tokens == sr.tokens and all(len(t) == new for t in pr.tokens)
        assert rounds_of(pr) == rounds_of(sr) and plens == slens


def test_each_round_is_read_after_the_next_one_is_issued(monkeypatch):
    """The order the pipeline exists for: while round r is read, round r + 1 is already issued
    (the last round excepted); the serial loop reads each round before the next."""
    events: list[str] = []
    issue, rows = Engine._issue, pipeline.InFlight.rows

    def spy_issue(self, *a, **k):
        events.append("issue")
        return issue(self, *a, **k)

    def spy_rows(self):
        events.append("read")
        return rows(self)

    monkeypatch.setattr(Engine, "_issue", spy_issue)
    monkeypatch.setattr(pipeline.InFlight, "rows", spy_rows)
    for on, expect in ((True, ["issue"] + ["issue", "read"] * 5 + ["read"]), (False, None)):
        events.clear()
        res = engine(PIPELINED["ar_dense"], new=7, pipeline=on).generate(PROMPTS)
        assert len(res.rounds) == 6
        assert events == (expect or ["issue", "read"] * 6)


def test_a_round_issued_past_the_end_is_drained_and_keeps_nothing(monkeypatch):
    """A chain round that ends every sequence sooner than one token a round would: the round
    issued behind it runs, is waited for and keeps nothing."""
    drained = []
    drain = pipeline.InFlight.drain
    monkeypatch.setattr(pipeline.InFlight, "drain", lambda self: drained.append(drain(self)))
    eng = engine(SELF_SPARSE, new=9)
    res = eng.generate(PROMPTS)
    last = res.rounds[-1]
    assert max(e for r in res.rounds for e in r.emitted) > 1  # chains kept drafts
    assert drained and sum(len(t) for t in res.tokens) == 9 * len(PROMPTS)
    assert last.wall_s > 0


def test_drain_refuses_a_round_that_kept_tokens():
    packed = torch.tensor([[0, 5, 5, 1], [2, 7, 7, 3]])
    flight = pipeline.InFlight(
        packed[:, 1], packed, None, StepTimer(torch.device("cpu")), None, None, False, False, 0.0
    )
    with pytest.raises(RuntimeError, match=r"kept tokens: \[0, 2\]"):
        flight.drain()


def test_what_keeps_a_loop_serial():
    class Switching:
        def after_round(self, stats):
            return None

    ngram = dataclasses.replace(SELF_SPARSE, drafter=DrafterSpec(kind="ngram"))
    draft_model = dataclasses.replace(
        SELF_SPARSE, drafter=DrafterSpec(kind="draft_model", model="draft")
    )
    cases = {
        "the controller may switch strategies after a round": engine(
            PIPELINED["ar_dense"], controller=Switching()
        ),
        "the selection statistics read each round on the host": engine(
            PIPELINED["ar_sparse"], record_stats=True
        ),
        "the ngram drafter drafts from the host's copy of the tokens": engine(ngram),
        "the draft_model drafter drafts from the host's copy of the tokens": engine(draft_model),
    }
    for reason, eng in cases.items():
        res = eng.generate(PROMPTS)
        assert res.serial_reason == reason and res.loop == "serial"
        assert all(len(t) == eng.config.max_new_tokens for t in res.tokens)


def test_the_cost_model_pipelines_the_rounds_the_engine_pipelines():
    """``perfmodel.loop_host.pipelined`` restates ``engine.pipeline.blocker``'s rule for a
    fixed strategy (perfmodel cannot import the engine): both agree for every drafter kind of
    the cost model, with drafts and without."""
    engine_drafters = {cls.kind: cls for cls in (ModelDrafter, NgramDrafter, SelfSparseDrafter)}
    # eagle has no engine drafter (``engine.strategy_check`` refuses it): its rounds are priced
    # as a serial loop would run them, the engine's rule for a host-side drafter.
    assert set(DRAFTER_CODES) == {*engine_drafters, "eagle"}
    for kind, code in DRAFTER_CODES.items():
        drafter = engine_drafters.get(kind, NgramDrafter)
        for loop in loop_host.LOOPS:
            cfg = DecodeConfig(pipeline=loop == "pipelined")
            model = loop_host.pipelined(loop_host.pipelining(loop), code, 3)
            assert bool(model) == (pipeline.blocker(cfg, KeepStrategy(), drafter, False) is None)
            model = loop_host.pipelined(loop_host.pipelining(loop), code, 0)
            assert bool(model) == (pipeline.blocker(cfg, KeepStrategy(), None, False) is None)


def test_triton_interpreter_pipelined_equals_serial():
    """The triton backend's fused acceptance step (``kernels.accept_commit``) under the
    pipeline: the same tokens and rounds as the serial loop."""
    s = dataclasses.replace(PIPELINED["ar_sparse"])
    (_, sr, slens), (_, pr, plens) = serial_and_pipelined(s, new=3, backend="triton")
    assert pr.tokens == sr.tokens and rounds_of(pr) == rounds_of(sr) and plens == slens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["ar_dense", "ar_nsa", "self_sparse"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gpu_pipelined_rounds_under_cuda_graphs_decode_what_serial_rounds_decode(case, temperature):
    """Under CUDA graphs every round replays the same acceptance graph, whose outputs the next
    round overwrites: the staged host copy must hold round r's rows while round r + 1 runs.
    bf16, triton backend, a ragged batch of four; the same tokens, rounds and cache lengths
    as the serial loop, twice in a row (the second run replays the first's graphs)."""
    from engine_helpers import GPU_TINY

    nsa = dict(attention="sparse", metadata="nsa", top_n=8, block_size=64, window=128)
    strategy = {
        "ar_dense": Strategy(name="ar_dense"),
        "ar_nsa": Strategy(name="ar_sparse", refresh_every=2, **nsa),
        "self_sparse": dataclasses.replace(SELF_SPARSE, block_size=64, window=128),
    }[case]
    model = tiny_model(GPU_TINY, seed=0, max_positions=4096, device="cuda").to(torch.bfloat16)
    prompts = random_prompts([1500, 1203, 611, 1777], vocab=512, seed=3)
    new = 40
    tree = DraftTree.from_spec(strategy.tree, strategy.traversal)
    runner = ModelRunner(
        model,
        batch=len(prompts),
        t_max=max(map(len, prompts)) + new + tree.num_nodes + 1,
        backend="triton",
        use_graphs=True,
    )
    out = {}
    for on in (False, True, False, True):
        cfg = DecodeConfig(max_new_tokens=new, temperature=temperature, pipeline=on, seed=4)
        eng = Engine(runner, strategy, cfg)
        res = eng.generate(prompts)
        assert res.loop == ("pipelined" if on else "serial")
        got = (res.tokens, rounds_of(res)[1:], runner.cache.lens.tolist())
        assert out.setdefault(on, got) == got  # repeatable
    assert out[True] == out[False]


def test_cli_decode_reports_its_loop_and_prices_it(capsys):
    """``ssvkit decode`` pipelines an autoregressive run by default and reads each round first
    with ``--serial-loop``; the report names the loop and the prediction prices it: no loop
    host time where the GPU's round hides it."""
    import json

    from ssvkit.cli import main

    base = "decode --model tiny --context 1K --batch 2 --strategy ar_dense --device cpu "
    base += "--backend torch --max-new-tokens 6 --json"
    reports = {}
    for extra in ("", " --serial-loop"):
        assert main((base + extra).split()) == 0
        reports[extra] = json.loads(capsys.readouterr().out)
    pipelined, serial = reports[""], reports[" --serial-loop"]
    assert pipelined["loop"] == "pipelined" and serial["loop"] == "serial"
    assert (
        pipelined["prediction"]["loop"] == "pipelined" and serial["prediction"]["loop"] == "serial"
    )
    assert pipelined["prediction"]["loop_s"] == 0 < serial["prediction"]["loop_s"]
    assert pipelined["sample"] == serial["sample"]
