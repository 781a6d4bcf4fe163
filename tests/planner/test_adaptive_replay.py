"""``benchmarks/adaptive_replay.py``: the per-depth acceptance it fits reproduces the measured
chains, its worlds charge what the document measured, and it runs end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "adaptive_replay", ROOT / "benchmarks" / "adaptive_replay.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["adaptive_replay"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


REPLAY = _load()


def _chain_mean(alpha: list[float], k: int) -> float:
    p, total = 1.0, 0.0
    for a in alpha[:k]:
        p *= a
        total += p
    return total


@pytest.mark.parametrize(
    "measured",
    [
        {2: 0.43, 4: 0.48, 7: 0.60},  # n-gram on prose (run 17): a burst after depth 4
        {2: 1.18, 4: 1.67, 7: 2.25},  # the draft model on code
        {2: 0.24, 4: 0.19, 7: 0.21},  # a longer chain measured below a shorter one: noise
    ],
)
def test_per_depth_alpha_reproduces_the_measured_chains(measured):
    alpha = REPLAY.per_depth_alpha(measured)
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
        REPLAY.per_depth_alpha({})


def test_worlds_charge_the_measured_rounds_and_the_replay_runs(tmp_path, capsys):
    doc = json.loads(REPLAY.PLANNER_JSON.read_text())
    setting = REPLAY.load_setting()
    worlds = REPLAY.build_worlds(doc, setting[0])
    assert set(worlds) == set(doc["adaptive"]["prompt_sets"])
    prose = worlds["prose"]
    for x in doc["adaptive"]["prompt_sets"]["prose"]["oracle"]["strategies"]:
        assert prose.round_s[x["id"]] == pytest.approx((1 + x["mean_accepted"]) / x["tokens_per_s"])
    assert prose.control_s > 0 and all(v >= 0 for v in prose.switch_s.values())
    # Serial control pays the measured host time per round; overlapped, it hides.
    serial = REPLAY.replay(prose, setting, REPLAY.parse_config("overlap=0"), seed=3)
    hidden = REPLAY.replay(prose, setting, REPLAY.parse_config("overlap=1"), seed=3)
    assert serial["tokens_per_s"] > 0 and hidden["tokens_per_s"] > 0
    assert serial["context"] >= doc["max_new_tokens"] and hidden["context"] >= doc["max_new_tokens"]
    out = tmp_path / "replay.json"
    assert REPLAY.main(["--runs", "2", "--sets", "random", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["sets"]["random"]
    assert row["runs"] == 2 and row["measured_gain"] == pytest.approx(
        doc["adaptive"]["prompt_sets"]["random"]["adaptive_gain"]
    )
    assert "random" in capsys.readouterr().out
    for bad in (["--sets", "poetry"], ["--config", "nope=1"], ["--config", "transfer=x"],
                ["--runs", "0"]):  # fmt: skip
        assert REPLAY.main(bad) == 2
