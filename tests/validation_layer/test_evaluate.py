import functools
import gc
import json
import math
from pathlib import Path

import numpy as np
import pytest
from fake_decodes import FakeDecodes
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.space import SpaceSpec
from ssvkit.validation import planner_eval, rescore
from ssvkit.validation.bench import captures_counted, steady_figures
from ssvkit.validation.evaluate import summary_table
from ssvkit.validation.prompts import (
    MEASURE_OFFSETS,
    PROFILE_OFFSETS,
    WALK_OFFSETS,
    measure_windows,
    prompt_crc32,
    prompt_tokens,
    walk_windows,
)
from ssvkit.validation.records import record_path
from ssvkit.validation.stats import (
    adaptive_resolution,
    measurement_resolution,
    pick,
    ranking_quality,
    set_resolution,
)
from ssvkit.validation.walks import walk_ngram

ROOT = Path(__file__).resolve().parents[2]


def test_prompt_sets_have_the_length_asked_and_differ():
    sets = {k: prompt_tokens(k, 700) for k in ("code", "prose", "repetitive", "random")}
    for k, v in sets.items():
        assert len(v) == 700 and all(0 <= t < 256 for t in v), k
    assert len({tuple(v) for v in sets.values()}) == 4
    # A different offset is a different window of the same source.
    assert prompt_tokens("code", 300, offset=300) != prompt_tokens("code", 300)
    rep = sets["repetitive"]
    assert rep[:256] == rep[256:512]
    # Random bytes look random: close to uniform over the byte values.
    counts = np.bincount(prompt_tokens("random", 25600), minlength=256)
    assert counts.min() > 50 and counts.max() < 160
    with pytest.raises(ValueError, match="unknown prompt set 'poetry'"):
        prompt_tokens("poetry", 10)
    with pytest.raises(ValueError, match="prompt length"):
        prompt_tokens("code", 0)


def test_ranking_quality():
    q = ranking_quality([3.0, 2.0, 1.0], [30.0, 20.0, 10.0])
    assert q["kendall_tau"] == pytest.approx(1.0) and q["regret"] == 0.0
    q = ranking_quality([3.0, 2.0, 1.0], [10.0, 20.0, 30.0])
    assert q["kendall_tau"] == pytest.approx(-1.0)
    assert q["regret"] == pytest.approx(1 - 10 / 30)


def test_pick_takes_the_top_then_spreads_over_runnable_ranks():
    ranking = [
        {"strategy": {"name": f"s{i}", "drafter": {"kind": "ngram"}, "tree": "chain:2"}}
        for i in range(40)
    ]
    ok = lambda s: int(s.name[1:]) % 3 != 1  # noqa: E731
    got = [r["strategy"]["name"] for r in pick(ranking, 8, ok, top=3)]
    runnable = [f"s{i}" for i in range(40) if i % 3 != 1]
    assert got[:3] == runnable[:3] and got[-1] == runnable[-1]
    assert len(got) == len(set(got)) == 8 and all(g in runnable for g in got)
    assert len(pick(ranking[:5], 8, ok)) == 3
    # Fewer than ``top`` asked for: the first ones (it raised in linspace before).
    assert [r["strategy"]["name"] for r in pick(ranking, 2, ok, top=3)] == got[:2]


def test_steady_figures_leave_out_round_zero_and_count_switches():
    from ssvkit.engine.results import DecodeResult, RoundRecord

    def rec(i, acc, wall, **step):
        return RoundRecord(i, "s", [100], 4, [acc], {"verify": wall, **step}, wall, i == 0)

    rounds = [rec(0, 4, 9.0), rec(1, 2, 1.0, control=0.5), rec(2, 3, 1.0, switch=2.0)]
    f = steady_figures(DecodeResult([[1]], rounds, 0, ""))
    assert f["tokens"] == 3 + 4 and f["rounds"] == 2
    # The controller's host time (its re-scores) counts like the switch's.
    assert f["tokens_per_s"] == pytest.approx(7 / 4.5) and f["switch_s"] == 2.0
    assert f["control_s"] == 0.5 and f["steps_s"]["shadow"] == 0.0
    assert f["accepted_hist"] == [0, 0, 1, 1]  # rounds 1 and 2 accepted 2 and 3
    assert f["capture_rounds"] == 0 and f["capture_s"] == 0
    # A later round that captured a graph missing when the run began is left out too (a
    # server captures before requests arrive), and said so.
    late = rec(3, 1, 7.0)
    late.captured = True
    g = steady_figures(DecodeResult([[1]], [*rounds, late], 0, ""))
    assert g["tokens"] == f["tokens"] and g["tokens_per_s"] == f["tokens_per_s"]
    assert g["capture_rounds"] == 1 and g["capture_s"] == 7.0 and g["capture_tokens"] == 2
    # Reported beside it: the run with those rounds put back (its 2 tokens over 7 s too).
    assert captures_counted(g) == pytest.approx((7 + 2) / (4.5 + 7.0))
    assert captures_counted(f) == pytest.approx(f["tokens_per_s"])
    # A run cached before capture_tokens was recorded counts the rounds' time only.
    old = {k: v for k, v in g.items() if k != "capture_tokens"}
    assert captures_counted(old) == pytest.approx(7 / (4.5 + 7.0))


