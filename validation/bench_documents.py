"""The document of record a GPU benchmark writes: its name, its fixed inputs, the provenance of
the run (device, versions, commit, time: ``kernels.timing.provenance``) and its rows, written
atomically so an interrupted run leaves no partial file; and the run of a benchmark over head
geometries that writes one (``time_geometries``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from ssvkit.calibration.kernel_checks import CorrectnessError
from ssvkit.kernels.timing import copy_bytes_per_s, provenance
from ssvkit.perfmodel.files import atomic_write


def write_benchmark(path: Path, benchmark: str, rows: list[dict], **fields) -> None:
    """Write ``{"benchmark", **fields, "provenance", "rows"}`` to ``path``."""
    doc = dict(benchmark=benchmark, **fields, provenance=provenance(), rows=rows)
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


def time_geometries(
    parser,
    args,
    benchmark: str,
    time_geometry: Callable[[str, float], list[dict]],
    table: Callable[[list[dict]], str],
    timing,
    **fields,
) -> int:
    """A benchmark over head geometries, run: refused in one line without a GPU; the copy rate
    measured, then each geometry of ``args.geometries`` checked and timed
    (``time_geometry(geometry, copy_bytes_per_s)``); a failed check exits 2 with its one line and
    writes nothing; else the document of record at ``args.out`` (the ``timing`` settings, the
    copy rate and ``fields`` beside the rows) and ``table`` of the rows printed."""
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    try:
        copy_bps = copy_bytes_per_s()
        rows = [r for g in args.geometries for r in time_geometry(g, copy_bps)]
    except CorrectnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_benchmark(
        Path(args.out),
        benchmark,
        rows,
        timing=dataclasses.asdict(timing),
        copy_bytes_per_s=copy_bps,
        **fields,
    )
    print(table(rows))
    return 0
