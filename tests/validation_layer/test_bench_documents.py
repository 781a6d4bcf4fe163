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