def test_run_passes_go_pass_by_pass_and_keep_the_least_disturbed_same_decode():
    from ssvkit.validation.bench import Bench
    from ssvkit.validation.passes import least_disturbed, run_passes

    calls = []
    # Per job, per pass: (tokens/s, rounds); job "b"'s second pass decodes otherwise.
    script = {"a": [(100.0, 10), (120.0, 10), (90.0, 10)], "b": [(50.0, 8), (80.0, 9), (60.0, 8)]}

    def fn(job):
        p = sum(c == job for c in calls)
        calls.append(job)
        tps, rounds = script[job][p]
        return {"tokens_per_s": tps, "tokens": 40, "rounds": rounds, "switches": []}

    bench = Bench(target=None, draft=None, model=None, gpu=None, draft_label="", timing_passes=3)
    done = run_passes(bench, {"a": (fn, ("a",), {}), "b": (fn, ("b",), {})})
    assert calls == ["a", "b"] * 3  # a whole pass, then the next
    assert done["a"]["tokens_per_s"] == 120.0 and done["a"]["passes_kept"] == 3
    assert done["a"]["passes_tokens_per_s"] == [100.0, 120.0, 90.0]
    # The faster pass of "b" decoded other rounds than the first: left out.
    assert done["b"]["tokens_per_s"] == 60.0 and done["b"]["passes_kept"] == 2
    # An adaptive run whose controller switched elsewhere in a pass: that pass is left out.
    sw = lambda r, to: [{"round": r, "to": to}]  # noqa: E731
    runs = [
        {"tokens_per_s": 10.0, "tokens": 5, "rounds": 3, "switches": sw(1, "x")},
        {"tokens_per_s": 30.0, "tokens": 5, "rounds": 3, "switches": sw(1, "y")},
        {"tokens_per_s": 20.0, "tokens": 5, "rounds": 3, "switches": sw(1, "x")},
    ]
    got = least_disturbed(runs)
    assert got["tokens_per_s"] == 20.0 and got["passes_kept"] == 2
    # A pass whose first round captured a graph (left out of its steady figures) decoded the
    # same as the others.
    runs = [
        {"tokens_per_s": 10.0, "tokens": 5, "rounds": 3, "capture_tokens": 2, "capture_rounds": 1},
        {"tokens_per_s": 30.0, "tokens": 7, "rounds": 4, "capture_tokens": 0, "capture_rounds": 0},
    ]
    got = least_disturbed(runs)
    assert got["tokens_per_s"] == 30.0 and got["passes_kept"] == 2
    # One pass: each job's run as it is, under its own key.
    bench.timing_passes, calls[:] = 1, []
    cache = {}
    bench.run = lambda key, f, *a, **k: cache.setdefault(key, f(*a, **k))
    one = run_passes(bench, {"a": (fn, ("a",), {})})
    assert one["a"] == {"tokens_per_s": 100.0, "tokens": 40, "rounds": 10, "switches": []}
    assert set(cache) == {"a"}


def test_interleave_takes_every_strategys_ith_run_in_turn_rotating_the_first():
    from ssvkit.validation.passes import interleave

    a = {"a0": 1, "a1": 2, "a2": 3}
    b = {"b0": 4, "b1": 5}
    c = {"c0": 6, "a1": 2, "c2": 8}  # a's job "a1" is c's too: run once, where first met
    got = interleave([a, b, c])
    assert list(got) == ["a0", "b0", "c0", "b1", "a1", "c2", "a2"]
    assert got == {**a, **b, **c}
    assert interleave([]) == {} and interleave([{}, {"x": 1}]) == {"x": 1}


def _loop_check_as_promised(check: dict) -> int:
    """The loop host check of one regime (``profile_runs.loop_host_check``): the GPU host's
    fit named, per drafter finite figures over its runs; the number of runs checked."""
    assert check["fit"].startswith("fit:loop_host.json@"), check
    per = check["drafters"]
    assert set(per) <= {"none", "draft_model", "ngram"} and "none" in per
    for e in per.values():
        assert e["rows"] >= 1
        assert all(math.isfinite(v) and v >= 0 for k, v in e.items() if k != "measured_median_s")
        assert math.isfinite(e["measured_median_s"])
    return sum(e["rows"] for e in per.values())


