"""The report over a scale campaign (``validation.scale_campaign``): perfmodel's prediction of each
cell beside what the cell measured, per GPU, model, batch and context.

    ssvkit report --campaign build/scale-campaign.json [--json] [--check] [--plot FILE]

Per group, the median / p90 / max absolute percentage error, with its count, of the verify
step, the round, tokens/s and the speedups of ``SPEEDUP_PAIRS`` (``build_scale``). The measured
round and tokens/s are those of the cell's full-batch rounds (``validation.full_batch``), the
whole run's tokens/s beside them; the prediction is perfmodel's step model now, with the
profile the campaign's GPU has when the report runs, at the acceptance of those rounds
(``predict_row``), without a host-loop term. Beside them, the simulator's replay of each cell
(``validation.scale_simulate``) against the whole run's tokens/s, and per figure the measured
values inside their predicted intervals (``coverage``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ssvkit.calibration.fit import error_stats
from ssvkit.perfmodel.files import malformed
from ssvkit.perfmodel.intervals import COVERAGE
from ssvkit.validation.decode_figures import inside, ratio_interval
from ssvkit.validation.e2e_campaign import NAMES
from ssvkit.validation.full_batch import row_figures
from ssvkit.validation.scale_cells import AUTOREGRESSIVE, BENCHMARK, CAMPAIGN_VERSION
from ssvkit.validation.scale_simulate import simulate_row

# (baseline, over): every baseline over ar_dense, and the grouped strategies over the sparse
# autoregressive baseline and both speculative ones (the seeds' headline ratios).
SPEEDUP_PAIRS = tuple((b, "ar_dense") for b in NAMES[1:]) + tuple(
    (b, over)
    for b in ("ssv", "ssv_planned")
    for over in ("ar_sparse", "sd_dense", "sd_sparse_naive")
)
# Issue targets of the campaign at scale: median and p90 APE per figure.
TARGETS = {
    f"{k}_{q}_ape": t
    for k in ("verify", "tokens_per_s", "speedup")
    for q, t in (("median", 0.08), ("p90", 0.15))
}
LEVELS = {
    "gpu": ("gpu",),
    "model": ("gpu", "model"),
    "batch": ("gpu", "model", "batch"),
    "context": ("gpu", "model", "batch", "context"),
}
NO_INTERVALS = (
    "no prediction intervals: the campaign's predictions carry none (predicted without "
    "residuals: the roofline, or before perfmodel had intervals), so none is drawn"
)
# The cell figures with intervals, and the key of each in ``decode_figures.predict``'s (the
# measured verify step is the target forward).
INTERVAL_KEYS = {
    "verify_s": "verify_forward_s",
    "round_s": "round_s",
    "tokens_per_s": "tokens_per_s",
}


def is_scale_campaign(doc: dict) -> bool:
    """Whether ``doc`` is a scale campaign document: its ``benchmark`` field, or, in a document
    without one, the device memory only the scale campaign records."""
    if "benchmark" in doc:
        return doc["benchmark"] == BENCHMARK
    return "available_bytes" in doc and doc.get("acceptance") == "synthetic:oracle"


def _keys(doc: dict, r: dict) -> dict:
    """What names a row's cell: the GPU, model, context, batch, baseline and acceptance."""
    return {
        "gpu": doc["gpu"],
        "model": r["model"].removeprefix("random:"),
        "context": r["context"],
        "batch": r["batch"],
        "batch_label": r["label"],
        "baseline": r["baseline"],
        "acceptance": r["acceptance"],
    }


def predict_row(doc: dict, r: dict) -> dict:
    """perfmodel's prediction of a measured row now, with the profile of the campaign's GPU,
    at the acceptance of the row's full-batch rounds (``row_figures``), its measured selection
    overlap, the NSA row schedule it ran with (``validation.records.measured_strategy``) and the
    element-wise implementation of its backend (``perfmodel.elementwise.elementwise_of_run``).
    The campaign's own prediction, stored with each row at measure time, is its provenance,
    not what the report compares."""
    from types import SimpleNamespace

    from ssvkit.perfmodel.elementwise import elementwise_of_run
    from ssvkit.validation.decode_figures import loop_of_run
    from ssvkit.validation.records import measured_strategy
    from ssvkit.validation.scale_measure import predict_cell

    settings = SimpleNamespace(gpu=doc["gpu"], new_tokens=doc["new_tokens"])
    _, alpha = row_figures(r)
    overlap = r["selection"]["group_overlap"]
    drafted = r["acceptance"] is not None
    elementwise = elementwise_of_run(r["provenance"])
    loop = loop_of_run(r["measured"])
    args = (r["model"], r["context"], r["batch"], drafted, alpha, overlap, settings, elementwise)
    return predict_cell(measured_strategy(r), *args, loop)


