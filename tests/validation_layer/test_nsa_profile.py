"""The NSA profiling script's arguments (its run needs a GPU under Nsight Compute)."""

import pytest
from ssvkit.validation import nsa_profile


@pytest.mark.parametrize(
    "argv",
    [["--geometry", "huge"], ["--batch", "0"], ["--rows-per-tile", "-1"], ["--impl", "split"]],
)
def test_a_bad_argument_exits_2_before_any_kernel_runs(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        nsa_profile.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert argv[1] in err or "bad value" in err
