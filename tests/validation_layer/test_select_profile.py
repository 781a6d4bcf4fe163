"""The selection profile's one-line refusals (bad values, no GPU) before it touches a GPU."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import select_profile as sp


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--t", "0"], "bad value"),
        (["--window", "-1"], "--window -1"),
        (["--context", "2048"], "--context 2048"),
        (["--method", "exact"], "--method"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, says):
    assert_refused(sp.main, argv, says, capsys)


def test_no_gpu_is_refused(capsys, monkeypatch):
    assert_needs_gpu(sp, [], capsys, monkeypatch)
