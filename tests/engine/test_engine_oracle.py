"""The oracle drafter on the CPU: decoding with it emits the target's own tokens (greedy and
sampled, batch 1 and ragged batches, chains and trees, dense and sparse); its accepted lengths
follow the chosen per-depth acceptance, also where its reference is wrong or the verify's
numerics leave it (the probes re-anchor it), and a probe leaves no state behind; ``ssvkit
decode --drafter oracle`` labels that acceptance synthetic, reports the probes' cost, feeds the
measured selection overlap of a sparse strategy to its prediction, and refuses bad values in
one line."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from engine_helpers import persistent_state, random_prompts, tiny_model, watch_probes
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

from ssvkit.cli import main

TARGET = tiny_model(seed=3)
NGRAM = DrafterSpec(kind="ngram")
SPARSE = dict(attention="sparse", top_n=2, block_size=16, window=32, metadata="mean")
CASES = {
    "chain_dense": Strategy(name="sd", tree="chain:4", drafter=NGRAM),
    "tree_dense": Strategy(name="sd", tree="full:2x3", drafter=NGRAM),
    "tree_sparse_union": Strategy(
        name="ssv", tree="full:2x2", drafter=NGRAM, mode="union", group_size=3, **SPARSE
    ),
}


def decode(strategy: Strategy, prompts, config: DecodeConfig, tail: int = 16):
    """``config``'s decode of ``prompts`` as one batch; the cache holds ``tail`` rows past the
    new tokens whatever the strategy, so sampled runs draw the same position uniforms."""
    t_max = max(map(len, prompts)) + config.max_new_tokens + tail
    target = ModelRunner(TARGET, batch=len(prompts), t_max=t_max, backend="torch")
    engine = Engine(target, strategy, config)
    return engine, engine.generate(prompts)


def autoregressive(strategy: Strategy, prompts, config: DecodeConfig) -> list[list[int]]:
    ar = dataclasses.replace(strategy, tree="chain:0")
    return decode(ar, prompts, config)[1].tokens


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("lengths", [[157], [157, 290, 93]])
@pytest.mark.parametrize("case", list(CASES))
def test_oracle_decoding_emits_the_targets_own_tokens(case, lengths, temperature):
    prompts = random_prompts(lengths, seed=7)
    plain = DecodeConfig(max_new_tokens=24, temperature=temperature, seed=5)  # 10-14 rounds
    want = autoregressive(CASES[case], prompts, plain)
    cfg = dataclasses.replace(plain, oracle_acceptance=(0.7,))
    engine, result = decode(CASES[case], prompts, cfg)
    assert result.tokens == want
    assert engine.drafter.kind == "oracle" and not engine.drafter.diverged
    assert result.mean_accepted() > 0.6  # expected: 1.19 (depth 2) to 1.77 (depth 4)


def wrong_from(reference: list[list[int]], starts: list[int], seed: int) -> list[list[int]]:
    """``reference`` with every token from ``starts[b]`` on replaced by a random one."""
    rng = np.random.default_rng(seed)
    return [
        r[:at] + rng.integers(0, 256, len(r) - at).tolist()
        for r, at in zip(reference, starts, strict=True)
    ]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("case", ["chain_dense", "tree_dense", "tree_sparse_union"])
def test_a_reference_wrong_from_some_position_on_is_re_anchored(monkeypatch, case, temperature):
    """The probes replace the wrong tokens: at acceptance 1 every round keeps the whole spine,
    the output is the target's and no sequence leaves its probes; the corrections cost probes
    beyond one per round."""
    prompts = random_prompts([120, 64], seed=2)
    # 20 tokens: past both wrong starts, over 4-7 rounds.
    plain = DecodeConfig(max_new_tokens=20, temperature=temperature, seed=4)
    want = autoregressive(CASES[case], prompts, plain)
    own = Engine._reference
    monkeypatch.setattr(
        Engine, "_reference", lambda self, p: wrong_from(own(self, p), [3, 11], seed=0)
    )
    cfg = dataclasses.replace(plain, oracle_acceptance=(1.0,))
    engine, result = decode(CASES[case], prompts, cfg)
    assert result.tokens == want
    assert not engine.drafter.diverged
    depth = DraftTree.from_spec(CASES[case].tree).max_depth
    for r in result.rounds:
        capped = [e < depth + 1 for e in r.emitted]  # max_new_tokens cut the round short
        assert all(a == depth or c for a, c in zip(r.accepted, capped, strict=True)), r
    cost = result.oracle_overhead()
    assert cost["probes"] > len(result.rounds) and cost["probes_per_round"] > 1


@pytest.mark.parametrize(
    ("tree", "alpha"),
    [("chain:3", (0.9, 0.6, 0.3)), ("full:2x3", (0.5, 0.8, 0.95)), ("best:12:4", (0.75,))],
)
def test_accepted_lengths_follow_the_chosen_acceptance_per_depth(tree, alpha):
    """Each depth's conditional acceptance (rounds that kept >= k drafts among those that kept
    >= k - 1) lies within 4 binomial standard deviations of alpha_k (a fixed seed: the draws,
    and so the outcome, are the same every run)."""
    prompts = random_prompts([64, 97, 80, 71], seed=11)
    strategy = Strategy(name="sd", tree=tree, drafter=NGRAM)
    # 120 tokens: 70-180 rounds reach each depth (four sequences).
    cfg = DecodeConfig(max_new_tokens=120, oracle_acceptance=alpha, seed=3)
    engine, result = decode(strategy, prompts, cfg)
    assert not engine.drafter.diverged
    accepted = np.concatenate([r.accepted for r in result.rounds])
    depth = DraftTree.from_spec(tree).max_depth
    for k, a in enumerate(cfg.oracle_profile(depth), start=1):
        n = int((accepted >= k - 1).sum())
        rate = (accepted >= k).sum() / n
        assert n >= 30, (k, n)
        assert abs(rate - a) <= 4 * math.sqrt(a * (1 - a) / n) + 1e-9, (k, rate, a, n)


def bump_verify(monkeypatch, token_at, every: int) -> None:
    """Verify forwards (more than one row) whose argmax at every ``every``-th position is
    ``token_at(pos, tokens)`` (``[B, t]`` positions and draft tokens); one-row forwards are
    untouched."""
    own = ModelRunner.tree_forward

    def tree_forward(self, tokens, tree, attn, **kw):
        logits, *rest = own(self, tokens, tree, attn, **kw)
        if tokens.shape[1] == 1:
            return (logits, *rest)
        pos = self.cache.lens.long()[:, None] + self.tree_tensors(tree).depth  # [B, t]
        bump = torch.zeros_like(logits).scatter_(2, token_at(pos, tokens)[..., None], 1e3)
        return (logits + bump * (pos % every == 0)[..., None], *rest)

    monkeypatch.setattr(ModelRunner, "tree_forward", tree_forward)


def perturb_verify(monkeypatch) -> None:
    """A token of the position at every fourth position: a stand-in for a verify whose
    numerics differ from the autoregressive forward's (one row, untouched), so the reference
    leaves the decode there."""
    bump_verify(monkeypatch, lambda pos, tokens: (pos * 37 + 11) % 256, every=4)


@pytest.mark.parametrize(
    ("tree", "alpha", "temperature"),
    [("chain:3", (0.9, 0.6, 0.3), 0.0), ("full:2x3", (0.8,), 0.9)],
)
def test_acceptance_follows_the_profile_where_the_verify_leaves_the_reference(
    monkeypatch, tree, alpha, temperature
):
    """The verify's numerics differ from the reference pass's: the decode emits what the same
    strategy emits with another drafter, no sequence leaves its probes, and each depth's
    conditional acceptance lies within 4 binomial standard deviations of alpha_k."""
    perturb_verify(monkeypatch)
    prompts = random_prompts([64, 97, 80], seed=11)
    strategy = Strategy(name="sd", tree=tree, drafter=NGRAM)
    # 120 tokens: 75-140 rounds reach each depth (three sequences).
    plain = DecodeConfig(max_new_tokens=120, temperature=temperature, seed=3)
    want = decode(strategy, prompts, plain)[1].tokens
    assert want != autoregressive(strategy, prompts, plain)  # the reference is wrong
    engine, result = decode(strategy, prompts, dataclasses.replace(plain, oracle_acceptance=alpha))
    assert result.tokens == want
    assert not engine.drafter.diverged
    accepted = np.concatenate([r.accepted for r in result.rounds])
    for k, a in enumerate(engine.config.oracle_profile(engine.tree.max_depth), start=1):
        n = int((accepted >= k - 1).sum())
        rate = (accepted >= k).sum() / n
        assert n >= 30, (k, n)
        assert abs(rate - a) <= 4 * math.sqrt(a * (1 - a) / n) + 1e-9, (k, rate, a, n)
    assert result.oracle_overhead()["probes_per_round"] > 1


def couple_rows(monkeypatch) -> None:
    """A token that depends on every draft token of the sequence at every third position: a
    stand-in for a grouped schedule, whose rounding of one row follows the other rows'
    selections, so correcting a deeper spine level moves a shallower one's outcome."""
    bump_verify(
        monkeypatch,
        lambda pos, tokens: (pos + tokens.long().sum(1, keepdim=True) * 7) % 256,
        every=3,
    )


