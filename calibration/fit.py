"""Fit the calibrated model (``perfmodel.class_fit``) per op class on the committed rows, and
measure its error on rows the fit never saw.

This module classifies the rows (``op_class``), holds the held-out ones back, fits every class
(``calibration.fit_class``, over the quantities ``calibration.features`` derives from its rows)
and writes the profile with its error per split. Only CUDA-graph rows are fitted, as the decode
loop runs under graphs; plain-launch rows stay in the data for reference.

Held-out rule (``is_heldout``; the README's "Calibration accuracy"): a row is held out when
``int(sha1(op, params, timing)[:8], 16) % 5 == 0`` or when it has one of the whole held-out
values -- context 48K or 96K, or 12 query tokens (``num_query_tokens`` or GEMM ``m``) -- so the
fit never sees those sizes at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.features import class_data
from ssvkit.calibration.fit_class import fit_class
from ssvkit.calibration.row_work import is_select_plan, sparse_mode, sparse_regime
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.nsa_plan import PER_QUERY, is_packed
from ssvkit.perfmodel.predictor import RESIDENT_SUFFIX
from ssvkit.perfmodel.profiles import PROFILE_VERSION
from ssvkit.perfmodel.rows import canonical
from ssvkit.perfmodel.select_work import TWO_LAUNCH

HELDOUT_CONTEXTS = (48 * 1024, 96 * 1024)
HELDOUT_TOKENS = (12,)
HELDOUT_MOD = 5
# Rows that are not op classes: the ceilings themselves, and torch SDPA, the dense kernel's
# baseline, which perfmodel never predicts (the step model's attention is ours).
UNFITTED_OPS = ("device_copy", "empty_triton_kernel", "torch_sdpa")
ROW_SPLIT_OPS = ("silu_mul", "kv_write", "rope_qk")


def op_class(row: dict) -> str:
    """The class a row is fitted in: its op class, with ``RESIDENT_SUFFIX`` when the row was
    timed L2-resident (``validation.engine_op_sweep --ops resident``; ``perfmodel.predictor``).

    An op class is the op name (the fused element-wise kernels' rows are named as
    ``perfmodel.ops.FUSED_CLASSES``), refined by sparse verification's kernel path and grid
    regime, repair's ``mode``, NSA's ``mode`` and ``impl`` and its one-row tiles
    (``/per_query``, rows timed with ``rows_per_tile`` 1), block selection's ``method`` and its
    two-launch baseline (``/two_launch``), the row width of a norm or the vocabulary of sampling,
    and the single-row calls of ``ROW_SPLIT_OPS`` (``/m1``)."""
    base = _op_class(row)
    return base + RESIDENT_SUFFIX if row["params"].get("l2") == "resident" else base


def _op_class(row: dict) -> str:
    p, op = row["params"], row["op"]
    if op == "sparse_verify":
        # One class per kernel path (``sparse_mode``: a union plan or none, member masks or
        # none; a group of one query runs the per_query launch) and grid regime
        # (``sparse_regime``: fewer group lists than SMs, split and merged over blocks that
        # about fit L2, or whole lists streamed from HBM in waves; one efficiency and L2 share
        # cannot serve both); group size, geometry, draft width, top-n, batch and context are
        # points of its launch plan's work (``perfmodel.sparse_work``).
        return f"{op}/{sparse_mode(row)}/{sparse_regime(row)}"
    if op == "repair":
        return f"{op}/{p['mode']}"
    if op == "nsa_verify":
        # One draft row a tile (where that is not the packed tiles) runs the kernels' one-row
        # path: a class of its own, the step model's per-query NSA class.
        rows = p.get("rows_per_tile") or 0
        heads = (p["num_query_tokens"], p["num_q_heads"], p["num_kv_heads"])
        one_row = rows == 1 and not is_packed(*heads, rows)
        return f"{op}/{p['mode']}/{p['impl']}" + ("/" + PER_QUERY if one_row else "")
    if op == "select_blocks":  # the two-launch baseline (``impl``) is a class of its own
        # Rows of the current kernels without an ``impl`` were timed before the one-launch
        # path existed: two launches.
        two = p.get("impl") == TWO_LAUNCH or (p.get("impl") is None and is_select_plan(row))
        return f"{op}/{p['method']}" + (f"/{TWO_LAUNCH}" if two else "")
    # Row-wise reductions: their time is set by the row length (one program walks a row), not
    # by the total bytes, so each hidden width / vocabulary is a class of its own; the fused
    # norm too (one program a row; rows wider than its register tile take two passes).
    if op in ("rmsnorm", "add_rms_norm"):
        return f"{op}/d{p['d']}"
    # Ops whose single-row call takes another torch path than several rows (a contiguous
    # chunk; an indexed store of one entry; rotary, whose q slice of one row is already
    # contiguous, so q's copy launches nothing): measured 4.4 vs 7.0 us, 4.9 vs 11 us and
    # 11.7-13.3 vs 14.5-16.4 us.
    if op in ROW_SPLIT_OPS and p.get("m") == 1:
        return f"{op}/m1"
    if op == "sampling":
        return f"{op}/v{p['vocab']}"
    return op


def is_heldout(row: dict) -> bool:
    p = row["params"]
    if p.get("context_len") in HELDOUT_CONTEXTS:
        return True
    if p.get("num_query_tokens") in HELDOUT_TOKENS or p.get("m") in HELDOUT_TOKENS:
        return True
    key = canonical({"op": row["op"], "params": p, "timing": row["timing"]})
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % HELDOUT_MOD == 0


def error_stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    """Median / p90 / max absolute percentage error (as fractions)."""
    if len(meas) == 0:
        return {"n": 0}
    ape = np.abs(pred / meas - 1.0)
    return {
        "n": int(len(meas)),
        "median_ape": float(np.median(ape)),
        "p90_ape": float(np.percentile(ape, 90)),
        "max_ape": float(ape.max()),
    }


def fit_profile(rows: list[dict], gpu: str, ceilings: dict) -> tuple[dict, list[dict]]:
    """The profile JSON (version 1) and every graph row annotated with its prediction."""
    bw, peak = ceilings["hbm_bytes_per_s"], ceilings["bf16_flops_per_s"]
    spec = get_gpu(gpu, measured=False)
    graph = [r for r in rows if r["timing"] == "graph" and r["op"] not in UNFITTED_OPS]
    by_class: dict[str, list[dict]] = {}
    for r in graph:
        by_class.setdefault(op_class(r), []).append(r)
    classes, annotated = {}, []
    for name, rs in sorted(by_class.items()):
        fit_rows = [r for r in rs if not is_heldout(r)]
        held = [r for r in rs if is_heldout(r)]
        if len(fit_rows) < 3:
            continue  # too few rows to fit anything honest; the class stays uncalibrated
        cf = _fitted(name, rs, fit_rows, bw, peak, spec)
        stats = {}
        for split, subset in (("fit", fit_rows), ("heldout", held)):
            stats[split], scored = _split_error(name, split, subset, cf, bw, peak, spec)
            annotated += scored
        classes[name] = {"fit": cf.to_json(), "error": stats, **measured_entry(name, rs, spec)}
    device = {r["device_name"] for r in graph}
    if len(device) != 1:
        raise ValueError(f"rows of several devices in one profile: {sorted(device)}")
    latest = max(r["timestamp"] for r in graph)
    profile = {
        "version": PROFILE_VERSION,
        "profile_id": f"{gpu}-{latest[:10]}-{len(graph)}rows-{_fit_hash(classes)}",
        "gpu": gpu,
        "device_name": device.pop(),
        "ceilings": {"copy_bytes_per_s": bw, "gemm_flops_per_s": peak},
        "heldout_rule": {
            "hash_mod": HELDOUT_MOD,
            "contexts": list(HELDOUT_CONTEXTS),
            "query_tokens": list(HELDOUT_TOKENS),
        },
        "rows": {"graph": len(graph), "commits": sorted({r["git_commit"] for r in graph})},
        "classes": classes,
    }
    return profile, annotated


def measured_entry(name: str, rows: list[dict], spec: GpuSpec) -> dict:
    """What a class's measured ``rows`` span that its profile entry keeps beside the fit,
    outside the id's hash of the fitted parameters: their head dimensions (``head_dims``) and
    their most serial steps after the parallel part (``steps_max``, a split call's merge). A
    call at another head dimension, or with more steps than any row ran, is an extrapolation
    (``ClassFit.in_range``). Each key is absent when no row carries it (no head dimension; no
    row with a step)."""
    out = {}
    dims = sorted({int(r["params"]["head_dim"]) for r in rows if "head_dim" in r["params"]})
    if dims:
        out["head_dims"] = dims
    steps = float(class_data(name, rows, spec).steps.max()) if rows else 0.0
    if steps > 0:
        out["steps_max"] = steps
    return out


MEASURED_KEYS = ("head_dims", "steps_max")


def measured_by_class(rows: list[dict], gpu: str) -> dict[str, dict]:
    """``measured_entry`` of each class of ``gpu``'s graph rows among ``rows``, as
    ``fit_profile`` stores them (classes with an empty entry absent)."""
    spec = get_gpu(gpu, measured=False)
    by_class: dict[str, list[dict]] = {}
    for r in rows:
        if r["timing"] == "graph" and r["op"] not in UNFITTED_OPS:
            by_class.setdefault(op_class(r), []).append(r)
    out = {k: measured_entry(k, rs, spec) for k, rs in by_class.items()}
    return {k: v for k, v in out.items() if v}


def _fitted(
    name: str, rs: list[dict], fit_rows: list[dict], bw: float, peak: float, spec: GpuSpec
) -> ClassFit:
    """The class's fit on ``fit_rows``, with the log10 bytes and FLOPs range of all its rows
    ``rs`` (held-out ones included) and, for a class with a chain term, their longest chain."""
    cf = fit_class(name, fit_rows, bw, peak, spec)
    every = class_data(name, rs, spec)
    chain = cf.t_depth_s > 0 or cf.t_depth_row_s > 0 or cf.t_depth_miss_s > 0
    return dataclasses.replace(
        cf,
        bytes_range=(float(np.log10(every.nbytes.min())), float(np.log10(every.nbytes.max()))),
        flops_range=(float(np.log10(every.flops.min())), float(np.log10(every.flops.max()))),
        depth_max=float(every.depth.max()) if chain else 0.0,
    )


def _split_error(
    name: str, split: str, subset: list[dict], cf: ClassFit, bw: float, peak: float, spec: GpuSpec
) -> tuple[dict, list[dict]]:
    """The fit's error on one split's rows (``error_stats``) and those rows annotated with the
    class, the split and their prediction."""
    if not subset:
        return {"n": 0}, []
    d = class_data(name, subset, spec)
    pred = cf.call_time_s(d.nbytes, d.flops, bw, peak, d.dedup, d.depth, d.steps, d.rows, d.stages)
    scored = [
        {**r, "class": name, "split": split, "predicted_s": float(p)}
        for r, p in zip(subset, pred, strict=True)
    ]
    return error_stats(pred, d.seconds), scored


def _fit_hash(classes: dict) -> str:
    """The first 8 hex digits of a hash of every class's fit parameters: the profile id names
    the fit itself besides its data (date, row count), so a refit under another model or class
    split gets a new id. Parameters are rounded to 6 significant digits: the id must not depend
    on the last bits of the optimiser's floating-point path on another machine."""
    rounded = json.loads(
        json.dumps({k: v["fit"] for k, v in classes.items()}),
        parse_float=lambda x: float(f"{float(x):.6g}"),
    )
    return hashlib.sha1(canonical(rounded).encode()).hexdigest()[:8]


def dumps(profile: dict) -> str:
    return json.dumps(profile, indent=1, sort_keys=True) + "\n"


def fit_folder(gpu: str, folder: Path | None = None) -> dict:
    """Derive ``ceilings.json`` and fit ``profile.json`` from the rows of ``folder`` (every
    ``*.jsonl`` there), with the residuals of its prediction intervals
    (``calibration.intervals``), written into ``folder``; by default the committed
    ``calibration/profiles/<gpu>/``. Returns the profile."""
    # Imported here: the residual sets refit classes with this module's fit.
    from ssvkit.calibration.intervals import intervals_json

    folder = folder or ceilings.PROFILES / gpu
    rows = ceilings.profile_rows(gpu, folder)
    overlay = ceilings.derive(gpu, rows)
    profile, _ = fit_profile(rows, gpu, overlay["ceilings"])
    profile["intervals"] = intervals_json(gpu, rows, overlay["ceilings"], profile)
    atomic_write(folder / "ceilings.json", json.dumps(overlay, indent=2, sort_keys=True) + "\n")
    atomic_write(folder / "profile.json", dumps(profile))
    return profile
