"""Checks shared by the GPU benchmarks' refusal tests: a bad value or a missing GPU ends the
run with exit status 2 and one line on stderr, before any output file is written."""

import pytest


def assert_refused(main, argv, says, capsys, out=None):
    """``main(argv)`` exits 2 with one stderr line holding ``says``; ``out`` was not written."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1
    if out is not None:
        assert not out.exists()


def assert_needs_gpu(module, argv, capsys, monkeypatch):
    """``module.main(argv)`` on a machine without CUDA refuses in one line."""
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert_refused(module.main, argv, "needs a CUDA GPU", capsys)
