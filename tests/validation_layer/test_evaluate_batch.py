"""The planner evaluation at batch > 1: every phase decodes batches of prompts and counts their
tokens, the measured strategies include sparse and dense ones, the ranking and the controller
work at the batch, a run stopped by ``--stop-after`` goes on from its cache, and ``--plan``
counts the decodes the evaluation asks for."""

import functools
import gc
import json
import math

import pytest
from fake_decodes import FakeDecodes
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.rank import score, strategy_from_json
from ssvkit.planner.space import SpaceSpec
from ssvkit.validation import planner_eval, rescore
from ssvkit.validation.prompts import (
    MEASURE_OFFSETS,
    PROFILE_OFFSETS,
    WALK_OFFSETS,
    adaptive_windows,
    batch_windows,
    code_prompts,
    prompt_crc32,
    prompt_tokens,
    reuse_line,
    set_prompts,
)
from ssvkit.validation.stats import family


def test_a_phase_takes_its_windows_in_turn_and_says_when_it_reuses_them():
    assert batch_windows((5, 6, 7), 4, 1) == [(5,), (6,), (7,), (5,)]
    assert batch_windows((5, 6, 7), 2, 2) == [(5, 6), (7, 5)]
    assert batch_windows((1, 7, 8, 9, 10), 2, 4) == [(1, 7, 8, 9), (10, 1, 7, 8)]
    with pytest.raises(ValueError, match="no prompt window"):
        batch_windows((), 1, 2)
    assert reuse_line("m", (1, 2, 3), 1, 3, 100) is None
    line = reuse_line("16K measured", (1, 2, 3), 2, 32, 15360)
    assert line == (
        "16K measured: 64 sequences over 3 prompt windows of 15360 tokens (a window decoded "
        "by up to 22 sequences, each drawing its own samples)"
    )


def test_the_adaptive_batch_of_each_prompt_set():
    """At batch 1 every set's prompt is its window 2 (the evaluation of record's); at batch B
    code takes window 2 and the walk windows the walks leave, the other sets windows 2, 3, ..."""
    assert adaptive_windows(100, 1, 5) == (2,)
    assert adaptive_windows(100, 3, 5, available=lambda limit: limit) == (2, *WALK_OFFSETS[5:])
    assert adaptive_windows(1000, 3, 0, available=lambda limit: 33_000) == (2, 31, 32)
    for kind in ("code", "prose", "repetitive", "random"):
        assert set_prompts(kind, 300, 1, (2,)) == [prompt_tokens(kind, 300, offset=600)]
    code = set_prompts("code", 300, 3, (2, 40))
    assert code == code_prompts(300, (2, 40, 2))
    prose = set_prompts("prose", 300, 2, (2,))
    assert prose == [prompt_tokens("prose", 300, offset=o) for o in (600, 900)]
    assert prose[0] != prose[1]


def _settings(**kw):
    return dict(
        per_regime=10,
        adaptive_context=1024,
        prompt_sets=("code", "random"),
        profile_prompts=1,
        walk_prompts=2,
        controller=ControllerConfig(),
        **kw,
    )


