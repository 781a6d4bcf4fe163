"""The H200 as a calibrated GPU, on a fixture profile: rows filed under ``h200`` (the H100's
committed rows relabelled as measured on an H200, in a temporary profiles folder) fit to a
profile labelled by its own id, and every pricing command takes ``--gpu h200`` as
``calibrated:<that id>``. A profile or rows of another GPU are refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import fit_folder
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.rows import load_rows, seal

from ssvkit.cli import main
from tests.fit_helpers import profiles_from, without_leave_one_out

COMMITTED = ceilings.PROFILES
ROWS = ("kernel_bench.jsonl", "op_sweep.jsonl")


def _relabelled(src, dst, every: int = 1) -> None:
    """Every ``every``-th of ``src``'s rows as if measured on an H200 (resealed: a synthetic
    fixture)."""
    rows = [seal({**r, "device_name": "NVIDIA H200"}) for r in load_rows(src)[::every]]
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A profiles folder: the committed H100 folder and an H200 one fitted from relabelled
    rows (a sixth of the kernel rows: all but three classes keep enough rows to be fitted).
    Its intervals come from the held-out and cross-GPU residuals alone
    (``without_leave_one_out``)."""
    base = tmp_path_factory.mktemp("profiles")
    shutil.copytree(COMMITTED / "h100-sxm", base / "h100-sxm")
    (base / "h200").mkdir()
    for name in ROWS:
        every = 6 if name == "kernel_bench.jsonl" else 1
        _relabelled(COMMITTED / "h100-sxm" / name, base / "h200" / name, every)
    with pytest.MonkeyPatch.context() as mp:
        without_leave_one_out(mp)
        fit_folder("h200", base / "h200")
    return base


@pytest.fixture
def profiles(root, monkeypatch):
    """Price and validate from ``root`` instead of the shipped profiles."""
    with profiles_from(monkeypatch, root):
        yield root


def _pid(root) -> str:
    return json.loads((root / "h200" / "profile.json").read_text())["profile_id"]


def test_the_fit_of_h200_rows_is_labelled_by_its_own_id(root):
    doc = json.loads((root / "h200" / "profile.json").read_text())
    h100 = json.loads((COMMITTED / "h100-sxm" / "profile.json").read_text())
    assert doc["gpu"] == "h200" and doc["device_name"] == "NVIDIA H200"
    assert doc["profile_id"].startswith("h200-") and doc["profile_id"] != h100["profile_id"]
    assert json.loads((root / "h200" / "ceilings.json").read_text())["gpu"] == "h200"
    assert Profile.load(root / "h200" / "profile.json", gpu="h200").gpu == "h200"
    with pytest.raises(ValueError, match="not 'h100-sxm': refusing it"):
        Profile.load(root / "h200" / "profile.json", gpu="h100-sxm")


def test_predict_is_calibrated_on_the_h200_profile(profiles, capsys):
    argv = ["predict", "--gpu", "h200", "--context", "16K", "--strategies", "ar_dense,ssv"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    flags = (":stand-in", ":extrapolated")
    labels = {r["tokens_per_s"]["provenance"] for r in doc["rows"]}
    assert {x.removesuffix(flags[0]).removesuffix(flags[1]) for x in labels} == {
        f"calibrated:{_pid(profiles)}"
    }
    # the rows hold every op these strategies run, the fused element-wise ones included: no
    # stand-in prices them
    assert not any(x.endswith(":stand-in") for x in labels)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sweep", "--context", "16K", "--workers", "1", "--no-progress", "--json"], "calibrated:"),
        (["rank", "--top", "1", "--json"], "calibrated:"),
        (["validate", "--sets", "interp"], "profile "),
        (["report", "--no-files", "--json"], '"profile_id": '),
    ],
)
def test_every_pricing_command_takes_the_h200(profiles, argv, needle, capsys):
    assert main([*argv, "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert needle + _pid(profiles) in out or f'{needle}"{_pid(profiles)}"' in out
    assert "transferred:" not in out


def test_a_profile_of_another_gpu_is_refused_in_one_line(root, tmp_path, monkeypatch, capsys):
    shutil.copytree(root / "h100-sxm", tmp_path / "h100-sxm")
    (tmp_path / "h200").mkdir()
    shutil.copy(root / "h100-sxm" / "profile.json", tmp_path / "h200" / "profile.json")
    with profiles_from(monkeypatch, tmp_path):
        assert main(["predict", "--gpu", "h200", "--context", "16K"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "measured on 'h100-sxm'" in err and "refusing" in err


def test_fit_only_refuses_rows_of_another_device_and_fits_its_own(
    root, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(ceilings, "PROFILES", tmp_path)
    (tmp_path / "h200").mkdir()
    shutil.copy(root / "h100-sxm" / "op_sweep.jsonl", tmp_path / "h200" / "op_sweep.jsonl")
    assert main(["calibrate", "--gpu", "h200", "--fit-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'NVIDIA H100 80GB HBM3' is filed under 'h200'" in err
    assert not (tmp_path / "h200" / "profile.json").exists()
    _relabelled(root / "h100-sxm" / "op_sweep.jsonl", tmp_path / "h200" / "op_sweep.jsonl")
    assert main(["calibrate", "--gpu", "h200", "--fit-only"]) == 0
    assert "profile h200-" in capsys.readouterr().out
    assert Profile.load(tmp_path / "h200" / "profile.json", gpu="h200").classes
