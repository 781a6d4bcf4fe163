"""Fit the calibrated model (``perfmodel.class_fit``) per op class on the committed rows, and
measure its error on rows the fit never saw.

Op classes: the op name (the fused element-wise kernels' rows are named as
``perfmodel.ops.FUSED_CLASSES``), refined by ``mode`` (sparse modes, NSA refresh/reuse, repair),
``impl`` (NSA fused/unfused), NSA's one-row tiles (``/per_query``, rows timed with
``rows_per_tile`` 1), ``method`` (block-score metadata) and select_blocks' two-launch
baseline (``/two_launch``). Only CUDA-graph rows are fitted: the decode loop runs under graphs;
plain-launch rows (which add Triton's tens of microseconds of Python launch path) stay in the
data for reference.

Held-out rule (documented in the README's "Calibration accuracy"): a row is held out when
``int(sha1(op, params, timing)[:8], 16) % 5 == 0`` or when it has one of the whole held-out
values -- context 48K or 96K, or 12 query tokens (``num_query_tokens`` or GEMM ``m``) -- so the
fit never sees those sizes at all.

Fit: per class, minimise the soft-L1 loss of log(predicted / measured) over t0, the efficiency
knots (K = 2..6 evenly spaced in log10 bytes and log10 FLOPs over the class's fit rows, K from
the row count), for sparse verification the L2-miss share h and the L2 throughput ratio r
(``perfmodel.class_fit``: requested bytes / (r BW) bound the call beside the HBM bytes;
bounded to [1, 4]), for repair the share h alone, for GEMMs, repair, the KV write and sampling
the latency t_k of a serial chain (a GEMM's K; the KV tiles one SM slot of a repair call walks,
``perfmodel.repair_plan``; the elements a KV-write thread stores in series,
``perfmodel.torch_plan``; the vocabulary a sampling row walks), for NSA verification the
latency t_s of a merge step (the serial walk over split partials), for NSA and dense
verification t_r of a row-tile row (``perfmodel.nsa_plan``, ``perfmodel.attention_work``), and
for block selection the rates t_x of its top-n stage's counts (``perfmodel.torch_plan``). Dense
verification's FLOPs are its kernel's padded row tiles' (``features``).
Deterministic (no random starts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares
from ssvkit.calibration import ceilings
from ssvkit.perfmodel.attention_work import dense_verify_tiles
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.nsa_plan import PER_QUERY, is_packed, merge_steps, mma_row_cost
from ssvkit.perfmodel.predictor import RESIDENT_SUFFIX
from ssvkit.perfmodel.profiles import PROFILE_VERSION
from ssvkit.perfmodel.repair_plan import chain_tiles
from ssvkit.perfmodel.rows import canonical
from ssvkit.perfmodel.torch_plan import kv_write_chain, topn_counts

HELDOUT_CONTEXTS = (48 * 1024, 96 * 1024)
HELDOUT_TOKENS = (12,)
HELDOUT_MOD = 5
# Rows that are not op classes: the ceilings themselves, and torch SDPA, the dense kernel's
# baseline, which perfmodel never predicts (the step model's attention is ours).
UNFITTED_OPS = ("device_copy", "empty_triton_kernel", "torch_sdpa")
DEDUP_OPS = ("sparse_verify",)
ROW_SPLIT_OPS = ("silu_mul", "kv_write", "rope_qk")
# Row-wise reductions whose time has a floor: every row's program walks the row (its length the
# param named here) whatever the row count, and many rows stream at bandwidth and hide it. The
# argmax over the vocabulary: 36.0 us at 1 row of 128256 logits, 40-43 us from 8 to 128 rows,
# then +0.15 us per row (94.8 us at 512); 11.8 -> 15.3 us up to 128 rows of 32000.
ROW_WALK_OPS = {"sampling": "vocab"}
L2_RATIO_STARTS = (1.2, 1.6, 2.0, 2.5, 3.0)  # starts of the L2 throughput ratio r (``fit_class``)


def op_class(row: dict) -> str:
    """The class a row is fitted in: its op class, with ``RESIDENT_SUFFIX`` when the row was
    timed L2-resident (``validation.engine_op_sweep --ops resident``; ``perfmodel.predictor``)."""
    base = _op_class(row)
    return base + RESIDENT_SUFFIX if row["params"].get("l2") == "resident" else base


def _op_class(row: dict) -> str:
    p, op = row["params"], row["op"]
    if op == "sparse_verify":
        # The group size sets the packed rows per program and so the parallelism: one class
        # each. Batch 1 and large batches are separate regimes: at batch 1 a call's blocks
        # (tens to ~200 MB) largely stay in the 50 MB L2 between groups and the grid is small.
        group = "" if p["mode"] == "per_query" else f"/C{p['group_size']}"
        return f"{op}/{p['mode']}{group}/" + ("b1" if p["batch"] == 1 else "bN")
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
        return f"{op}/{p['method']}" + ("/two_launch" if p.get("impl") == "two_launch" else "")
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


def repair_dedup_bytes(p: dict, requested: float) -> float:
    """Expected distinct-block bytes of a repair call whose rows each gather ``w`` distinct
    blocks drawn uniformly from the prefix's ``N`` blocks (the kernel sweep's construction): per
    (sequence, KV head) ``N (1 - (1 - w / N)^t)`` distinct blocks of the ``t w`` requested, so
    ``requested`` scales by that share (the q/o/lse bytes are a small part and scale alike)."""
    n = p["context_len"] // p["block_size"]
    w = p.get("missed_blocks") if p["mode"] == "repair" else p["top_n"]
    t = p["num_query_tokens"]
    if not w:
        return requested
    distinct = n * (1.0 - (1.0 - w / n) ** t)
    return requested * distinct / (t * w)


def features(row: dict) -> tuple[float, float, float | None]:
    """(requested bytes, FLOPs, deduplicated bytes or None) of one call.

    Sparse verification rows carry the measured ``global_unique_bytes`` of their selections;
    repair rows get the expected distinct bytes of their uniform random selections. Dense
    verification's FLOPs are those of the row tiles its kernel runs, padding included
    (``dense_tiles``), as the step model counts them."""
    p = row["params"]
    dedup, flops = None, float(row["flops"])
    if row["op"] in DEDUP_OPS:
        dedup = p.get("global_unique_bytes")
    elif row["op"] == "repair":
        dedup = repair_dedup_bytes(p, float(row["unique_bytes"]))
    elif row["op"] == "dense_verify":
        flops *= dense_tiles(row)[0]
    return float(row["unique_bytes"]), flops, dedup


def dense_tiles(row: dict) -> tuple[float, float]:
    """``perfmodel.attention_work.dense_verify_tiles`` of a dense verification row: the padded
    rows' share of its row tiles' FLOPs and the tile's cost in ``mma.sync`` rows."""
    p = row["params"]
    return dense_verify_tiles(
        p["num_query_tokens"], p["num_q_heads"], p["num_kv_heads"], p["head_dim"]
    )


