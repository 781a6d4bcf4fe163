"""The decode loop on the CPU: greedy speculative output equals greedy autoregressive output for
dense and exact sparse attention and every drafter; sampling preserves the target distribution
end to end; controller switches, traces and statistics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from engine_helpers import TINY, random_prompts, tiny_model
from scipy.stats import chisquare
from ssvkit.engine.controller import RoundStats
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.trace_writer import TraceWriter
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy
from ssvkit.perfmodel.trace import read_trace

TARGET = tiny_model(seed=0)
DRAFT = tiny_model(seed=0, noise=0.3)
PROMPTS = random_prompts([70, 41])  # two sequences of different lengths
DM = DrafterSpec(kind="draft_model", model="draft")
SPARSE = dict(attention="sparse", top_n=2, block_size=16, window=32, metadata="mean")


def generate(
    strategy,
    *,
    prompts=PROMPTS,
    n=40,
    backend="torch",
    trace=None,
    controller=None,
    stats=False,
    target=TARGET,
    draft=DRAFT,
    temperature=0.0,
    seed=0,
):
    b, t_max = len(prompts), max(map(len, prompts)) + n + 70
    runner = ModelRunner(target, batch=b, t_max=t_max, backend=backend)
    drunner = ModelRunner(draft, batch=b, t_max=t_max, backend=backend)
    cfg = DecodeConfig(max_new_tokens=n, record_stats=stats, temperature=temperature, seed=seed)
    eng = Engine(runner, strategy, cfg, draft_runner=drunner, trace=trace, controller=controller)
    return eng.generate(prompts)


AR_DENSE = generate(Strategy(name="ar_dense")).tokens
AR_SPARSE = {
    r: generate(Strategy(name="ar_sparse", refresh_every=r, **SPARSE)).tokens for r in (1, 2)
}

SPEC = {
    "chain_draft_model": Strategy(name="sd", tree="chain:4", drafter=DM),
    "tree_dfs": Strategy(name="sd", tree="full:2x2", traversal="dfs", drafter=DM),
    "tree_bfs": Strategy(name="sd", tree="best:12:4", traversal="bfs", drafter=DM),
    "ngram_tree": Strategy(name="sd", tree="full:3x2", drafter=DrafterSpec(kind="ngram")),
    "self_sparse": Strategy(
        name="sd",
        tree="chain:3",
        drafter=DrafterSpec(kind="self_sparse", sparsity_ratio=0.3),
        block_size=16,
        window=32,
    ),
}


@pytest.mark.parametrize("case", list(SPEC))
def test_greedy_speculative_equals_autoregressive_dense(case):
    res = generate(SPEC[case])
    assert res.tokens == AR_DENSE
    assert len(res.rounds) < 40  # some drafts were accepted: fewer rounds than tokens


@pytest.mark.parametrize("mode", ["union", "per_query", "shared"])
@pytest.mark.parametrize("refresh_every", [1, 2])
def test_greedy_speculative_equals_autoregressive_sparse(mode, refresh_every):
    s = Strategy(
        name="ssv",
        tree="full:2x3",
        drafter=DM,
        mode=mode,
        group_size=3,
        refresh_every=refresh_every,
        **SPARSE,
    )
    res = generate(s)
    ar = AR_SPARSE[refresh_every]  # autoregressive with the same sparse attention
    assert ar != AR_DENSE and AR_SPARSE[1] != AR_SPARSE[2]  # both really change the attention
    if mode == "shared":  # approximate: a group shares its first query's blocks
        agree = np.mean(
            [a == b for x, y in zip(res.tokens, ar, strict=True) for a, b in zip(x, y, strict=True)]
        )
        assert agree > 0.2
    else:  # exact: every query keeps its own blocks
        assert res.tokens == ar


def test_nsa_branches_run_with_refresh_reuse():
    s = Strategy(
        name="nsa",
        tree="chain:3",
        drafter=DM,
        attention="sparse",
        metadata="nsa",
        top_n=2,
        block_size=16,
        window=32,
        comp_block=16,
        comp_stride=8,
        refresh_every=2,
    )
    res = generate(s, stats=True)
    assert len(res.tokens[0]) == 40 and res.rounds[1].selection is not None


class SwitchAfter:
    """Switches to ``new`` after ``k`` rounds and records what it was given."""

    def __init__(self, k: int, new: Strategy) -> None:
        self.k, self.new, self.seen = k, new, []

    def after_round(self, stats: RoundStats) -> Strategy | None:
        self.seen.append(stats)
        return self.new if stats.round == self.k else None


def test_controller_switches_strategy_and_drafter(tmp_path):
    # Dense strategies: the statistics select with their sparse fields (top_n, block, window).
    small = dict(top_n=2, block_size=16, window=32)
    ctl = SwitchAfter(3, dataclasses.replace(SPEC["ngram_tree"], **small))
    trace = TraceWriter(tmp_path / "run.jsonl", "tiny", TINY.num_layers)
    prompts = random_prompts([150, 120])
    res = generate(
        dataclasses.replace(SPEC["tree_dfs"], **small),
        controller=ctl,
        trace=trace,
        stats=True,
        prompts=prompts,
    )
    assert res.tokens == generate(Strategy(name="ar"), prompts=prompts).tokens
    assert {r.strategy for r in res.rounds} == {"sd"}
    assert ctl.seen[0].drafted == 6 and ctl.seen[-1].drafted == 12  # full:2x2, full:3x2
    t = read_trace(tmp_path / "run.jsonl")
    # one record per round and sequence still generating in it
    assert len(t.rounds) == sum(len(r.sequences) for r in res.rounds) > len(res.rounds)
    # Two strategies named "sd": the second gets its own header id.
    assert set(t.header["strategies"]) == {"sd", "sd#1"}
    assert t.header["strategies"]["sd#1"]["drafter"]["kind"] == "ngram"
    assert t.rounds[-1]["strategy"] == "sd#1" and t.rounds[0]["strategy"] == "sd"
    assert t.column("accepted").sum() == sum(sum(r.accepted) for r in res.rounds)
    assert set(t.rounds[0]["step_s"]) == {"draft", "launch", "verify", "accept"}
    layer = t.layer_column("layer_overlap")
    assert layer is not None and not np.isnan(layer).all()
    assert np.all(layer[~np.isnan(layer[:, 0]), 0] == 0) and np.nanmax(layer) <= 1
    assert t.layer_column("predict_hit") is not None  # from the second round on
    reuse = t.layer_column("reuse_hit")  # the same rounds, reuse of the last round's top-n
    assert reuse is not None and reuse.shape == t.layer_column("predict_hit").shape
    seen = ~np.isnan(reuse)
    assert seen.any() and ((reuse[seen] >= 0) & (reuse[seen] <= 1)).all()
    assert len(t.header["reuse_hit_mean"]) == TINY.num_layers
    assert not (tmp_path / "run.jsonl.partial").exists()


def test_controller_can_turn_speculation_off_and_on():
    ctl = SwitchAfter(2, Strategy(name="ar_dense"))
    res = generate(SPEC["chain_draft_model"], controller=ctl)
    assert res.tokens == AR_DENSE
    assert [r.drafted for r in res.rounds][:4] == [4, 4, 4, 0]


def test_selection_stats_are_shares_and_see_grouping():
    s = Strategy(name="ssv", tree="full:2x3", drafter=DM, mode="union", group_size=4, **SPARSE)
    res = generate(s, stats=True, prompts=random_prompts([200, 180]))
    sel = [r.selection for r in res.rounds]
    g = np.concatenate([x.group_overlap for x in sel])
    assert np.all((g >= 0) & (g <= 1)) and g.shape[1] == TINY.num_layers
    hits = np.concatenate([x.predict_hit for x in sel[1:]])
    assert np.nanmax(hits) <= 1 and np.nanmin(hits) >= 0
    assert np.isnan(sel[0].predict_hit).all()  # no history on the first round


def test_stochastic_decoding_preserves_the_target_distribution():
    """2000 sequences sampled at temperature 1 through the whole loop: the joint distribution
    of the first two speculative tokens matches the target model's, computed exactly."""
    cfg = TINY.replace(vocab_size=8)
    target = tiny_model(cfg, seed=11)
    draft = tiny_model(cfg, seed=11, noise=0.5)
    prompt = [1, 5, 2, 7, 3]
    n = 2000
    s = Strategy(name="sd", tree="full:2x2", drafter=DrafterSpec(kind="draft_model", model="d"))
    res = generate(s, prompts=[prompt] * n, n=3, target=target, draft=draft, temperature=1.0)
    got = np.array([tok[:3] for tok in res.tokens])  # x0 (prefill), x1, x2 (speculative)
    # Exact target probabilities of (x1, x2) given x0 from full causal forwards.
    runner = ModelRunner(target, batch=1, t_max=16, backend="torch")
    counts, expect = [], []
    for x0 in range(8):
        rows = got[got[:, 0] == x0]
        if len(rows) < 100:
            continue
        p1 = torch.softmax(runner.prefill([prompt + [x0]])[0], -1)
        joint = torch.stack(
            [p1[x1] * torch.softmax(runner.prefill([prompt + [x0, x1]])[0], -1) for x1 in range(8)]
        ).flatten()
        counts.append(np.bincount(rows[:, 1] * 8 + rows[:, 2], minlength=64))
        expect.append(joint.double().numpy() * len(rows))
    counts, expect = np.concatenate(counts), np.concatenate(expect)
    keep = expect >= 5  # merge the rare cells into one
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expect[keep], expect[~keep].sum())
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert np.mean([np.mean(r.accepted) for r in res.rounds]) > 0.3  # drafts were accepted


