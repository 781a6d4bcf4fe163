"""``ssvkit report``: the end-to-end validation report from the committed campaign, planner
evaluation and kernel rows."""

import json
import math
import re

import pytest
from ssvkit.validation import report as rpt
from ssvkit.validation.records import NSA_SCHEDULE, record_path
from ssvkit.validation.report_markdown import markdown

from ssvkit.cli import main


@pytest.fixture(scope="module")
def rep():
    return rpt.build()


def test_report_compares_every_baseline_at_every_context(rep):
    camp = json.loads(record_path("campaign.json").read_text())
    pairs = {(r["baseline"], r["context_len"]) for r in camp["rows"]}
    e = rep["e2e"]
    assert {(r["baseline"], r["context_len"]) for r in e["rows"]} == pairs
    assert {r["baseline"] for r in e["rows"]} == set(rpt.BASELINE_ORDER)
    for r in e["rows"]:
        for side in ("measured", "predicted"):
            for k in ("tokens_per_s", "verify_s", "round_s"):
                assert math.isfinite(r[side][k]) and r[side][k] > 0, (r["baseline"], side, k)
        # The prediction is at the measured acceptance: same tokens per round.
        assert r["predicted"]["tokens_per_round"] == pytest.approx(
            r["measured"]["tokens_per_round"], rel=1e-3
        )
        sim = r["simulated"]
        assert sim["rounds"] > 10 and sim["tokens_per_s"] > 0
    contexts = {c for _, c in pairs}
    assert len(e["speedups"]) == len(pairs) - len(contexts)  # all but ar_dense, per context
    for key in ("verify", "tokens_per_s", "round", "speedup", "simulator"):
        assert e[key]["n"] > 0 and 0 <= e[key]["median_ape"] <= e[key]["max_ape"]
    assert set(rep["targets"]) == set(rpt.TARGETS)
    for k, t in rep["targets"].items():
        assert t["threshold"] == rpt.TARGETS[k] and t["met"] == (t["value"] <= t["threshold"])
    assert rep["kernels"]["overall"]["heldout"]["n"] > 100
    assert set(rep["planner"]["kendall_tau"]) == set(rep["planner"]["regret"])


def test_each_run_is_priced_with_the_nsa_schedule_it_ran():
    """The committed campaign records the NSA schedule each run ran (one draft row a tile for
    the naive baseline, four for ssv's union C = 4) and each is priced with it; a run that
    records none (a campaign before the schedule was recorded ran packed row tiles) is priced
    with packed tiles, as the step model prices ``shared``. At the tiny pair's 3.5K context the
    naive baseline's two schedules' predictions differ, and only the one-row tiles take a
    stand-in class."""
    camp = json.loads(record_path("campaign.json").read_text())
    planner = json.loads(record_path("planner.json").read_text())
    keep = ("sd_sparse_naive", "ssv")
    camp["rows"] = [r for r in camp["rows"] if r["baseline"] in keep and r["context_len"] < 8192]
    assert {(r["baseline"], r[NSA_SCHEDULE]) for r in camp["rows"]} == {
        ("sd_sparse_naive", 1),
        ("ssv", 4),
    }
    as_measured = rpt.campaign_section(camp, planner, sim=False)["rows"]
    legacy = [{k: v for k, v in r.items() if k != NSA_SCHEDULE} for r in camp["rows"]]
    as_legacy = rpt.campaign_section(dict(camp, rows=legacy), planner, sim=False)["rows"]
    packed = [dict(r, strategy=dict(r["strategy"], mode="shared", group_size=1)) for r in legacy]
    as_packed = rpt.campaign_section(dict(camp, rows=packed), planner, sim=False)["rows"]
    per_query = [dict(r, **{NSA_SCHEDULE: 1}) for r in legacy]
    as_per_query = rpt.campaign_section(dict(camp, rows=per_query), planner, sim=False)["rows"]
    for m, old, p, q in zip(as_measured, as_legacy, as_packed, as_per_query, strict=True):
        assert old["predicted"]["verify_s"] == pytest.approx(p["predicted"]["verify_s"], rel=1e-12)
        assert q["predicted"]["stand_ins"] and not old["predicted"]["stand_ins"]
        if m["baseline"] == "sd_sparse_naive":
            # every layer a one-row refresh: the schedule moves its prediction
            ratio = q["predicted"]["verify_s"] / old["predicted"]["verify_s"]
            assert abs(ratio - 1) > 0.02, ratio
            assert m["predicted"]["verify_s"] == pytest.approx(q["predicted"]["verify_s"])