def test_every_phase_decodes_batches_of_prompts_and_counts_their_tokens(tmp_path, monkeypatch):
    """``evaluate`` at batch 2 on injected decodes (``FakeDecodes``): every decode gets two
    prompts -- the profile's first windows, the measured runs' windows in turn, the adaptive
    sets' batches --, each run's tokens are both sequences', the ranking and the predictions
    are the batch's, and the measured strategies hold the best sparse and dense ones."""
    from ssvkit.validation import bench as vb
    from ssvkit.validation import evaluate as ev

    fake = FakeDecodes()
    monkeypatch.setattr(vb, "run_once", fake)
    bench = vb.make_bench("tiny", "tiny-draft", 1024, 12, 1, "cpu", temperature=1.0, batch=2)
    bench.log = lambda m: None
    bench.measure_texts = 2
    bench.cache = vb.RunCache(tmp_path / "runs.jsonl", {"decodes": "fake", "batch": 2})
    space = SpaceSpec(
        drafters=("draft_model", "ngram"),
        trees=("chain:0", "chain:3", "best:8:4"),
        draft_model=bench.draft_label,
    )
    doc, ranking = ev.evaluate(bench, {"<=4K": 1024}, space, **_settings())
    assert doc["batch"] == ranking["batch"] == 2
    assert fake.batches and all(len(b) == 2 for b in fake.batches)
    crcs = {tuple(prompt_crc32(p) for p in b) for b in fake.batches}
    assert tuple(prompt_crc32(p) for p in code_prompts(1024, PROFILE_OFFSETS[:2])) in crcs
    reg = doc["regimes"]["<=4K"]
    assert reg["measure_windows"] == [list(MEASURE_OFFSETS[:2]), list(MEASURE_OFFSETS[2:4])]
    for ws in reg["measure_windows"]:
        assert tuple(prompt_crc32(p) for p in code_prompts(1024, tuple(ws))) in crcs
    ranked = ranking["regimes"]["<=4K"]["ranking"]
    by_id = {r["id"]: strategy_from_json(r["strategy"]) for r in ranked}
    strategies = list(by_id.values())
    measured = [by_id[r["id"]] for r in reg["strategies"]]
    # The best of every family is measured, sparse and dense alike.
    best_of = {}
    for s in strategies:
        best_of.setdefault(family(s), s)
    assert set(best_of.values()) <= set(measured) and {s.is_sparse for s in measured} == {
        True,
        False,
    }
    for row, s in zip(reg["strategies"], measured, strict=True):
        m = row["measured"]
        # Two runs of two sequences of 12 tokens, less each run's first round (<= 2 x 5).
        assert 2 * (2 * 12 - 2 * 5) <= m["tokens"] <= 2 * 2 * 12
        # the CPU bench runs the torch backend: its element-wise ops are torch's
        assert bench.elementwise == "torch" and doc["provenance"]["backend"] == "torch"
        kw = {"elementwise": bench.elementwise}
        (p,), _ = score(bench.model, bench.gpu, [s], 1024, _profile(doc), "<=4K", 2, **kw)
        assert row["predicted_tokens_per_s"] == pytest.approx(p.tokens_per_s)
    a = doc["adaptive"]["prompt_sets"]
    code = tuple(
        prompt_crc32(p) for p in set_prompts("code", 1024, 2, adaptive_windows(1024, 2, 2))
    )
    rand = tuple(prompt_crc32(p) for p in set_prompts("random", 1024, 2, (2,)))
    assert code in crcs and rand in crcs
    for row in a.values():
        assert row["adaptive"]["tokens_per_s"] > 0 and row["offline_best"]["tokens"] > 12
    # The run cache keeps every sequence's text with its prompt's CRC-32.
    kept = [json.loads(x)["value"] for x in (tmp_path / "runs.jsonl").read_text().splitlines()[1:]]
    texts = [v for v in kept if "texts" in v]
    assert texts and all(len(v["texts"]) == len(v["prompt_crc32s"]) == 2 for v in texts)
    assert not any("text" in v for v in kept)
    # ``ssvkit rank --evaluation`` ranks at the evaluation's batch: the ranking it measured.
    from ssvkit.cli import main

    path, again = tmp_path / "eval.json", tmp_path / "again.json"
    path.write_text(json.dumps(doc))
    assert main(["rank", "--evaluation", str(path), "--json", "--out", str(again)]) == 0
    got = json.loads(again.read_text())
    rows = lambda e: [(r["describe"], r["tokens_per_s"]) for r in e["ranking"]]  # noqa: E731
    assert got["batch"] == 2 and rows(got["regimes"]["<=4K"]) == rows(ranking["regimes"]["<=4K"])


def _profile(doc):
    from ssvkit.planner.profile import profile_from_json

    return profile_from_json(doc["profile"], "the evaluation's profile", "x")


def test_stop_after_leaves_the_runs_in_the_cache_and_the_same_command_goes_on(
    tmp_path, capsys, monkeypatch
):
    from ssvkit.validation import bench as vb

    monkeypatch.setenv("SSVKIT_GIT_COMMIT", "feedbee")
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    fake = FakeDecodes()
    monkeypatch.setattr(vb, "run_once", fake)
    space = functools.partial(SpaceSpec, top_ns=(4, 8), refresh_every=(1, 2))
    monkeypatch.setattr(planner_eval, "SpaceSpec", space)
    out, runs = tmp_path / "p.json", tmp_path / "runs.jsonl"
    args = [
        "--batch", "2", "--contexts", "256", "--adaptive-context", "256", "--per-regime", "3",
        "--new-tokens", "8", "--trees", "chain:0,chain:3", "--prompt-sets", "random",
        "--device", "cpu", "--out", str(out), "--resume", str(runs),
    ]  # fmt: skip
    assert planner_eval.main([*args, "--stop-after", "0"]) == 3
    assert "stopped by --stop-after 0 before run" in capsys.readouterr().out
    assert not out.exists() and len(runs.read_text().splitlines()) == 1  # the settings alone
    assert planner_eval.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["batch"] == 2 and set(doc["regimes"]) == {"<=4K"}
    decoded = len(fake.batches)
    assert planner_eval.main(args) == 0  # everything from the cache
    assert len(fake.batches) == decoded
    assert planner_eval.main([*args[:-2], "--stop-after", "5"]) == 2
    assert "--stop-after 5.0 needs --resume" in capsys.readouterr().err


def test_batch_defaults_and_the_run_cache_of_batch_1():
    """Batch 1 keeps the evaluation of record's settings and run-cache keys; batch > 1 its
    own defaults, and the batch joins the cache's settings."""
    one = planner_eval.parse_args(["--out", "x"])
    assert (one.contexts, one.per_regime, one.new_tokens, one.measure_texts) == (
        "3584,7680,15360,30720",
        12,
        384,
        20,
    )
    assert (one.repeats, one.timing_passes, one.profile_prompts, one.adaptive_context) == (
        3,
        3,
        10,
        "15360",
    )
    assert "batch" not in planner_eval.cache_settings(one)
    many = planner_eval.parse_args(["--out", "x", "--batch", "32", "--repeats", "4"])
    assert many.contexts == "15360,30720" and many.repeats == 4 and many.timing_passes == 1
    assert planner_eval.cache_settings(many)["batch"] == 32


