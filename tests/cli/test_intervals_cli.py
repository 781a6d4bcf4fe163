"""Intervals in what the commands print and write: ``ssvkit predict`` (text, ``--json``,
``--csv``), ``ssvkit sweep`` (the table and its best cells) and ``ssvkit rank``; none, and why,
for the roofline; the transfer labels of the JSON's top level."""

import csv
import json

import numpy as np
import pytest
from ssvkit.perfmodel.baselines import compare
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.profiles import shipped_profile
from ssvkit.perfmodel.strategy import Strategy, Workload

from ssvkit.cli import main

PID = shipped_profile("h100-sxm").profile_id
# torch's element-wise ops, which the profile has classes of (no stand-in widens an interval)
ARGS = ["predict", "--context", "16K,128K", "--strategies", "ar_dense,sd_dense,ssv"]
ARGS += ["--elementwise", "torch"]
TIMES = ("tokens_per_s", "round_s", "draft_s", "verify_s")
SPEEDUPS = ("speedup_vs_ar_dense", "speedup_vs_ar_sparse")


def _json(argv, capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_json_gives_every_figure_an_interval(capsys):
    doc = _json(ARGS, capsys)
    assert doc["provenance"] == f"calibrated:{PID}" and doc["intervals"]["coverage"] == 0.9
    for row in doc["rows"]:
        for k in (*TIMES, *SPEEDUPS):
            lo, hi = row[k]["interval"]
            assert 0 < lo <= hi or row[k]["value"] == lo == hi == 0, (row["strategy"], k)
        if row["strategy"] == "ar_dense":  # over itself: one prediction on both sides
            assert row["speedup_vs_ar_dense"]["interval"] == [1.0, 1.0]
        else:
            lo, hi = row["speedup_vs_ar_dense"]["interval"]
            assert lo < row["speedup_vs_ar_dense"]["value"] < hi
        # tokens/s is batch x tokens per round over the round: its interval is the inverse
        t_lo, t_hi = row["round_s"]["interval"]
        n = row["tokens_per_s"]["value"] * row["round_s"]["value"]
        assert row["tokens_per_s"]["interval"] == pytest.approx([n / t_hi, n / t_lo])
        for name, op in row["ops"].items():
            lo, hi = op["time"]["interval"]
            assert 0 < lo <= hi, name
            # a kernel family's leave-out sets, or the loop host fit's runs
            sets = ("heldout", "loop host: ") if name == "loop.host" else ("heldout",)
            assert op["residuals"] is None or op["residuals"].startswith(sets), name
        assert row["ops"]["verify.ffn_gate_up"]["residuals"] == "heldout"


def test_predict_says_extrapolated_rows_take_the_leave_one_out_residuals(capsys):
    """The autoregressive step's single-row norms lie outside their class's measured range."""
    doc = _json(ARGS, capsys)
    ext = [r for r in doc["rows"] if r["tokens_per_s"]["provenance"].endswith(":extrapolated")]
    assert {r["strategy"] for r in ext} == {"ar_dense"}
    for r in doc["rows"]:
        wide = [k for k, op in r["ops"].items() if "leave_one_out" in (op["residuals"] or "")]
        assert bool(wide) == (r in ext), r["strategy"]
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "ar_dense*" in out and "* extrapolated:" in out and "sd_dense*" not in out


def test_predict_roofline_has_no_intervals_and_says_why(capsys):
    doc = _json([*ARGS, "--roofline"], capsys)
    assert doc["intervals"] == {
        "coverage": None,
        "note": "the datasheet roofline is a floor with no residuals",
    }
    assert all(r["tokens_per_s"]["interval"] is None for r in doc["rows"])
    assert main([*ARGS, "--roofline"]) == 0
    out = capsys.readouterr().out
    assert "no intervals: the datasheet roofline" in out and "[" not in out.split("\n")[3]


def test_predict_json_top_level_says_how_the_gpu_is_priced(capsys, h200_without_a_profile):
    """A GPU without a profile is labelled transferred at the top too, not by its datasheet
    ceilings (which ``ceilings`` names), and its intervals widen for the datasheet gap."""
    doc = _json([*ARGS, "--gpu", "h100-pcie"], capsys)
    assert doc["provenance"] == f"transferred:{PID}->h100-pcie"
    assert doc["ceilings"] == "datasheet"
    pcie = {r["strategy"]: r for r in doc["rows"] if r["context_len"] == 16384}
    doc = _json([*ARGS, "--gpu", "h200"], capsys)
    assert doc["provenance"] == f"transferred:{PID}->h200"
    assert doc["ceilings"].startswith("calibrated:h200-ceilings")
    h200 = {r["strategy"]: r for r in doc["rows"] if r["context_len"] == 16384}
    for name, r in pcie.items():

        def up(row):
            return row["round_s"]["interval"][1] / row["round_s"]["value"]

        assert up(r) > up(h200[name]) + 0.05, name


def test_predict_csv_carries_the_intervals_of_the_json(tmp_path, capsys):
    path = tmp_path / "p.csv"
    doc = _json([*ARGS, "--csv", str(path)], capsys)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(doc["rows"])
    for r, j in zip(rows, doc["rows"], strict=True):
        for k in (*TIMES, *SPEEDUPS):
            assert [float(r[f"{k}_low"]), float(r[f"{k}_high"])] == j[k]["interval"]
        lo, hi = j["ops"]["verify.lm_head"]["time"]["interval"]
        assert (float(r["verify.lm_head_s_low"]), float(r["verify.lm_head_s_high"])) == (lo, hi)
        assert r["extrapolated"] in ("True", "False")


def test_the_text_table_prints_each_figure_with_its_interval(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(x for x in out if x.split()[:2] == ["16K", "ssv"])
    doc = _json(ARGS, capsys)
    ssv = next(r for r in doc["rows"] if (r["strategy"], r["context_len"]) == ("ssv", 16384))
    lo, hi = ssv["tokens_per_s"]["interval"]
    assert f"{ssv['tokens_per_s']['value']:.1f} [{lo:.1f}, {hi:.1f}]" in row
    lo, hi = ssv["speedup_vs_ar_dense"]["interval"]
    assert f"x [{lo:.2f}, {hi:.2f}]" in row
    assert any(x.startswith("[low, high]: 90% intervals") for x in out)


def test_sweep_intervals_are_those_of_predict_for_the_same_points(tmp_path, capsys):
    out = tmp_path / "s.csv"
    argv = ["sweep", "--context", "16K", "--strategies", "ar_dense,sd_dense,ssv"]
    assert main([*argv, "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[low, high]: 90% intervals" in text
    table = {r["strategy"]: r for r in csv.DictReader(out.open())}
    rows = compare(
        get_model("llama-3.1-8b"),
        get_gpu("h100-sxm"),
        [Strategy.from_name(n) for n in ("ar_dense", "sd_dense", "ssv")],
        [16384],
        Workload(context_len=16384),
    )
    for r in rows:
        t = table[r["strategy"]]
        for k in (*TIMES, *SPEEDUPS):
            got = [float(t[f"{k}_low"]), float(t[f"{k}_high"])]
            assert got == pytest.approx(r["intervals"][k], rel=1e-12), (r["strategy"], k)
        tpot = [float(t["tpot_s_low"]), float(t["tpot_s_high"])]
        want = np.array(r["intervals"]["round_s"]) / r["tokens_per_round"]
        assert tpot == pytest.approx(want, rel=1e-12)
    assert table["ar_dense"]["speedup_vs_ar_dense_low"] == "1.0"


def test_rank_prints_each_strategy_with_its_interval(capsys):
    assert main(["rank", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "] tok/s" in out and "[low, high]: 90% intervals" in out
    assert main(["rank", "--top", "2", "--roofline"]) == 0
    assert "no intervals" in capsys.readouterr().out
