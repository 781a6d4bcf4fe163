"""The measurement-row schema (version 1): one JSON object per line, sealed with a checksum.

Every timed configuration (a kernel, a GEMM, an elementwise op, an empty launch) is one row
holding the fields ``REQUIRED`` names (``validate`` says what each holds): the op and its
params, its timings, its work, the ceilings measured in the same run and its provenance, with
``schema_version`` and ``checksum`` (``seal``). Measured data is never edited by hand:
``load_rows`` recomputes every checksum and refuses a row whose content no longer matches it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

SCHEMA_VERSION = 1
REQUIRED = {
    "op": str,
    "params": dict,
    "median_s": float,
    "p10_s": float,
    "p90_s": float,
    "timing": str,
    "unique_bytes": (int, float),
    "flops": (int, float),
    "achieved_bytes_per_s": (int, float),
    "copy_bytes_per_s": (int, float),
    "gemm_flops_per_s": (int, float),
    "launch_s": (int, float),
    "device_name": str,
    "torch_version": str,
    "triton_version": str,
    "git_commit": str,
    "timestamp": str,
}
TIMINGS = ("launch", "graph")


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def checksum(row: dict) -> str:
    body = {k: v for k, v in row.items() if k != "checksum"}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def seal(row: dict) -> dict:
    """The row with ``schema_version`` and its ``checksum`` set (validates it first)."""
    out = {**row, "schema_version": SCHEMA_VERSION}
    out.pop("checksum", None)
    validate(out, check_sum=False)
    out["checksum"] = checksum(out)
    return out


# Params derived from a row's defining ones (the split count the wrapper chose, the load
# fractions and distinct bytes of the selections, the input sets rotated, the missed blocks of a
# fraction): not part of its key, ignored when matching rows of one configuration.
DERIVED = frozenset(
    {
        "num_splits",
        "f_load",
        "f_load_formula",
        "global_unique_bytes",
        "rotations",
        "missed_blocks",
    }
)


def row_key(op: str, timing: str, params: dict) -> str:
    """Stable identity of a measured configuration (resume and de-duplication key): op, timing
    and the params that define the configuration (``DERIVED`` left out)."""
    defining = {k: v for k, v in params.items() if k not in DERIVED}
    return f"{op}|{timing}|{json.dumps(defining, sort_keys=True)}"


def validate(row: dict, *, check_sum: bool = True, where: str = "row") -> None:
    """Raise ``ValueError`` naming the first problem of a row: a field of ``REQUIRED``
    missing or of the wrong type, another schema version, an unknown timing, timings out of
    order, or (``check_sum``) a checksum that does not match. A row holds:

    - ``op``: op name (``dense_verify``, ``sparse_verify``, ``gemm``, ``sdpa``, ...);
    - ``params``: the configuration (``context_len``, ``num_query_tokens``, ``num_q_heads``,
      ``num_kv_heads``, ``head_dim``, ``batch``, ``mode``, ``group_size``, ``overlap``,
      ``top_n``, ``block_size``, ... -- whatever defines the op's work);
    - timings: ``median_s``, ``p10_s``, ``p90_s`` and ``timing`` (``launch`` | ``graph``);
    - work: ``unique_bytes`` (the fewest device-memory bytes the op must move), ``flops``,
      ``achieved_bytes_per_s``;
    - ceilings measured in the same run: ``copy_bytes_per_s``, ``gemm_flops_per_s``,
      ``launch_s``;
    - provenance: ``device_name``, ``torch_version``, ``triton_version``, ``git_commit``,
      ``timestamp``;
    - ``schema_version`` and ``checksum``: sha256 of the row's canonical JSON without the
      checksum;
    - optional, in rows of the sweeps' runner (``calibration.runner``): ``wall_s`` and
      ``first_call_s``, the wall seconds the row took and its op's first (compiling) call.
    """
    for name, kind in REQUIRED.items():
        if name not in row:
            raise ValueError(f"{where}: missing field {name!r}")
        if not isinstance(row[name], kind) or isinstance(row[name], bool):
            raise ValueError(f"{where}: field {name!r} has type {type(row[name]).__name__}")
    if row.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{where}: schema_version {row.get('schema_version')!r} is not {SCHEMA_VERSION}"
        )
    if row["timing"] not in TIMINGS:
        raise ValueError(f"{where}: timing {row['timing']!r} is not launch or graph")
    if not (0 < row["p10_s"] <= row["median_s"] <= row["p90_s"]):
        raise ValueError(f"{where}: timings must satisfy 0 < p10 <= median <= p90")
    if check_sum and row.get("checksum") != checksum(row):
        raise ValueError(f"{where}: checksum mismatch: the row was edited after it was measured")


def load_rows(path: str | Path) -> list[dict]:
    """All rows of a JSONL file, each validated (checksum included)."""
    rows = []
    p = Path(path)
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{i}: not valid JSON ({e.msg})") from None
        validate(row, where=f"{p}:{i}")
        rows.append(row)
    return rows


def redo_matches(selectors: Iterable[str], op: str, params: dict) -> bool:
    """Whether a row of ``op`` with ``params`` is one to measure again: some selector is its
    op alone (``nsa_verify``) or its op with params it has (``nsa_verify:mode=refresh:batch=1``,
    each ``key=value`` compared with the param as text: ``True``, ``16``, ``bfloat16``)."""
    for sel in selectors:
        name, *conds = sel.split(":")
        if name != op:
            continue
        if all(str(params.get(k)) == v for k, _, v in (c.partition("=") for c in conds)):
            return True
    return False


def check_redo(selectors: Iterable[str]) -> None:
    """``ValueError`` naming a selector whose conditions are not ``key=value``."""
    for sel in selectors:
        _, *conds = sel.split(":")
        bad = [c for c in conds if not c.partition("=")[0] or not c.partition("=")[1]]
        if bad or not sel.split(":")[0]:
            raise ValueError(
                f"redo selector must be OP or OP:KEY=VALUE[:KEY=VALUE...], got {sel!r}"
            )
