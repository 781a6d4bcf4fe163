import json

import pytest
from ssvkit.calibration import ceilings
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.rows import checksum, load_rows, seal, validate


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_committed_overlay_is_derived_from_the_rows(gpu):
    rows = ceilings.profile_rows(gpu)
    committed = json.loads((ceilings.PROFILES / gpu / "ceilings.json").read_text())
    assert committed == ceilings.derive(gpu, rows)
    g = get_gpu(gpu)
    assert g.provenance == f"calibrated:{committed['profile_id']}"
    assert g.hbm_bytes_per_s == committed["ceilings"]["hbm_bytes_per_s"]


def _row(**kw):
    r = {
        "op": "gemm",
        "params": {"m": 1},
        "median_s": 2e-6,
        "p10_s": 1e-6,
        "p90_s": 3e-6,
        "timing": "graph",
        "unique_bytes": 10.0,
        "flops": 2.0,
        "achieved_bytes_per_s": 5e6,
        "copy_bytes_per_s": 3e12,
        "gemm_flops_per_s": 7e14,
        "launch_s": 2e-6,
        "device_name": "NVIDIA H100 80GB HBM3",
        "torch_version": "2.11",
        "triton_version": "3.6",
        "git_commit": "abc",
        "timestamp": "2026-11-22T00:00:00+00:00",
    }
    r.update(kw)
    return seal(r)


def test_hand_edited_row_is_detected(tmp_path):
    row = _row()
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps(row) + "\n")
    assert len(load_rows(p)) == 1
    row["median_s"] = 1.5e-6  # a "fix" typed in by hand
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_rows(p)
    row["checksum"] = checksum(row)
    validate(row)  # re-sealing is deliberate, not an edit that slips through


def test_row_schema_rejects_bad_rows():
    with pytest.raises(ValueError, match="p10 <= median <= p90"):
        _row(p10_s=5e-6)
    with pytest.raises(ValueError, match="timing"):
        _row(timing="eager")
    bad = _row()
    del bad["flops"]
    with pytest.raises(ValueError, match="missing field 'flops'"):
        validate(bad)


def test_device_mismatch_is_refused(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps(_row(device_name="NVIDIA H200")) + "\n")
    with pytest.raises(ValueError, match="measured on 'NVIDIA H200' is filed under 'h100-sxm'"):
        ceilings.profile_rows("h100-sxm", tmp_path)


def test_committed_rows_are_all_valid():
    rows = ceilings.profile_rows("h100-sxm")
    assert len(rows) > 1000
    assert {r["op"] for r in rows} >= {"dense_verify", "sparse_verify", "gemm", "repair"}


def test_sweep_refuses_an_unknown_op_group_in_one_line(tmp_path, capsys):
    from ssvkit.calibration import sweep

    assert sweep.main(["--out", str(tmp_path), "--ops", "gemm,bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'bogus'" in err and "resident" in err
    assert not any(tmp_path.iterdir())  # nothing written
    # The sweep of record adds the engine's own ops as a group of its own.
    from ssvkit.validation import engine_op_sweep

    assert engine_op_sweep.main(["--out", str(tmp_path), "--ops", "engine,bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'bogus'" in err and "engine" in err and "elementwise" in err


def test_current_kernel_rows_put_the_unfitted_families_in_place_and_add_their_ceilings(
    tmp_path, monkeypatch
):
    """A profile folder's ``unfitted/`` rows replace the profile's rows of each kernel op they
    time; their copy rows join the profile's (each run measured its own ceilings)."""
    gpu = tmp_path / "h100-sxm"
    (gpu / ceilings.UNFITTED).mkdir(parents=True)
    old = [_row(params={"m": 1}), _row(op="device_copy", copy_bytes_per_s=3.0e12)]
    old.append(_row(op="rmsnorm", params={"m": 4}))
    new = [_row(params={"m": 2}, git_commit="def"), _row(op="device_copy", copy_bytes_per_s=3.1e12)]
    for path, rows in ((gpu / "a.jsonl", old), (gpu / ceilings.UNFITTED / "b.jsonl", new)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(ceilings, "PROFILES", tmp_path)
    assert ceilings.has_unfitted("h100-sxm")
    got = ceilings.current_kernel_rows("h100-sxm")
    assert [r["params"] for r in got if r["op"] == "gemm"] == [{"m": 2}]
    assert [r["op"] for r in got].count("device_copy") == 2 and any(
        r["op"] == "rmsnorm" for r in got
    )
    assert ceilings.derive("h100-sxm", got)["ceilings"]["hbm_bytes_per_s"] == 3.1e12
    (gpu / ceilings.UNFITTED / "b.jsonl").unlink()
    assert not ceilings.has_unfitted("h100-sxm")
    assert ceilings.current_kernel_rows("h100-sxm") == ceilings.profile_rows("h100-sxm")


def test_every_committed_profile_file_is_package_data():
    """An installed ssvkit (CI installs it) reads its profiles from the package: every file
    under calibration/profiles must match one of the package-data globs of pyproject.toml."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["ssvkit.calibration"]
    base = root / "calibration"
    packaged = {p for g in globs for p in base.glob(g)}  # a glob's * stays within one folder
    files = [p for p in (base / "profiles").rglob("*") if p.is_file()]
    assert files
    assert [str(p.relative_to(base)) for p in files if p not in packaged] == []
