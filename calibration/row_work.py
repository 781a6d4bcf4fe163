"""The launch-plan work of one measured kernel row: the counts its op's plan gives at the row's
parameters and on the GPU that timed it (``perfmodel.select_work``, ``perfmodel.sparse_work``,
``perfmodel.dense_work``, ``perfmodel.repair_work``; NSA's in ``calibration.nsa_rows``), and
which plan a row's kernels followed (rows of older kernels keep theirs, by the commit that timed
them). ``calibration.features`` derives the fit's features from them.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime

from ssvkit.calibration.ceilings import DEVICE_NAMES
from ssvkit.perfmodel.attention_plan import DEFAULT_DENSE_CONFIG, DenseVerifyConfig
from ssvkit.perfmodel.dense_work import DenseWork, dense_call_work
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.repair_work import RepairWork, distinct_share, repair_call_work
from ssvkit.perfmodel.select_work import SelectShape, SelectWork, select_call_work
from ssvkit.perfmodel.sparse_plan import (
    DEFAULT_SPARSE_CONFIG,
    SparseVerifyConfig,
    sparse_tile_shape,
)
from ssvkit.perfmodel.sparse_work import (
    SparseShape,
    SparseWork,
    grid_regime,
    kernel_mode,
    num_lists,
    sparse_call_work,
)

# NSA rows timed with the kernels that split a row tile's whole grid and walked the partials in
# series (``perfmodel.nsa_plan``'s split geometry; the committed H100 rows): their features
# keep that geometry. Later rows follow the slot plan (``perfmodel.nsa_work``).
NSA_SPLIT_PLAN_COMMITS = ("51d8197",)
# Sparse verification rows timed with the kernel that split a group's list until the grid
# filled one wave (``perfmodel.attention_work.fill_sparse_splits``; the committed H100 rows).
SPARSE_FILL_SPLIT_COMMITS = ("51d8197",)
# Sparse verification rows whose split calls ran the merge of one partial row a program
# (``kernels.merge`` before it combined tiles of rows; the committed H100 rows): a merge launch of
# as many programs as rows, whose cost no feature describes.
SPARSE_ROW_MERGE_COMMITS = ("51d8197",)
# Sparse verification rows whose split calls merged their partials in a launch of their own
# (``SparseVerifyConfig(fused_merge=False)``; every row timed before the split programs merged
# their groups' rows themselves).
SPARSE_MERGE_LAUNCH_COMMITS = (
    "51d8197",
    "4732e87",
    "99cef21",
    "8a014bf",
    "e875b5f",
    "20e807a",
    "2408afa",
    "6cf2db1",
)
# Sparse verification rows whose union calls built their plan with the kernel that compared every
# member's ids with the group's (``perfmodel.attention_work.union_plan_compares``' ``compare``):
# the committed H100 rows and the H200 rows timed before the sort kernel.
UNION_COMPARE_PLAN_COMMITS = ("51d8197", "e875b5f")
# Block-selection rows timed with the kernels that scored one tile a program and picked in torch
# (``perfmodel.select_work``'s ``torch_pick``; the committed H100 rows): their top-n stage keeps
# ``perfmodel.torch_plan.topn_counts``. Later rows follow the current plan's counts.
SELECT_TORCH_PICK_COMMITS = ("51d8197",)
# Block-selection rows timed before the two launches took the tile pick where it pays
# (``perfmodel.pick_work.tile_pick_pays``; the H200 rows of record): every call picked over
# whole rows with the threshold pick.
SELECT_WHOLE_ROW_PICK_COMMITS = ("e8d5fcf", "1da5357")


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


def sm_resources(gpu: GpuSpec | None) -> dict[str, int]:
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
        **sm_resources(gpu),
        tile_pick=False if row.get("git_commit", "")[:7] in SELECT_WHOLE_ROW_PICK_COMMITS else None,
    )


# Sparse verification rows timed from then on ran 4 warps a program up to an accumulator of
# ``sparse_plan.FOUR_WARP_ACC_ELEMS``; earlier rows 4 up to 32 packed rows, else 8.
SPARSE_ACC_WARPS_SINCE = "2026-12-06T00:45:00+00:00"


def timed_before(row: dict, since: str) -> bool:
    """Whether ``row`` was timed before the ISO time ``since`` (a row without a timestamp was
    not)."""
    stamp = row.get("timestamp")
    return bool(stamp) and datetime.fromisoformat(stamp) < datetime.fromisoformat(since)


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
    the registry does not name (``sm_resources``)."""
    return _device_sms(row.get("device_name", ""))


@functools.lru_cache(maxsize=16)
def _device_sms(device_name: str) -> int:
    for gpu, names in DEVICE_NAMES.items():
        if device_name in names:
            return get_gpu(gpu, measured=False).num_sms
    return sm_resources(None)["num_sms"]


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
    commit = row.get("git_commit", "")[:7]
    work = sparse_call_work(
        shape,
        config=sparse_config(row),
        split_rule="fill" if commit in SPARSE_FILL_SPLIT_COMMITS else "wave_balance",
        union_plan=union_plan_kernel(row),
        **sm_resources(gpu),
    )
    if commit in SPARSE_ROW_MERGE_COMMITS and work.num_splits > 1:
        # Rows of the one-row merge keep the S steps the H100 profile was fitted with.
        work = dataclasses.replace(work, merge_steps=work.num_splits)
    return work