def test_sampling_with_deterministic_drafts_emits_the_autoregressive_text():
    """When sampling, each position's token is drawn by inverse CDF at its own uniform (drawn
    from the seed), and deterministic drafts are accepted when they hold that token: the
    n-gram drafter's chains and trees emit exactly the autoregressive run's text, so their
    speeds compare on the same text. Another seed writes another text. (Temperature 0.05: the
    random tiny model's text repeats enough for n-gram drafts to be accepted, and still differs
    from the greedy text.)"""
    prompts = [p * 3 for p in random_prompts([40, 23], seed=5)]  # repeats: n-gram matches
    kw = dict(prompts=prompts, n=60, temperature=0.05)
    ar = generate(Strategy(name="ar"), seed=3, **kw)
    assert ar.tokens != generate(Strategy(name="ar"), prompts=prompts, n=60).tokens  # not greedy
    ng = DrafterSpec(kind="ngram")
    for tree in ("chain:2", "chain:6", "full:3x2"):
        run = generate(Strategy(name="ng", tree=tree, drafter=ng), seed=3, **kw)
        assert run.tokens == ar.tokens, tree
        assert sum(sum(r.accepted) for r in run.rounds) >= 10, tree  # drafts were accepted
    assert generate(Strategy(name="ar"), seed=4, **kw).tokens != ar.tokens


