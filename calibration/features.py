"""What the calibrated model (``perfmodel.class_fit``) is fitted over, derived from one measured
row of an op class: a call's requested bytes, FLOPs and deduplicated bytes (``features``), its
serial chain (``depth``, t_k), the merge steps after its parallel part (``serial_steps``, t_s),
its row tile's MMA rows (``tile_rows``, t_r) and its extra stages' counts (``stage_counts``,
t_x); and a class's rows as arrays (``class_data``). Each count comes from the same launch plan
the step model prices the op with (``perfmodel.nsa_work``, ``perfmodel.select_work``,
``perfmodel.dense_work``, ``perfmodel.repair_work``, ``perfmodel.torch_plan``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from ssvkit.calibration.ceilings import DEVICE_NAMES
from ssvkit.perfmodel.attention_plan import DEFAULT_SPARSE_CONFIG, SparseVerifyConfig
from ssvkit.perfmodel.dense_work import DenseWork, dense_call_work
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.nsa_plan import merge_steps, mma_row_cost, tile_packing
from ssvkit.perfmodel.nsa_work import NsaShape, NsaWork, nsa_call_work
from ssvkit.perfmodel.repair_work import RepairWork, distinct_share, repair_call_work
from ssvkit.perfmodel.select_work import SelectShape, SelectWork, select_call_work
from ssvkit.perfmodel.sparse_work import (
    SparseShape,
    SparseWork,
    grid_regime,
    kernel_mode,
    num_lists,
    sparse_call_work,
)
from ssvkit.perfmodel.torch_plan import kv_write_chain, topn_counts

DEDUP_OPS = ("sparse_verify",)
# NSA rows timed with the kernels that split a row tile's whole grid and walked the partials in
# series (``perfmodel.nsa_plan``'s split geometry; the committed H100 rows): their features
# keep that geometry. Later rows follow the slot plan (``perfmodel.nsa_work``).
NSA_SPLIT_PLAN_COMMITS = ("51d8197",)
# Sparse verification rows timed with the kernel that split a group's list until the grid
# filled one wave (``perfmodel.attention_work.fill_sparse_splits``; the committed H100 rows).
SPARSE_FILL_SPLIT_COMMITS = ("51d8197",)
FILL_SPLIT_CONFIG = SparseVerifyConfig(programs_per_sm=4)  # that kernel's wave: 4 x SMs
# Block-selection rows timed with the kernels that scored one tile a program and picked in torch
# (``perfmodel.select_work``'s ``torch_pick``; the committed H100 rows): their top-n stage keeps
# ``perfmodel.torch_plan.topn_counts``. Later rows follow the current plan's counts.
SELECT_TORCH_PICK_COMMITS = ("51d8197",)
# Row-wise reductions whose time has a floor: every row's program walks the row (its length the
# param named here) whatever the row count, and many rows stream at bandwidth and hide it. The
# argmax over the vocabulary: 36.0 us at 1 row of 128256 logits, 40-43 us from 8 to 128 rows,
# then +0.15 us per row (94.8 us at 512); 11.8 -> 15.3 us up to 128 rows of 32000.
ROW_WALK_OPS = {"sampling": "vocab"}


def repair_dedup_bytes(p: dict, requested: float) -> float:
    """Expected distinct-block bytes of a repair call whose rows each gather ``w`` distinct
    blocks drawn uniformly from the prefix's ``N`` blocks (the kernel sweep's construction,
    ``perfmodel.repair_work.distinct_share``): ``requested`` scaled by that share (the q/o/lse
    bytes are a small part and scale alike)."""
    n = p["context_len"] // p["block_size"]
    return requested * float(distinct_share(n, repair_blocks(p), p["num_query_tokens"]))


def repair_blocks(p: dict) -> int:
    """Blocks each row of a repair row's call walks: its missed blocks, or every selected one
    when it recomputes."""
    return p["missed_blocks"] if p["mode"] == "repair" else p["top_n"]


def features(row: dict, gpu: GpuSpec | None = None) -> tuple[float, float, float | None]:
    """(requested bytes, FLOPs, deduplicated bytes or None) of one call.

    Sparse verification: its launch plan's work at the row's measured selections
    (``sparse_work``); repair rows get the expected distinct bytes of their uniform random
    selections. Dense verification and repair count their bytes and FLOPs (padded tiles,
    exponentials) from their launch plans (``dense_work``, ``repair_work``), as the step model
    does; NSA's FLOPs are its padded row tiles' against their branches' keys (``nsa_work``)."""
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
        return w.requested_bytes, w.flops, None
    return float(row["unique_bytes"]), flops, None


