"""The document of record a GPU benchmark writes: its name, its fixed inputs, the provenance of
the run (device, versions, commit, time: ``kernels.timing.provenance``) and its rows, written
atomically so an interrupted run leaves no partial file."""

from __future__ import annotations

import json
from pathlib import Path

from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.files import atomic_write


def write_benchmark(path: Path, benchmark: str, rows: list[dict], **fields) -> None:
    """Write ``{"benchmark", **fields, "provenance", "rows"}`` to ``path``."""
    doc = dict(benchmark=benchmark, **fields, provenance=provenance(), rows=rows)
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
