"""The text and JSON that ``ssvkit sweep`` prints (``ssvkit.cli.sweep_cmd``): the best
strategy of each cell with its interval, the capacity table, and the files written."""

from __future__ import annotations

import json

import numpy as np

from ssvkit.cli.options import bounded_text, interval_legend, intervals_doc
from ssvkit.perfmodel.numbers import count_label, figure

CELL_COLUMNS = (  # (column, header, width, format): printed when the sweep varies them
    ("model", "model", 14, "s"),
    ("gpu", "gpu", 9, "s"),
    ("tp", "tp", 3, "d"),
    ("context_len", "context", 7, "ctx"),
    ("batch", "batch", 5, "d"),
    ("acceptance", "accept", 6, ".2f"),
    ("overlap", "overlap", 7, ".2f"),
    ("kv_bytes", "kv", 3, "d"),
)


def _best_rows(table: dict, spec, top: int) -> tuple[list[str], int]:
    axes = {"model": spec.models, "gpu": spec.gpus, "context_len": spec.context_len}
    shown = [
        c
        for c in CELL_COLUMNS
        if c[0] == "context_len" or len(axes.get(c[0], getattr(spec, c[0], ()))) > 1
    ]
    m = np.flatnonzero(table["best"])
    figures = (
        ("tokens_per_s", "tok/s", 1.0, ".1f", ""),
        ("speedup_vs_ar_dense", "vs ar_dense", 1.0, ".2f", "x"),
        ("speedup_vs_ar_sparse", "vs ar_sparse", 1.0, ".2f", "x"),
        ("tpot_s", "tpot ms", 1e3, ".2f", ""),
    )
    texts = {
        col: [
            bounded_text(
                table[col][i] * scale,
                _interval(table, col, i, scale),
                fmt,
                suffix,
            )
            for i in m[:top]
        ]
        for col, _, scale, fmt, suffix in figures
    }
    widths = {col: max([len(h), *map(len, texts[col])]) for col, h, *_ in figures}
    head = " ".join(f"{h:>{w}s}" for _, h, w, _ in shown) + f" {'strategy':28s}"
    head += "".join(f" {h:>{widths[col]}s}" for col, h, *_ in figures)
    lines = [head, "-" * len(head)]
    for j, i in enumerate(m[:top]):
        cells = []
        for col, _, w, fmt in shown:
            v = table[col][i]
            text = count_label(int(v)) if fmt == "ctx" else format(v if fmt != "s" else str(v), fmt)
            cells.append(f"{text[:w]:>{w}s}")
        lines.append(
            " ".join(cells)
            + f" {str(table['strategy'][i])[:28]:28s}"
            + "".join(f" {texts[col][j]:>{widths[col]}s}" for col, *_ in figures)
        )
    return lines, len(m)


def _interval(table: dict, col: str, i: int, scale: float = 1.0):
    """[low, high] of ``col`` at row ``i`` (times ``scale``), or None (no interval)."""
    lo, hi = table[f"{col}_low"][i], table[f"{col}_high"][i]
    return None if np.isnan(lo) else [lo * scale, hi * scale]


def _capacity_rows(cap: dict) -> list[str]:
    i0 = 0
    lines = [
        f"capacity: TTFT <= {cap['slo_ttft_s'][i0]:g} s and TPOT <= "
        f"{cap['slo_tpot_s'][i0] * 1e3:g} ms for {100 * cap['attainment'][i0]:g}% of "
        f"{cap['num_requests'][i0]} requests ({cap['output_tokens'][i0]} output tokens), "
        "simulated serving; * = fewest GPUs for that rate",
        f"{'model':14s} {'gpu':9s} {'tp':>2s} {'context':>7s} {'strategy':28s} "
        f"{'max req/s/replica':>17s} {'rate':>8s} {'GPUs':>6s}  status",
    ]
    for i in range(len(cap["model"])):
        gpus = cap["gpus_needed"][i]
        lines.append(
            f"{str(cap['model'][i])[:14]:14s} {str(cap['gpu'][i])[:9]:9s} {cap['tp'][i]:2d} "
            f"{count_label(int(cap['context_len'][i])):>7s} {str(cap['strategy'][i])[:28]:28s} "
            f"{cap['replica_requests_per_s'][i]:17.3f} {cap['requests_per_s'][i]:8g} "
            f"{'-' if np.isnan(gpus) else f'{gpus:.0f}':>6s}{'*' if cap['best'][i] else ' '} "
            f"{cap['status'][i]}"
        )
    return lines