def test_rows_that_depend_on_other_rows_leave_the_plan_but_not_their_probes(monkeypatch):
    """Where no draft makes the target emit the plan, the round takes its last probe's draft
    after max_depth + 2 probes: the verify emits exactly what that probe did (no sequence
    diverges), and the rounds that left the drawn plan are counted in ``off_plan``."""
    couple_rows(monkeypatch)
    prompts = random_prompts([90, 70], seed=6)
    strategy = Strategy(name="sd", tree="chain:3", drafter=NGRAM)
    cfg = DecodeConfig(max_new_tokens=40, seed=2, oracle_acceptance=(1.0,))
    engine, result = decode(strategy, prompts, cfg)
    assert not engine.drafter.diverged
    short = sum(
        a < 3 and e == a + 1
        for r in result.rounds
        for a, e in zip(r.accepted, r.emitted, strict=True)
    )
    assert 0 < short <= engine.drafter.off_plan
    assert max(r.oracle_probes for r in result.rounds) == 3 + 2


NSA = dict(SPARSE, metadata="nsa", comp_block=16, comp_stride=8)


@pytest.mark.parametrize(
    ("strategy", "summary"),
    [
        pytest.param(
            Strategy(name="ssv", tree="chain:4", drafter=NGRAM, refresh_every=2, **NSA),
            "comp_k",
            id="nsa",
        ),
        pytest.param(CASES["tree_sparse_union"], "meta0", id="union"),
        pytest.param(
            Strategy(
                name="ssv", tree="chain:4", drafter=NGRAM, mode="shared", group_size=2, **SPARSE
            ),
            "meta0",
            id="shared",
        ),
    ],
)
def test_a_probe_leaves_no_state_behind(monkeypatch, strategy, summary):
    """Every probe of a sampled decode (NSA's compressed tokens, block metadata, shared
    groups) leaves the lengths, the committed KV, the summaries, the device counters and
    uniforms and the generators as they were; the verify reproduces the last probe."""
    perturb_verify(monkeypatch)  # corrections too: more than one probe in some rounds
    changes = watch_probes(monkeypatch)
    prompts = random_prompts([90, 133], seed=5)
    cfg = DecodeConfig(max_new_tokens=40, temperature=0.9, seed=2, oracle_acceptance=(0.8,))
    engine = Engine(
        ModelRunner(TARGET, batch=2, t_max=133 + 40 + 16, backend="torch"), strategy, cfg
    )
    result = engine.generate(prompts)
    assert not engine.drafter.diverged
    assert len(changes) > len(result.rounds) and not any(changes), changes
    assert summary in persistent_state(engine)  # the summary the probes were checked on