def _measured(r: dict) -> dict:
    """A row's measured figures as the report compares them: over its full-batch rounds where
    it has them (``row_figures``), else over the whole run; the whole run's tokens/s beside
    them."""
    m = r["measured"]
    full, _ = row_figures(r)
    out = {
        "tokens_per_s": m["tokens_per_s"],
        "verify_s": m["steps_s"]["verify"],
        "round_s": m["wall_s"] / m["rounds"],
        "run_tokens_per_s": m["tokens_per_s"],
        "rounds": f"whole run ({m['rounds']} rounds)",
    }
    if full is not None:
        out.update(tokens_per_s=full["tokens_per_s"], round_s=full["round_s"])
        out["rounds"] = (
            f"full batch ({full['rounds']} of {m['rounds']} rounds, wall {full['wall']})"
        )
    return out


def _cell(doc: dict, r: dict) -> dict:
    """A measured row's figures: measured (``_measured``), predicted now (``predict_row``),
    and its keys."""
    p = predict_row(doc, r)
    out = {
        **_keys(doc, r),
        "acceptance_source": r["measured_acceptance"]["source"],
        "overlap": r["selection"]["group_overlap"],
        "measured": _measured(r),
    }
    out["simulated"] = simulate_row(doc, r)
    if "error" in p:
        return {**out, "predicted": None, "unpredicted": p["error"]}
    out["predicted"] = {
        "tokens_per_s": p["tokens_per_s"],
        "verify_s": p.get("verify_forward_s"),
        "round_s": p["round_s"],
        "provenance": p["provenance"],
        "intervals": p.get("intervals"),
        "round_log_bounds": p.get("round_log_bounds"),
    }
    return out


def _speedups(cells: list[dict]) -> list[dict]:
    """Each pair of ``SPEEDUP_PAIRS`` measured and predicted at one (model, context, batch) and
    acceptance (an autoregressive cell pairs with every acceptance)."""
    at = {(c["model"], c["context"], c["batch"], c["baseline"], c["acceptance"]): c for c in cells}
    out = []
    for model, ctx, batch in sorted({(c["model"], c["context"], c["batch"]) for c in cells}):
        here = [c for c in cells if (c["model"], c["context"], c["batch"]) == (model, ctx, batch)]
        accs = sorted({c["acceptance"] for c in here if c["acceptance"] is not None}) or [None]
        for b, over in SPEEDUP_PAIRS:
            both_ar = b in AUTOREGRESSIVE and over in AUTOREGRESSIVE
            for a in [None] if both_ar else accs:
                x = at.get((model, ctx, batch, b, None if b in AUTOREGRESSIVE else a))
                y = at.get((model, ctx, batch, over, None if over in AUTOREGRESSIVE else a))
                if x is None or y is None or not (x["predicted"] and y["predicted"]):
                    continue
                predicted = x["predicted"]["tokens_per_s"] / y["predicted"]["tokens_per_s"]
                out.append(
                    {
                        **{k: x[k] for k in ("gpu", "model", "context", "batch")},
                        "acceptance": a,
                        "baseline": b,
                        "over": over,
                        "measured": x["measured"]["tokens_per_s"] / y["measured"]["tokens_per_s"],
                        "predicted": predicted,
                        "interval": ratio_interval(
                            predicted,
                            y["predicted"]["round_log_bounds"],
                            x["predicted"]["round_log_bounds"],
                        ),
                    }
                )
    return out


def _pairs(cells, key: str) -> list[tuple[float, float]]:
    return [
        (c["predicted"][key], c["measured"][key])
        for c in cells
        if c["predicted"] and c["predicted"][key] is not None
    ]


def _errors(pairs: list[tuple[float, float]]) -> dict:
    return error_stats(np.array([p for p, _ in pairs]), np.array([m for _, m in pairs]))


def _summary(cells: list[dict], speedups: list[dict]) -> dict:
    """The error of every figure over ``cells`` and ``speedups``, each speedup pair apart."""
    out = {k: _errors(_pairs(cells, f"{k}_s")) for k in ("verify", "round")}
    out["tokens_per_s"] = _errors(_pairs(cells, "tokens_per_s"))
    out["speedup"] = _errors([(x["predicted"], x["measured"]) for x in speedups])
    out["speedups"] = {}
    for b, over in SPEEDUP_PAIRS:
        sel = [
            (x["predicted"], x["measured"])
            for x in speedups
            if (x["baseline"], x["over"]) == (b, over)
        ]
        if sel:
            out["speedups"][f"{b}/{over}"] = _errors(sel)
    out["simulated_tokens_per_s"] = _errors(
        [
            (c["simulated"]["tokens_per_s"], c["measured"]["run_tokens_per_s"])
            for c in cells
            if c["simulated"]
        ]
    )
    out["acceptance"] = sorted({c["acceptance_source"] for c in cells})
    out["unpredicted"] = sum(c["predicted"] is None for c in cells)
    return out