def sweep_summary(result, files: dict, top: int) -> str:
    f, t = result.facts, result.table
    lines = [
        f"sweep: {f['points']:,} points ({result.spec.shape()}) evaluated in "
        f"{f['elapsed_s']:.2f} s ({f['points'] / max(f['points_s'], 1e-9):,.0f} points/s, "
        f"{f['partitions']} tasks on {f['executor']}) [{', '.join(f['provenance'])}]",
        f"  infeasible {int((~t['feasible']).sum()):,}  KV does not fit "
        f"{int((t['feasible'] & ~t['fits_memory']).sum()):,}  extrapolated "
        f"{int(t['extrapolated'].sum()):,}",
        "best strategy per cell:",
    ]
    rows, n = _best_rows(t, result.spec, top)
    lines += rows
    shown = np.flatnonzero(t["best"])[:top]
    lines += interval_legend(
        [not np.isnan(t["tokens_per_s_low"][i]) for i in shown],
        "no residuals price the datasheet roofline or a transfer across architectures",
    )
    if n > top:
        lines.append(f"... {n - top:,} more cells (--top N, or the table's best column)")
    if result.capacity is not None:
        lines += ["", *_capacity_rows(result.capacity)]
    for kind, path in files.items():
        lines.append(f"wrote {kind}: {path}")
    return "\n".join(lines)


def _row_doc(table: dict, i: int, prov_key: str = "provenance") -> dict:
    p = str(table[prov_key][i])
    doc = {k: _plain(table[k][i]) for k in ("model", "gpu", "strategy", "base")}
    for k in ("tp", "context_len", "batch", "acceptance", "overlap", "kv_bytes"):
        doc[k] = _plain(table[k][i])
    units = {"tokens_per_s": "tokens/s", "tokens_per_s_per_gpu": "tokens/s", "tpot_s": "s"}
    units.update({f"speedup_vs_{a}": "x" for a in ("ar_dense", "ar_sparse")})
    for k, unit in units.items():
        iv = _interval(table, k, i)
        doc[k] = {
            **figure(_plain(table[k][i]), unit, p),
            "interval": None if iv is None else [float(x) for x in iv],
        }
    if "sim_tokens_per_s" in table:
        doc["sim_tokens_per_s"] = figure(
            _plain(table["sim_tokens_per_s"][i]), "tokens/s", str(table["sim_provenance"][i])
        )
    return doc


def _cap_doc(cap: dict, i: int) -> dict:
    p = str(cap["provenance"][i]) or "not simulated"
    doc = {
        k: _plain(cap[k][i])
        for k in ("model", "gpu", "tp", "context_len", "acceptance", "overlap", "kv_bytes")
    }
    doc.update(
        strategy=str(cap["strategy"][i]),
        status=str(cap["status"][i]),
        best=bool(cap["best"][i]),
        requests_per_s=figure(_plain(cap["requests_per_s"][i]), "requests/s", "input"),
        replica_requests_per_s=figure(_plain(cap["replica_requests_per_s"][i]), "requests/s", p),
        replica_saturation_requests_per_s=figure(
            _plain(cap["replica_saturation_requests_per_s"][i]), "requests/s", p
        ),
        gpus_needed=figure(_plain(cap["gpus_needed"][i]), "GPUs", p),
    )
    return doc


def _plain(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v


def sweep_json(result, files: dict) -> str:
    f, t = result.facts, result.table
    wall = "measured:wall-clock"
    doc = {
        "points": f["points"],
        "partitions": f["partitions"],
        "executor": f["executor"],
        "elapsed_s": figure(f["elapsed_s"], "s", wall),
        "points_per_s": figure(f["points"] / max(f["points_s"], 1e-9), "points/s", wall),
        "provenance": f["provenance"],
        "intervals": intervals_doc(),
        "spec": result.spec.to_doc(),
        "best": [_row_doc(t, int(i)) for i in np.flatnonzero(t["best"])],
        "files": {k: str(v) for k, v in files.items()},
    }
    if result.capacity is not None:
        doc["capacity"] = [
            _cap_doc(result.capacity, i) for i in range(len(result.capacity["model"]))
        ]
    return json.dumps(doc, indent=1)
