"""Slot sizing of the current NSA kernels (``kernels.nsa_launch``: ``plan_slots``,
``refresh_slots``; ``kernels.nsa_merge_kernels.split_slots``), scalar and without torch: how
many slots each (sequence x KV head, row tile) program of a launch gets and how a program's
branches split its slots. The calibrated NSA classes' work counts (``perfmodel.nsa_work``)
follow it.
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

from ssvkit.perfmodel.nsa_plan import (
    COMPRESSED_ALONE,
    COMPRESSED_CTAS_PER_SM,
    CTAS_PER_SM,
    MAKESPAN_PLANS,
    MAX_SPLITS,
    TILE_PLANS,
)

MIN_TILES_PER_SLOT = 2
EXPECTED_OVERLAP = 0.7  # the row-to-row overlap the host assumes when sizing slots


def slot_counts(
    work: tuple[float, float, float],
    programs: int,
    num_sms: int,
    branches=(True, True, True),
    *,
    compressed_ctas: int = COMPRESSED_CTAS_PER_SM,
) -> tuple[int, int, int]:
    """Slots per (sequence x KV head, row tile) of one launch of the enabled ``branches`` under
    the default ("fixed") plan on a GPU of ``num_sms`` SMs: ``plan_slots`` with every slot at
    least ``MIN_TILES_PER_SLOT`` key tiles (``compressed_ctas``: ``compressed_capacity``'s)."""
    return plan_slots(
        work,
        tuple(branches),
        programs,
        num_sms * CTAS_PER_SM,
        min_tiles_per_slot=MIN_TILES_PER_SLOT,
        compressed_ctas=compressed_ctas,
    )


def split_slots(n: int, units: tuple[int, int, int], enabled: tuple[bool, bool, bool]):
    """``n`` slots of one row tile split between the enabled branches (compressed, selected,
    window) in proportion to their key tiles ``units``, at least one each: the integer
    arithmetic of the forward kernel's ``split_slots`` (``kernels.nsa_merge_kernels``)."""
    on_c, on_s, on_w = enabled
    total = max(sum(u for u, on in zip(units, enabled, strict=True) if on), 1)
    later = int(on_s) + int(on_w)
    share_c = min(max((2 * n * units[0] + total) // (2 * total), 1), n - later)
    c = (share_c if later else n) if on_c else 0
    share_s = min(max((2 * n * units[1] + total) // (2 * total), 1), n - c - 1)
    s = (share_s if on_w else n - c) if on_s else 0
    return c, s, n - c - s


def launch_makespan(lengths, programs: int, capacity: int) -> float:
    """Finish time of a launch whose grid is ``(programs, len(lengths))``, every program of
    slot ``j`` running ``lengths[j]``, on ``capacity`` resident program places filled in
    launch order (``programs`` fastest), each freed place taking the next program."""
    free = [0.0] * capacity
    end = 0.0
    for length in lengths:
        for _ in range(programs):
            start = heapq.heappop(free)
            end = max(end, start + length)
            heapq.heappush(free, start + length)
    return end


@lru_cache(maxsize=4096)
def fit_slots(
    work: tuple[float, float, float],
    enabled: tuple[bool, bool, bool],
    programs: int,
    capacity: int,
    max_splits: int,
    overhead: float,
) -> int:
    """Slots per row tile of the "fit" plan: of ``sum(enabled)`` to ``max_splits``, the count
    whose launch finishes first (``launch_makespan``, fewest slots on a tie), each program
    costing its branch's slice of key tiles (``split_slots`` of ``work``, the key tiles of one
    row tile per branch) plus ``overhead`` key tiles (its query load, partial and merge share).

    Unlike the "fixed" plan it may start a second wave: where one branch's slice is long (the
    compressed tokens of a tile of few rows), more programs of the short branches finish
    early and hand their places on, which one wave's budget does not allow."""
    units = tuple(math.ceil(w) if on else 0 for w, on in zip(work, enabled, strict=True))
    lowest = sum(enabled)
    best, best_s = math.inf, lowest
    for n in range(lowest, max(lowest, max_splits) + 1):
        if programs * n > 4 * capacity and n > lowest:
            break
        counts = split_slots(n, units, enabled)
        lengths = []
        for u, k in zip(units, counts, strict=True):
            lengths += [math.ceil(u / k) + overhead] * k if k else []
        span = launch_makespan(lengths, programs, capacity)
        if span < best - 1e-9:
            best, best_s = span, n
    return best_s


def branch_tiles(
    t: int,
    rows: int,
    *,
    nc_max: int,
    nb_max: int,
    top_n: int,
    block_size: int,
    block_n: int,
    window: int,
    overlap: float,
) -> tuple[float, float, float]:
    """Key tiles of one row tile per branch at the longest prefix the cache holds:
    compressed, selected (the union of ``min(t, rows)`` rows at row-to-row overlap
    ``overlap``), window plus draft tail (``kernels.nsa_launch.LaunchPlan.branch_tiles``)."""
    union = top_n * (1 + (min(t, rows) - 1) * (1.0 - overlap))
    return (
        math.ceil(nc_max / block_n),
        min(union, nb_max) * (block_size // block_n),
        math.ceil((min(window, nb_max * block_size) + t) / block_n),
    )


def compressed_capacity(
    enabled: tuple[bool, bool, bool], programs: int, capacity: int, compressed_ctas: int
) -> int:
    """The resident program places a "fixed" launch is sized for: ``capacity``, times
    ``compressed_ctas`` for a launch of the compressed branch alone (a refresh call's first,
    the compressed launch of shared context tiles) of more than ``capacity / 2`` row tiles,
    whose one wave would give each tile a single slot and each SM a single program: one program
    of four warps an SM streams the compressed tokens at about half the DRAM bandwidth
    (``validation/data/nsa-ncu-ar-h200.txt``), two resident ones double the bytes in flight.
    The unfused reuse call's compressed branch, which runs beside its selected and window
    branches, passes 1: there two programs an SM made the call slower."""
    if enabled == COMPRESSED_ALONE and capacity < 2 * programs <= 2 * capacity:
        return capacity * compressed_ctas
    return capacity


def plan_slots(
    work: tuple[float, float, float],
    enabled: tuple[bool, bool, bool],
    programs: int,
    capacity: int,
    *,
    tile_plan: str = "fixed",
    num_splits: int = 0,
    max_splits: int = MAX_SPLITS,
    min_tiles_per_slot: int = 2,
    compressed_ctas: int = COMPRESSED_CTAS_PER_SM,
) -> tuple[int, int, int]:
    """The host's slot count per branch of one launch (``kernels.nsa_launch.plan_slots`` on a
    GPU): ``work`` key tiles per branch of one row tile, ``programs`` row tiles, ``capacity``
    resident programs (SMs x programs per SM).

    "fixed": every slot about the same key tiles, at least ``min_tiles_per_slot``, at most one
    wave and ``max_splits``, slots taken from the branch with the least work per slot. "fit"
    and "fit_slots" (``MAKESPAN_PLANS``): ``fit_slots`` slots, which the kernel splits by its
    own key tiles; the host's per-branch counts are ``split_slots`` of the expected ones.
    ``num_splits`` > 0 apportions that many. A "fixed" launch of the compressed branch alone
    takes ``compressed_capacity``'s places.

    Under "fixed" a call of 17 draft rows at 4 head slots is two tiles (16 + 1 rows) that share
    one wave's slots: the full tile gets half of t = 16's, and the kernel's split leaves its
    selected slices three times as long. "fit" packs up to ``FIT_BLOCK_M_MAX`` MMA rows (32
    draft rows there) in one tile, so the compressed and window keys are streamed once per KV
    head and the slices stay t = 16's. This, ``split_slots`` and ``branch_tiles`` mirror the
    current wrapper's slot sizing for both plans (``tests/perfmodel/test_nsa_plan.py`` checks
    them against it)."""
    work = [w if on else 0.0 for w, on in zip(work, enabled, strict=True)]
    if num_splits:
        total = max(num_splits, sum(enabled))
        return tuple(max(1, round(total * w / sum(work))) if w else 0 for w in work)
    if tile_plan not in TILE_PLANS:
        raise ValueError(f"tile_plan must be one of {', '.join(TILE_PLANS)}, got {tile_plan!r}")
    if tile_plan in MAKESPAN_PLANS:
        n = fit_slots(
            tuple(work), tuple(enabled), programs, capacity, max_splits, min_tiles_per_slot
        )
        return split_slots(n, tuple(math.ceil(w) for w in work), tuple(enabled))
    capacity = compressed_capacity(tuple(enabled), programs, capacity, compressed_ctas)
    per_slot = max(min_tiles_per_slot, programs * sum(work) / capacity)
    pairs = zip(work, enabled, strict=True)
    slots = [max(1, math.ceil(w / per_slot)) if on else 0 for w, on in pairs]
    limit = max(min(max_splits, capacity // programs), sum(enabled))
    while sum(slots) > limit:
        i = min((k for k in range(3) if slots[k] > 1), key=lambda k: work[k] / slots[k])
        slots[i] -= 1
    return tuple(slots)