def test_the_acceptance_profile_checks_its_values_and_length():
    assert DecodeConfig.parse_acceptance("0.9, 0.5,1") == (0.9, 0.5, 1.0)
    cfg = DecodeConfig(oracle_acceptance=(0.9, 0.5))
    assert cfg.oracle_profile(2) == (0.9, 0.5)
    assert DecodeConfig(oracle_acceptance=(0.8,)).oracle_profile(3) == (0.8, 0.8, 0.8)
    with pytest.raises(ValueError, match="has 2 values; the tree has depth 3"):
        cfg.oracle_profile(3)
    for bad in ((0.0,), (1.2,), ()):
        with pytest.raises(ValueError, match="oracle acceptance"):
            DecodeConfig(oracle_acceptance=bad)
    with pytest.raises(ValueError, match="'x' is not a number"):
        DecodeConfig.parse_acceptance("0.8,x")


def test_decode_command_labels_the_oracles_acceptance_synthetic(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    argv = ["decode", "--model", "tiny", "--device", "cpu", "--context", "128"]
    argv += ["--strategy", "ssv", "--metadata", "mean", "--top-n", "1", "--block-size", "32"]
    argv += ["--window", "32", "--tree", "chain:3", "--max-new-tokens", "16"]
    argv += ["--batch", "2", "--drafter", "oracle", "--oracle-acceptance", "0.9,0.7,0.5"]
    assert main([*argv, "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["acceptance"] == "synthetic:oracle"
    for name in ("mean_accepted", "acceptance_rate"):
        assert out[name]["provenance"] == "synthetic:oracle"
    assert out["fitted_alpha"]["provenance"].endswith("synthetic:oracle")
    oracle = out["oracle"]
    assert {k: oracle[k] for k in ("acceptance", "diverged", "sequences")} == {
        "acceptance": [0.9, 0.7, 0.5],
        "diverged": 0,
        "sequences": 2,
    }
    # The fp32 CPU decode agrees with its autoregressive reference: one probe per round.
    assert oracle["probes_per_round"] == 1.0 and oracle["probe_s"]["value"] > 0
    assert out["strategy"]["drafter"]["kind"] == "ngram" and "oracle" in out["note"]
    # A sparse strategy records its selections: the prediction takes the measured overlap.
    assert out["prediction"]["overlap"]["provenance"] == "measured:group_overlap"
    assert out["prediction"]["overlap"]["value"] == pytest.approx(out["selection"]["group_overlap"])
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["acceptance"] == "synthetic:oracle"
    assert header["oracle_probes"] == out["rounds"] and header["oracle_probe_s"] > 0
    assert main(argv) == 0  # no --trace or --stats: the oracle records the selections itself
    text = capsys.readouterr().out
    assert "[synthetic]" in text and "acceptance: synthetic (oracle drafter" in text
    assert "oracle probes: 1.00 verify forwards per round" in text
    assert "[measured:group_overlap]" in text


RANDOM = ["--model", "random:llama-3.1-8b", "--device", "cpu"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--drafter", "oracle"], "needs --oracle-acceptance"),
        (["--oracle-acceptance", "0.8"], "needs --drafter oracle"),
        (["--drafter", "eagle", "--oracle-acceptance", "0.8"], "--drafter takes oracle"),
        (["--drafter", "oracle", "--oracle-acceptance", "1.5"], "outside (0, 1]"),
        (["--drafter", "oracle", "--oracle-acceptance", "0"], "outside (0, 1]"),
        (["--drafter", "oracle", "--oracle-acceptance", "0.8,high"], "'high' is not a number"),
        (
            ["--drafter", "oracle", "--oracle-acceptance", "0.9,0.8", "--tree", "chain:3"],
            "has 2 values; the tree has depth 3",
        ),
        (
            ["--drafter", "oracle", "--oracle-acceptance", "0.8", "--strategy", "ar_dense"],
            "needs a strategy that drafts",
        ),
        (
            ["--drafter", "oracle", "--oracle-acceptance", "0.8", "--drafter-kind", "ngram"],
            "drop --drafter-kind",
        ),
        (
            ["--drafter", "oracle", "--oracle-acceptance", "0.8", "--ranking", "r.json"],
            "--ranking chooses the drafter",
        ),
    ],
)
def test_decode_oracle_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    rc = main(["decode", *RANDOM, *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


class _Cycle:
    """A controller that switches every round, through autoregressive rounds and two trees."""

    def __init__(self, strategies) -> None:
        self.strategies, self.calls = strategies, 0

    def after_round(self, stats):
        self.calls += 1
        return self.strategies[self.calls % len(self.strategies)]


def test_the_oracle_keeps_drafting_across_strategy_switches():
    prompts = random_prompts([80, 121], seed=4)
    cycle = [
        Strategy(name="ar", tree="chain:0", drafter=NGRAM),
        CASES["chain_dense"],
        CASES["tree_dense"],
    ]
    cfg = DecodeConfig(max_new_tokens=40, oracle_acceptance=(0.8,))
    want = autoregressive(CASES["tree_dense"], prompts, DecodeConfig(max_new_tokens=40))
    target = ModelRunner(TARGET, batch=2, t_max=max(map(len, prompts)) + 40 + 16, backend="torch")
    engine = Engine(target, cycle[0], cfg, controller=_Cycle(cycle))
    result = engine.generate(prompts)
    assert result.tokens == want
    assert not engine.drafters.built["oracle"].diverged
    drafted = [r for r in result.rounds if r.drafted]
    assert drafted and np.mean([np.mean(r.accepted) for r in drafted]) > 0.6
