import json
import subprocess
import sys

import numpy as np
import pytest
from ssvkit.sweep.grid import spec_from_doc
from ssvkit.sweep.runner import run_sweep
from ssvkit.sweep.table import read_table, to_csv

from ssvkit.cli import main

ARGS = ["sweep", "--context", "4K,32K", "--batch", "1,8", "--no-progress", "--workers", "1"]
# The base install: the sweep extra's packages cannot be imported. Runs each argv of a JSON list
# and prints [exit code, stderr] per run, then the GPU packages that got imported.
BASE_ONLY = """
import contextlib, io, json, sys
for m in ('pandas', 'pyarrow', 'dask', 'distributed', 'yaml'):
    sys.modules[m] = None
from ssvkit.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out.append([main(argv), err.getvalue()])
out.append(sorted(m for m in ('torch', 'triton') if m in sys.modules))
print(json.dumps(out))
"""


def _walk_figures(obj, path="$"):
    if isinstance(obj, dict):
        if "value" in obj:
            yield path, obj
            return
        for k, v in obj.items():
            yield from _walk_figures(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk_figures(v, f"{path}[{i}]")


def test_csv_round_trips_the_table(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main([*ARGS, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sweep: 20 points" in text and f"wrote table: {out}" in text
    table, _ = read_table(out)
    ref = run_sweep(spec_from_doc({"context_len": ["4K", "32K"], "batch": [1, 8]}), workers=1)
    assert list(table) == list(ref.table)
    for k, v in ref.table.items():
        got = table[k]
        if v.dtype.kind == "f":
            assert np.array_equal(got, v, equal_nan=True), k  # repr round-trips exactly
        else:
            assert got.tolist() == v.tolist(), k
    assert out.read_text() == to_csv(ref.table)


def test_parquet_and_pandas(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    out = tmp_path / "s.parquet"
    assert main([*ARGS, "--out", str(out), "--strategies", "ar_dense,ssv"]) == 0
    table, meta = read_table(out)
    assert meta["spec"]["context_len"] == [4096, 32768]
    assert table["strategy"].tolist() == ["ar_dense"] * 4 + ["ssv"] * 4
    frame = pd.read_parquet(out)
    assert len(frame) == 8 and frame["provenance"].str.startswith("calibrated:").all()
    best = frame[frame["best"]]
    assert set(best["strategy"]) <= {"ar_dense", "ssv"} and len(best) == 4


def test_json_every_figure_has_provenance(capsys):
    assert main([*ARGS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["points"] == 20 and len(doc["best"]) == 4
    figures = list(_walk_figures(doc["best"]))
    assert len(figures) == 4 * 5
    for path, fig in figures:
        assert fig["provenance"] and "unit" in fig, path
    assert doc["points_per_s"]["provenance"] == "measured:wall-clock"


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--context", "4K,abc"], "context_len[1] 'abc' is not an integer"),
        (["--model", "llama-9"], "unknown model 'llama-9'"),
        (["--acceptance", "0.5,2"], "acceptance must lie in [0, 1], got 2.0"),
        (["--vary", "group_size"], "--vary 'group_size' is not FIELD=V1,V2"),
        (["--vary", "grp=2,4"], "vary: unknown or fixed field 'grp'"),
        (["--capacity-slo-tpot-s", "0.02"], "capacity options need --capacity-rates"),
        (["--capacity-rates", "0"], "capacity.rates must be positive numbers"),
        (["--grid", "missing.yaml"], "grid file 'missing.yaml' does not exist"),
        (["--partition-points", "0"], "--partition-points must be >= 1"),
        (["--out", "nowhere/s.csv"], "folder 'nowhere' does not exist"),
        (["--out", "s.txt"], "must end in .csv or .parquet"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, monkeypatch, capsys, extra, needle):
    monkeypatch.chdir(tmp_path)
    out = [] if "--out" in extra else ["--out", "s.csv"]
    assert main([*ARGS, *out, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ssvkit sweep: error: ") and needle in err, err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_grid_file_and_flags_merge(tmp_path, capsys):
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps({"context": ["8K"], "batch": [1, 4], "strategies": ["ar_dense"]}))
    assert main(["sweep", "--grid", str(grid), "--batch", "2", "--dry-run"]) == 0
    assert "sweep: 1 points" in capsys.readouterr().out
    grid.write_text(json.dumps({"context": ["8K"], "batchs": [1]}))
    assert main(["sweep", "--grid", str(grid)]) == 2
    assert "g.json: unknown key 'batchs' (did you mean: batch" in capsys.readouterr().err


def test_capacity_table_beside_the_sweep(tmp_path, capsys):
    out = tmp_path / "c.csv"
    argv = ["sweep", "--context", "2K", "--strategies", "ar_dense", "--no-progress"]
    argv += ["--capacity-rates", "2,20", "--capacity-num-requests", "30"]
    argv += ["--capacity-output-tokens", "32", "--capacity-iterations", "3", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    cap, _ = read_table(tmp_path / "c.capacity.csv")
    assert cap["requests_per_s"].tolist() == [2.0, 20.0]
    assert "capacity: TTFT <= 2 s" in text and "wrote capacity:" in text
    assert (cap["gpus_needed"] >= 1).all() and cap["best"].all()


def test_base_install_runs_sweep_and_plot_and_names_the_extra(tmp_path):
    (tmp_path / "g.yaml").write_text("batch: [1]\n")
    (tmp_path / "s.parquet").write_bytes(b"PAR1")
    failing = {
        (
            "sweep",
            "--out",
            "t.parquet",
        ): "Parquet output needs pyarrow: pip install 'ssvkit[sweep]'",
        ("sweep", "--scheduler", "tcp://127.0.0.1:8786"): "--scheduler needs dask.distributed",
        ("sweep", "--grid", "g.yaml"): "reading g.yaml needs PyYAML",
        ("plot", "s.parquet"): "reading Parquet needs pyarrow",
    }
    runs = [
        ["sweep", "--context", "8K,32K", "--acceptance", "0.6,0.8", "--out", "s.csv"],
        ["plot", "s.csv", "--kind", "heatmap,pareto", "--baselines", "ar_sparse"],
        *[list(argv) for argv in failing],
    ]
    r = subprocess.run(
        [sys.executable, "-c", BASE_ONLY, json.dumps(runs)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard, not a speed check
    )
    assert r.returncode == 0, r.stderr
    *results, heavy = json.loads(r.stdout.splitlines()[-1])
    assert heavy == []  # neither torch nor triton is imported
    (rc_sweep, err_sweep), (rc_plot, err_plot) = results[:2]
    assert rc_sweep == 0 and "sweep: " in err_sweep  # the progress bar, on stderr
    assert rc_plot == 0, err_plot
    assert sorted(p.name for p in tmp_path.glob("s-*.png")) == [
        "s-csv-heatmap-vs-ar_sparse.png",
        "s-csv-pareto.png",
    ]
    for (rc, err), needle in zip(results[2:], failing.values(), strict=True):
        assert rc == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "t.parquet").exists()
