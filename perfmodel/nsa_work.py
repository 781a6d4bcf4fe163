"""The work one NSA verification call does, counted from the launch plan the current kernels
make (``perfmodel.nsa_plan``: ``plan_slots``, ``split_slots``), without
torch: the counts the slot-planned NSA classes are fitted on and priced with (``NsaWork``).

A call's forward launches (``perfmodel.nsa_shape.forward_launches``) each have
``B x Hkv x tiles x S`` programs, each an equal slice of one branch's key tiles of one row tile
(compressed tokens, the tile's union of selected blocks, window plus draft tail). Launches run
in series, except those that share the SMs at once, counted as one part (``_schedule``,
``side_by_side``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES
from ssvkit.perfmodel.dense_work import key_tile_weight
from ssvkit.perfmodel.nsa_plan import (
    CTAS_PER_SM,
    PAIRED_RESIDENT,
    STORED_SCORE_BYTES,
    WGMMA_MIN_ROWS,
    WGMMA_ROW_COST,
    forward_warps,
    pairs_launches,
    stores_scores,
)
from ssvkit.perfmodel.nsa_shape import (
    BLOCK_N,
    ELEM_BYTES,
    F32,
    PAIRED,
    Launch,
    NsaShape,
    branch_units,
    compressed_tokens,
    live_launches,
    resident_programs,
    tile_packing_of,
    tile_union_blocks,
)
from ssvkit.perfmodel.nsa_slots import EXPECTED_OVERLAP, MIN_TILES_PER_SLOT, plan_slots, split_slots
from ssvkit.perfmodel.select_work import MAX_WARPS_PER_SM
from ssvkit.perfmodel.work_points import at_distinct_points

I32 = 4
UNION_PLAN_WARPS = 4  # kernels.nsa_steps.union_plan's num_warps


@dataclass(frozen=True, slots=True)
class NsaWork:
    """What one NSA call executes; counts and bytes as floats.

    - ``requested_bytes``: what the programs read and write: every row tile's K/V tiles (the
      compressed tokens once per tile of their launch, the window once per tile, the tile's
      own union of selected blocks), queries, outputs, gates, the fp32 slot partials a merge
      reads back, an unfused call's branch outputs, a refresh call's block scores;
      ``unique_bytes``: the same with the compressed tokens, the window and the union of
      every draft row's selected blocks once per (sequence, KV head) -- the other tiles' reads
      of them may hit L2 (a head's row tiles walk their ascending block lists side by side);
    - ``chain_tiles``: key tiles in series, summed over the parts: per part the busiest
      program's slice, or the part's tiles over its resident programs when the grid overfills
      the SMs (``resident_programs``: what shared memory holds); a tile's load latency over
      the pipeline's depth prices it (Little's law: the bytes in flight per SM set the rate),
      whatever the head dimension;
    - ``merge_steps``: partial slots a row tile's merge reads, summed over merges in series (of
      merges side by side, the longest);
    - ``row_cost``: the row tile's ``BLOCK_M`` in ``mma.sync`` rows (``wgmma`` rows count
      half), weighted by ``dense_work.key_tile_weight`` (a tile's MMAs and softmax at its head
      dimension over their work at D = 128), as a dense call's rows are: the head dimension
      scales what a key tile's rows cost, not the latency of its load;
    - ``waves``: program waves summed over the parts (each pays a prologue and an epilogue),
      and those of the union plan's launch where the call builds it (``union_plan_work``);
    - ``pick_rows``: a refresh call's selection rows (``B x Hkv x t``), each walked by one
      program of the top-n pick; its block scoring's bytes and FLOPs are in the counts above
      (``block_score_work``);
    - ``mma_flops``: the FLOPs of the padded MMA tiles: every ``BLOCK_M`` row of a row tile
      against every key of the tile's branches (its union of selected blocks included: a row
      computes the blocks its tile's other rows selected, masked), ``4 x BLOCK_M x D`` a key.

    It ignores the spread of union sizes across tiles.
    """

    requested_bytes: float
    unique_bytes: float
    chain_tiles: float
    merge_steps: float
    row_cost: float
    waves: float
    pick_rows: float
    mma_flops: float


def block_score_work(s: NsaShape, comp: Launch) -> tuple[float, float]:
    """Bytes and MMA FLOPs of a refresh call's block scoring over the row tiles of its
    compressed launch ``comp`` (``kernels.nsa_selection``): each tile's compressed keys read
    again and multiplied by the tile's ``BLOCK_M`` rows, or, where that moves fewer bytes
    (``kernels.nsa_selection.stores_comp_scores``), the scores the compressed launch stored: 8
    bytes a real row and compressed token, written and read back."""
    nc = compressed_tokens(s)
    heads = s.batch * s.num_kv_heads
    group = s.num_q_heads // s.num_kv_heads
    if stores_scores(min(comp.rows[0], s.t), group, s.head_dim * ELEM_BYTES):
        return heads * float(STORED_SCORE_BYTES) * sum(comp.rows) * group * nc, 0.0
    keys = heads * len(comp.rows) * nc
    return keys * s.head_dim * ELEM_BYTES, keys * comp.block_m * s.head_dim * 2.0


def union_plan_work(
    s: NsaShape, launches: list[Launch], *, fused: bool, refresh: bool, num_sms: int
) -> tuple[float, float]:
    """(waves, bytes) of the union plan's launch a call makes before its forward
    (``kernels.nsa_steps.union_plan``): one program per row tile of the selected branch's
    launch, of ``UNION_PLAN_WARPS`` warps, that clears a bitmap of the scored blocks, sets its
    rows' bits (an atomic a picked block) and scans the bitmap into the tile's ascending list
    and member bits. Nothing where the tiles hold one row each (a row streams its own picks) or
    the call is handed the plan (``NsaShape.union_given``: a fused reuse call)."""
    given = s.union_given and fused and not refresh
    tiles = [la.rows for la in launches if la.branches[1]]
    if given or not tiles or max(tiles[0]) <= 1:
        return 0.0, 0.0
    heads = s.batch * s.num_kv_heads
    programs = heads * len(tiles[0])
    nb_max = s.num_blocks
    per_sm = MAX_WARPS_PER_SM // UNION_PLAN_WARPS
    waves = math.ceil(programs / (num_sms * per_sm))
    bitmap = 2 * nb_max * I32  # cleared, then scanned
    lists = 2 * min(max(tiles[0]) * s.top_n, nb_max) * I32 + I32  # blocks, bits, count
    picks = heads * s.t * s.top_n * I32
    return float(waves), float(programs * (bitmap + lists) + picks)


@dataclass(frozen=True, slots=True)
class Part:
    """Forward work that holds the SMs at once: its programs (x slots), the programs one SM
    holds, the busiest program's slice and the key tiles of all its programs. A part costs its
    waves and a chain of its busiest slice or of its key tiles over the SMs' resident
    programs (``nsa_call_work``)."""

    grid: int
    resident: int
    busiest: float
    key_tiles: float


def launch_part(
    s: NsaShape, launch: Launch, num_sms: int, smem_per_sm_bytes: int
) -> tuple[Part, int]:
    """One forward launch as a ``Part``, and the slots each of its programs has: as many as
    the host sizes at the longest prefix and its assumed overlap under the shape's tile plan
    (``nsa_slots.plan_slots``)."""
    heads = s.batch * s.num_kv_heads
    assumed = NsaShape(**{**_fields(s), "overlap": EXPECTED_OVERLAP})
    programs = heads * len(launch.rows)
    host = branch_units(assumed, tile_union_blocks(assumed, launch.rows[0]))
    slots = plan_slots(
        host,
        launch.branches,
        programs,
        num_sms * CTAS_PER_SM,
        tile_plan=s.plan,
        min_tiles_per_slot=MIN_TILES_PER_SLOT,
        compressed_ctas=s.compressed_ctas if launch.alone else 1,
    )
    n = sum(slots)
    busiest = total = 0.0
    for u in launch.units:
        split = split_slots(n, u, launch.branches)
        for x in range(3):
            if launch.branches[x]:
                busiest = max(busiest, math.ceil(u[x] / max(split[x], 1)))
                total += heads * u[x]
    resident = resident_programs(launch.block_m, s.head_dim, smem_per_sm_bytes)
    return Part(programs * n, resident, busiest, total), n


def side_by_side(*parts: Part) -> Part:
    """Launches on streams of their own as one part that shares the SMs: the busiest slice of
    any, their programs and key tiles together, each program weighed by the share of an SM it
    takes (``1 / resident``, in units of the residents' least common multiple)."""
    per_sm = math.lcm(*(p.resident for p in parts))
    return Part(
        sum(p.grid * (per_sm // p.resident) for p in parts),
        per_sm,
        max(p.busiest for p in parts),
        sum(p.key_tiles * (per_sm // p.resident) for p in parts),
    )


def _schedule(
    s: NsaShape,
    launches: list[Launch],
    parts: list[Part],
    slots: list[int],
    fused: bool,
    refresh: bool,
    num_sms: int,
) -> tuple[list[Part], int]:
    """The parts of a call that run in series, and its merge steps: the slots its merges read,
    summed over merges in series and the longest of those side by side (``parts`` and
    ``slots``: one a launch of ``launches``).

    ``context_tiles`` "paired" runs a fused reuse call's two launches as one where one wave
    holds them (``nsa_plan.pairs_launches``) and they have one warp count
    (``nsa_plan.forward_warps``): it saves a launch's wave, but an SM that holds a program of
    each kind walks their slices about one after the other, so the part's chain is the sum of
    the two busiest slices (priced with the longer alone, the H200's paired rows came out 4%
    and 17% low, median by row-tile shape); ``branch_streams`` runs an unfused call's
    branches, one launch each, on streams of their own (``side_by_side``): a reuse call's
    launches as one part, a refresh call's compressed and window launches as one part and then
    the selected launch. Other launches run in series."""
    paired = s.shared_context == PAIRED and fused and not refresh and len(parts) == 2
    # The kernel pairs two launches of one warp count only (kernels.nsa_verify._pairs).
    paired = paired and len({forward_warps(la.block_m, s.plan) for la in launches}) == 1
    if paired and pairs_launches(parts[0].grid + parts[1].grid, num_sms):
        a, b = parts  # one launch of kernels.nsa_pair, PAIRED_RESIDENT programs an SM
        grid, tiles = a.grid + b.grid, a.key_tiles + b.key_tiles
        return [Part(grid, PAIRED_RESIDENT, a.busiest + b.busiest, tiles)], sum(slots)
    if fused or not s.branch_streams:
        # Merges in series: fused, one over every slot (a refresh call's reads the compressed
        # launch's slots too); unfused, one per branch: the slots of every launch.
        return parts, sum(slots)
    if not refresh:  # every branch, forward and merge, beside the others
        return [side_by_side(*parts)], max(slots)
    # Compressed (0), selected (1), window (2): the part and merge slots of each branch the
    # call has (a call without the compressed branch has no launch of it).
    each = zip(launches, parts, slots, strict=True)
    branch = {la.branches.index(True): (p, n) for la, p, n in each}
    merge = [branch[x][1] if x in branch else 0 for x in range(3)]
    # First the compressed forward, its block scoring and top-n pick, the window branch beside
    # them; then the selected branch, the compressed merge beside it. Merges side by side count
    # as the longest of them and stages in series add: the window merge runs in the first
    # stage, where no other merge does, so it counts whole; the compressed and selected merges
    # share the second, so the longer of the two counts.
    first = side_by_side(*(branch[x][0] for x in (0, 2) if x in branch))
    return [first, branch[1][0]], merge[2] + max(merge[0], merge[1])


def nsa_call_work(
    s: NsaShape, *, fused: bool, refresh: bool, num_sms: int, smem_per_sm_bytes: int
) -> NsaWork:
    """The work of one ``nsa_verify`` (``fused``) or ``nsa_verify_unfused`` call, a refresh
    call (it selects its blocks) or a reuse one, on ``num_sms`` SMs."""
    heads = s.batch * s.num_kv_heads
    launches = live_launches(s, fused=fused, refresh=refresh)
    parts, slots = [], []  # per launch: its part, its slots a program
    tile_reads = flops = partial_bytes = 0.0
    for launch in launches:
        part, n = launch_part(s, launch, num_sms, smem_per_sm_bytes)
        parts.append(part)
        slots.append(n)
        tile_reads += part.key_tiles
        flops += part.key_tiles * launch.block_m
        partial_bytes += 2 * part.grid * launch.block_m * (s.head_dim + 2) * F32
    series, merge = _schedule(s, launches, parts, slots, fused, refresh, num_sms)
    chain = sum(max(p.busiest, p.key_tiles / (num_sms * p.resident)) for p in series)
    waves = sum(math.ceil(p.grid / (num_sms * p.resident)) for p in series)
    plan_waves, plan_bytes = union_plan_work(
        s, launches, fused=fused, refresh=refresh, num_sms=num_sms
    )
    waves += plan_waves
    comp_units, _, win_units = branch_units(s, 0.0)
    selected = branch_units(s, tile_union_blocks(s, s.t))[1]
    rows_q = s.batch * s.t * s.num_q_heads
    other = 2 * rows_q * s.head_dim * ELEM_BYTES + rows_q * 3 * F32 + partial_bytes + plan_bytes
    if not fused:
        branches = 3 if s.comp_stride else 2
        other += branches * 2 * rows_q * s.head_dim * ELEM_BYTES  # branch outputs, gated apart
    pick_rows = heads * s.t if refresh else 0.0
    score_flops = 0.0
    if refresh:
        other += 2 * pick_rows * s.num_blocks * F32
        score_bytes, score_flops = block_score_work(s, launches[0]) if s.comp_stride else (0, 0)
        other += score_bytes
    block_m = tile_packing_of(s, s.rows_per_tile)[2]
    kv_tile = BLOCK_N * 2 * s.head_dim * ELEM_BYTES
    return NsaWork(
        # Every tile reads its branches' key tiles; the compressed tokens, the window and the
        # union of all draft rows' selected blocks once per (sequence, KV head) are the unique
        # ones (the other tiles' reads may hit L2).
        requested_bytes=float(tile_reads * kv_tile + other),
        unique_bytes=float(heads * (comp_units + win_units + selected) * kv_tile + other),
        chain_tiles=float(chain),
        merge_steps=float(merge),
        row_cost=float(
            (block_m if block_m < WGMMA_MIN_ROWS else WGMMA_ROW_COST * block_m)
            * key_tile_weight(s.head_dim)
        ),
        waves=float(waves),
        pick_rows=float(pick_rows),
        mma_flops=float(flops * BLOCK_N * s.head_dim * 4 + score_flops),
    )


def _fields(s: NsaShape) -> dict:
    return {name: getattr(s, name) for name in NsaShape.__slots__}


WORK_FIELDS = NsaWork.__slots__


def nsa_work_arrays(
    shape: dict,
    *,
    fused: bool,
    refresh: bool,
    num_sms: int,
    smem_per_sm_bytes: int = DEFAULT_SMEM_PER_SM_BYTES,
) -> dict[str, np.ndarray]:
    """``nsa_call_work`` at every point of ``shape`` (``NsaShape`` field names to arrays or
    scalars that broadcast), as one array per ``NsaWork`` field, evaluated once per distinct
    point; a point of no draft rows or heads counts nothing."""

    def work(kw: dict) -> NsaWork | None:
        if min(kw["batch"], kw["t"], kw["num_q_heads"], kw["num_kv_heads"]) < 1:
            return None
        return nsa_call_work(
            NsaShape(**kw),
            fused=fused,
            refresh=refresh,
            num_sms=num_sms,
            smem_per_sm_bytes=smem_per_sm_bytes,
        )

    key = ("nsa_call_work", fused, refresh, num_sms, smem_per_sm_bytes)
    return at_distinct_points(shape, work, WORK_FIELDS, floats=("overlap",), memo_key=key)
