"""The tiny pair's batched decoding over several contexts (``validation.batched_decode``) on the
CPU, each ``ssvkit decode`` run in this process instead of a process of its own: every
(context, batch, baseline, drafter) has its run, a second call takes them all from the run
cache, ``--stop-after`` writes what finished, ``max`` is the longest context the tiny pair's
positions hold, and bad input is one line."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from ssvkit.engine.checkpoint import resolve_source
from ssvkit.kernels.tree import MAX_TREE_NODES
from ssvkit.validation import batched_decode

from ssvkit.cli import main as cli_main


def _in_process(argv, folder):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return code or 0, out.getvalue(), err.getvalue()


def _never(argv, folder):
    raise AssertionError(f"a finished run went again: {argv}")


def _argv(tmp_path, *extra):
    return [
        "--contexts", "200,300",
        "--batches", "1,2",
        "--baselines", "ar_dense,sd_dense",
        "--drafters", "ngram",
        "--new-tokens", "4",
        "--device", "cpu",
        "--out", str(tmp_path / "b.json"),
        "--resume", str(tmp_path / "b.jsonl"),
        *extra,
    ]  # fmt: skip


def test_every_context_batch_and_baseline_runs_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(batched_decode, "run_ssvkit", _in_process)
    assert batched_decode.main(_argv(tmp_path)) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["complete"] and doc["settings"]["contexts"] == [200, 300]
    keys = [(r["context"], r["batch"], r["baseline"], r["drafter"]) for r in doc["runs"]]
    assert keys == [
        (c, b, n, d)
        for c in (200, 300)
        for b in (1, 2)
        for n, d in (("ar_dense", None), ("sd_dense", "ngram"))
    ]
    for r in doc["runs"]:
        rep = r["report"]
        assert r["exit_code"] == 0 and rep["context"] == r["context"] and rep["batch"] == r["batch"]
    text = capsys.readouterr().out
    assert "context 200" in text and "context 300" in text
    monkeypatch.setattr(batched_decode, "run_ssvkit", _never)
    assert batched_decode.main(_argv(tmp_path)) == 0
    assert json.loads((tmp_path / "b.json").read_text())["runs"] == doc["runs"]


def test_repeats_interleave_and_the_table_shows_their_median_and_range(tmp_path, monkeypatch):
    """Every run once, then every run again; the table's cell is the runs' median (here the
    middle of three made-up speeds) and a line gives their range."""
    speeds = iter([100.0, 10.0, 300.0, 30.0, 200.0, 20.0])

    def fake(argv, folder):
        report = {"tokens_per_s": {"value": next(speeds)}, "context": 200, "batch": 1}
        return 0, json.dumps(report), ""

    monkeypatch.setattr(batched_decode, "run_ssvkit", fake)
    argv = _argv(tmp_path, "--repeats", "3")
    argv[argv.index("--contexts") + 1] = "200"
    argv[argv.index("--batches") + 1] = "1"
    assert batched_decode.main(argv) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    order = [(r["baseline"], r["repeat"]) for r in doc["runs"]]
    assert order == [(n, k) for k in range(3) for n in ("ar_dense", "sd_dense")]
    assert doc["settings"]["repeats"] == 3
    assert len({r["key"] for r in doc["runs"]}) == 6
    text = batched_decode.table(doc)
    assert "200.0" in text and "20.0" in text.splitlines()[3]
    assert "ar_dense  b=1: 3 runs, 100.0 to 300.0" in text


def test_metadata_reaches_the_sparse_baselines_only(tmp_path, monkeypatch):
    """``--metadata mean`` runs ``ar_sparse`` with block-metadata selection (the report's
    strategy says so) and leaves ``ar_dense``'s command as it was; the settings record it."""
    monkeypatch.setattr(batched_decode, "run_ssvkit", _in_process)
    argv = _argv(tmp_path, "--metadata", "mean")
    argv[argv.index("--baselines") + 1] = "ar_dense,ar_sparse"
    argv[argv.index("--contexts") + 1] = "300"
    argv[argv.index("--batches") + 1] = "2"
    assert batched_decode.main(argv) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["settings"]["metadata"] == "mean"
    runs = {r["baseline"]: r for r in doc["runs"]}
    assert "--metadata" not in runs["ar_dense"]["argv"]
    assert runs["ar_sparse"]["argv"][-2:] == ["--metadata", "mean"]
    assert runs["ar_sparse"]["report"]["strategy"]["metadata"] == "mean"
    text = batched_decode.table(doc)
    assert "sparse block scores: mean" in text
    # Batch 2 decodes in lockstep under greedy autoregression: every round but the last is a
    # full-batch round, shown beside its prediction where the run has one.
    rep = runs["ar_sparse"]["report"]
    line = f"  ar_sparse  b=2: {rep['full_batch']['tokens_per_s']['value']:.1f}"
    if "tokens_per_s" in rep["prediction"]:
        line += f", predicted {rep['prediction']['tokens_per_s']:.1f}"
    assert line in text.splitlines()