def depth(row: dict, gpu: GpuSpec) -> float:
    """Serial chain of one call (``perfmodel.class_fit``'s t_k term): K of a GEMM; for repair,
    the KV tiles one SM slot walks in series on ``gpu`` (``perfmodel.repair_plan``, the
    missed blocks, or the selected ones when recomputing, times the grid's waves); for the KV
    write, the elements one thread of its two ``index_put_`` kernels stores in series
    (``perfmodel.torch_plan``); for sampling, the row length (``ROW_WALK_OPS``); 0 for the
    other ops, whose t0 and efficiencies hold their latency."""
    p = row["params"]
    if row["op"] == "gemm":
        return float(p["k"])
    if row["op"] == "kv_write":
        return float(kv_write_chain(p["m"], p["num_kv_heads"], p["head_dim"]))
    if row["op"] in ROW_WALK_OPS:
        return float(p[ROW_WALK_OPS[row["op"]]])
    if row["op"] == "repair":
        blocks = p["missed_blocks"] if p["mode"] == "repair" else p["top_n"]
        return float(
            chain_tiles(
                p["num_query_tokens"],
                p["num_kv_heads"],
                p["batch"],
                blocks,
                p["block_size"],
                p["head_dim"],
                gpu.num_sms,
                gpu.smem_per_sm_bytes,
            )
        )
    return 0.0


def serial_steps(row: dict, num_sms: int) -> float:
    """Dependent steps one call runs after its parallel part (``perfmodel.class_fit``'s t_s
    term): the partial slots an NSA call's merges walk, from the launch plan the wrapper makes
    for this shape on ``num_sms`` SMs -- the same function the step model's NSA ops use; 0 for
    the other ops."""
    if row["op"] != "nsa_verify":
        return 0.0
    p = row["params"]
    return float(
        merge_steps(
            p["num_query_tokens"],
            p["num_q_heads"],
            p["num_kv_heads"],
            p["batch"],
            num_sms,
            fused=p["impl"] == "fused",
            refresh=p["mode"] == "refresh",
            rows_per_tile=p.get("rows_per_tile") or 0,
        )
    )


