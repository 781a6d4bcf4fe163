"""validation.sm_streams: the SM counts it times, its read kernel's sums (on the interpreter),
its table and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch
from ssvkit.validation import sm_streams as ss


def test_sm_counts_are_powers_of_two_three_quarters_and_all():
    assert ss.sm_counts(132) == [1, 2, 4, 8, 16, 32, 64, 99, 128, 132]
    assert ss.sm_counts(1) == [1]
    assert ss.sm_counts(8) == [1, 2, 4, 6, 8]


def test_each_program_sums_its_own_span():
    tile, tiles, programs = 16, 5, 3
    x = torch.randn(programs * tiles * tile + 7, dtype=torch.float32)
    out = torch.full((programs * tile,), float("nan"))
    ss.stream_read_kernel[(programs,)](x, out, tiles, TILE=tile, STAGES=2)
    want = x[: programs * tiles * tile].view(programs, tiles, tile).sum(dim=1)
    torch.testing.assert_close(out.view(programs, tile), want, rtol=1e-5, atol=1e-5)


def test_table_prints_each_rate_in_gb_per_s():
    rows = [
        dict(sms=1, per_sm=1, bytes_per_s=150e9, sm_bytes_per_s=150e9),
        dict(sms=132, per_sm=2, bytes_per_s=4.5e12, sm_bytes_per_s=4.5e12 / 132),
    ]
    lines = ss.table(rows)
    assert lines[1].split() == ["1", "1", "150", "150.0"]
    assert lines[2].split() == ["132", "2", "4500", "34.1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ss.main(["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