def _groups(level: tuple[str, ...], cells, speedups, skipped) -> list[dict]:
    keys = sorted({tuple(c[k] for k in level) for c in cells + skipped})
    out = []
    for key in keys:

        def here(rows, key=key):
            return [x for x in rows if tuple(x[k] for k in level) == key]

        g = {**dict(zip(level, key, strict=True)), **_summary(here(cells), here(speedups))}
        g["skipped"] = len(here(skipped))
        out.append(g)
    return out


def coverage(cells: list[dict], speedups: list[dict]) -> dict:
    """Per figure, how many measured values lie inside their predicted intervals, of how many
    have one."""
    out = {}
    for key, iv_key in INTERVAL_KEYS.items():
        got = [
            inside(c["predicted"]["intervals"][iv_key], c["measured"][key])
            for c in cells
            if c["predicted"] and c["predicted"]["intervals"]
        ]
        out[key] = {"inside": sum(got), "n": len(got)}
    got = [inside(x["interval"], x["measured"]) for x in speedups if x["interval"]]
    out["speedup"] = {"inside": sum(got), "n": len(got)}
    return out


def _intervals_note(cov: dict) -> dict:
    """Whether intervals are drawn, and the note that says what they are or why none is."""
    if not any(v["n"] for v in cov.values()):
        return {"drawn": False, "note": NO_INTERVALS}
    counts = ", ".join(f"{k} {v['inside']}/{v['n']}" for k, v in cov.items())
    return {
        "drawn": True,
        "coverage": COVERAGE,
        "note": f"{100 * COVERAGE:.0f}% prediction intervals from the kernel families' leave-out "
        f"residuals (perfmodel.intervals); measured inside: {counts}",
        "inside": cov,
    }


def _skipped(doc: dict, r: dict) -> dict:
    return {
        **_keys(doc, r),
        "reason": r["reason"],
        "memory": r.get("memory"),
    }


def build_scale(doc: dict, source: str | Path) -> dict:
    """The report of a scale campaign document (``ValueError`` in one line when it holds no
    cell or is malformed). Skipped cells keep the campaign's reason (the memory arithmetic
    where memory refused them); the acceptance is the oracle drafter's, labelled
    ``synthetic:oracle``."""
    with malformed(f"scale campaign {str(source)!r}"):
        if doc["version"] != CAMPAIGN_VERSION:
            raise ValueError(
                f"scale campaign {str(source)!r} has version {doc['version']!r}, "
                f"not {CAMPAIGN_VERSION}"
            )
        rows = doc["rows"]
        if not rows:
            raise ValueError(f"scale campaign {str(source)!r} holds no cells")
        cells = [_cell(doc, r) for r in rows if r["status"] == "measured"]
        skipped = [_skipped(doc, r) for r in rows if r["status"] != "measured"]
        speedups = _speedups(cells)
        prov = doc["provenance"]
    overall = _summary(cells, speedups)
    values = {
        f"{k}_{q}_ape": overall[k].get(f"{q}_ape")
        for k in ("verify", "tokens_per_s", "speedup")
        for q in ("median", "p90")
    }
    return {
        "benchmark": "scale_report",
        "source": str(source),
        "campaign": {
            "gpu": doc["gpu"],
            "device_name": prov.get("device_name"),
            "git_commit": prov.get("git_commit"),
            "command": prov.get("command"),
            "complete": doc.get("complete"),
            "dtype": doc.get("dtype"),
            "new_tokens": doc.get("new_tokens"),
            "acceptance": doc.get("acceptance"),
        },
        "prediction": "perfmodel's step model now ("
        + ", ".join(sorted({c["predicted"]["provenance"] for c in cells if c["predicted"]}))
        + ") at the measured acceptance of the full-batch rounds, overlap and NSA row schedule, "
        "without a host-loop term",
        "measured": "full-batch rounds (every sequence decoding, none finishing) where a cell has "
        "them, else the whole run; the whole run's tokens/s beside them",
        "intervals": _intervals_note(coverage(cells, speedups)),
        "overall": overall,
        "groups": {
            name: _groups(level, cells, speedups, skipped) for name, level in LEVELS.items()
        },
        "cells": cells,
        "speedups": speedups,
        "skipped": skipped,
        "targets": {
            k: {"value": v, "threshold": TARGETS[k], "met": v is not None and v <= TARGETS[k]}
            for k, v in values.items()
        },
    }


def plot_points(rep: dict) -> list[tuple]:
    """(baseline, measured, predicted, interval or None) tokens/s of every cell with a
    prediction."""
    return [
        (
            c["baseline"],
            c["measured"]["tokens_per_s"],
            c["predicted"]["tokens_per_s"],
            (c["predicted"]["intervals"] or {}).get("tokens_per_s"),
        )
        for c in rep["cells"]
        if c["predicted"]
    ]