def test_evaluation_runs_end_to_end_on_the_cpu(tmp_path, capsys, monkeypatch):
    """The benchmark on the trained tiny pair in the smallest configuration that runs every
    phase for real (a space whose sparse budgets fit a 256-token context, one profile prompt,
    one timing pass, one prompt set): every figure is there and sane, the run cache resumes
    and re-scores it, and bad arguments fail with one line and exit 2 before any model is
    built. ``test_evaluation_asks_for_every_run_in_whole_passes`` checks the evaluation's
    structure at its own settings, on injected decodes."""
    out = tmp_path / "planner.json"
    assert planner_eval.main(["--contexts", "1K", "--out", str(out), "--per-regime", "0"]) == 2
    assert "--per-regime" in capsys.readouterr().err and not out.exists()
    assert (
        planner_eval.main(
            ["--contexts", "1K", "--out", str(out)] + ["--prompt-sets", "code,poetry"]
        )
        == 2
    )
    assert "unknown prompt set 'poetry'" in capsys.readouterr().err and not out.exists()
    assert planner_eval.main(["--contexts", "1K,2K", "--out", str(out)]) == 2  # same regime
    assert "two contexts fall in regime <=4K" in capsys.readouterr().err and not out.exists()
    too_many = ["--profile-prompts", "11"]
    assert planner_eval.main(["--contexts", "1K", "--out", str(out), *too_many]) == 2
    assert "--profile-prompts must lie in 1..10, got 11" in capsys.readouterr().err
    assert planner_eval.main(["--contexts", "1K", "--out", str(out), "--measure-texts", "0"]) == 2
    assert "--measure-texts must lie in 1..20, got 0" in capsys.readouterr().err
    assert planner_eval.main(["--contexts", "1K", "--out", str(out), "--walk-prompts", "41"]) == 2
    assert "--walk-prompts must lie in 0..40, got 41" in capsys.readouterr().err
    # The run cache's settings hold the commit: fixed, so that a commit made meanwhile in the
    # tree does not refuse the second call.
    monkeypatch.setenv("SSVKIT_GIT_COMMIT", "feedbee")
    # No full collection before each run (``validation.bench.run_once`` makes one so that
    # none pauses a timed run): in a test session's heap it costs more than the run, and times
    # nothing checked here.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    # top4 x 64 fits 256 tokens, top8 x 64 does not; refresh every 1 and 2.
    space = functools.partial(SpaceSpec, top_ns=(4, 8), refresh_every=(1, 2))
    monkeypatch.setattr(planner_eval, "SpaceSpec", space)
    args = [
        "--contexts",
        "256",
        "--adaptive-context",
        "256",
        "--per-regime",
        "3",
        "--new-tokens",
        "8",
        "--repeats",
        "1",
        "--measure-texts",
        "1",
        "--device",
        "cpu",
        "--trees",
        "chain:0,chain:3,best:8:4",
        "--prompt-sets",
        "random",
        "--profile-prompts",
        "1",
        "--timing-passes",
        "1",
        "--walk-prompts",
        "1",
        "--no-oracle",
        "--out",
        str(out),
        "--ranking-out",
        str(tmp_path / "ranking.json"),
        "--resume",
        str(tmp_path / "runs.jsonl"),
    ]
    assert planner_eval.main(args) == 0
    table = capsys.readouterr().out
    assert "kendall_tau" in table and "adaptive at 256" in table
    doc = json.loads(out.read_text())
    ranking = json.loads((tmp_path / "ranking.json").read_text())
    reg = doc["regimes"]["<=4K"]
    assert reg["n"] == len(reg["strategies"]) == 3
    assert -1 <= reg["kendall_tau"] <= 1 and 0 <= reg["regret"] < 1
    ids = [r["id"] for r in ranking["regimes"]["<=4K"]["ranking"]]
    for row in reg["strategies"]:
        m = row["measured"]
        assert math.isfinite(m["tokens_per_s"]) and m["tokens_per_s"] > 0
        assert m["runs_window"] == [1] and m["runs_tokens_per_s"] == [m["tokens_per_s"]]
        assert row["predicted_tokens_per_s"] > 0 and ids[row["offline_rank"]] == row["id"]
    prof = doc["profile"]["regimes"]["<=4K"]
    acc = prof["acceptance"]
    assert {"draft_model", "ngram"} <= set(acc) and all(0 <= a <= 1 for a in acc.values())
    walked = {
        k: v for k, v in doc["profile_chain_tokens"]["<=4K"].items() if k.startswith("ngram@")
    }
    assert len(walked) == 4 and {v["walked_prompts"] for v in walked.values()} == {1 + 1}
    assert all(v["walked"] >= 1 and v["used"] == v["walked"] for v in walked.values())
    # The sparse strategies ran: a factor per drafter and attention key.
    per_key = doc["profile_attention_factor_per_key"]["<=4K"]
    assert set(per_key) == {"draft_model", "ngram"} == {k.split("@")[0] for k in prof["attention"]}
    for factors in per_key.values():
        assert set(factors) == {f"exact:nsa32s16:top4x64w512:r{r}" for r in (1, 2)}
        assert all(math.isfinite(f) and f >= 0 for f in factors.values())
    assert set(prof["overlap"]) == {"bfs"} and 0 <= prof["overlap"]["bfs"] <= 1
    assert "overhead" not in prof
    _loop_check_as_promised(doc["profile_loop_host"]["<=4K"])
    ((kind, row),) = doc["adaptive"]["prompt_sets"].items()
    assert kind == "random" and doc["adaptive_gain_off_distribution_mean"] == row["adaptive_gain"]
    for k in ("default", "offline_best", "adaptive"):
        assert row[k]["tokens_per_s"] > 0
    assert row["offline_best"]["id"] == ids[0] and "oracle" not in row
    assert doc["adaptive_ceiling"] is None
    # No CUDA graphs on the CPU, so no capture rounds: counting them changes nothing.
    assert row["adaptive"]["capture_rounds"] == 0
    assert row["adaptive_gain_captures_counted"] == pytest.approx(row["adaptive_gain"])
    # Adaptive runs keep both drafters warm and record what the n-gram shadow saw.
    (run,) = row["adaptive"]["runs"]
    assert run["warm_s"] > 0 and isinstance(run["switches"], list)
    shadow = run["shadow"]["ngram"]
    assert shadow["positions"] > 0
    chains = [f"chain:{k}" for k in range(1, 9)]
    tpr = [shadow["tokens_per_round"][k] for k in chains]
    assert tpr == sorted(tpr) and 1 <= tpr[0] and tpr[-1] <= 9
    # and the n-gram trees among the candidates, from their own walks
    trees = set(shadow["tokens_per_round"]) - set(chains)
    assert trees and trees == {t for t in trees if len(parse_tree(t)) > 1}
    assert all(1 <= shadow["tokens_per_round"][t] for t in trees)
    # A fixed strategy has no shadow and never switches; the controller's host time is
    # counted for every run alike.
    best = row["offline_best"]
    assert "shadow" not in best and best["switch_s"] == 0 and best["control_s"] >= 0
    # Switch costs the timed runs knew: per destination kind, from the untimed runs.
    known = row["adaptive"]["known_switch_cost_s"]
    assert isinstance(known, dict) and all(v >= 0 for v in known.values())
    assert {"cold", "warm"} <= set(row["adaptive"])
    assert doc["provenance"]["runs_from_cache"] == 0
    # Re-scored from its runs on the CPU by the same code: the very figures it recorded.
    kept = [json.loads(x)["value"] for x in (tmp_path / "runs.jsonl").read_text().splitlines()[1:]]
    kept = [v for v in kept if "text" in v]
    assert kept and all(isinstance(v["prompt_crc32"], int) for v in kept)
    again = rescore.rescore(tmp_path / "runs.jsonl", out)["<=4K"]
    assert again["kendall_tau"] == reg["kendall_tau"] and again["regret"] == reg["regret"]
    # The same command again resumes from the run cache: no run is decoded again, and the
    # evaluation is the same document.
    n_runs = len((tmp_path / "runs.jsonl").read_text().splitlines()) - 1
    assert planner_eval.main(args) == 0
    assert f"resuming: {n_runs} runs" in capsys.readouterr().out
    again = json.loads(out.read_text())
    assert again["provenance"]["runs_from_cache"] == n_runs
    assert {k: v for k, v in again.items() if k != "provenance"} == {
        k: v for k, v in doc.items() if k != "provenance"
    }
    # The adaptive phase alone on the evaluation's own profile (``--adaptive-from``): the same
    # offline best, from the same cached runs, the same figures; each set's shadow and
    # verify time per round in the table.
    alone = tmp_path / "adaptive.json"
    from_args = [*args[: args.index("--out")], "--out", str(alone), "--resume", args[-1]]
    assert planner_eval.main([*from_args, "--adaptive-from", str(out)]) == 0
    table = capsys.readouterr().out
    assert "adaptive at 256" in table and "shadow us/round" in table and "differs" not in table
    phase = json.loads(alone.read_text())
    assert phase["adaptive"] == doc["adaptive"] and phase["from"] == str(out.name)
    assert phase["offline_best_before"] == {"random": row["offline_best"]["id"]}
    assert planner_eval.main([*from_args, "--adaptive-from", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert planner_eval.main([*from_args, "--adaptive-from", str(out), "--batch", "2"]) == 2
    assert "was evaluated at batch 1, not 2" in capsys.readouterr().err
    # Other settings with that cache: refused before any run, the output left alone.
    out.unlink()
    assert planner_eval.main([*args, "--new-tokens", "9"]) == 2
    assert "written for other settings" in capsys.readouterr().err and not out.exists()


def test_evaluation_asks_for_every_run_in_whole_passes(tmp_path, monkeypatch):
    """``evaluate`` at the evaluation's own kind of settings (two drafters, three trees, a 1K
    context, three profile prompts and two walk prompts, two timing passes, two measured
    texts, two prompt sets, the oracle) on injected decodes (``FakeDecodes``): each phase asks
    for the runs it should, every timed run goes in two whole passes and keeps its least
    disturbed, and a second call with the run cache decodes nothing and gives the same
    document."""
    from ssvkit.validation import bench as vb
    from ssvkit.validation import evaluate as ev

    fake = FakeDecodes()
    monkeypatch.setattr(vb, "run_once", fake)
    bench = vb.make_bench("tiny", "tiny-draft", 1024, 12, 1, "cpu", temperature=1.0)
    bench.log = lambda m: None
    bench.timing_passes, bench.measure_texts = 2, 2
    bench.cache = vb.RunCache(tmp_path / "runs.jsonl", {"decodes": "fake"})
    space = SpaceSpec(
        drafters=("draft_model", "ngram"),
        trees=("chain:0", "chain:3", "best:8:4"),
        draft_model=bench.draft_label,
    )
    settings = dict(
        per_regime=4,
        adaptive_context=1024,
        prompt_sets=("code", "random"),
        profile_prompts=3,
        walk_prompts=2,
        controller=ControllerConfig(),
    )
    doc, ranking = ev.evaluate(bench, {"<=4K": 1024}, space, **settings)
    assert set(doc["kendall_tau"]) == set(doc["regret"]) == {"<=4K"}
    reg = doc["regimes"]["<=4K"]
    assert reg["n"] == len(reg["strategies"]) == 4
    assert -1 <= reg["kendall_tau"] <= 1 and 0 <= reg["regret"] < 1
    ids = [r["id"] for r in ranking["regimes"]["<=4K"]["ranking"]]
    for row in reg["strategies"]:
        m = row["measured"]
        assert math.isfinite(m["tokens_per_s"]) and m["tokens_per_s"] > 0
        # Two measured texts: the first two prompt windows (validation.prompts.MEASURE_OFFSETS),
        # one run each (seeds 0 and 1), pooled.
        assert m["runs_window"] == [1, 7] and len(m["runs_tokens_per_s"]) == 2
        assert min(m["runs_tokens_per_s"]) <= m["tokens_per_s"] <= max(m["runs_tokens_per_s"])
        assert row["predicted_tokens_per_s"] > 0 and ids[row["offline_rank"]] == row["id"]
    assert [r["offline_rank"] for r in reg["strategies"]][:3] == [0, 1, 2]
    assert reg["measurement"]["windows"] == 2 and reg["measurement"]["pair_ratio_se"] >= 0
    prof = doc["profile"]["regimes"]["<=4K"]
    acc = prof["acceptance"]
    assert {"draft_model", "ngram"} <= set(acc) and all(0 <= a <= 1 for a in acc.values())
    # Every drafter on every tree with drafts (chain:0 drafts nothing), dense, and on the
    # attention factors' tree (best:16:6).
    for kind, resolved in (("draft_model", 2), ("ngram", 2)):
        assert {f"{kind}@chain:3"} <= set(acc)
        assert sum(k.startswith(f"{kind}@parents:") for k in acc) == resolved
    # The chains' tokens per round pooled over the drafter's chains at least as long:
    # chain:3 from the 3 prompts' runs of chain:3 and of the reference chain:4, chain:4
    # (the longest) from its own, which pooling leaves as they are.
    chains = doc["profile_chain_tokens"]["<=4K"]
    for kind in ("draft_model", "ngram"):
        c3, c4 = chains[f"{kind}@chain:3"], chains[f"{kind}@chain:4"]
        assert (c3["runs"], c4["runs"]) == (6, 3)
        assert c4["pooled"] == pytest.approx(c4["own"]) and 1 <= c3["pooled"] <= 4
        if kind == "draft_model":
            assert c4["used"] == c4["pooled"] and c3["used"] == c3["pooled"]
        assert acc[f"{kind}@chain:3"] == pytest.approx(alpha_from_tokens("chain:3", c3["used"]))
    # The n-gram drafter's trees, chains and branching ones, from their walks over the texts
    # of every dense profile run (engine.ngram_shadow.walk_text), each tree's own runs beside them.
    walked = {k: v for k, v in chains.items() if k.startswith("ngram@")}
    assert len(walked) == 4 and {k for k in acc if k.startswith("ngram@")} == set(walked)
    texts = {v["walked_texts"] for v in walked.values()}
    assert len(texts) == 1 and texts.pop() >= 3 * 5 + 2  # 3 prompts x (chains, trees, AR) at
    # least, and one autoregressive text on each of the 2 walk prompts
    assert {v["walked_prompts"] for v in walked.values()} == {3 + 2}
    assert doc["profile_walk_prompts"] == 2
    for k, v in walked.items():
        assert v["used"] == v["walked"] and 1 <= v["walked"] and v["own"] >= 1
        assert acc[k] == pytest.approx(alpha_from_tokens(k.split("@")[1], v["walked"]))
    # A factor per drafter and attention key of the space's valid sparse strategies at 1K
    # (top16 x 64 fits, top32 x 64 does not; NSA selects per row whatever the grouping):
    # refresh every 1, 2, 4 and 8.
    # The profile holds each drafter's median over the keys; the keys' own beside it.
    att = prof["attention"]
    assert set(att) == {"draft_model@sparse", "ngram@sparse"}
    per_key = doc["profile_attention_factor_per_key"]["<=4K"]
    for kind, factors in per_key.items():
        assert len(factors) == 4 and all(
            k.startswith("exact:nsa32s16:top16x64w512:r") for k in factors
        )
        assert all(math.isfinite(f) and f >= 0 for f in factors.values())
        assert att[f"{kind}@sparse"] == pytest.approx(float(np.median(list(factors.values()))))
    # Acceptance from 3 code prompts per drafter and tree (4 trees with drafts, 2 drafters),
    # each a run of the loop host check too.
    assert doc["profile_prompts"] == 3
    assert _loop_check_as_promised(doc["profile_loop_host"]["<=4K"]) >= 3 * 4 + 1 + 8
    keys = [json.loads(x)["key"] for x in (tmp_path / "runs.jsonl").read_text().splitlines()[1:]]
    per_prompt = [
        {k.split("|")[-1] for k in keys if k.startswith(f"profile|1024|p{j}|")} for j in (1, 2)
    ]
    assert per_prompt[0] == per_prompt[1] and len(per_prompt[0]) >= 7, keys
    a = doc["adaptive"]["prompt_sets"]
    assert set(a) == {"code", "random"} == set(doc["adaptive_gain"])
    for row in a.values():
        for k in ("default", "offline_best", "adaptive"):
            assert row[k]["tokens_per_s"] > 0
        assert row["offline_best"]["id"] == ids[0]
        assert row["adaptive_gain"] == pytest.approx(
            row["adaptive"]["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1
        )
        known = row["adaptive"]["known_switch_cost_s"]
        assert isinstance(known, dict) and all(v >= 0 for v in known.values())
        assert {"cold", "warm"} <= set(row["adaptive"])
        # The oracle: each (drafter, tree) at its best-ranked attention, AR once; the offline
        # best among them, from the very runs it was measured with, so the ceiling is >= 0.
        o = row["oracle"]
        fixed = {x["id"]: x for x in o["strategies"]}
        assert len(fixed) == len(o["strategies"]) == 2 * 2 + 1
        assert fixed[ids[0]]["tokens_per_s"] == row["offline_best"]["tokens_per_s"]
        assert o["tokens_per_s"] == max(x["tokens_per_s"] for x in fixed.values())
        assert o["ceiling"] == pytest.approx(o["tokens_per_s"] / fixed[ids[0]]["tokens_per_s"] - 1)
        assert o["ceiling"] >= 0 and fixed[o["best"]]["describe"] == o["describe"]
    assert doc["adaptive_ceiling"] == {k: v["oracle"]["ceiling"] for k, v in a.items()}
    assert doc["adaptive_gain_captures_counted"] == {
        k: v["adaptive_gain_captures_counted"] for k, v in a.items()
    }
    assert doc["adaptive_gain_off_distribution_mean"] == pytest.approx(a["random"]["adaptive_gain"])
    assert set(doc["met"]) == {"kendall_tau", "regret", "adaptive_gain_off_distribution"}
    # Two timing passes of every measured and adaptive run and of every steady profile run
    # (the loop host check's), the second cached as "|t1"; the profile's selection-statistics
    # runs (gamma) and the walks' texts go once.
    assert doc["timing_passes"] == doc["profile_timing_passes"] == 2
    steady = ("measure|", "adapt|", "profile|", "attention|", "attention-dense|")
    timed = [
        k
        for k in keys
        if k.startswith(steady)
        and "|cold|" not in k
        and "|warm|" not in k
        and not k.endswith("|t1")
    ]
    assert any(k.startswith("profile|") for k in timed)
    assert timed and {f"{k}|t1" for k in timed} == {k for k in keys if k.endswith("|t1")}
    assert any(k.startswith("overlap|") for k in keys)
    assert not any(k.startswith(("overlap|", "walk|")) and k.endswith("|t1") for k in keys)
    # Each decode went once per pass; its first pass ran slow, so every figure is the
    # second's, and both passes decoded alike.
    assert set(fake.runs.values()) <= {1, 2} and 2 in fake.runs.values()
    check = doc["profile_loop_host"]["<=4K"]
    assert check["timing_passes"] == 2 and check["passes_kept_min"] == 2
    for row in a.values():
        (run,) = row["adaptive"]["runs"]
        slow, fast = run["passes_tokens_per_s"]
        assert run["passes_kept"] == 2 and run["tokens_per_s"] == fast
        assert fast == pytest.approx(FakeDecodes.SLOW * slow)
    # Again with the run cache: nothing decoded, the same document.
    decoded = dict(fake.runs)
    again, _ = ev.evaluate(bench, {"<=4K": 1024}, space, **settings)
    assert fake.runs == decoded and bench.cache.reused == len(keys)
    assert {k: v for k, v in again.items() if k != "provenance"} == {
        k: v for k, v in doc.items() if k != "provenance"
    }


def test_walk_ngram_weighs_each_prompt_alike():
    """Texts of one prompt count as one text's worth together (their sums over their number),
    so a prompt decoded by many runs does not outweigh one decoded once."""
    from ssvkit.engine.ngram_shadow import walk_text

    class B:
        log = staticmethod(lambda m: None)

        @staticmethod
        def decode():
            return type("D", (), {"ngram_max_n": 3})()

    rng = np.random.default_rng(0)
    rep = [int(x) for x in rng.integers(0, 8, 40)]
    loud = (rep * 4, [rep[:30] * 3, rep[5:35] * 3, rep[:20] * 4])  # repeats: n-gram hits
    quiet = (
        [int(x) for x in rng.integers(0, 256, 160)],
        [[int(x) for x in rng.integers(0, 256, 90)]],
    )
    pairs = [(loud[0], t) for t in loud[1]] + [(quiet[0], quiet[1][0])]
    specs = ("chain:3", "parents:-1,-1,0,1")
    a = {f"ngram@{sp}": 0.5 for sp in specs}
    record: dict = {}
    walk_ngram(B(), "<=4K", a, [], [], {}, record, pairs)
    for sp in specs:
        per = [walk_text(p, t, (sp,))[sp] for p, t in pairs]
        loud_r = np.mean([r for r, _ in per[:3]]), np.mean([d for _, d in per[:3]])
        want = 1 + (loud_r[1] + per[3][1]) / (loud_r[0] + per[3][0])
        pooled = 1 + sum(d for _, d in per) / sum(r for r, _ in per)
        got = record["<=4K"][f"ngram@{sp}"]
        assert got["walked"] == pytest.approx(want) and got["walked"] != pytest.approx(pooled)
        assert (got["walked_texts"], got["walked_prompts"]) == (4, 2)
        assert a[f"ngram@{sp}"] == pytest.approx(alpha_from_tokens(sp, want))
    # A kept text whose prompt CRC is not this prompt's (a run cache from a machine whose
    # package sources, the code corpus, differ) is refused, not walked after the wrong prompt.
    from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

    s = Strategy(name="x", tree="chain:3", drafter=DrafterSpec(kind="ngram"))
    ok = {"text": loud[1][0], "prompt_crc32": prompt_crc32(loud[0])}
    walk_ngram(B(), "<=4K", dict(a), [(s, ok)], [[loud[0]]], {}, {})
    with pytest.raises(ValueError, match="another prompt than this machine's corpus"):
        walk_ngram(B(), "<=4K", dict(a), [(s, ok)], [[quiet[0]]], {}, {})


def test_measurement_resolution_resamples_the_windows_jointly():
    """Strategies whose runs move together window by window (the prompt sets the pace) are
    told apart exactly however much the windows differ; independent noise blurs them; rows
    without runs per window, or on different windows, give None."""
    rng = np.random.default_rng(1)
    pace = rng.uniform(1000, 3000, 10)  # per window
    speed = np.array([1.0, 0.97, 0.95, 0.9, 0.8, 0.7])

    def rows(runs):
        return [
            {
                "predicted_tokens_per_s": 10.0 - i,
                "measured": {
                    "runs_window": list(range(10)),
                    "runs_tokens_per_s": list(r),
                    "tokens_per_s": float(len(r) / np.sum(1.0 / r)),
                },
            }
            for i, r in enumerate(runs)
        ]

    tied = measurement_resolution(rows([f * pace for f in speed]))
    assert tied["windows"] == 10 and tied["pair_ratio_se"] == pytest.approx(0.0, abs=1e-12)
    assert tied["draw_regret_mean"] == tied["draw_regret_p90"] == 0.0
    noisy = measurement_resolution(rows([f * pace * rng.lognormal(0, 0.1, 10) for f in speed]))
    assert 0.01 < noisy["pair_ratio_se"] < 0.1 and 0 <= noisy["draw_regret_p90"] < 0.2
    bare = rows([f * pace for f in speed])
    del bare[2]["measured"]["runs_window"]
    assert measurement_resolution(bare) is None
    moved = rows([f * pace for f in speed])
    moved[0]["measured"]["runs_window"] = list(range(1, 11))
    assert measurement_resolution(moved) is None
    # Runs with full-batch figures are resampled on those (what the regime is scored on).
    full = rows([f * pace * rng.lognormal(0, 0.1, 10) for f in speed])
    for r, f in zip(full, speed, strict=True):
        r["measured"]["runs_full_batch_tokens_per_s"] = list(f * pace)
        r["measured"]["full_batch_tokens_per_s"] = float(10 / np.sum(1.0 / (f * pace)))
    assert measurement_resolution(full)["pair_ratio_se"] == pytest.approx(0.0, abs=1e-12)
    full[0]["measured"]["runs_full_batch_tokens_per_s"][3] = None
    assert measurement_resolution(full)["pair_ratio_se"] > 0.01


def _adaptive_row(best, adaptive, others=()):
    """A prompt set's entry as ``evaluate_adaptive`` writes it (the figures the resolution
    reads): runs per seed, the recorded medians."""
    fixed = [("s-best", best), *((f"s-{i}", r) for i, r in enumerate(others))]
    strategies = [
        {
            "id": i,
            "describe": f"fixed {i}",
            "tokens_per_s": float(np.median(r)),
            "runs_tokens_per_s": list(r),
        }
        for i, r in fixed
    ]
    return {
        "offline_best": {
            "id": "s-best",
            "tokens_per_s": float(np.median(best)),
            "runs_tokens_per_s": list(best),
        },
        "adaptive": {
            "tokens_per_s": float(np.median(adaptive)),
            "runs": [{"tokens_per_s": float(x)} for x in adaptive],
        },
        "oracle": {"strategies": strategies},
    }


def test_adaptive_resolution_pairs_the_seeds():
    """A controller run that gains the same over the offline best's run of its seed is measured
    exactly, however much the seeds differ; independent noise widens the interval around the
    recorded gain; the strongest fixed alternative is the best other than the offline best,
    measured the same way; runs that do not pair up give None."""
    rng = np.random.default_rng(3)
    pace = rng.uniform(1000, 3000, 5)  # per seed
    row = _adaptive_row(pace, 1.1 * pace, [0.9 * pace, 1.05 * pace])
    m = adaptive_resolution(row)
    assert m["seeds"] == 5 and m["paired_gains"] == pytest.approx([0.1] * 5)
    assert m["gain"] == pytest.approx(0.1)
    assert m["gain_p05"] == pytest.approx(0.1) and m["gain_p95"] == pytest.approx(0.1)
    c = m["challenger"]
    assert c["id"] == "s-1" and c["gain"] == pytest.approx(0.05)
    assert c["gain_p05"] == pytest.approx(0.05) and c["gain_p95"] == pytest.approx(0.05)
    assert m["hindsight"]["strategies"] == 3 and m["hindsight"]["gain"] == pytest.approx(0.05)
    # Per seed, the fastest of them after the fact: here each alternative wins some seeds.
    swap = np.array([1.2, 0.8, 1.2, 0.8, 1.0])
    h = adaptive_resolution(_adaptive_row(pace, pace, [swap * pace, pace / swap]))["hindsight"]
    assert h["paired_gains"] == pytest.approx([0.2, 0.25, 0.2, 0.25, 0.0])
    assert h["gain"] == pytest.approx(
        np.median(pace * [1.2, 1.25, 1.2, 1.25, 1.0]) / np.median(pace) - 1
    )
    noisy = _adaptive_row(pace, 1.1 * pace * rng.lognormal(0, 0.1, 5))
    n = adaptive_resolution(noisy)
    gain = noisy["adaptive"]["tokens_per_s"] / noisy["offline_best"]["tokens_per_s"] - 1
    assert n["gain"] == pytest.approx(gain)
    assert n["gain_p05"] < gain < n["gain_p95"] and n["gain_p95"] - n["gain_p05"] > 0.02
    assert "challenger" not in n and "hindsight" not in n  # the oracle ran only the best
    short = _adaptive_row(pace, 1.1 * pace)
    short["adaptive"]["runs"].pop()
    assert adaptive_resolution(short) is None
    bare = _adaptive_row(pace, 1.1 * pace)
    del bare["offline_best"]["runs_tokens_per_s"]
    assert adaptive_resolution(bare) is None and set_resolution(bare) is None
    # A recorded resolution is read as it is; the summary table prints the interval.
    row["resolution"] = {**m, "gain_p05": -0.5}
    assert set_resolution(row)["gain_p05"] == -0.5


def test_summary_table_gives_the_adaptive_interval():
    doc = json.loads(record_path("planner.json").read_text())
    table = summary_table(doc)
    for k, v in doc["adaptive"]["prompt_sets"].items():
        m = set_resolution(v)
        line = next(x for x in table.splitlines() if x.startswith(k))
        assert f"{m['gain_p05']:+6.1%}..{m['gain_p95']:+6.1%}" in line


def test_walk_windows_lie_past_the_others_and_inside_the_corpus():
    """The walk prompts' windows are none of the profile's, the measured ones or the adaptive
    phase's (window 2), and like the measured ones stay inside the corpus."""
    assert not set(WALK_OFFSETS) & {*PROFILE_OFFSETS, *MEASURE_OFFSETS, 2}
    assert walk_windows(1000, 5, available=lambda limit: limit) == WALK_OFFSETS[:5]
    assert walk_windows(1000, 0, available=lambda limit: limit) == ()
    # 34 windows of 1000 tokens fit in 34000 bytes: windows 31-33 of the walks.
    assert walk_windows(1000, 20, available=lambda limit: 34_000) == (31, 32, 33)
    assert walk_windows(1000, 20, available=lambda limit: 30_000) == ()
    with pytest.raises(ValueError, match="walk prompts must lie in 0..40, got 41"):
        walk_windows(1000, 41, available=lambda limit: limit)


def test_measured_windows_stay_inside_the_corpus():
    """A measured prompt window that would run past the corpus's end repeats its start (where
    the profile's prompts are): such windows are left out, the rest taken in order."""
    assert measure_windows(1000, 3, available=lambda limit: limit) == MEASURE_OFFSETS[:3]
    assert measure_windows(1000, 20, available=lambda limit: limit) == MEASURE_OFFSETS
    # 17 windows of 1000 tokens fit in 17000 bytes: windows 16 and below.
    assert measure_windows(1000, 10, available=lambda limit: 17_000) == (1, 7, 8, 9, 10, 16)
    assert measure_windows(1000, 2, available=lambda limit: 17_000) == (1, 7)
    with pytest.raises(ValueError, match="no measured prompt window of 1000 tokens"):
        measure_windows(1000, 5, available=lambda limit: 1500)
    assert measure_windows(1000, 10, available=lambda limit: limit) == MEASURE_OFFSETS[:10]
    assert MEASURE_OFFSETS[:10] == (1, 7, 8, 9, 10, 16, 17, 18, 19, 20)  # the first ten
    with pytest.raises(ValueError, match="measured texts must lie in 1..20, got 21"):
        measure_windows(1000, 21, available=lambda limit: limit)


def test_run_cache_resumes_and_drops_a_cut_off_tail(tmp_path):
    from ssvkit.validation.bench import RunCache

    path = tmp_path / "c.jsonl"
    c = RunCache(path, {"a": 1})
    calls = []
    assert c.get("k1", lambda: calls.append(1) or {"x": 1.5}) == {"x": 1.5}
    assert c.get("k1", lambda: calls.append(1) or {"x": 9}) == {"x": 1.5} and calls == [1]
    c.get("k2", lambda: {"x": 2})
    with open(path, "a") as fh:
        fh.write('{"key": "k3", "val')  # killed while writing
    c2 = RunCache(path, {"a": 1})
    assert c2.runs == {"k1": {"x": 1.5}, "k2": {"x": 2}} and c2.reused == 0
    assert c2.get("k3", lambda: {"x": 3}) == {"x": 3}
    assert RunCache(path, {"a": 1}).runs["k3"] == {"x": 3}
    with pytest.raises(ValueError, match="other settings"):
        RunCache(path, {"a": 2})
    with pytest.raises(ValueError, match="does not exist"):
        RunCache(tmp_path / "no" / "c.jsonl", {})


def test_decode_adapts_online_from_a_ranking(tmp_path, capsys):
    """``ssvkit decode --ranking``: starts from the regime's offline best of a ranking of the
    trained pair and reports the controller's switches."""
    from ssvkit.cli import main

    ck = ROOT / "engine" / "checkpoints"
    ranking = tmp_path / "r.json"
    argv = [
        "rank",
        "--model",
        str(ck / "tiny-target"),
        "--drafters",
        "ngram,draft_model",
        "--draft-model",
        str(ck / "tiny-draft"),
        "--trees",
        "chain:0,chain:3,best:8:4",
        "--out",
        str(ranking),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    best = json.loads(ranking.read_text())["regimes"]["<=4K"]["ranking"][0]["strategy"]
    argv = [
        "decode",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--context",
        "600",
        "--max-new-tokens",
        "16",
        "--ranking",
        str(ranking),
    ]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == best and isinstance(out["switches"], list)
    assert out["note"].startswith("strategy: the offline best of")
    assert main(argv) == 0
    assert "online controller:" in capsys.readouterr().out


def test_an_adaptive_context_whose_regime_is_not_ranked_is_refused(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert planner_eval.main(["--plan", "--contexts", "2K", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--adaptive-context 15360 falls in regime 16K" in err and "Traceback" not in err
    assert not out.exists()