def is_slot_plan(row: dict) -> bool:
    """Whether ``row`` is an NSA call of the slot-planned kernels (``perfmodel.nsa_work``)."""
    return row["op"] == "nsa_verify" and row.get("git_commit", "")[:7] not in NSA_SPLIT_PLAN_COMMITS


def is_select_plan(row: dict) -> bool:
    """Whether ``row`` is a block-selection call of the current kernels (the threshold pick;
    ``perfmodel.select_work``), not of the torch-pick plan."""
    return (
        row["op"] == "select_blocks"
        and row.get("git_commit", "")[:7] not in SELECT_TORCH_PICK_COMMITS
    )


def is_plan_priced(row: dict) -> bool:
    """Whether ``row``'s class is fitted on its kernels' launch-plan counts (the step model then
    prices it with its op's ``slot_plan``, or sparse verification's op, which is its plan's):
    NSA of the slot plan, block selection of the current kernels, sparse and dense
    verification, repair."""
    plan_ops = ("sparse_verify", "dense_verify", "repair")
    return is_slot_plan(row) or is_select_plan(row) or row["op"] in plan_ops


def _sm_resources(gpu: GpuSpec | None) -> dict[str, int]:
    """``gpu``'s SMs and shared memory per SM, the H100/H200's 132 and 227 KiB when None."""
    if gpu is None:
        return {"num_sms": 132, "smem_per_sm_bytes": 227 * 1024}
    return {"num_sms": gpu.num_sms, "smem_per_sm_bytes": gpu.smem_per_sm_bytes}


def select_work(row: dict, gpu: GpuSpec | None) -> SelectWork:
    """``perfmodel.select_work`` of the call a block-selection row of the current kernels
    timed, on ``gpu``'s SMs and shared memory (the H100/H200's 132 and 227 KiB when None);
    rows of no ``impl`` ran the two launches."""
    p = row["params"]
    shape = SelectShape(
        batch=p["batch"],
        t=p["num_query_tokens"],
        num_q_heads=p["num_q_heads"],
        num_kv_heads=p["num_kv_heads"],
        head_dim=p["head_dim"],
        context_len=p["context_len"],
        top_n=p["top_n"],
        block_size=p["block_size"],
        kinds=1 if p["method"] == "mean" else 2,
    )
    return select_call_work(
        shape,
        fused=p.get("impl") == "one_launch",
        **_sm_resources(gpu),
    )