def test_batch_rows_are_independent():
    alone = generate(SPEC["tree_dfs"], prompts=PROMPTS[1:]).tokens
    assert alone[0] == AR_DENSE[1]


def test_engine_refuses_what_it_cannot_run():
    runner = ModelRunner(TARGET, batch=1, t_max=64, backend="torch")
    cfg = DecodeConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="EAGLE"):
        Engine(runner, Strategy(name="x", tree="chain:2"), cfg)
    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(runner, Strategy(name="x", tree="chain:2", drafter=DM), cfg)
    with pytest.raises(ValueError, match="window"):
        Engine(runner, dataclasses.replace(SPEC["tree_dfs"], **{**SPARSE, "window": 4}), cfg)
    with pytest.raises(ValueError, match="chains only"):
        Strategy(name="x", tree="full:2x2", drafter=DrafterSpec(kind="self_sparse"))
    with pytest.raises(ValueError, match="head_dim"):
        odd = tiny_model(TINY.replace(head_dim=24))
        Engine(ModelRunner(odd, batch=1, t_max=64, backend="triton"), Strategy(name="a"), cfg)


def test_summaries_follow_the_strategy_that_reads_them():
    """A sparse strategy's block metadata and NSA's compressed tokens are refreshed by every
    commit while they exist: a dense strategy run after them on the same runners must not keep
    them (it would pay for them each round), must decode as on fresh runners, and a sparse
    strategy switched to mid-generation must rebuild them from the committed prefix."""
    nsa = Strategy(
        name="nsa",
        tree="chain:3",
        drafter=DM,
        attention="sparse",
        metadata="nsa",
        top_n=2,
        block_size=16,
        window=32,
        comp_block=16,
        comp_stride=8,
    )
    b, n = len(PROMPTS), 40
    t_max = max(map(len, PROMPTS)) + n + 70
    runner = ModelRunner(TARGET, batch=b, t_max=t_max, backend="torch")
    drunner = ModelRunner(DRAFT, batch=b, t_max=t_max, backend="torch")
    cfg = DecodeConfig(max_new_tokens=n)
    for s in (nsa, Strategy(name="sd", tree="chain:4", drafter=DM, **SPARSE)):
        Engine(runner, s, cfg, draft_runner=drunner).generate(PROMPTS)
    assert runner.cache.meta is not None  # the sparse strategy's
    dense = Engine(runner, SPEC["chain_draft_model"], cfg, draft_runner=drunner)
    assert runner.cache.meta is None and runner.cache.comp is None
    assert dense.generate(PROMPTS).tokens == AR_DENSE
    assert runner.cache.meta is None and runner.cache.comp is None
    # Dense for 3 rounds, then sparse (metadata "mean", exact per-query selection): the
    # summaries are built at the switch and kept up; the output is the sparse decode's.
    sparse = Strategy(name="ssv", tree="full:2x3", drafter=DM, mode="per_query", **SPARSE)
    eng = Engine(
        runner,
        Strategy(name="ar_sparse", **SPARSE),
        cfg,
        draft_runner=drunner,
        controller=SwitchAfter(3, sparse),
    )
    assert eng.generate(PROMPTS).tokens == AR_SPARSE[1]
    assert runner.cache.meta is not None and runner.cache.comp is None
    eng = Engine(
        runner,
        Strategy(name="ar_dense"),
        cfg,
        draft_runner=drunner,
        controller=SwitchAfter(3, sparse),
    )
    assert (
        eng.generate(PROMPTS).tokens
        == generate(Strategy(name="ar_dense"), controller=SwitchAfter(3, sparse)).tokens
    )


