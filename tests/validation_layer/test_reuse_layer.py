"""The reuse-layer decomposition's one-line refusals (bad values, no GPU) before it touches a
GPU, and its table."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import reuse_layer as rl


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--out", "x.json", "--t", "1"], "--t 1"),
        (["--out", "x.json", "--t", "65"], "--t 65"),
        (["--out", "x.json", "--context", "1024"], "--context 1024"),
        ([], "--out"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, says):
    assert_refused(rl.main, argv, says, capsys)


def test_no_gpu_is_refused(capsys, monkeypatch):
    assert_needs_gpu(rl, ["--out", "x.json"], capsys, monkeypatch)


def test_the_table_gives_each_variant_and_the_floor(capsys):
    rows = [
        dict(variant="lists all", splits=8, listed_blocks=2183.4, per_split=9, median_s=24.4e-6),
        dict(variant="lists 0", splits=8, listed_blocks=0.0, per_split=0, median_s=8.5e-6),
    ]
    rl.print_table(rows, dict(floor_s=15.2e-6, distinct_blocks=234.0))
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["lists", "all", "8", "2183", "9", "24.40"]
    assert out[2].split() == ["lists", "0", "8", "0", "0", "8.50"]
    assert "floor 15.2 us" in out[-1] and "234 distinct" in out[-1]
