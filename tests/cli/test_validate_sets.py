"""``ssvkit validate --sets``: the transfer sets it prints and carries in ``--json``, computed
on a profiles folder of a few kernel classes (the committed rows of dense verification, the
GEMMs, the KV writes, one union sparse verification class and the ceilings' ops, of both GPUs),
so that the sets' refits take seconds. ``ssvkit validate --check`` in CI computes every set of
the committed rows."""

from __future__ import annotations

import json
import shutil

import pytest
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import op_class
from ssvkit.calibration.transfer_sets import TARGETS
from ssvkit.perfmodel.rows import load_rows

from ssvkit.cli import main
from tests.fit_helpers import profiles_from

KEPT_OPS = {"gemm", "dense_verify", "device_copy", "empty_triton_kernel", "kv_write"}
UNION = "sparse_verify/union/many_lists"


def _kept(row: dict) -> bool:
    return row["op"] in KEPT_OPS or (row["op"] == "sparse_verify" and op_class(row) == UNION)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The committed profiles folder with each GPU's rows, its ``unfitted/`` ones too, cut to
    the kept families (the rows are the committed ones, seals intact)."""
    base = tmp_path_factory.mktemp("profiles")
    for gpu in ("h100-sxm", "h200"):
        shutil.copytree(ceilings.PROFILES / gpu, base / gpu)
        for path in (base / gpu).rglob("*.jsonl"):
            kept = [r for r in load_rows(path) if _kept(r)]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return base


@pytest.fixture(scope="module")
def profiles(root):
    with pytest.MonkeyPatch.context() as mp, profiles_from(mp, root):
        yield root


def test_validate_prints_the_chosen_sets(profiles, capsys):
    assert main(["validate", "--sets", "group"]) == 0
    out = capsys.readouterr().out
    assert "profile h100-sxm-" not in out  # the interpolation tables only when chosen
    lines = out.splitlines()
    assert lines[0] == "group: leave one group size out"
    assert lines[1].startswith("target median APE <= 6%, p90 APE <= 15%: ")
    # its own class refitted on the other group sizes: no other class named as the predictor
    union = next(x for x in lines if x.startswith(UNION + " "))
    assert union.split()[-1] in ("met", "MISSED")
    # several sets in the order of the table (the group set's refits are the first call's)
    assert main(["validate", "--sets", "group,interp"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("profile h100-sxm-") and "\ngroup: leave one group size out" in out
    assert main(["validate", "--sets", "heads"]) == 2
    assert "unknown test set 'heads'" in capsys.readouterr().err


def test_validate_json_carries_the_sets(profiles, capsys):
    assert main(["validate", "--json", "--sets", "interp,group,gpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overall"]["heldout"]["n"] > 10  # the interpolation report is unchanged
    assert doc["transfer_targets"] == TARGETS
    assert set(doc["transfer"]) == {"group", "h100-sxm->h200", "h200->h100-sxm"}
    for key, s in doc["transfer"].items():
        target = TARGETS["leave_one_out" if key == "group" else "cross_gpu"]
        assert s["target"] == target
        for stats in s["classes"].values():
            assert stats["n"] > 0
            met = stats["median_ape"] <= target["median_ape"] and stats["p90_ape"] <= 0.15
            assert stats["met"] == met
        assert s["met"] == all(c["met"] for c in s["classes"].values())
    # the sets predict each GPU's rows of the current kernels (the H100's unfitted/ rows in
    # place of its profile's attention rows), so every H100 class the H200 rows fit is scored
    back = doc["transfer"]["h200->h100-sxm"]
    assert {"gemm", "dense_verify", UNION} <= set(back["classes"])
    assert not back["other_kernels"]
    assert back["unpredicted"] and not set(back["unpredicted"]) & set(back["classes"])
