"""A benchmark's document of record: its name, fields, provenance and rows, in that order."""

import json

from ssvkit.validation.bench_documents import write_benchmark


def test_document_holds_name_fields_provenance_and_rows(tmp_path):
    out = tmp_path / "b.json"
    write_benchmark(out, "pick_warps", [{"rows": 8}], top_n=16, block_size=64)
    doc = json.loads(out.read_text())
    assert list(doc) == ["benchmark", "top_n", "block_size", "provenance", "rows"]
    assert doc["benchmark"] == "pick_warps" and doc["rows"] == [{"rows": 8}]
    assert {"device_name", "git_commit", "timestamp"} <= set(doc["provenance"])
    assert out.read_text().endswith("}\n")


def _geometry_run(tmp_path, monkeypatch, time_geometry):
    import argparse
    from types import SimpleNamespace

    from ssvkit.kernels.timing import TimingConfig
    from ssvkit.validation import bench_documents as bd

    monkeypatch.setattr(bd.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bd, "copy_bytes_per_s", lambda: 4e12)
    monkeypatch.setattr(bd, "provenance", lambda: {"device_name": "a GPU"})
    args = SimpleNamespace(out=str(tmp_path / "g.json"), geometries=["tiny", "llama-3.1-8b"])
    table = lambda rows: f"{len(rows)} rows"  # noqa: E731
    timing = TimingConfig(warmup=1, graph_launches=2, graph_reps=3, max_total_s=0.1)
    return bd.time_geometries(
        argparse.ArgumentParser(), args, "bench", time_geometry, table, timing, knob=17
    )


def test_geometry_run_writes_every_geometrys_rows_at_the_measured_copy_rate(
    tmp_path, monkeypatch, capsys
):
    code = _geometry_run(tmp_path, monkeypatch, lambda g, bw: [{"geometry": g, "bw": bw}])
    doc = json.loads((tmp_path / "g.json").read_text())
    assert code == 0 and capsys.readouterr().out.strip() == "2 rows"
    assert doc["copy_bytes_per_s"] == 4e12 and doc["knob"] == 17 and doc["timing"]["warmup"] == 1
    assert [r["geometry"] for r in doc["rows"]] == ["tiny", "llama-3.1-8b"]


def test_geometry_run_whose_check_fails_exits_2_in_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    from ssvkit.calibration.kernel_checks import CorrectnessError

    def failing(g, bw):
        if g == "llama-3.1-8b":
            raise CorrectnessError("dense_verify at llama-3.1-8b: max error 0.5 (NaN)")
        return [{"geometry": g}]

    assert _geometry_run(tmp_path, monkeypatch, failing) == 2
    err = capsys.readouterr().err
    assert err == "error: dense_verify at llama-3.1-8b: max error 0.5 (NaN)\n"
    assert not (tmp_path / "g.json").exists()
