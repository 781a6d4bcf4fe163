"""What the calibrated model (``perfmodel.class_fit``) is fitted over, derived from one measured
row of an op class: a call's requested bytes, FLOPs and deduplicated bytes (``features``), its
serial chain (``depth``, t_k), the merge steps after its parallel part (``serial_steps``, t_s),
its row tile's MMA rows (``tile_rows``, t_r) and its extra stages' counts (``stage_counts``,
t_x); and a class's rows as arrays (``class_data``). Each count comes from the same launch plan
the step model prices the op with (``perfmodel.nsa_work``, ``perfmodel.select_work``,
``perfmodel.dense_work``, ``perfmodel.repair_work``, ``perfmodel.torch_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.calibration.nsa_rows import nsa_work
from ssvkit.calibration.row_work import (
    dense_work,
    is_select_plan,
    is_slot_plan,
    repair_dedup_bytes,
    repair_work,
    select_work,
    sparse_mode,
    sparse_work,
)
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.nsa_plan import merge_steps, mma_row_cost
from ssvkit.perfmodel.torch_plan import kv_write_chain, topn_counts

# Row-wise reductions whose time has a floor: every row's program walks the row (its length the
# param named here) whatever the row count, and many rows stream at bandwidth and hide it. The
# argmax over the vocabulary: 36.0 us at 1 row of 128256 logits, 40-43 us from 8 to 128 rows,
# then +0.15 us per row (94.8 us at 512); 11.8 -> 15.3 us up to 128 rows of 32000.
ROW_WALK_OPS = {"sampling": "vocab"}


def features(row: dict, gpu: GpuSpec | None = None) -> tuple[float, float, float | None]:
    """(requested bytes, FLOPs, deduplicated bytes or None) of one call.

    Sparse verification: its launch plan's work at the row's measured selections
    (``sparse_work``); repair rows get the expected distinct bytes of their uniform random
    selections. Dense verification and repair count their bytes and FLOPs (padded tiles,
    exponentials) from their launch plans (``dense_work``, ``repair_work``), as the step model
    does; NSA's FLOPs are its padded row tiles' against their branches' keys (``nsa_work``);
    block selection's deduplicated bytes read each KV head's queries once (``select_work``)."""
    p = row["params"]
    flops = float(row["flops"])
    if row["op"] == "sparse_verify":
        w = sparse_work(row, gpu)
        return w.requested_bytes, w.mma_flops, w.unique_bytes
    if row["op"] == "repair":
        w = repair_work(row, gpu)
        nbytes = float(w.requested_bytes)
        return nbytes, float(w.flops), repair_dedup_bytes(p, nbytes)
    if row["op"] == "dense_verify":
        d = dense_work(row, gpu)
        return d.requested_bytes, d.flops, d.unique_bytes
    if is_slot_plan(row):
        w = nsa_work(row, gpu)
        return w.requested_bytes, w.mma_flops, w.unique_bytes
    if is_select_plan(row):
        w = select_work(row, gpu)
        return w.requested_bytes, w.flops, w.unique_bytes
    return float(row["unique_bytes"]), flops, None


def depth(row: dict, gpu: GpuSpec) -> float:
    """Serial chain of one call (``perfmodel.class_fit``'s t_k term): K of a GEMM; for NSA,
    block selection, dense verification and repair, the key tiles a program walks in series
    on ``gpu`` times its waves (their launch plans; repair's tiles weighted by their work); for
    the KV write, the elements one thread of its two ``index_put_`` kernels stores in series
    (``perfmodel.torch_plan``); for sampling, the row length (``ROW_WALK_OPS``); 0 for the
    other ops, whose t0 and efficiencies hold their latency."""
    p = row["params"]
    if row["op"] == "sparse_verify":
        return sparse_work(row, gpu).chain_tiles
    if is_slot_plan(row):
        return nsa_work(row, gpu).chain_tiles
    if is_select_plan(row):
        return select_work(row, gpu).chain_tiles
    if row["op"] == "dense_verify":
        return dense_work(row, gpu).chain_tiles
    if row["op"] == "repair":
        return float(repair_work(row, gpu).chain_tiles)
    if row["op"] == "gemm":
        return float(p["k"])
    if row["op"] == "kv_write":
        return float(kv_write_chain(p["m"], p["num_kv_heads"], p["head_dim"]))
    if row["op"] in ROW_WALK_OPS:
        return float(p[ROW_WALK_OPS[row["op"]]])
    return 0.0


def serial_steps(row: dict, num_sms: int, gpu: GpuSpec | None = None) -> float:
    """Dependent steps one call runs after its parallel part (``perfmodel.class_fit``'s t_s
    term): the partial slots an NSA or dense verification call's merges walk, from the launch
    plan the wrapper makes for this shape on ``num_sms`` SMs -- the same functions the step
    model's ops use; the partials a split sparse verification call's merge reads a row
    (``perfmodel.sparse_work``); 0 for the other ops."""
    if row["op"] == "sparse_verify":
        return sparse_work(row, gpu).merge_steps
    if row["op"] == "dense_verify":
        return dense_work(row, gpu).merge_steps
    if row["op"] != "nsa_verify":
        return 0.0
    if is_slot_plan(row):
        return nsa_work(row, gpu).merge_steps
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


def tile_rows(row: dict, gpu: GpuSpec | None = None) -> float:
    """MMA rows of one program's row tile, padding included (``BLOCK_M``), in ``mma.sync``
    rows (a 64-row ``wgmma`` tile counts half: ``perfmodel.nsa_plan.mma_row_cost``), of an NSA
    or sparse verification call; of a dense verification call, the rows its busiest SM holds
    at once on ``gpu`` (``perfmodel.dense_work``'s ``sm_rows``); of a block selection of the
    current kernels, one score tile's MMA work a warp issues (``perfmodel.select_work``'s
    ``tile_work``) (``perfmodel.class_fit``'s t_r and t_kr terms); 0 for the other ops."""
    if row["op"] == "dense_verify":
        return dense_work(row, gpu).sm_rows
    if row["op"] == "sparse_verify":
        return sparse_work(row, None).row_cost
    if is_select_plan(row):
        return select_work(row, gpu).tile_work
    if row["op"] != "nsa_verify":
        return 0.0
    if is_slot_plan(row):
        return nsa_work(row, None).row_cost
    p = row["params"]
    heads = (p["num_query_tokens"], p["num_q_heads"], p["num_kv_heads"])
    return float(mma_row_cost(*heads, p.get("rows_per_tile") or 0))


def stage_counts(row: dict, gpu: GpuSpec | None = None) -> tuple[float, ...]:
    """Counts of a call's extra stages (``perfmodel.class_fit``'s t_x terms): for block selection,
    its top-n stage's (``perfmodel.torch_plan.topn_counts``: scores scanned, keys sorted, a row's
    sort length; or the current pick's and the score programs' query averaging,
    ``perfmodel.select_work``'s ``stage_counts``), over the score rows of every KV head's query
    rows and the blocks of the scored cache (context plus draft rows); for NSA, its program
    waves (and a refresh call's pick rows); for sparse verification its waves, the row-tile
    rows a slot finishes in series, its tiles an SM and a union plan's compares
    (``perfmodel.sparse_work``); for dense verification, its merge launch and its tail bytes;
    for repair, its waves; none for the other ops."""
    if is_slot_plan(row):
        w = nsa_work(row, gpu)
        return (w.waves, w.pick_rows) if row["params"]["mode"] == "refresh" else (w.waves,)
    if row["op"] == "sparse_verify":
        w = sparse_work(row, gpu)
        stages = (w.waves, w.row_waves, w.sm_tiles)
        return (*stages, w.plan_compares) if sparse_mode(row) == "union" else stages
    if row["op"] == "dense_verify":
        w = dense_work(row, gpu)
        return (w.splits, w.tail_bytes)
    if row["op"] == "repair":
        return (float(repair_work(row, gpu).waves),)
    if row["op"] != "select_blocks":
        return ()
    if is_select_plan(row):
        return select_work(row, gpu).stage_counts
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
    f = [features(r, gpu) for r in rows]
    dedup = [x[2] for x in f]
    return Data(
        name,
        np.array([x[0] for x in f]),
        np.array([max(x[1], 1.0) for x in f]),
        None if any(d is None for d in dedup) else np.array(dedup, dtype=float),
        np.array([r["median_s"] for r in rows]),
        np.array([depth(r, gpu) for r in rows]),
        np.array([serial_steps(r, gpu.num_sms, gpu) for r in rows]),
        np.array([tile_rows(r, gpu) for r in rows]),
        tuple(np.array(x) for x in zip(*(stage_counts(r, gpu) for r in rows), strict=True)),
    )
