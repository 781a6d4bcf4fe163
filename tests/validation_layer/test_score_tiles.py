"""The score-tile benchmark's shapes and table, and its one-line refusals (bad head dims or
warps; no GPU) that write nothing."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import score_tiles as st


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--head-dims", "96"], "--head-dims 96"),
        (["--head-dims", "512"], "--head-dims 512"),
        (["--warps", "3"], "--warps 3"),
        (["--warps", "x"], "--warps"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "s.json"
    assert_refused(st.main, ["--out", str(out), *argv], says, capsys, out)


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(st, ["--out", str(tmp_path / "s.json")], capsys, monkeypatch)


def test_shapes_take_32_block_tiles_up_to_32_rows():
    assert st._shapes(20, [2, 4]) == [(32, 2), (32, 4), (16, 2), (16, 4)]
    assert st._shapes(40, [4]) == [(16, 4)]


def test_table_lists_the_shapes_that_fit(capsys):
    shape = dict(block_nb=32, warps=4, fits=True, spilled=68, graph_s=7e-5)
    rows = [
        dict(
            batch=8,
            context_len=32768,
            t=20,
            head_dim=128,
            method="quest",
            rule=dict(block_nb=16, warps=4),
            floor_s=1e-5,
            shapes=[shape, dict(block_nb=16, warps=8, fits=False)],
        )
    ]
    st.print_table(rows)
    out = capsys.readouterr().out.splitlines()
    assert "16x4w" in out[1] and "32x4w 70.0 (68)" in out[1] and "16x8w" not in out[1]
