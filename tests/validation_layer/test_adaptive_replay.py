"""``validation.adaptive_replay``: the per-depth acceptance it fits reproduces the measured
chains, its worlds charge what the document measured, and it runs end to end."""

from __future__ import annotations

import json

import pytest
from ssvkit.validation import adaptive_replay as replay
from ssvkit.validation import replay_worlds as rw
from ssvkit.validation.controller_world import load_setting, simulate_accepted
from ssvkit.validation.records import record_path


def _chain_mean(alpha: list[float], k: int) -> float:
    p, total = 1.0, 0.0
    for a in alpha[:k]:
        p *= a
        total += p
    return total


@pytest.mark.parametrize(
    "measured",
    [
        {2: 0.43, 4: 0.48, 7: 0.60},  # n-gram on prose: a burst after depth 4
        {2: 1.18, 4: 1.67, 7: 2.25},  # the draft model on code
        {2: 0.24, 4: 0.19, 7: 0.21},  # a longer chain measured below a shorter one: noise
    ],
)
def test_per_depth_alpha_reproduces_the_measured_chains(measured):
    alpha = rw.per_depth_alpha(measured)
    assert len(alpha) == 8 and all(0.0 <= a <= 1.0 for a in alpha)
    done, lo = 0.0, 0
    for k in sorted(measured):
        got = _chain_mean(alpha, k)
        if measured[k] <= done:  # a piece cannot take drafts back: it accepts nothing
            assert alpha[lo:k] == [0.0] * (k - lo) and got == pytest.approx(done)
        elif alpha[lo] == 1.0:  # out of reach after the shorter chains: all it can
            assert got <= measured[k] and alpha[lo:k] == [1.0] * (k - lo)
        else:
            assert got == pytest.approx(measured[k], abs=1e-6)
        done, lo = got, k
    with pytest.raises(ValueError, match="at least one measured chain"):
        rw.per_depth_alpha({})


def test_worlds_charge_the_measured_rounds_and_the_replay_runs(tmp_path, capsys):
    doc = json.loads(record_path("planner.json").read_text())
    setting = load_setting()
    worlds = rw.build_worlds(doc, setting[0])
    assert set(worlds) == set(doc["adaptive"]["prompt_sets"])
    prose = worlds["prose"]
    for x in doc["adaptive"]["prompt_sets"]["prose"]["oracle"]["strategies"]:
        assert prose.round_s[x["id"]] == pytest.approx((1 + x["mean_accepted"]) / x["tokens_per_s"])
    assert prose.control_s > 0 and all(v >= 0 for v in prose.switch_s.values())
    # Serial control pays the measured host time per round; overlapped, it hides.
    serial = replay.replay(prose, setting, replay.parse_config("overlap=0"), seed=3)
    hidden = replay.replay(prose, setting, replay.parse_config("overlap=1"), seed=3)
    assert serial["tokens_per_s"] > 0 and hidden["tokens_per_s"] > 0
    assert serial["context"] >= doc["max_new_tokens"] and hidden["context"] >= doc["max_new_tokens"]
    out = tmp_path / "replay.json"
    assert replay.main(["--runs", "2", "--sets", "random", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["sets"]["random"]
    assert row["runs"] == 2 and row["measured_gain"] == pytest.approx(
        doc["adaptive"]["prompt_sets"]["random"]["adaptive_gain"]
    )
    assert "random" in capsys.readouterr().out
    for bad in (
        ["--sets", "poetry"],
        ["--config", "nope=1"],
        ["--config", "transfer=x"],
        ["--runs", "0"],
    ):
        assert replay.main(bad) == 2


def test_expected_accepted_is_the_simulated_mean_and_the_sibling_fit_recovers_it():
    import numpy as np
    from ssvkit.perfmodel.strategy import parse_tree

    tree = parse_tree("best:8:4")
    alpha = [0.7, 0.6, 0.5, 0.4]
    rng = np.random.default_rng(0)
    for s in (1.0, 0.5, 0.0):
        sim = np.mean([simulate_accepted(tree, alpha, rng, s) for _ in range(20000)])
        exact = rw.expected_accepted(tree, alpha, s)
        assert sim == pytest.approx(exact, abs=0.03)
    # Second choices right less often: fewer accepted, down to the top chain's at 0.
    assert rw.expected_accepted(tree, alpha, 0.5) < rw.expected_accepted(tree, alpha, 1)
    chain = [i - 1 for i in range(4)]  # the tree's depth as a chain: its top path
    top = rw.expected_accepted(tuple(chain), alpha, 1.0)
    assert rw.expected_accepted(tree, alpha, 0.0) == pytest.approx(top)
    # The fit finds the factor that made the measurement; chains alone leave it at 1.
    wide = parse_tree("best:16:6")
    made = [(p, rw.expected_accepted(p, alpha, 0.37)) for p in (tree, wide)]
    assert rw.fit_sibling(made, alpha) == pytest.approx(0.37, abs=0.006)
    assert rw.fit_sibling([(tuple(chain), 1.2)], alpha) == 1.0


def test_worlds_fit_siblings_to_the_measured_trees():
    from ssvkit.perfmodel.strategy import parse_tree
    from ssvkit.planner.rank import strategy_from_json
    from ssvkit.planner.space import strategy_id

    doc = json.loads(record_path("planner.json").read_text())
    ranking = load_setting()[0]
    by_id = {}
    for reg in ranking["regimes"].values():
        for r in reg["ranking"]:
            s = strategy_from_json(r["strategy"])
            by_id[strategy_id(s)] = s
    worlds = rw.build_worlds(doc, ranking)
    for name, w in worlds.items():
        err = {}  # per kind: squared errors at the fitted factor and at 1
        for x in doc["adaptive"]["prompt_sets"][name]["oracle"]["strategies"]:
            s = by_id.get(x["id"])
            if s is None or s.is_sparse or rw._chain_len(s.tree) or not parse_tree(s.tree):
                continue
            k, m = s.drafter.kind, x["mean_accepted"]
            assert 0.0 <= w.sibling[k] <= 1.0
            got = rw.expected_accepted(parse_tree(s.tree), w.alpha[k], w.sibling[k])
            one = rw.expected_accepted(parse_tree(s.tree), w.alpha[k], 1.0)
            e = err.setdefault(k, [0.0, 0.0])
            e[0], e[1] = e[0] + (got - m) ** 2, e[1] + (one - m) ** 2
            if k == "draft_model":  # within 15% of each measured tree (at 1: up to 33% over)
                assert got == pytest.approx(m, rel=0.15), (name, s.tree)
        assert err and all(fit <= one for fit, one in err.values())
