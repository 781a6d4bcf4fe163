import json
import subprocess
import sys

import pytest

from ssvkit.cli import build_parser, main
from ssvkit.cli.simulate_cmd import build_config

FAST = ["--context", "8K", "--num-tokens", "64", "--timeline-rounds", "4"]


def test_json_figures_and_files(tmp_path, capsys):
    argv = ["simulate", "ssv", *FAST, "--out-dir", str(tmp_path), "--json"]
    argv += ["--trace-out", str(tmp_path / "t.jsonl")]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    for name in ("simulated_tokens_per_s", "analytic_tokens_per_s", "rounds_per_wall_s"):
        fig = doc["figures"][name]
        assert fig["value"] > 0 and fig["unit"] and fig["provenance"], name
    # perfmodel's analytic figures carry their interval; the simulated ones none
    for name, f in doc["figures"].items():
        extra = {"interval"} if name.startswith("analytic_") else set()
        assert set(f) == {"value", "unit", "provenance"} | extra, name
    lo, hi = doc["figures"]["analytic_tokens_per_s"]["interval"]
    assert 0 < lo < doc["figures"]["analytic_tokens_per_s"]["value"] < hi
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "sim-ssv-gantt.png",
        "sim-ssv-requests.csv",
        "sim-ssv.chrome.json",
        "t.jsonl",
    ]
    chrome = json.loads((tmp_path / "sim-ssv.chrome.json").read_text())
    assert any(e["ph"] == "X" for e in chrome["traceEvents"])
    assert (tmp_path / "sim-ssv-gantt.png").read_bytes()[:4] == b"\x89PNG"


def test_summary_and_no_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "ssd", *FAST, "--no-files"]) == 0
    out = capsys.readouterr().out
    assert "simulated_tokens_per_s" in out and "b_star" in out
    assert list(tmp_path.iterdir()) == []


def test_context_len_is_a_hidden_alias_of_context(capsys):
    """``--context-len`` sets the same context as ``--context`` and stays out of the help."""
    parse = build_parser().parse_args
    old = build_config(parse(["simulate", "ssv", "--context-len", "8K"]))
    new = build_config(parse(["simulate", "ssv", "--context", "8K"]))
    assert old.context_len == new.context_len == 8192
    assert build_config(parse(["simulate", "ssv"])).context_len == 32768
    with pytest.raises(SystemExit):
        parse(["simulate", "--help"])
    help_text = capsys.readouterr().out
    assert "--context " in help_text and "--context-len" not in help_text


@pytest.mark.parametrize(
    "args,needle",
    [
        (["nope"], "unknown scenario 'nope'"),
        (["serve", "--serve-rate", "-1"], "rate must lie in"),
        (["serve", "--kv-capacity-tokens", "100"], "impossible capacity"),
        (["sparsespec", "--kv-capacity-tokens", "100"], "impossible capacity"),
        (["ssv", "--acceptance", "1.5"], "acceptance must lie in"),
        (["ssv", "--batch", "-2"], "batch must be an integer >= 0"),
        (["ssv", "--out-dir", "/no/such/dir"], "does not exist"),
        (["ssv", "--acceptance-model", "trace"], "needs a trace file"),
        (["ssv", "--trace", "/no/t.jsonl", "--acceptance-model", "trace"], "does not exist"),
        (["ssd", "--tree", "best:8"], "tree must be chain:K"),
        (["prr", "--strategy", "sd_dense"], "needs a sparse strategy"),
        (["ssv", "--context", "100"], "exceeds context_len=100"),
        (["ssv", "--overlap-spread", "0.49"], "too large"),
        (["ssv", "--ssd-fallback", "sometimes"], "unknown fallback"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(args, needle, tmp_path, capsys, monkeypatch):
    """In this process (``test_bad_input_from_the_console_script`` runs one case as the
    console script does): an uncaught exception fails the test where a process would print
    its traceback."""
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", *args, "--num-tokens", "16"]
    if "--out-dir" not in args:
        argv += ["--out-dir", str(tmp_path)]
    try:
        rc = main(argv)
    except SystemExit as e:  # a usage error, from argparse
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args,needle",
    [(["nope"], "unknown scenario 'nope'"), (["ssv", "--acceptance", "1.5"], "acceptance must")],
)
def test_bad_input_from_the_console_script(args, needle, tmp_path):
    """A usage error and a refused value in a process of their own: exit 2, one line on a
    piped stderr, no traceback, nothing written."""
    argv = [sys.executable, "-m", "ssvkit.cli", "simulate", *args, "--num-tokens", "16"]
    argv += ["--out-dir", str(tmp_path)]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert list(tmp_path.iterdir()) == []