def test_report_counts_the_measurements_inside_their_intervals(rep):
    """Every prediction carries its interval (the verify forward's for the engine's verify
    step); the counts recount from the rows, and the markdown prints them."""
    e = rep["e2e"]
    inside = sum(
        lo <= r["measured"]["verify_s"] <= hi
        for r in e["rows"]
        for lo, hi in [r["predicted"]["intervals"]["verify_forward_s"]]
    )
    assert e["coverage"]["verify_s"] == {"inside": inside, "n": len(e["rows"])}
    ar = [r for r in e["rows"] if r["baseline"] == "ar_dense"]
    for r in ar:  # the speedup over itself is not among the pairs
        assert r["predicted"]["intervals"]["round_s"][0] < r["predicted"]["round_s"]
    got = sum(x["interval"][0] <= x["measured"] <= x["interval"][1] for x in e["speedups"])
    assert e["coverage"]["speedup"] == {"inside": got, "n": len(e["speedups"])}
    md = markdown(rep)
    assert f"| verify step | {len(e['rows'])} | {inside} |" in md


def test_simulator_replays_the_measured_acceptance(rep):
    """With the same costs, the simulator replaying the seed-0 run's accepted counts agrees with
    the analytic prediction at that run's tokens per round (the prediction is at the seeds'
    pooled ones: scaled by the ratio, since a dense round's time does not depend on what it
    accepts): computed independently, equal to 1%. Against the pooled prediction itself an
    outlying seed 0 would differ by its acceptance alone (a seed that accepts 3.7 drafts per round
    where the others accept 2.7-3.6 moves it by 15%). A draft model's round does depend on what
    it accepts a little: its catch-up forward runs when the kept path reaches the deepest level,
    one draft forward in D + 1 of a round, so those runs agree to 7%."""
    camp = json.loads(record_path("campaign.json").read_text())
    seed0 = {
        (r["baseline"], r["context_len"]): r["measured"]
        for r in camp["rows"]
        if "rounds_trace" in r["measured"]
    }
    for r in rep["e2e"]["rows"]:
        trace = seed0[(r["baseline"], r["context_len"])]["rounds_trace"][1:]  # as replayed
        tpr0 = sum(a + 1 for _, _, a in trace) / len(trace)
        pred0 = r["predicted"]["tokens_per_s"] * tpr0 / r["measured"]["tokens_per_round"]
        rel = 0.07 if r["describe"].startswith("draft_model") else 0.01
        assert r["simulated"]["tokens_per_s"] == pytest.approx(pred0, rel=rel), r["baseline"]


