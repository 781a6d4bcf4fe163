"""The pick benchmark's table from rows as it writes them, and its one-line refusals (bad rows,
blocks or warps; no GPU) that write nothing."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import pick_warps as pw


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--rows", "12"], "--rows 12"),
        (["--blocks", "8"], "--blocks 8"),
        (["--warps", "3"], "--warps 3"),
        (["--rows", "x"], "--rows"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "p.json"
    assert_refused(pw.main, ["--out", str(out), *argv], says, capsys, out)


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(pw, ["--out", str(tmp_path / "p.json")], capsys, monkeypatch)


def test_table_lists_every_case_and_warp_count(capsys):
    rows = [
        dict(rows=8, blocks=129, default_warps=4, floor_s=1e-9, graph_s={"1": 5e-6, "4": 3e-6}),
        dict(rows=2048, blocks=2049, default_warps=4, floor_s=4e-6, graph_s={"1": 4e-5, "4": 3e-5}),
    ]
    pw.print_table(rows)
    out = capsys.readouterr().out.splitlines()
    assert "1 warps" in out[0] and "4 warps" in out[0]
    assert out[1].split() == ["129", "8", "5.0", "3.0", "4"]
    assert out[2].split() == ["2049", "2048", "40.0", "30.0", "4"]


@pytest.mark.gpu
def test_gpu_a_case_is_checked_and_timed():
    row = pw.run_case(64, 129, [1, 4], 4e12)
    assert set(row["graph_s"]) == {"1", "4"} and all(v > 0 for v in row["graph_s"].values())
