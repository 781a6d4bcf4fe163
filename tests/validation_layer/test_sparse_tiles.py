"""The sparse-tile benchmark's table and its one-line refusals (bad widths, contexts, batches;
no GPU) that write nothing."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import sparse_tiles as st


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--widths", "3"], "--widths 3"),
        (["--contexts", "1024"], "--contexts 1024"),
        (["--batches", "0"], "bad --batches"),
        (["--t", "65"], "bad --batches or --t"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "s.json"
    assert_refused(st.main, ["--out", str(out), *argv], says, capsys, out)


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(st, ["--out", str(tmp_path / "s.json")], capsys, monkeypatch)


def test_table_lists_every_width(capsys):
    row = dict(
        mode="union",
        group_size=4,
        batch=1,
        context_len=131072,
        top_n=16,
        floor_s=2e-6,
        graph_s={"1": 1.5e-5, "4": 9e-6},
    )
    st.print_table([row])
    out = capsys.readouterr().out.splitlines()
    assert "1 blocks" in out[0] and "4 blocks" in out[0]
    assert "15.0" in out[1] and "9.0" in out[1] and out[1].endswith("2.0")


def test_distinct_blocks_count_each_head_once_and_shared_groups_first_rows():
    import numpy as np

    idx = np.array([[[[0, 1, -1], [1, 2, 3], [7, 8, 9], [9, 10, -1]]]], dtype=np.int32)
    assert st.distinct_blocks(idx, 1) == 8  # 0-3, 7-10
    assert st.distinct_blocks(idx, 2) == 5  # rows 0 and 2: 0, 1, 7, 8, 9
