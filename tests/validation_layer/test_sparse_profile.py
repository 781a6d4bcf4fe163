"""The sparse profile's one-line refusals (bad values, no GPU) before it touches a GPU."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import sparse_profile as sp


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--t", "0"], "bad value"),
        (["--overlap", "1.5"], "--overlap 1.5"),
        (["--context", "1024"], "--context 1024"),
        (["--mode", "dense"], "--mode"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, says):
    assert_refused(sp.main, argv, says, capsys)


def test_no_gpu_is_refused(capsys, monkeypatch):
    assert_needs_gpu(sp, [], capsys, monkeypatch)