class CountingGraphs:
    """Stands in for ``GraphRunner`` on the CPU: runs eagerly, counting a capture the first
    time it sees a key (as the CUDA one captures) and the drops of its keys."""

    def __init__(self):
        from ssvkit.engine.graphs import GraphRunner

        self.inner, self.seen = GraphRunner(False), set()
        self.enabled, self.captures, self.clears = False, 0, 0

    def __call__(self, key, fn, inputs, neutral=None, on_launch=None):
        if key not in self.seen:
            self.seen.add(key)
            self.captures += 1
        return self.inner(key, fn, inputs, neutral, on_launch)

    def __contains__(self, key):
        return key in self.seen

    def __len__(self):
        return len(self.seen)

    def clear(self):
        self.seen.clear()
        self.clears += 1


def test_rounds_flag_captures_missing_when_the_run_began():
    """A round that captures a graph missing when the run began carries a start-up cost (the
    evaluation leaves it out, ``validation.bench.steady_figures``); a capture after the run's
    own switch dropped the graphs (a change of the cache's summaries) is that switch's cost."""
    b, n = len(PROMPTS), 40
    t_max = max(map(len, PROMPTS)) + n + 70
    runner = ModelRunner(TARGET, batch=b, t_max=t_max, backend="torch")
    drunner = ModelRunner(DRAFT, batch=b, t_max=t_max, backend="torch")
    runner.graphs, drunner.graphs = CountingGraphs(), CountingGraphs()
    cfg = DecodeConfig(max_new_tokens=n)
    ngram = dataclasses.replace(SPEC["ngram_tree"], tree="chain:2")

    def run(start, to):
        eng = Engine(runner, start, cfg, draft_runner=drunner, controller=SwitchAfter(3, to))
        return [r.round for r in eng.generate(PROMPTS).rounds if r.captured]

    # Fresh runners: round 0 captures the first strategy's graphs, round 4 the second's.
    assert run(SPEC["chain_draft_model"], ngram) == [0, 4]
    # Both strategies' graphs are there now: no round captures.
    assert run(SPEC["chain_draft_model"], ngram) == []
    # A switch to a sparse strategy builds block metadata, which drops the graphs: what the
    # rounds after it capture is the switch's (no flag), though they do capture.
    sparse = Strategy(name="sp", tree="chain:2", drafter=DM, **SPARSE)
    before = runner.graphs.captures
    assert run(SPEC["chain_draft_model"], sparse) == []
    assert runner.graphs.captures > before