def test_both_loops_run_interleaved_and_the_table_tells_them_apart(tmp_path, monkeypatch):
    """``--loops pipelined,serial``: each run twice, side by side, the serial one with
    ``--serial-loop`` (its report says so) under a key of its own and a row of its own."""
    monkeypatch.setattr(batched_decode, "run_ssvkit", _in_process)
    argv = _argv(tmp_path, "--loops", "pipelined,serial")
    argv[argv.index("--baselines") + 1] = "ar_dense"
    argv[argv.index("--contexts") + 1] = "200"
    argv[argv.index("--batches") + 1] = "2"
    assert batched_decode.main(argv) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [r["key"] for r in doc["runs"]] == ["200|ar_dense|None|2", "200|ar_dense|None|2|serial"]
    pipelined, serial = doc["runs"]
    assert "--serial-loop" not in pipelined["argv"] and serial["argv"][-1] == "--serial-loop"
    assert pipelined["report"]["loop"] == "pipelined" and serial["report"]["loop"] == "serial"
    rows = [x.split()[0:2] for x in batched_decode.table(doc).splitlines()[2:4]]
    assert rows == [
        ["ar_dense", f"{pipelined['report']['tokens_per_s']['value']:.1f}"],
        ["ar_dense", "(serial)"],
    ]


def test_stop_after_writes_the_runs_so_far(tmp_path, monkeypatch):
    monkeypatch.setattr(batched_decode, "run_ssvkit", _never)
    assert batched_decode.main(_argv(tmp_path, "--stop-after", "0")) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["runs"] == [] and not doc["complete"]


def test_max_is_the_longest_context_the_tiny_pair_holds():
    limit = resolve_source("tiny").config.max_position_embeddings
    got = batched_decode.parse_contexts("8K,max,16K", 128)
    assert got == [8192, limit - 128 - MAX_TREE_NODES - 1, 16384]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--contexts", "8K,x"], "x"),
        (["--baselines", "ar_fast"], "ar_fast"),
        (["--new-tokens", "0"], "--new-tokens must be >= 1"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--metadata", "kmeans"], "kmeans"),
        (["--baselines", "ssv_planned", "--metadata", "quest"], "--metadata quest"),
        (["--loops", "pipelined,eager"], "eager"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, change, message):
    argv = _argv(tmp_path)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    code = None
    try:
        code = batched_decode.main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b.json").exists()


def test_children_import_the_package_this_process_imported(tmp_path):
    import subprocess
    import sys

    from ssvkit.validation.batched_decode import child_env

    import ssvkit

    done = subprocess.run(
        [sys.executable, "-c", "import ssvkit; print(ssvkit.__file__)"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == ssvkit.__file__


def test_the_h100_profile_interval_holds_its_batch_32_record():
    """The tiny pair's batch-32 record on the H100 ran the current NSA and selection kernels,
    whose rows the H100 profile is fitted on: each baseline's figure lies within 5% of every
    measured run, and its interval holds them all."""
    from ssvkit.engine.checkpoint import TINY_DRAFT, TINY_TARGET
    from ssvkit.perfmodel.strategy import Strategy
    from ssvkit.validation.decode_figures import loop_of_run, predict
    from ssvkit.validation.records import record_path

    doc = json.loads(record_path("batched-decode-b32-h100.json").read_text())
    runs = {}
    for run in doc["runs"]:
        runs.setdefault(run["baseline"], []).append(run["report"])
    assert set(runs) == {"ar_dense", "ar_sparse"}
    for baseline, reports in runs.items():
        r = reports[0]
        pred = predict(
            Strategy.from_name(baseline),
            str(TINY_TARGET / "config.json"),
            str(TINY_DRAFT / "config.json"),
            r["context"] + doc["settings"]["new_tokens"] // 2,
            r["batch"],
            0.0,
            None,
            "h100-sxm",
            elementwise="fused",
            loop=loop_of_run(r),  # serial: recorded before the pipeline
        )
        low, high = pred["intervals"]["tokens_per_s"]
        measured = [x["tokens_per_s"]["value"] for x in reports]
        assert len(measured) == 3
        assert all(abs(pred["tokens_per_s"] / m - 1) < 0.05 for m in measured), (pred, measured)
        assert all(low <= m <= high for m in measured), (baseline, low, high, measured)