def tile_rows(row: dict) -> float:
    """MMA rows of one program's row tile, padding included (``BLOCK_M``), in ``mma.sync``
    rows (a 64-row ``wgmma`` tile counts half: ``perfmodel.nsa_plan.mma_row_cost``), of an NSA
    or a dense verification call (``perfmodel.class_fit``'s t_r term; ``dense_tiles``); 0 for
    the other ops."""
    if row["op"] == "dense_verify":
        return dense_tiles(row)[1]
    if row["op"] != "nsa_verify":
        return 0.0
    p = row["params"]
    heads = (p["num_query_tokens"], p["num_q_heads"], p["num_kv_heads"])
    return float(mma_row_cost(*heads, p.get("rows_per_tile") or 0))


def stage_counts(row: dict) -> tuple[float, ...]:
    """Counts of a call's extra stages (``perfmodel.class_fit``'s t_x terms): for block
    selection, its top-n stage's (``perfmodel.torch_plan.topn_counts``: scores scanned, keys
    sorted, a row's sort length), over the score rows of every KV head's query rows and the
    blocks of the scored cache (context plus draft rows); none for the other ops."""
    if row["op"] != "select_blocks":
        return ()
    p = row["params"]
    rows = p["batch"] * p["num_kv_heads"] * p["num_query_tokens"]
    num_blocks = -(-(p["context_len"] + p["num_query_tokens"]) // p["block_size"])
    return tuple(float(x) for x in topn_counts(rows, num_blocks, p["top_n"]))


def _knots(values: np.ndarray, k: int) -> tuple[float, ...]:
    lo, hi = float(np.log10(values.min())), float(np.log10(values.max()))
    if hi - lo < 1e-6:
        hi = lo + 1e-6
    return tuple(np.linspace(lo, hi, k))


@dataclass(frozen=True, slots=True)
class Data:
    name: str
    nbytes: np.ndarray
    flops: np.ndarray
    dedup: np.ndarray | None
    seconds: np.ndarray
    depth: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    stages: tuple[np.ndarray, ...]


def _data(name: str, rows: list[dict], gpu: GpuSpec) -> Data:
    f = [features(r) for r in rows]
    dedup = [x[2] for x in f]
    return Data(
        name,
        np.array([x[0] for x in f]),
        np.array([max(x[1], 1.0) for x in f]),
        None if any(d is None for d in dedup) else np.array(dedup, dtype=float),
        np.array([r["median_s"] for r in rows]),
        np.array([depth(r, gpu) for r in rows]),
        np.array([serial_steps(r, gpu.num_sms) for r in rows]),
        np.array([tile_rows(r) for r in rows]),
        tuple(np.array(x) for x in zip(*(stage_counts(r) for r in rows), strict=True)),
    )


def _latency_bound(seconds: np.ndarray, count: np.ndarray) -> float:
    """Upper bound of a per-unit latency: the whole of a call's time spread over its count,
    for the call where that is least."""
    on = count > 0
    return float((seconds[on] / count[on]).min())


def fit_class(name: str, rows: list[dict], bw: float, peak: float, gpu: GpuSpec) -> ClassFit:
    """Least-squares fit of one class on its fit rows."""
    d = _data(name, rows, gpu)
    k = int(np.clip(len(rows) // 8, 2, 6))
    bk, fk = _knots(d.nbytes, k), _knots(d.flops, k)
    has_h = d.dedup is not None
    # The L2 throughput bound r only where a call's programs re-read each other's blocks
    # (sparse verification's overlapping selections); repair's uniform draws barely repeat.
    has_l2 = has_h and name.split("/")[0] in DEDUP_OPS
    has_depth = bool(d.depth.any())
    has_steps = bool(d.steps.any())
    has_rows = bool(d.rows.any())
    n_stage = len(d.stages)
    n_eff = 1 + 2 * k
    n_lat = n_eff + has_h + has_depth + has_steps + has_rows

    def unpack(x):
        h = float(x[n_eff]) if has_h else None
        t_depth = float(x[n_eff + has_h]) if has_depth else 0.0
        t_step = float(x[n_eff + has_h + has_depth]) if has_steps else 0.0
        t_row = float(x[n_eff + has_h + has_depth + has_steps]) if has_rows else 0.0
        l2 = float(x[n_lat + n_stage]) if has_l2 else 0.0
        eb, ef = tuple(x[1 : 1 + k]), tuple(x[1 + k : 1 + 2 * k])
        return ClassFit(
            name,
            float(x[0]),
            bk,
            eb,
            fk,
            ef,
            h,
            t_depth_s=t_depth,
            t_step_s=t_step,
            t_row_s=t_row,
            t_stage_s=tuple(float(v) for v in x[n_lat : n_lat + n_stage]),
            l2_ratio=l2,
        )

    def resid(x):
        t = unpack(x).call_time_s(
            d.nbytes, d.flops, bw, peak, d.dedup, d.depth, d.steps, d.rows, d.stages
        )
        return np.log(t) - np.log(d.seconds)

    x0 = [0.3 * d.seconds.min()] + [0.7] * k + [0.6] * k
    lo = [0.0] + [0.01] * k + [0.01] * k
    hi = [d.seconds.min()] + [4.0] * k + [1.5] * k
    if has_h:
        x0, lo, hi = x0 + [0.5], lo + [0.0], hi + [1.0]
    if has_depth:
        depth_hi = _latency_bound(d.seconds, d.depth)
        x0, lo, hi = x0 + [0.3 * depth_hi], lo + [0.0], hi + [depth_hi]
    if has_steps:
        step_hi = _latency_bound(d.seconds, d.steps)
        x0, lo, hi = x0 + [0.3 * step_hi], lo + [0.0], hi + [step_hi]
    if has_rows:
        row_hi = _latency_bound(d.seconds, d.rows)
        x0, lo, hi = x0 + [0.3 * row_hi], lo + [0.0], hi + [row_hi]
    for count in d.stages:
        stage_hi = _latency_bound(d.seconds, count)
        x0, lo, hi = x0 + [0.1 * stage_hi], lo + [0.0], hi + [stage_hi]
    if has_l2:  # last: the starts below replace the last parameter
        x0, lo, hi = x0 + [L2_RATIO_STARTS[0]], lo + [1.0], hi + [4.0]
    # r's bound has no gradient where it does not bind, so the fit would keep any start that
    # never binds: start it at a few ratios and keep the lowest loss on the fit rows.
    starts = [x0] + [x0[:-1] + [r] for r in L2_RATIO_STARTS[1:]] if has_l2 else [x0]
    sols = [
        least_squares(
            resid, x, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, x_scale="jac", max_nfev=4000
        )
        for x in starts
    ]
    return unpack(min(sols, key=lambda s: s.cost).x)


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
        cf = fit_class(name, fit_rows, bw, peak, spec)
        every = _data(name, rs, spec)
        cf = dataclasses.replace(
            cf,
            bytes_range=(float(np.log10(every.nbytes.min())), float(np.log10(every.nbytes.max()))),
            flops_range=(float(np.log10(every.flops.min())), float(np.log10(every.flops.max()))),
        )
        stats = {}
        for split, subset in (("fit", fit_rows), ("heldout", held)):
            if subset:
                d = _data(name, subset, spec)
                pred = cf.call_time_s(
                    d.nbytes, d.flops, bw, peak, d.dedup, d.depth, d.steps, d.rows, d.stages
                )
                stats[split] = error_stats(pred, d.seconds)
                for r, p in zip(subset, pred, strict=True):
                    annotated.append({**r, "class": name, "split": split, "predicted_s": float(p)})
            else:
                stats[split] = {"n": 0}
        classes[name] = {"fit": cf.to_json(), "error": stats}
    device = {r["device_name"] for r in graph}
    if len(device) != 1:
        raise ValueError(f"rows of several devices in one profile: {sorted(device)}")
    latest = max(r["timestamp"] for r in graph)
    # The id names the data (date, row count) and the fit itself (a hash of its parameters), so
    # a refit under another model or class split gets a new id.
    # Parameters rounded to 6 significant digits: the id must not depend on the last bits of
    # the optimiser's floating-point path on another machine.
    rounded = json.loads(
        json.dumps({k: v["fit"] for k, v in classes.items()}),
        parse_float=lambda x: float(f"{float(x):.6g}"),
    )
    fit_hash = hashlib.sha1(canonical(rounded).encode())
    profile = {
        "version": PROFILE_VERSION,
        "profile_id": f"{gpu}-{latest[:10]}-{len(graph)}rows-{fit_hash.hexdigest()[:8]}",
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
