"""What the calibrated model (``perfmodel.class_fit``) is fitted over, derived from one measured
row of an op class: a call's requested bytes, FLOPs and deduplicated bytes (``features``), its
serial chain (``depth``, t_k), the merge steps after its parallel part (``serial_steps``, t_s),
its row tile's MMA rows (``tile_rows``, t_r) and its extra stages' counts (``stage_counts``,
t_x); and a class's rows as arrays (``class_data``). Each count comes from the same launch plan
the step model prices the op with (``perfmodel.nsa_plan``, ``perfmodel.repair_plan``,
``perfmodel.torch_plan``, ``perfmodel.attention_work``). Dense verification's FLOPs are its
kernel's padded row tiles' (``dense_tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_work import dense_verify_tiles
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.nsa_plan import merge_steps, mma_row_cost
from ssvkit.perfmodel.repair_plan import chain_tiles
from ssvkit.perfmodel.torch_plan import kv_write_chain, topn_counts

DEDUP_OPS = ("sparse_verify",)
# Row-wise reductions whose time has a floor: every row's program walks the row (its length the
# param named here) whatever the row count, and many rows stream at bandwidth and hide it. The
# argmax over the vocabulary: 36.0 us at 1 row of 128256 logits, 40-43 us from 8 to 128 rows,
# then +0.15 us per row (94.8 us at 512); 11.8 -> 15.3 us up to 128 rows of 32000.
ROW_WALK_OPS = {"sampling": "vocab"}


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


@dataclass(frozen=True, slots=True)
class Data:
    """One class's rows as arrays, one entry per row (``class_data``)."""

    name: str
    nbytes: np.ndarray
    flops: np.ndarray
    dedup: np.ndarray | None
    seconds: np.ndarray
    depth: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    stages: tuple[np.ndarray, ...]


def class_data(name: str, rows: list[dict], gpu: GpuSpec) -> Data:
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
