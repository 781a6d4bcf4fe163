"""Bad input, by class of fault, across the commands: a number typed, a size past what can run,
a file read, an output path, an option the run would ignore. Each case must end with exit code
2, one line on stderr that names the bad value, no traceback, and no file left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ssvkit.perfmodel.files import read_json, write_files
from ssvkit.perfmodel.numbers import parse_count, parse_count_list

from ssvkit.cli import main

LLAMA = json.loads(
    (Path(__file__).parents[2] / "perfmodel/data/models/llama-3.1-8b.json").read_text()
)


def _config(**fields) -> str:
    return json.dumps({**LLAMA, **fields})


FILES = {
    "bin.json": b"\xff\xfe\x00\x81 not text",
    "list.json": b"[1, 2]",
    "empty.json": b"",
    "nan.json": b'{"version": 2, "regimes": {"16K": {"overlap": NaN}}}',
    "inf_layers.json": _config(num_hidden_layers=float("inf")).encode(),
    "zero_heads.json": _config(num_attention_heads=0).encode(),
    "float_layers.json": _config(num_hidden_layers=2.5).encode(),
    "neg_ffn.json": _config(intermediate_size=-5).encode(),
    "huge_vocab.json": _config(vocab_size=10**30).encode(),
    "str_hidden.json": _config(hidden_size="big").encode(),
    "bad_rope.json": _config(rope_scaling=[1, 2]).encode(),
    "moe_bad_list.json": json.dumps(
        {
            **LLAMA,
            "model_type": "qwen3_moe",
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "mlp_only_layers": 3,
        }
    ).encode(),
    "eval_space_key.json": json.dumps(
        {
            "model": "llama-3.1-8b",
            "gpu_model": "h100-sxm",
            "space": {"bogus": [1]},
            "profile": {},
            "regimes": {},
        }
    ).encode(),
    "eval_space_list.json": json.dumps(
        {
            "model": "llama-3.1-8b",
            "gpu_model": "h100-sxm",
            "space": [1],
            "profile": {},
            "regimes": {},
        }
    ).encode(),
    "prof_list.json": b'{"version": 2, "regimes": {"16K": {"acceptance": [1, 2]}}}',
    "campaign_bare.json": b'{"version": 1, "rows": []}',
    "arrivals.csv": b"arrival_s,prompt_len,output_len\n0,1024,20000000\n",
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv, workdir, capsys):
    before = {p for p in workdir.rglob("*")}
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err
    after = {p for p in workdir.rglob("*")}
    return code, err, sorted(str(p.relative_to(workdir)) for p in after - before)


def _check(argv, needle, workdir, capsys):
    code, err, new = _run(argv, workdir, capsys)
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert not new, new


NUMBERS = [
    (["predict", "--context", "inf"], "--context 'inf' is not a whole number"),
    (["predict", "--context", "nan"], "--context 'nan' is not a whole number"),
    (["predict", "--context", "1e30"], "--context 1e30 is out of range"),
    (["predict", "--context", "8K,,16K"], "--context '8K,,16K' has an empty item"),
    (["predict", "--context", "1.3"], "--context '1.3' is not a whole number"),
    (["predict", "--acceptance", "nan"], "'nan' is not a finite number"),
    (["predict", "--overlap", "inf"], "'inf' is not a finite number"),
    (["sweep", "--context", "8K,,16K"], "--context '8K,,16K' has an empty item"),
    (["sweep", "--context", "inf"], "context_len[0] 'inf' is not a whole number"),
    (["sweep", "--vary", "group_size=2,,4"], "'group_size=2,,4' has an empty item"),
    (["sweep", "--top", "-1"], "--top must be >= 1, got -1"),
    (["sweep", "--scheduler-timeout-s", "nan"], "'nan' is not a finite number"),
    (["simulate", "ssv", "--context", "inf"], "--context 'inf' is not a whole number"),
    (["simulate", "ssv", "--context", "8K,16K"], "--context takes one value"),
    (["simulate", "ssv", "--acceptance", "nan"], "'nan' is not a finite number"),
    (["decode", "--context", "inf", "--device", "cpu"], "--context 'inf' is not a whole number"),
    (["decode", "--temperature", "inf", "--device", "cpu"], "'inf' is not a finite number"),
    (["decode", "--seed", "-1", "--device", "cpu"], "seed must be >= 0, got -1"),
    (["calibrate", "--fit-only", "--budget-s", "nan"], "'nan' is not a finite number"),
    (["calibrate", "--compile-jobs", "0"], "--compile-jobs must be >= 1, got 0"),
    (["calibrate", "--fit-only", "--compile-jobs", "4"], "--compile-jobs applies to the kernel"),
    (["plot", "x.csv", "--acceptance", "nan"], "'nan' is not a finite number"),
]

SIZES = [
    (["predict", "--tree", "best:100000"], "tree 'best:100000' has 100000 nodes"),
    (["predict", "--tree", "full:100x100"], "has more than 64 nodes"),
    (["predict", "--batch", "100000000000"], "no --context fits in memory: batch 100000000000"),
    (["predict", "--context", "1M", "--batch", "4"], "no --context fits in memory"),
    (["predict", "--group-size", "100000"], "group_size 100000 exceeds"),
    (["rank", "--trees", "best:100000"], "tree 'best:100000' has 100000 nodes"),
    (["rank", "--batch", "100000000000"], "no regime to rank for llama-3.1-8b: <=4K: batch"),
    (["sweep", "--batch", "100000000000"], "no point of the grid can run: batch 1000"),
    (["sweep", "--tp", "3"], "no point of the grid can run: tp=3 does not divide"),
    (["simulate", "ssd", "--ssd-max-batch", "100000000000"], "max_batch must be <= 65536"),
    (["sweep", "--simulate", "--sim-num-tokens", "100000000000"], "simulate.num_tokens"),
    (["simulate", "ssv", "--num-tokens", "10000000000"], "tokens to simulate; a run takes"),
    (["simulate", "ssv", "--batch", "64"], "needs 2,131,008 KV tokens"),
    (["simulate", "ssv", "--context", "1e12"], "KV tokens"),
    (
        [
            "simulate",
            "serve",
            "--serve-arrival",
            "trace",
            "--serve-arrivals-file",
            "arrivals.csv",
            "--no-files",
        ],
        "asks for 20,000,000 output tokens",
    ),
    (["decode", "--tree", "best:100000", "--device", "cpu"], "has 100000 nodes"),
    (["decode", "--context", "1e30", "--device", "cpu"], "--context 1e30 is out of range"),
]

INPUT_FILES = [
    (["predict", "--model", "bin.json"], "model config 'bin.json' is not UTF-8 text"),
    (["predict", "--model", "list.json"], "must hold an object at its top level, not a list"),
    (["predict", "--model", "empty.json"], "model config 'empty.json' is not valid JSON"),
    (["predict", "--model", "inf_layers.json"], "'inf_layers.json' holds Infinity"),
    (["predict", "--model", "zero_heads.json"], "'num_attention_heads' must lie in 1.."),
    (["simulate", "ssv", "--model", "zero_heads.json"], "'num_attention_heads' must lie in"),
    (["predict", "--model", "float_layers.json"], "'num_hidden_layers' must be an integer"),
    (["predict", "--model", "neg_ffn.json"], "'intermediate_size' must lie in 1.."),
    (["predict", "--model", "huge_vocab.json"], "'vocab_size' must lie in 1.."),
    (["predict", "--model", "str_hidden.json"], "'hidden_size' must be an integer, got 'big'"),
    (["predict", "--model", "bad_rope.json"], "'rope_scaling' must be an object or null"),
    (["predict", "--model", "moe_bad_list.json"], "'mlp_only_layers' must be a list"),
    (["models", "--model", "bin.json"], "is not UTF-8 text"),
    (["simulate", "ssv", "--trace", "bin.json"], "trace 'bin.json' is not UTF-8 text"),
    (["simulate", "ssv", "--trace", "adir"], "trace 'adir' is a folder, not a file"),
    (
        [
            "simulate",
            "serve",
            "--serve-arrival",
            "trace",
            "--serve-arrivals-file",
            "adir",
            "--no-files",
        ],
        "arrivals file 'adir' is a folder",
    ),
    (["sweep", "--grid", "bin.json"], "grid file 'bin.json' is not UTF-8 text"),
    (["sweep", "--grid", "adir"], "grid file 'adir' is a folder"),
    (["rank", "--acceptance-profile", "adir"], "acceptance profile 'adir' is a folder"),
    (["rank", "--acceptance-profile", "bin.json"], "acceptance profile 'bin.json' is not UTF-8"),
    (["rank", "--acceptance-profile", "nan.json"], "'nan.json' holds NaN"),
    (["rank", "--acceptance-profile", "prof_list.json"], "16K.acceptance must be an object"),
    (["rank", "--evaluation", "eval_space_key.json"], "unknown space key 'bogus'"),
    (["rank", "--evaluation", "eval_space_list.json"], "the space must be an object of axes"),
    (["rank", "--evaluation", "adir"], "planner evaluation 'adir' is a folder"),
    (["report", "--planner", "list.json", "--no-files"], "must hold an object at its top level"),
    (["report", "--campaign", "list.json", "--no-files"], "must hold an object at its top level"),
    (["report", "--campaign", "adir", "--no-files"], "campaign 'adir' is a folder"),
    (["report", "--campaign", "campaign_bare.json", "--no-files"], "is malformed (KeyError"),
    (["plot", "adir/x.csv"], "sweep file 'adir/x.csv' does not exist"),
    (["decode", "--ranking", "list.json", "--device", "cpu"], "ranking 'list.json' must hold"),
    (["decode", "--prompt-file", "adir", "--device", "cpu"], "--prompt-file 'adir' is a folder"),
]

OUTPUTS = [
    (["predict", "--csv", "adir"], "--csv 'adir' is a folder"),
    (["predict", "--plot", "adir"], "--plot 'adir' must end in .png or .pdf or .svg"),
    (["predict", "--plot", "p.txt"], "--plot 'p.txt' must end in .png or .pdf or .svg"),
    (["predict", "--csv", "ok.csv", "--plot", "missing/x.png"], "folder 'missing' does not exist"),
    (["predict", "--plot", "ok.png", "--csv", "adir"], "--csv 'adir' is a folder"),
    (["predict", "--csv", "fifo"], "--csv 'fifo' is not a regular file"),
    (["predict", "--csv", "/proc/x.csv"], "folder '/proc' is not writable"),
    (["sweep", "--out", "adir"], "'adir' must end in .csv or .parquet"),
    (["sweep", "--out", "/proc/x.csv"], "folder '/proc' is not writable"),
    (["simulate", "ssv", "--gantt", "adir"], "--gantt 'adir' must end in .png"),
    (["simulate", "ssv", "--csv", "adir"], "--csv 'adir' is a folder"),
    (["simulate", "ssv", "--trace-out", "adir"], "--trace-out 'adir' is a folder"),
    (["simulate", "ssv", "--out-dir", "list.json"], "--out-dir 'list.json' is a file"),
    (["rank", "--out", "adir"], "--out 'adir' is a folder"),
    (["report", "--out", "list.json"], "--out 'list.json' is a file, not a folder"),
    (["validate", "--plot", "missing"], "--plot 'missing' does not exist"),
    (["decode", "--trace", "adir", "--device", "cpu"], "--trace 'adir' is a folder"),
]

IGNORED = [
    (["simulate", "ssv", "--no-files", "--csv", "x.csv"], "--no-files writes no file, but --csv"),
    (["simulate", "ssv", "--no-files", "--out-dir", "adir"], "but --out-dir asks for one"),
    (["simulate", "ssv", "--num-requests", "5"], "num_requests is for serve and sparsespec"),
    (["simulate", "ssv", "--acceptance-table", "0.5"], "acceptance_table is read by"),
    (["simulate", "serve", "--serve-arrivals-file", "arrivals.csv"], "read with arrival=trace"),
    (["report", "--no-files", "--out", "adir"], "--no-files writes nothing, but --out"),
    (["predict", "--drafter-model", "qwen3-8b"], "is read by --drafter-kind draft_model only"),
    (["simulate", "ssv", "--drafter-model", "x"], "is read by --drafter-kind draft_model only"),
    (["rank", "--draft-model", "qwen3-8b"], "is read with --drafters draft_model"),
    (["calibrate", "--fit-only", "--sweeps", "ops"], "--fit-only runs no sweep"),
    (["calibrate", "--sweeps", "bogus"], "--sweeps 'bogus': choose from ops, kernels"),
    (["calibrate", "--redo", "nsa_verify:mode", "--out", "d"], "got 'nsa_verify:mode'"),
    (["sweep", "--scheduler-timeout-s", "-5"], "--scheduler-timeout-s must be > 0"),
    (["validate", "--model", "physical", "--check"], "--check applies to --model classes"),
]


@pytest.mark.parametrize(
    "argv, needle", NUMBERS, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_numbers_typed(argv, needle, workdir, capsys):
    _check(argv, needle, workdir, capsys)


@pytest.mark.parametrize(
    "argv, needle", SIZES, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_sizes_bounded_before_running(argv, needle, workdir, capsys):
    _check(argv, needle, workdir, capsys)


@pytest.mark.parametrize(
    "argv, needle", INPUT_FILES, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_input_files(argv, needle, workdir, capsys):
    _check(argv, needle, workdir, capsys)


@pytest.mark.parametrize(
    "argv, needle", OUTPUTS, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_output_paths_checked_before_anything_is_written(argv, needle, workdir, capsys):
    _check(argv, needle, workdir, capsys)


@pytest.mark.parametrize(
    "argv, needle", IGNORED, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_options_the_run_would_ignore(argv, needle, workdir, capsys):
    _check(argv, needle, workdir, capsys)


def test_null_kv_heads_takes_the_hf_default(workdir, capsys):
    (workdir / "null_kv.json").write_text(_config(num_key_value_heads=None))
    assert main(["models", "--model", "null_kv.json", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc[0] if isinstance(doc, list) else doc
    assert "32" in json.dumps(row)  # num_kv_heads = num_attention_heads


def test_predict_notes_contexts_past_training_or_memory(workdir, capsys):
    assert main(["predict", "--context", "8K,512K", "--strategies", "ar_dense"]) == 0
    out = capsys.readouterr().out
    assert "context 524288 does not fit: batch 1 x context 524288" in out
    assert "context 524288 is past llama-3.1-8b's 131072 trained positions" in out
    assert main(["predict", "--context", "8K,512K", "--strategies", "ar_dense", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 2


def test_write_files_leaves_nothing_when_one_write_fails(tmp_path):
    ok, bad = tmp_path / "a.txt", tmp_path / "missing" / "b.txt"
    with pytest.raises(ValueError, match="folder .*missing' does not exist"):
        write_files([(ok, "x"), (bad, "y")])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="two outputs go to"):
        write_files([(ok, "x"), (tmp_path / "." / "a.txt", "y")])
    write_files([(ok, "x"), (tmp_path / "c.bin", b"\x00")])
    assert ok.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.txt",
        "c.bin",
    ]


def test_numbers_and_json_readers(tmp_path):
    assert parse_count_list("8K, 1.5K,32768", "--x") == [8192, 1536, 32768]
    assert parse_count(" 2M ", "--x") == 2 << 20
    for bad in ("0", "-1", "1K5", "2^10", "", "nan"):
        with pytest.raises(ValueError, match="--x"):
            parse_count(bad, "--x")
    p = tmp_path / "d.json"
    p.write_text('{"a": Infinity}')
    with pytest.raises(ValueError, match="holds Infinity, not a finite number"):
        read_json(p, "doc")
    p.write_text('"text"')
    with pytest.raises(ValueError, match="top level, not a string"):
        read_json(p, "doc")
    assert read_json(p, "doc", kind=str) == "text"


def test_predict_plot_format_follows_the_extension(workdir, capsys):
    magic = {"pdf": b"%PDF", "svg": b"<?xml", "png": b"\x89PNG"}
    for fmt, head in magic.items():
        assert main(["predict", "--context", "8K", "--plot", f"p.{fmt}"]) == 0
        assert (workdir / f"p.{fmt}").read_bytes().startswith(head)
    capsys.readouterr()


def test_report_outside_a_clone_says_what_it_needs(workdir, capsys, monkeypatch):
    """The measurements of record ship with the package: the report reads them from any working
    directory; only its default output folder needs a clone."""
    import ssvkit.validation.report_markdown

    assert main(["report", "--no-files"]) == 0 and "speedup vs ar_dense" in capsys.readouterr().out
    monkeypatch.setattr(ssvkit.validation.report_markdown, "REPORT_DIR", "no/such/folder")
    _check(["report"], "give --out DIR or --no-files", workdir, capsys)


def test_a_trace_replays_only_against_a_tree_that_can_accept_its_counts(workdir, capsys):
    wide = ["simulate", "sd_dense", "--tree", "best:32:8", "--num-tokens", "200", "--no-files"]
    assert main([*wide, "--trace-out", "wide.jsonl"]) == 0
    capsys.readouterr()
    argv = [
        "simulate",
        "sd_dense",
        "--tree",
        "chain:2",
        "--acceptance-model",
        "trace",
        "--trace",
        "wide.jsonl",
        "--no-files",
    ]
    _check(argv, "the trace drafts up to 32 tokens a round", workdir, capsys)


@pytest.mark.parametrize("missing", ["torch", "triton"])
def test_a_package_the_base_install_leaves_out_is_named_in_one_line(missing, monkeypatch, capsys):
    """A command that needs torch or triton on a base install says which and how to add it."""
    from ssvkit.cli import decode_cmd

    def run(args):
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(decode_cmd, "run", run)
    assert main(["decode", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"ssvkit decode: error: this command needs {missing}" in err and "pip install" in err


def test_a_missing_module_of_the_project_itself_is_not_hidden(monkeypatch):
    from ssvkit.cli import decode_cmd

    def run(args):
        raise ModuleNotFoundError("No module named 'ssvkit.nowhere'", name="ssvkit.nowhere")

    monkeypatch.setattr(decode_cmd, "run", run)
    with pytest.raises(ModuleNotFoundError):
        main(["decode", "--model", "tiny"])
