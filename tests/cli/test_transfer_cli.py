"""How the pricing commands resolve ``--gpu``: its own profile, one transferred from its
architecture, another architecture's only with ``--transfer-across-architectures``, the bare
roofline with ``--roofline``; a GPU nothing may price is refused in one line, exit 2."""

import json

import pytest
from ssvkit.perfmodel.profiles import shipped_profile

from ssvkit.cli import main

PID = shipped_profile("h100-sxm").profile_id
ONE = ["--context", "16K", "--strategies", "ar_dense,ssv", "--json"]


# These tests price the H200 by transfer (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("h200_without_a_profile")


def _provenances(capsys) -> set[str]:
    """The labels of the profile (or roofline) that priced the rows, without the flags of an
    extrapolation or a stand-in class (the fused element-wise ops, ``perfmodel.calibrated``)."""
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    return {
        r["tokens_per_s"]["provenance"].removesuffix(":stand-in").removesuffix(":extrapolated")
        for r in rows
    }


@pytest.mark.parametrize(
    ("argv", "label"),
    [
        (["--gpu", "h100-sxm"], f"calibrated:{PID}"),
        (["--gpu", "h200"], f"transferred:{PID}->h200"),
        (["--gpu", "h100-pcie"], f"transferred:{PID}->h100-pcie"),
        (
            ["--gpu", "a100-80g", "--transfer-across-architectures"],
            f"transferred-cross-arch:{PID}->a100-80g",
        ),
        (["--gpu", "h100-sxm", "--roofline"], "datasheet"),
        (["--gpu", "a100-80g", "--roofline"], "datasheet"),
    ],
)
def test_predict_labels(argv, label, capsys):
    assert main(["predict", *argv, *ONE]) == 0
    assert _provenances(capsys) == {label}


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--context", "16K"],
        ["simulate", "ssv", "--no-files"],
        ["sweep", "--context", "16K"],
        ["rank", "--top", "1"],
    ],
)
def test_a_gpu_without_a_profile_of_its_architecture_is_refused(argv, capsys):
    assert main([*argv, "--gpu", "a100-80g"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no calibrated profile for a100-80g" in err and "hopper (h100-sxm)" in err


def test_roofline_and_the_cross_architecture_opt_in_exclude_each_other(capsys):
    argv = ["predict", "--gpu", "a100-80g", "--roofline", "--transfer-across-architectures"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "not allowed with argument --roofline" in capsys.readouterr().err


def test_simulate_labels_its_costs_with_the_transferred_profile(capsys):
    assert main(["simulate", "ssv", "--gpu", "h200", "--no-files", "--json"]) == 0
    out = capsys.readouterr().out
    assert f"costs:transferred:{PID}->h200" in out and "datasheet" not in out


def test_sweep_transfers_per_gpu_and_takes_the_opt_in_from_a_grid(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text("gpus: [h200, a100-80g]\ncontext_len: [16K]\nany_architecture: true\n")
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--grid", str(grid), "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    provs = {line.rsplit(",", 1)[-1] for line in out.read_text().splitlines()[1:]}
    labels = {p.removesuffix(":stand-in").removesuffix(":extrapolated") for p in provs}
    want = {f"transferred:{PID}->h200", f"transferred-cross-arch:{PID}->a100-80g"}
    assert want <= labels