def nsa_row_overlap(row: dict) -> float:
    """The selection overlap gamma that gives an NSA row's measured selected blocks: the row
    counts, per (sequence, KV head), the union of each row tile's blocks outside the window
    (its rows' tiles as the plan packs them with a row schedule, else one union of all rows:
    ``calibration.kernel_ops``), and the selection model puts ``n (1 + (r - 1)(1 - gamma))``
    blocks in a union of ``r`` rows. 0.7 (the host's assumption) where no union has two rows."""
    p = row["params"]
    b, t, hq, hkv, d = (
        p[k] for k in ("batch", "num_query_tokens", "num_q_heads", "num_kv_heads", "head_dim")
    )
    comp_tokens = (p["context_len"] - p["comp_block"]) // p["comp_stride"] + 1
    kv_row = 2 * d * 2
    rest = 2 * b * t * hq * d * 2 + b * hq * t * 4 + b * t * hq * 3 * 4
    rest += b * hkv * comp_tokens * kv_row
    sel = ((row["unique_bytes"] - rest) / kv_row / (b * hkv) - p["window"] - t) / p["block_size"]
    step = tile_packing(t, hq // hkv, p["rows_per_tile"])[0] if "rows_per_tile" in p else t
    rows = [min(step, t - i) for i in range(0, t, step)]
    spread = sum(r - 1 for r in rows)
    if spread == 0:
        return 0.7
    n = p["top_n"]
    return float(min(max(1.0 - (sel - n * len(rows)) / (n * spread), 0.0), 1.0))


def nsa_work(row: dict, gpu: GpuSpec | None) -> NsaWork:
    """``perfmodel.nsa_work`` of the call an NSA row timed, at its measured selection overlap,
    on ``gpu``'s SMs and shared memory (the H100/H200's 132 and 227 KiB when None)."""
    p = row["params"]
    shape = NsaShape(
        batch=p["batch"],
        t=p["num_query_tokens"],
        num_q_heads=p["num_q_heads"],
        num_kv_heads=p["num_kv_heads"],
        head_dim=p["head_dim"],
        context_len=p["context_len"],
        overlap=nsa_row_overlap(row),
        rows_per_tile=p.get("rows_per_tile") or 0,
        top_n=p["top_n"],
        block_size=p["block_size"],
        window=p["window"],
        comp_block=p["comp_block"],
        comp_stride=p["comp_stride"],
    )
    return nsa_call_work(
        shape,
        fused=p["impl"] == "fused",
        refresh=p["mode"] == "refresh",
        **_sm_resources(gpu),
    )


def sparse_mode(row: dict) -> str:
    """The kernel path a sparse verification row timed (``perfmodel.sparse_work.kernel_mode``:
    a group of one query runs the ``per_query`` launch)."""
    p = row["params"]
    return kernel_mode(p["mode"], p["group_size"], p["num_query_tokens"])


def sparse_regime(row: dict) -> str:
    """The grid regime of a sparse verification row (``perfmodel.sparse_work.grid_regime``: its
    group lists against the SMs of the GPU that timed it, ``row_num_sms``)."""
    p = row["params"]
    t = p["num_query_tokens"]
    c = 1 if sparse_mode(row) == "per_query" else min(p["group_size"], t)
    lists = num_lists(p["batch"], p["num_kv_heads"], t, c)
    return str(grid_regime(lists, row_num_sms(row)))


def row_num_sms(row: dict) -> int:
    """SMs of the registry GPU whose device timed ``row``; the H100/H200's 132 for a device
    the registry does not name (``_sm_resources``)."""
    return _device_sms(row.get("device_name", ""))


@functools.lru_cache(maxsize=16)
def _device_sms(device_name: str) -> int:
    for gpu, names in DEVICE_NAMES.items():
        if device_name in names:
            return get_gpu(gpu, measured=False).num_sms
    return _sm_resources(None)["num_sms"]


def sparse_work(row: dict, gpu: GpuSpec | None) -> SparseWork:
    """``perfmodel.sparse_work`` of the call a sparse verification row timed, with its
    measured selections (a union group's mean list, ``f_load``; a (sequence, KV head)'s
    distinct blocks, ``global_unique_bytes``), under the split rule of its kernel, on
    ``gpu``'s SMs and shared memory (the H100/H200's 132 and 227 KiB when None)."""
    p = row["params"]
    b, t, hkv, top_n = p["batch"], p["num_query_tokens"], p["num_kv_heads"], p["top_n"]
    mode = sparse_mode(row)
    c = 1 if mode == "per_query" else min(p["group_size"], t)
    groups = -(-t // c)
    per_query = b * hkv * t * top_n
    row_blocks = {"per_query": per_query, "union": p["f_load"] * per_query}.get(
        mode, b * hkv * groups * top_n
    )
    block_bytes = 2 * p["block_size"] * p["head_dim"] * 2
    fixed = row["unique_bytes"] - row_blocks * block_bytes  # tail, queries, outputs, ids
    shape = SparseShape(
        batch=b,
        t=t,
        num_q_heads=p["num_q_heads"],
        num_kv_heads=hkv,
        head_dim=p["head_dim"],
        context_len=p["context_len"],
        mode=mode,
        group_size=p["group_size"],
        top_n=top_n,
        block_size=p["block_size"],
        overlap=p["overlap"],
        list_blocks=p["f_load"] * t * top_n / groups if mode == "union" else None,
        unique_blocks=(p["global_unique_bytes"] - fixed) / block_bytes / (b * hkv),
    )
    fill = row.get("git_commit", "")[:7] in SPARSE_FILL_SPLIT_COMMITS
    return sparse_call_work(
        shape,
        config=FILL_SPLIT_CONFIG if fill else DEFAULT_SPARSE_CONFIG,
        split_rule="fill" if fill else "wave_balance",
        **_sm_resources(gpu),
    )


def dense_work(row: dict, gpu: GpuSpec | None) -> DenseWork:
    """``perfmodel.dense_work`` of the call a dense verification row timed, on ``gpu``'s SMs and
    shared memory (the H100/H200's when None)."""
    p = row["params"]
    heads = (p["num_q_heads"], p["num_kv_heads"], p["head_dim"])
    return dense_call_work(
        p["batch"], p["num_query_tokens"], p["context_len"], *heads, **_sm_resources(gpu)
    )


def repair_work(row: dict, gpu: GpuSpec | None) -> RepairWork:
    """``perfmodel.repair_work`` of the call a repair row timed, on ``gpu``'s SMs and shared
    memory (the H100/H200's when None)."""
    p = row["params"]
    heads = (p["num_q_heads"], p["num_kv_heads"], p["head_dim"])
    return repair_call_work(
        p["num_query_tokens"],
        *heads,
        p["batch"],
        repair_blocks(p),
        p["block_size"],
        **_sm_resources(gpu),
    )


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
    at once on ``gpu`` (``perfmodel.dense_work``'s ``sm_rows``) (``perfmodel.class_fit``'s t_r
    term); 0 for the other ops."""
    if row["op"] == "dense_verify":
        return dense_work(row, gpu).sm_rows
    if row["op"] == "sparse_verify":
        return sparse_work(row, None).row_cost
    if row["op"] != "nsa_verify":
        return 0.0
    if is_slot_plan(row):
        return nsa_work(row, None).row_cost
    p = row["params"]
    heads = (p["num_query_tokens"], p["num_q_heads"], p["num_kv_heads"])
    return float(mma_row_cost(*heads, p.get("rows_per_tile") or 0))


def stage_counts(row: dict, gpu: GpuSpec | None = None) -> tuple[float, ...]:
    """Counts of a call's extra stages (``perfmodel.class_fit``'s t_x terms): for block
    selection, its top-n stage's (``perfmodel.torch_plan.topn_counts``: scores scanned, keys
    sorted, a row's sort length, or the threshold pick's, ``perfmodel.select_work``), over the
    score rows of every KV head's query rows and the blocks of the scored cache (context plus
    draft rows); for NSA, its program waves (and a refresh call's pick rows); for sparse
    verification its waves, the row-tile rows a slot finishes in series, its tiles an SM and a
    union plan's compares (``perfmodel.sparse_work``); for dense verification, its merge
    launch; for repair, its waves; none for the other ops."""
    if is_slot_plan(row):
        w = nsa_work(row, gpu)
        return (w.waves, w.pick_rows) if row["params"]["mode"] == "refresh" else (w.waves,)
    if row["op"] == "sparse_verify":
        w = sparse_work(row, gpu)
        stages = (w.waves, w.row_waves, w.sm_tiles)
        return (*stages, w.plan_compares) if sparse_mode(row) == "union" else stages
    if row["op"] == "dense_verify":
        return (dense_work(row, gpu).splits,)
    if row["op"] == "repair":
        return (float(repair_work(row, gpu).waves),)
    if row["op"] != "select_blocks":
        return ()
    if is_select_plan(row):
        w = select_work(row, gpu)
        return (w.pick_chain, w.pick_rows)
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
