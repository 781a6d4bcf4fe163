import json
import subprocess
import sys
from pathlib import Path

import pytest

from ssvkit.cli import main


def _walk_figures(obj, path="$"):
    """Yield (path, dict) for every numeric figure in the JSON output."""
    if isinstance(obj, dict):
        if "value" in obj:
            yield path, obj
            return
        for k, v in obj.items():
            yield from _walk_figures(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk_figures(v, f"{path}[{i}]")


def test_default_table(capsys):
    assert main(["predict"]) == 0
    out = capsys.readouterr().out
    for name in ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv"):
        assert name in out
    for ctx in ("8K", "16K", "32K", "64K", "128K"):
        assert f"\n{ctx:>8s} " in out
    assert "llama-3.1-8b on h100-sxm" in out


def test_json_every_figure_has_provenance(capsys):
    assert main(["predict", "--json", "--context", "16K,64K"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 10
    figures = list(_walk_figures(doc["rows"]))
    assert len(figures) > 100
    for path, fig in figures:
        assert fig.get("provenance"), path
        assert "unit" in fig, path
    # every number in a row sits inside a figure
    for row in doc["rows"]:
        for k, v in row.items():
            if k not in ("context_len", "strategy"):
                assert isinstance(v, dict), k


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--gpu", "h1000"], "unknown GPU 'h1000'"),
        (["--context=-8K"], "--context must be >= 1, got -8K"),
        (["--context", "8K", "--top-n", "256"], "exceeds context_len=8192"),
        (["--group-size", "0"], "group_size must be an integer >= 1"),
        (["--acceptance", "1.2"], "acceptance must lie in [0, 1]"),
        (["--strategies", "ssv,nope"], "unknown strategy 'nope'"),
        (["--tree", "best:x"], "tree 'best:x'"),
        (
            ["--elementwise", "triton"],
            "one of fused, torch, fused_torch_accept, fused_unchained, got 'triton'",
        ),
    ],
)
def test_bad_input_one_line_exit_2(argv, needle, capsys, tmp_path):
    out_csv = tmp_path / "out.csv"
    assert main(["predict", *argv, "--csv", str(out_csv)]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1
    assert not out_csv.exists()


def test_elementwise_picks_the_engine_implementation_priced(capsys):
    """``--elementwise torch`` prices torch's separate ops (the header says which): slower than
    the default fused kernels, and without their stand-in; the JSON carries the workload's."""
    argv = ["predict", "--context", "32K", "--strategies", "ar_dense", "--json"]
    tps = {}
    for ew in ("fused", "torch"):
        assert main([*argv, "--elementwise", ew]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["workload"]["elementwise"] == ew
        (row,) = doc["rows"]
        tps[ew] = row["tokens_per_s"]["value"]
        ops = set(row["ops"])
        assert ("verify.add_rms_norm" in ops) == (ew == "fused") != ("verify.norms" in ops)
    assert tps["fused"] > tps["torch"]
    assert main(["predict", "--context", "32K", "--elementwise", "torch"]) == 0
    assert "element-wise torch" in capsys.readouterr().out.splitlines()[0]


def test_rank_takes_the_implementation_and_refuses_a_bad_one(capsys):
    assert main(["rank", "--top", "1", "--elementwise", "gpu"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "one of fused, torch, fused_torch_accept, fused_unchained, got 'gpu'" in err
    )
    assert main(["rank", "--top", "1", "--elementwise", "torch", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["elementwise"] == "torch"


def test_malformed_config_json(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 1')
    assert main(["predict", "--model", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_cli_entry_point_exit_code_and_no_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "ssvkit.cli", "predict", "--model", "nope"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run(
        [sys.executable, "-m", "ssvkit.cli", "predict", "--batch", "x"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_csv_and_plot_written(tmp_path, capsys):
    csv_path, png = tmp_path / "p.csv", tmp_path / "p.png"
    assert main(["predict", "--context", "8K,32K", "--csv", str(csv_path), "--plot", str(png)]) == 0
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("context_len,strategy,tokens_per_s") and len(lines) == 11
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_registry_commands(capsys):
    assert main(["gpus", "--sources"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "mi300x" in out and "datasheet" in out
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert {m["name"] for m in models} >= {"llama-3.1-8b", "deepseek-r1"}


def test_output_files_get_the_usual_permissions(tmp_path, capsys):
    import os
    import stat

    path = tmp_path / "p.csv"
    assert main(["predict", "--context", "8K", "--csv", str(path)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_every_help_page_shows_examples_that_parse_and_points_to_the_glossary():
    import shlex

    from ssvkit.cli import COMMANDS, GLOSSARY, build_parser, examples

    parser = build_parser()
    glossary = (Path(__file__).parents[2] / "docs" / "glossary.md").read_text()
    for term in ("APE", "b\\*", "f_load", "γ (gamma", "TTFT / TPOT", "extrapolated"):
        assert f"**{term}" in glossary, term
    assert "docs/glossary.md" in GLOSSARY
    for name, mod in COMMANDS.items():
        text = examples(mod)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ssvkit ")]
        assert lines and text.endswith(GLOSSARY), name
        for line in lines:
            argv = shlex.split(line.split("#")[0])[1:]
            assert parser.parse_args(argv).command == name, line


def test_attention_column_holds_every_attention_op(capsys):
    """The table's attn column sums every attention op of a row, the NSA refresh calls included
    (``ar_sparse`` runs only refresh calls at refresh_every 1), and the five columns add up to
    the round."""
    from ssvkit.perfmodel.baselines import compare, grouped_seconds
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.perfmodel.strategy import Strategy, Workload

    rows = compare(
        get_model("llama-3.1-8b"),
        get_gpu("h100-sxm"),
        [Strategy.from_name(n) for n in ("ar_sparse", "ssv")],
        [32768],
        Workload(),
    )
    for r in rows:
        g = grouped_seconds(r)
        refresh = sum(v for k, v in r["op_s"].items() if "sparse_attention" in k)
        assert refresh > 0 and g["attention"] == pytest.approx(refresh)
        assert sum(g.values()) == pytest.approx(r["round_s"])
    assert main(["predict", "--strategies", "ar_sparse", "--context", "32K"]) == 0
    line = next(
        x
        for x in capsys.readouterr().out.splitlines()
        if [w.rstrip("*") for w in x.split()[:2]] == ["32K", "ar_sparse"]
    )
    attn = float(line.split("|")[1].split()[2])
    assert attn == pytest.approx(1e3 * grouped_seconds(rows[0])["attention"], abs=0.006)
