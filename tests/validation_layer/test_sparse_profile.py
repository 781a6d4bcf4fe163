"""The sparse profile's one-line refusals (bad values, no GPU) before it touches a GPU."""

import pytest
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
    with pytest.raises(SystemExit) as e:
        sp.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1


def test_no_gpu_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(sp.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        sp.main([])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
