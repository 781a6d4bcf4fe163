"""Sweep tables: a dict of equal-length numpy columns, written as CSV (base install) or Parquet
(``sweep`` extra: pyarrow), read back the same way, and turned into a pandas frame on demand.

CSV floats are written with ``repr`` (shortest round-trip form), NaN as an empty field, so a
table read back equals the one written, and two runs with equal results write equal bytes.
Parquet files carry the sweep's spec and run facts as JSON in the schema metadata.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.files import check_input, read_text

FORMATS = (".csv", ".parquet")
META_KEY = b"ssvkit.sweep"


def table_format(path: str | Path) -> str:
    """``csv`` or ``parquet`` from the file name; raises for other suffixes."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"output {str(path)!r} must end in .csv or .parquet")
    return suffix[1:]


def require_pyarrow(what: str):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{what} needs pyarrow: pip install 'ssvkit[sweep]' (or use .csv)"
        ) from None
    return pyarrow


def num_rows(table: dict[str, np.ndarray]) -> int:
    return len(next(iter(table.values()))) if table else 0


def _strings(col: np.ndarray) -> list[str]:
    if col.dtype.kind == "f":
        return ["" if v != v else repr(v) for v in col.tolist()]
    if col.dtype.kind == "b":
        return ["True" if v else "False" for v in col.tolist()]
    return [str(v) for v in col.tolist()]


def to_csv(table: dict[str, np.ndarray]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(table))
    w.writerows(zip(*(_strings(c) for c in table.values()), strict=True))
    return buf.getvalue()


def to_parquet(table: dict[str, np.ndarray], meta: dict | None = None) -> bytes:
    pa = require_pyarrow("Parquet output")
    import pyarrow.parquet as pq

    arrays = {
        k: pa.array(
            v.tolist() if v.dtype == object else v, type=pa.string() if v.dtype == object else None
        )
        for k, v in table.items()
    }
    t = pa.table(arrays)
    if meta is not None:
        t = t.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


def encode(table: dict[str, np.ndarray], path: str | Path, meta: dict | None = None) -> bytes | str:
    """The bytes (Parquet) or text (CSV) of ``table`` for ``path``'s format."""
    return to_parquet(table, meta) if table_format(path) == "parquet" else to_csv(table)


def _parse_column(values: list[str]) -> np.ndarray:
    if values and all(v in ("True", "False") for v in values):
        return np.array([v == "True" for v in values], dtype=bool)
    try:
        ints = [int(v) for v in values]
        return np.array(ints, dtype=np.int64)
    except ValueError:
        pass
    try:
        return np.array([float(v) if v != "" else np.nan for v in values], dtype=float)
    except ValueError:
        return np.array(values, dtype=object)


def read_table(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """``(columns, meta)`` of a sweep file written by ``encode`` (meta is empty for CSV)."""
    p = Path(path)
    fmt = table_format(p)
    if fmt == "parquet":
        check_input(p, "sweep file")
        require_pyarrow("reading Parquet")
        import pyarrow.parquet as pq

        try:
            t = pq.read_table(p)
        except Exception as e:  # pyarrow raises its own error types for corrupt files
            raise ValueError(f"{p.name} is not a readable Parquet file: {e}") from None
        meta = json.loads((t.schema.metadata or {}).get(META_KEY, b"{}"))
        cols = {}
        for name in t.column_names:
            c = t.column(name)
            arr = c.to_numpy(zero_copy_only=False)
            cols[name] = arr.astype(object) if arr.dtype.kind in "OU" else arr
        return cols, meta
    rows = list(csv.reader(io.StringIO(read_text(p, "sweep file"), newline="")))
    if not rows:
        raise ValueError(f"{p.name} is empty")
    head, body = rows[0], rows[1:]
    if any(len(r) != len(head) for r in body):
        raise ValueError(f"{p.name}: rows have differing numbers of fields (not a sweep CSV)")
    return {h: _parse_column([r[i] for r in body]) for i, h in enumerate(head)}, {}


def to_pandas(table: dict[str, np.ndarray]):
    """A ``pandas.DataFrame`` of the columns (needs the ``sweep`` extra)."""
    try:
        import pandas as pd
    except ImportError:
        raise ValueError("a pandas frame needs pandas: pip install 'ssvkit[sweep]'") from None
    return pd.DataFrame({k: v for k, v in table.items()})


def sibling(path: str | Path, kind: str) -> Path:
    """``sweep.csv`` -> ``sweep.<kind>.csv`` (where the capacity table goes)."""
    p = Path(path)
    return p.with_name(f"{p.stem}.{kind}{p.suffix}")
