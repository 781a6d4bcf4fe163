"""Measured-vs-predicted error of a fitted profile: per op class and overall, fit and held-out
rows apart, and the error of predicted *ratios* (the figures users act on).

Ratios compare two rows of the same configuration but one knob:

- ``union_vs_per_query`` / ``shared_vs_per_query``: a grouped sparse mode against per-query
  loads at the same context, top_n, overlap and batch;
- ``t16_vs_t1``: dense verification of 16 query rows against 1, same context and batch;
- ``sparse_vs_dense``: per-query sparse verification against dense, both at t = 16, same
  context and batch;
- ``nsa_fused_vs_unfused``: the fused NSA path against its three separate branches;
- ``repair_vs_recompute``: repairing the missed blocks against recomputing all selected ones.

A ratio counts as held out when either of its two rows is. Error = |predicted / measured - 1|.
"""

from __future__ import annotations

import numpy as np

from calibration.fit import (
    UNFITTED_OPS,
    depth,
    error_stats,
    features,
    is_heldout,
    op_class,
    serial_steps,
    stage_counts,
    tile_rows,
)
from perfmodel.calibrated import Profile
from perfmodel.hardware import get_gpu

TARGETS = {"heldout_median_ape": 0.05, "heldout_p90_ape": 0.10, "heldout_ratio_median": 0.05}


def _key(r: dict, *names) -> tuple:
    return tuple(r["params"].get(n) for n in names)


def ratio_pairs(rows: list[dict]) -> list[dict]:
    """Pairs of annotated rows (with ``predicted_s`` and ``split``) and their ratios."""
    out = []

    def add(kind, a, b):
        out.append(
            {
                "kind": kind,
                "measured": a["median_s"] / b["median_s"],
                "predicted": a["predicted_s"] / b["predicted_s"],
                "heldout": a["split"] == "heldout" or b["split"] == "heldout",
                "params": {
                    k: v
                    for k, v in a["params"].items()
                    if k
                    in (
                        "context_len",
                        "batch",
                        "top_n",
                        "overlap",
                        "group_size",
                        "num_query_tokens",
                        "missed_blocks",
                        "mode",
                        "impl",
                    )
                },
            }
        )

    sparse = [r for r in rows if r["op"] == "sparse_verify"]
    pq = {
        _key(r, "context_len", "top_n", "overlap", "batch"): r
        for r in sparse
        if r["params"]["mode"] == "per_query"
    }
    for r in sparse:
        mode, c = r["params"]["mode"], r["params"]["group_size"]
        base = pq.get(_key(r, "context_len", "top_n", "overlap", "batch"))
        if base is not None and mode in ("union", "shared") and c > 1:
            add(f"{mode}_vs_per_query", r, base)
    dense = [r for r in rows if r["op"] == "dense_verify"]
    d1 = {_key(r, "context_len", "batch"): r for r in dense if r["params"]["num_query_tokens"] == 1}
    d16 = {
        _key(r, "context_len", "batch"): r for r in dense if r["params"]["num_query_tokens"] == 16
    }
    for k, r in d16.items():
        if k in d1:
            add("t16_vs_t1", r, d1[k])
    for r in sparse:
        p = r["params"]
        if p["mode"] == "per_query" and p["num_query_tokens"] == 16:
            base = d16.get(_key(r, "context_len", "batch"))
            if base is not None:
                add("sparse_vs_dense", r, base)
    nsa = [r for r in rows if r["op"] == "nsa_verify"]
    unf = {
        _key(r, "context_len", "batch", "mode", "overlap"): r
        for r in nsa
        if r["params"]["impl"] == "unfused"
    }
    for r in nsa:
        if r["params"]["impl"] == "fused":
            base = unf.get(_key(r, "context_len", "batch", "mode", "overlap"))
            if base is not None:
                add("nsa_fused_vs_unfused", r, base)
    rec = {
        _key(r, "context_len", "batch"): r
        for r in rows
        if r["op"] == "repair" and r["params"]["mode"] == "recompute"
    }
    for r in rows:
        if r["op"] == "repair" and r["params"]["mode"] == "repair":
            base = rec.get(_key(r, "context_len", "batch"))
            if base is not None:
                add("repair_vs_recompute", r, base)
    return out


def report(annotated: list[dict], worst: int = 8) -> dict:
    """Error tables of annotated rows: per class and overall for each split, ratio errors per
    kind and overall, the worst rows, and whether the targets hold."""
    out: dict = {"classes": {}, "overall": {}, "ratios": {}, "worst": {}}
    for split in ("fit", "heldout"):
        sub = [r for r in annotated if r["split"] == split]
        pred = np.array([r["predicted_s"] for r in sub])
        meas = np.array([r["median_s"] for r in sub])
        out["overall"][split] = error_stats(pred, meas)
        ape = np.abs(pred / meas - 1) if len(sub) else np.array([])
        order = np.argsort(-ape)[:worst]
        out["worst"][split] = [
            {
                "class": sub[i]["class"],
                "params": sub[i]["params"],
                "measured_s": sub[i]["median_s"],
                "predicted_s": sub[i]["predicted_s"],
                "ape": float(ape[i]),
            }
            for i in order
        ]
    for cls in sorted({r["class"] for r in annotated}):
        out["classes"][cls] = {}
        for split in ("fit", "heldout"):
            sub = [r for r in annotated if r["class"] == cls and r["split"] == split]
            out["classes"][cls][split] = error_stats(
                np.array([r["predicted_s"] for r in sub]), np.array([r["median_s"] for r in sub])
            )
    pairs = ratio_pairs(annotated)
    for kind in sorted({p["kind"] for p in pairs}) + ["all"]:
        sel = [p for p in pairs if kind in ("all", p["kind"])]
        out["ratios"][kind] = {}
        for split, keep in (("fit", False), ("heldout", True)):
            s = [p for p in sel if p["heldout"] == keep]
            out["ratios"][kind][split] = error_stats(
                np.array([p["predicted"] for p in s]), np.array([p["measured"] for p in s])
            )
    h, hr = out["overall"]["heldout"], out["ratios"]["all"]["heldout"]
    values = {
        "heldout_median_ape": h.get("median_ape", float("inf")),
        "heldout_p90_ape": h.get("p90_ape", float("inf")),
        "heldout_ratio_median": hr.get("median_ape", float("inf")),
    }
    out["targets"] = {
        k: {"value": v, "threshold": TARGETS[k], "met": v <= TARGETS[k]} for k, v in values.items()
    }
    out["pairs"] = pairs
    return out


def annotate(rows: list[dict], profile: Profile) -> list[dict]:
    """Every graph row of a fitted class with the stored profile's prediction and its split."""
    spec = get_gpu(profile.gpu, measured=False)
    out = []
    for r in rows:
        if r["timing"] != "graph" or r["op"] in UNFITTED_OPS:
            continue
        cls = op_class(r)
        if cls not in profile.classes:
            continue
        nbytes, flops, dedup = features(r)
        steps, rows = serial_steps(r, spec.num_sms), tile_rows(r)
        pred = float(
            profile.call_time_s(
                cls, nbytes, max(flops, 1.0), dedup, depth(r, spec), steps, rows, stage_counts(r)
            )
        )
        out.append(
            {**r, "class": cls, "predicted_s": pred, "split": "heldout" if is_heldout(r) else "fit"}
        )
    return out