def test_report_cli_writes_the_report_and_checks_targets(rep, tmp_path, capsys, monkeypatch):
    """The command writes the report of ``build`` (the module's, built once) and its PNGs;
    ``--check`` exits 1 exactly when a target is missed."""
    asked = []
    monkeypatch.setattr(rpt, "build", lambda *args: asked.append(args) or rep)
    rc = main(["report", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "speedup vs ar_dense" in out and asked == [("h100-sxm", None, None)]
    md = (tmp_path / "REPORT.md").read_text()
    assert "validation/data/campaign.json" in md and "validation/data/planner.json" in md
    assert "calibration/profiles/h100-sxm" in md and "ssv_planned" in md
    for png in ("verify.png", "tokens_per_s.png", "speedup.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    missed = not all(t["met"] for t in rep["targets"].values())
    assert main(["report", "--no-files", "--check"]) == (1 if missed else 0)
    capsys.readouterr()  # that run's text: each judged run below is read on its own
    for met in (True, False):
        judged = {**rep, "targets": {k: {**t, "met": met} for k, t in rep["targets"].items()}}
        monkeypatch.setattr(rpt, "build", lambda *args, judged=judged: judged)
        assert main(["report", "--no-files", "--check"]) == (0 if met else 1)
        assert ("MISSED" in capsys.readouterr().out) != met
    monkeypatch.undo()  # the errors below come from the real ``build``
    assert main(["report", "--out", str(tmp_path / "nope")]) == 2
    assert "nope' does not exist" in capsys.readouterr().err
    assert main(["report", "--no-files", "--campaign", str(tmp_path / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 7}))
    assert main(["report", "--no-files", "--campaign", str(bad)]) == 2
    assert "not a version-1 campaign" in capsys.readouterr().err


def test_report_gives_the_adaptive_gains_with_capture_rounds_counted_when_recorded(rep):
    pl = dict(rep["planner"])
    pl["adaptive_gain"] = {"code": 0.01, "random": 0.132}
    pl["adaptive_gain_captures_counted"] = {"code": 0.01, "random": -0.03}
    md = markdown({**rep, "planner": pl})
    line = next(x for x in md.splitlines() if x.startswith("With the rounds that captured"))
    assert line.endswith("code +1.0%, random -3.0%.")
    # An evaluation that did not record them gets no such line.
    pl["adaptive_gain_captures_counted"] = None
    assert "With the rounds that captured" not in markdown({**rep, "planner": pl})


def test_report_gives_the_adaptive_ceiling_when_recorded(rep):
    pl = dict(rep["planner"])
    pl["adaptive_ceiling"] = {"code": 0.0, "repetitive": 0.056}
    md = markdown({**rep, "planner": pl})
    line = next(x for x in md.splitlines() if x.startswith("The best fixed strategy"))
    assert line.endswith("code +0.0%, repetitive +5.6%.")
    pl["adaptive_ceiling"] = None  # an evaluation without the oracle's runs
    assert "The best fixed strategy" not in markdown({**rep, "planner": pl})


def test_report_gives_each_regimes_measurement_resolution(rep):
    """The ranking table says how finely each regime's measurement orders its strategies
    (derived from the measured runs per window); n/a where an evaluation kept none."""
    pl = dict(rep["planner"])
    regs = list(pl["kendall_tau"])
    pl["measurement"] = {r: {"pair_ratio_se": 0.021, "draw_regret_p90": 0.037} for r in regs}
    pl["measurement"][regs[0]] = None
    md = markdown({**rep, "planner": pl})
    rows = [x for x in md.splitlines() if x.startswith("| ") and "%" in x and "Kendall" not in x]
    first = next(x for x in rows if x.startswith(f"| {regs[0]} |"))
    assert first.endswith("| n/a | n/a |")
    if len(regs) > 1:
        other = next(x for x in rows if x.startswith(f"| {regs[1]} |"))
        assert other.endswith("| 2.1% | 3.7% |")
    assert "how finely the measurement orders" in md


def test_report_gives_the_adaptive_gains_interval_and_the_strongest_alternative(rep):
    """A table per prompt set: the gain, its interval over the seeds, each seed's paired gain
    and the strongest fixed alternative (its name's pipes escaped, a table cell); no table
    where no prompt set kept its runs per seed."""
    pl = dict(rep["planner"])
    pl["adaptive_resolution"] = {
        "prose": {
            "gain": -0.032,
            "paired_gains": [-0.03, 0.01],
            "gain_p05": -0.049,
            "gain_p95": -0.006,
            "challenger": {
                "describe": "ngram chain:7 bfs | dense",
                "gain": -0.025,
                "gain_p05": -0.04,
                "gain_p95": 0.028,
            },
            "hindsight": {"strategies": 13, "gain": 0.0, "paired_gains": [0.0, 0.084]},
        },
        "random": None,
    }
    md = markdown({**rep, "planner": pl})
    row = next(x for x in md.splitlines() if x.startswith("| prose |"))
    assert row == (
        "| prose | -3.2% | -4.9% to -0.6% | -3.0 +1.0 | ngram chain:7 bfs \\| dense "
        "| -2.5% | -4.0% to +2.8% | +0.0% (+0.0 +8.4) |"
    )
    del pl["adaptive_resolution"]["prose"]["hindsight"]  # derived from older evaluations
    assert next(
        x for x in markdown({**rep, "planner": pl}).splitlines() if x.startswith("| prose |")
    ).endswith("| n/a |")
    assert not any(x.startswith("| random |") for x in md.splitlines())
    pl["adaptive_resolution"] = {"random": None}
    assert "strongest fixed alternative" not in markdown({**rep, "planner": pl})


def _verdicts(block: str) -> list[str]:
    """The targets line's verdicts, in order: Kendall tau, regret, off-distribution gain."""
    line = next(x for x in block.splitlines() if x.startswith("Targets:"))
    return re.findall(r"\((met|not met)\)", line)


def test_readme_planner_block_follows_the_evaluation(tmp_path):
    """The planner block of the results page: each regime's figures and each prompt set's gain
    as the installed evaluation records them, and the verdicts of its ``met``, whichever they
    are."""
    from ssvkit.validation.readme import planner_block

    path = record_path("planner.json")
    doc = json.loads(path.read_text())
    block = planner_block()

    def said(met):
        targets = ("kendall_tau", "regret", "adaptive_gain_off_distribution")
        return ["met" if met[k] else "not met" for k in targets]

    for r, v in doc["regimes"].items():
        assert (
            f"| {r} | {v['context_len']} | {v['n']} | {doc['kendall_tau'][r]:.2f} | "
            f"{100 * doc['regret'][r]:.1f}% |"
        ) in block
    for k, g in doc["adaptive_gain"].items():
        assert any(
            x.startswith(f"| {k}") and f"| {100 * g:+.1f}% |" in x for x in block.splitlines()
        )
    assert _verdicts(block) == said(doc["met"])
    assert block.rstrip().endswith(f"on every off-distribution set ({said(doc['met'])[2]}).")
    # The opposite verdicts, from an evaluation that records them.
    doc["met"] = {k: not v for k, v in doc["met"].items()}
    for v in doc["adaptive"]["prompt_sets"].values():
        v.pop("oracle")  # no fixed alternatives, no hindsight
    other = tmp_path / "planner.json"
    other.write_text(json.dumps(doc))
    block = planner_block(other)
    assert block.startswith(f"Evaluation `{other}` (commit ")
    assert _verdicts(block) == said(doc["met"])
    assert "| n/a | n/a |" in block


def test_readme_adaptive_phase_block_follows_the_document(tmp_path):
    """The adaptive-phase block: each prompt set's gain, switches, oracle ceiling and shadow
    time as the document records them; a set without the oracle's runs says n/a."""
    from ssvkit.validation.readme import adaptive_phase_block

    path = record_path("planner-adaptive-b32-h200.json")
    doc = json.loads(path.read_text())
    rows = {
        x.split(" | ")[0].lstrip("| ").split(" (")[0]: x
        for x in adaptive_phase_block(path).splitlines()
        if x.startswith("| ") and "---" not in x
    }
    for k, v in doc["adaptive"]["prompt_sets"].items():
        run = v["adaptive"]
        assert f"| {100 * v['adaptive_gain']:+.1f}% |" in rows[k]
        assert f"| {len(run['switches'])} |" in rows[k]
        assert rows[k].endswith(
            f"| {run['steps_s']['shadow'] * 1e6:.0f} | {run['steps_s']['verify'] * 1e6:.0f} |"
        )
        assert f"{100 * v['oracle']['ceiling']:+.1f}% (" in rows[k]
    first = next(iter(doc["adaptive"]["prompt_sets"]))
    doc["adaptive"]["prompt_sets"][first].pop("oracle")
    other = tmp_path / "adaptive.json"
    other.write_text(json.dumps(doc))
    line = next(x for x in adaptive_phase_block(other).splitlines() if x.startswith(f"| {first}"))
    assert "| n/a |" in line


def test_readme_campaign_table_follows_the_document(tmp_path):
    """A scale campaign's table: every measured cell's tokens/s in its (context, batch) row and
    baseline column, a speculative baseline's acceptances from high to low; a baseline without a
    measured cell in a row says n/a."""
    from ssvkit.validation.readme import campaign_table_block

    path = record_path("scale-campaign-glm-h200.json")
    doc = json.loads(path.read_text())
    baselines = doc["settings"]["baselines"]

    def table(block):
        lines = block.splitlines()
        assert lines[0] == "| context | batch | " + " | ".join(baselines) + " |"
        cells = {}
        for x in lines[2:]:
            parts = x.strip("| ").split(" | ")
            cells[(parts[0], int(parts[1]))] = dict(zip(baselines, parts[2:], strict=True))
        return cells

    cells = table(campaign_table_block(path))
    assert len(cells) == len({(r["context_asked"], r["batch"]) for r in doc["rows"]})
    for r in doc["rows"]:
        cell = cells[(f"{r['context_asked'] // 1024}K", r["batch"])][r["baseline"]]
        values = cell.split(" / ")
        at = 0 if r["acceptance"] in (None, max(doc["settings"]["acceptances"])) else 1
        assert values[at] == f"{r['measured']['tokens_per_s']:.0f}"
    first = doc["rows"][0]
    for r in doc["rows"]:
        same = (r["context_asked"], r["batch"]) == (first["context_asked"], first["batch"])
        if same and r["baseline"] in ("ar_sparse", "ssv") and r["acceptance"] in (None, 0.6):
            r["status"] = "skipped"
    other = tmp_path / "campaign.json"
    other.write_text(json.dumps(doc))
    row = table(campaign_table_block(other))[(f"{first['context_asked'] // 1024}K", first["batch"])]
    assert row["ar_sparse"] == "n/a"
    assert " / " not in row["ssv"] and " / " in row["sd_dense"]