def test_plan_counts_the_decodes_the_evaluation_asks_for(capsys):
    """``--plan`` at batch 32: the measured decodes are per_regime x measure_texts x passes per
    regime, the adaptive ones per prompt set the cold and warm runs and repeats x passes of the
    controller, the default, the offline best and the oracle's; a decode of 32 sequences costs
    more than one of 1; the table names what it leaves out."""
    from ssvkit.validation.eval_plan import plan_table

    args = planner_eval.parse_args(["--batch", "32", "--gpu", "h200", "--plan"])
    p = planner_eval.plan_of(args)
    rows = {(r["phase"], r["regime"]): r for r in p["phases"]}
    for regime in ("16K", "32K"):
        assert rows[("measure", regime)]["decodes"] == 10 * 2 * 1
        assert rows[("profile", regime)]["seconds"] > 0
        # Sparse and dense strategies compete among the measured ones.
        names = p["measured"][regime]
        assert len(names) == 10 and any("| nsa |" in n for n in names)
        assert any(n.endswith("| dense") for n in names)
    adapt = rows[("adapt", "32K")]["decodes"]
    assert adapt % 4 == 0 and (adapt // 4 - 2) % 2 == 0 and adapt // 4 > 2 + 2 * 3
    one = planner_eval.plan_of(planner_eval.parse_args(["--gpu", "h200", "--plan"]))
    per = lambda q, ph: next(  # noqa: E731
        r["seconds"] / r["decodes"] for r in q["phases"] if (r["phase"], r["regime"]) == ph
    )
    assert per(p, ("measure", "16K")) > 2 * per(one, ("measure", "16K"))
    assert math.isfinite(p["seconds"]) and p["seconds"] == pytest.approx(
        sum(r["seconds"] for r in p["phases"])
    )
    text = plan_table(p, 32)
    assert "plan at batch 32" in text and "not counted: model load" in text
    assert planner_eval.main(["--batch", "32", "--gpu", "h200", "--plan"]) == 0
    assert "measured over predicted round" in capsys.readouterr().out


def test_planner_eval_at_batch_2_on_the_cpu(tmp_path, capsys, monkeypatch):
    """The evaluation decoding for real at batch 2 in its smallest configuration (one sparse
    key, one prompt set): the ranking, the measured strategies with tau and regret, the
    adaptive runs under the controller at batch 2, every run two sequences' tokens."""
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    space = functools.partial(SpaceSpec, top_ns=(4,), refresh_every=(1,))
    monkeypatch.setattr(planner_eval, "SpaceSpec", space)
    out, runs = tmp_path / "p.json", tmp_path / "runs.jsonl"
    args = [
        "--batch", "2", "--contexts", "256", "--adaptive-context", "256", "--per-regime", "3",
        "--new-tokens", "16", "--repeats", "1", "--measure-texts", "1", "--device", "cpu",
        "--trees", "chain:0,chain:3", "--prompt-sets", "random", "--walk-prompts", "1",
        "--no-oracle", "--out", str(out), "--ranking-out", str(tmp_path / "r.json"),
        "--resume", str(runs),
    ]  # fmt: skip
    assert planner_eval.main(args) == 0
    assert "kendall_tau" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["batch"] == 2 and json.loads((tmp_path / "r.json").read_text())["batch"] == 2
    reg = doc["regimes"]["<=4K"]
    assert reg["n"] == 3 and -1 <= reg["kendall_tau"] <= 1 and 0 <= reg["regret"] < 1
    assert reg["measure_windows"] == [list(MEASURE_OFFSETS[:2])]
    # Scored on the full-batch figures the runs recorded, the whole runs' beside them.
    assert reg["measured_figure"] == "full_batch" and -1 <= reg["whole_run"]["kendall_tau"] <= 1
    for row in reg["strategies"]:
        # One run of two sequences of 16 tokens, 15 of them from the rounds (the first root is
        # the prefill's), less the first round's (at most 2 x 4 on chain:3): more than one
        # sequence's 15.
        assert 15 < row["measured"]["tokens"] <= 2 * 15 and row["measured"]["tokens_per_s"] > 0
    row = doc["adaptive"]["prompt_sets"]["random"]
    (run,) = row["adaptive"]["runs"]
    assert run["tokens"] > 15 and run["shadow"]["ngram"]["positions"] > 15
    # Re-scored from its runs on the CPU at its batch: the very figures it recorded.
    again = rescore.rescore(runs, out)["<=4K"]
    assert again["kendall_tau"] == reg["kendall_tau"] and again["regret"] == reg["regret"]
    kept = [json.loads(x)["value"] for x in runs.read_text().splitlines()[1:]]
    assert all(
        len(v["texts"]) == 2 and all(len(t) == 16 for t in v["texts"]) for v in kept if "texts" in v
    )
    assert any(v.get("full_batch") for v in kept)
