"""Rows timed under a launch plan the current kernels no longer run.

``calibration.row_work`` prices each row with the plan its kernels ran when it was timed (by its
commit or its timestamp against the time of a kernel change), so a fit stays true to its rows
after a kernel changes. Such a row still describes an older kernel: a sweep with ``--redo
stale`` times it again. A row is stale where its call, timed now, would run another plan: its
work counts (``row_work``'s ``nsa_work``, ``sparse_work``, ``select_work``, ``dense_work``,
``repair_work``) differ from those of the same row stamped with the current code and time, or
its class leaves the plan-priced ones (an NSA row of the split plan, a selection row of the
torch pick). Ops whose classes are not plan-priced are never stale here.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ssvkit.calibration import row_work as rw
from ssvkit.calibration.nsa_rows import nsa_work
from ssvkit.perfmodel.hardware import GpuSpec

STALE = "stale"  # the --redo selector of the stale rows
CURRENT_COMMIT = "current"  # a commit no kernel change lists: the current code


def as_timed_now(row: dict) -> dict:
    """``row`` as the current code would time it now: its commit and timestamp replaced."""
    return {**row, "git_commit": CURRENT_COMMIT, "timestamp": datetime.now(UTC).isoformat()}


def launch_work(row: dict, gpu: GpuSpec | None = None):
    """The work counts of the plan ``row``'s call ran (``row_work``), None for an op whose
    class is not priced from its plan."""
    if rw.is_slot_plan(row):
        return nsa_work(row, gpu)
    if rw.is_select_plan(row):
        return rw.select_work(row, gpu)
    fn = {
        "sparse_verify": rw.sparse_work,
        "dense_verify": rw.dense_work,
        "repair": rw.repair_work,
    }.get(row["op"])
    return None if fn is None else fn(row, gpu)


def is_stale(row: dict, gpu: GpuSpec | None = None) -> bool:
    """Whether ``row``'s call ran another launch plan than the current kernels run for it (on
    ``gpu``'s SMs and shared memory; the H100/H200's when None)."""
    now = as_timed_now(row)
    if rw.is_plan_priced(row) != rw.is_plan_priced(now):
        return True
    return rw.is_plan_priced(row) and launch_work(row, gpu) != launch_work(now, gpu)