def sparse_config(row: dict) -> SparseVerifyConfig:
    """The launch configuration a sparse verification row's calls ran: the default, with a
    merge launch of its own for rows of ``SPARSE_MERGE_LAUNCH_COMMITS``, and for rows timed
    before ``SPARSE_ACC_WARPS_SINCE`` the warps of the rule then (4 up to 32 packed rows)."""
    cfg = DEFAULT_SPARSE_CONFIG
    if row.get("git_commit", "")[:7] in SPARSE_MERGE_LAUNCH_COMMITS:
        cfg = dataclasses.replace(cfg, fused_merge=False)
    if timed_before(row, SPARSE_ACC_WARPS_SINCE):
        p = row["params"]
        c = 1 if sparse_mode(row) == "per_query" else min(p["group_size"], p["num_query_tokens"])
        heads = (p["num_q_heads"], p["num_kv_heads"], p["block_size"], p["head_dim"])
        m_pad = sparse_tile_shape(cfg, c, *heads)[0]
        cfg = dataclasses.replace(cfg, num_warps=4 if m_pad <= 32 else 8)
    return cfg


def union_plan_kernel(row: dict) -> str:
    """The union plan kernel a sparse verification row's calls ran, had they built one:
    ``"compare"`` for rows of ``UNION_COMPARE_PLAN_COMMITS``, else ``"sort"``
    (``kernels.group_plan``)."""
    return "compare" if row.get("git_commit", "")[:7] in UNION_COMPARE_PLAN_COMMITS else "sort"


def union_plan_generation(row: dict) -> str | None:
    """The union plan kernel a sparse verification row's call ran before its attention
    (``union_plan_kernel``); None for a call that builds no plan (``per_query``, ``shared``, a
    group of one query) and for other ops."""
    if row["op"] != "sparse_verify" or sparse_mode(row) != "union":
        return None
    p = row["params"]
    if min(p["group_size"], p["num_query_tokens"]) <= 1:
        return None
    return union_plan_kernel(row)


def merge_generation(row: dict) -> str | None:
    """The merge a sparse verification row's call ran after its split programs: ``"row"`` (a
    launch of one partial row a program whatever the row count, ``SPARSE_ROW_MERGE_COMMITS``),
    ``"tile"`` (a ``kernels.merge`` launch: tiles of rows, one row a program only where the
    rows are fewer than the SMs can share; ``SPARSE_MERGE_LAUNCH_COMMITS``) or ``"fused"``
    (the last split program of each group merges its rows: where the launch plan merges in the
    launch, ``perfmodel.sparse_plan.merges_in_launch``); None for a call that does not
    split, and for other ops (dense verification's split calls run the same merge launch; its
    cross-GPU rows are compared whichever ran)."""
    if row["op"] != "sparse_verify":
        return None
    work = sparse_work(row, None)
    if work.num_splits <= 1:
        return None
    commit = row.get("git_commit", "")[:7]
    if commit in SPARSE_ROW_MERGE_COMMITS:
        return "row"
    return "tile" if work.merge_launches > 0 else "fused"


# Dense verification rows timed from then on ran 17 to 32 packed rows as a 64-row tile at a head
# dimension of at most 128 (``DenseVerifyConfig.warpgroup_rows_from``); earlier rows as a
# 32-row tile.
DENSE_WARPGROUP_TILE_SINCE = "2026-12-06T14:45:00+00:00"
DENSE_ROW32_CONFIG = dataclasses.replace(DEFAULT_DENSE_CONFIG, warpgroup_rows_from=33)


def dense_config(row: dict) -> DenseVerifyConfig:
    """The launch configuration a dense verification row's calls ran: the default, or for rows
    timed before ``DENSE_WARPGROUP_TILE_SINCE`` the 32-row tile of 17 to 32 packed rows."""
    if timed_before(row, DENSE_WARPGROUP_TILE_SINCE):
        return DENSE_ROW32_CONFIG
    return DEFAULT_DENSE_CONFIG


def dense_work(row: dict, gpu: GpuSpec | None) -> DenseWork:
    """``perfmodel.dense_work`` of the call a dense verification row timed, under its launch
    configuration (``dense_config``), on ``gpu``'s SMs and shared memory (the H100/H200's when
    None)."""
    p = row["params"]
    heads = (p["num_q_heads"], p["num_kv_heads"], p["head_dim"])
    return dense_call_work(
        p["batch"],
        p["num_query_tokens"],
        p["context_len"],
        *heads,
        **sm_resources(gpu),
        config=dense_config(row),
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
        **sm_resources(gpu),
    )
