"""The NSA work of one measured kernel row (``perfmodel.nsa_work``): the selection overlap its
measured bytes give, the lone compressed launch's sizing it ran, and the rows to time again when
that sizing came in.
"""

from __future__ import annotations

from datetime import datetime

from ssvkit.calibration.row_work import sm_resources
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.nsa_plan import (
    COMPRESSED_CTAS_PER_SM,
    CONTEXT_TILES,
    DEFAULT_TILE_PLAN,
    TILE_PLANS,
    WIDE_TILE_ELEMS,
    tile_packing,
)
from ssvkit.perfmodel.nsa_shape import NsaShape
from ssvkit.perfmodel.nsa_slots import EXPECTED_OVERLAP
from ssvkit.perfmodel.nsa_work import NsaWork, nsa_call_work

# The blocks every row's own selection keeps whatever its scores (``kernels.nsa_verify``'s
# ``num_sink`` and ``num_local`` defaults, which the kernel sweep runs): the first block of the
# prefix, outside the window, and the last, inside it.
SWEEP_SINK_BLOCKS = 1
SWEEP_LOCAL_BLOCKS = 1
# Rows over which a given-overlap selection's fresh blocks are new (``kernel_inputs.SPAN``).
SWEEP_SPAN = 8


def own_selection_union(p: dict, rows: int) -> float:
    """Expected blocks outside the window in the union of ``rows`` draft rows' own selections
    at an NSA row's params: the sink blocks, plus the blocks outside the window that the rows'
    free picks reach when each row draws its ``top_n`` less the forced blocks uniformly from the
    prefix's blocks that are not forced. The sweep's scores come from random queries and keys,
    so the rows' picks are close to independent draws; correlation through shared keys makes the
    measured union a few percent smaller, which ``nsa_row_overlap`` scales away."""
    bs = p["block_size"]
    num_blocks = -(-p["context_len"] // bs)
    window_blocks = p["context_len"] // bs - (p["context_len"] - p["window"]) // bs
    free = num_blocks - SWEEP_SINK_BLOCKS - SWEEP_LOCAL_BLOCKS
    picks = p["top_n"] - SWEEP_SINK_BLOCKS - SWEEP_LOCAL_BLOCKS
    outside = num_blocks - window_blocks - SWEEP_SINK_BLOCKS
    if free <= 0 or outside <= 0 or picks <= 0:
        return float(SWEEP_SINK_BLOCKS)
    return SWEEP_SINK_BLOCKS + outside * (1.0 - (1.0 - min(picks / free, 1.0)) ** rows)


def given_overlap_union(p: dict, rows: int) -> float:
    """Expected blocks in the union of ``rows`` consecutive draft rows' selections of a given
    overlap as the sweep builds them (``kernel_inputs.overlap_block_idx``, from a span's first
    row): each row keeps ``round(overlap * n)`` blocks of the row before and draws the rest new
    to its span of ``SWEEP_SPAN`` rows, so the first span's union grows by the fresh blocks a
    row; a later span draws its fresh blocks from the prefix less the row before it, and those
    that land outside the union so far (the share of that pool the union does not hold) add."""
    n = p["top_n"]
    num_blocks = -(-p["context_len"] // p["block_size"])
    fresh = n - round(p["overlap"] * n)
    first = min(rows, SWEEP_SPAN)
    union = float(min(n + (first - 1) * fresh, num_blocks))
    for start in range(first, rows, SWEEP_SPAN):
        drawn = min(SWEEP_SPAN, rows - start) * fresh
        union += drawn * (num_blocks - union) / max(num_blocks - n, 1)
    return min(union, float(num_blocks))


def sweep_selection_union(p: dict, rows: int) -> float:
    """Expected selected blocks in the union of ``rows`` draft rows as the sweep builds an NSA
    row's selections: its own selection where the row has no overlap, else the given one's."""
    if p.get("overlap") is None:
        return own_selection_union(p, rows)
    return given_overlap_union(p, rows)


def nsa_row_overlap(row: dict) -> float:
    """The selection overlap gamma that gives an NSA row's selected blocks a row tile as the
    work model counts them: the selection model puts ``n (1 + (r - 1)(1 - gamma))`` blocks in
    the union of a tile of ``r`` rows. The row counts, per (sequence, KV head), the union of each
    row tile's blocks outside the window (its rows' tiles as the plan packs them with a row
    schedule, else one union of all ``t`` rows: ``calibration.kernel_ops``). A row of one union
    whose kernels pack its rows into several tiles has its tile's union read off the sweep's
    selection (``sweep_selection_union``, which saturates as rows add blocks already picked),
    scaled to the measured union of all rows: the linear model fitted to all ``t`` rows would
    give each tile too few blocks. ``EXPECTED_OVERLAP`` (the host's assumption) where no tile
    has two rows."""
    p = row["params"]
    b, t, hq, hkv, d = (
        p[k] for k in ("batch", "num_query_tokens", "num_q_heads", "num_kv_heads", "head_dim")
    )
    comp_tokens = (p["context_len"] - p["comp_block"]) // p["comp_stride"] + 1
    kv_row = 2 * d * 2
    rest = 2 * b * t * hq * d * 2 + b * hq * t * 4 + b * t * hq * 3 * 4
    rest += b * hkv * comp_tokens * kv_row
    sel = ((row["unique_bytes"] - rest) / kv_row / (b * hkv) - p["window"] - t) / p["block_size"]
    n = p["top_n"]
    plan = p.get("tile_plan", DEFAULT_TILE_PLAN)
    packed = tile_packing(
        t, hq // hkv, p.get("rows_per_tile", 0), plan, d, row_wide_tile_elems(row)
    )[0]
    if "rows_per_tile" in p:
        return _chain_overlap(sel, n, [min(packed, t - i) for i in range(0, t, packed)])
    if packed < t:
        share = sweep_selection_union(p, packed) / sweep_selection_union(p, t)
        return _chain_overlap(sel * share, n, [packed])
    return _chain_overlap(sel, n, [t])


def _chain_overlap(union: float, top_n: int, tiles: list[int]) -> float:
    """The gamma at which the selection model's tiles of ``tiles`` rows hold ``union`` blocks in
    all, clipped to [0, 1]; the host's assumed overlap where no tile has two rows."""
    spread = sum(r - 1 for r in tiles)
    if spread == 0:
        return EXPECTED_OVERLAP
    return float(min(max(1.0 - (union - top_n * len(tiles)) / (top_n * spread), 0.0), 1.0))


# Rows timed from then on ran the kernels that size a lone compressed launch of one slot a row
# tile for two programs an SM (perfmodel.nsa_slots.compressed_capacity); earlier rows for one.
COMPRESSED_CTAS_SINCE = "2026-11-30T12:50:00+00:00"


def row_compressed_ctas(row: dict) -> int:
    """The ``NsaVerifyConfig.compressed_ctas`` an NSA row ran with, from when it was timed
    (``COMPRESSED_CTAS_SINCE``; a row without a time is the current kernels')."""
    stamp = row.get("timestamp")
    if stamp and datetime.fromisoformat(stamp) < datetime.fromisoformat(COMPRESSED_CTAS_SINCE):
        return 1
    return COMPRESSED_CTAS_PER_SM


# When the kernels began capping a row tile's MMA rows above a head dim of 128
# (``NsaVerifyConfig.wide_tile_elems``): rows timed before it ran 32-row tiles at D = 256.
WIDE_TILE_SINCE = "2026-12-07T10:00:00+00:00"


def row_wide_tile_elems(row: dict) -> int:
    """The ``NsaVerifyConfig.wide_tile_elems`` an NSA row ran with, from when it was timed
    (``WIDE_TILE_SINCE``: 0, no cap, before; a row without a time is the current kernels')."""
    stamp = row.get("timestamp")
    if stamp and datetime.fromisoformat(stamp) < datetime.fromisoformat(WIDE_TILE_SINCE):
        return 0
    return WIDE_TILE_ELEMS


def nsa_row_shape(row: dict, compressed_ctas: int | None = None) -> NsaShape:
    """The ``NsaShape`` of the call an NSA row timed, at its measured selection overlap
    (``nsa_row_overlap``), with the lone compressed launch's sizing it ran
    (``row_compressed_ctas``) unless given."""
    p = row["params"]
    return NsaShape(
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
        shared_context=CONTEXT_TILES.index(p.get("context_tiles", "per_tile")),
        # An unfused row without the param ran its branches on one stream.
        branch_streams=int(p["impl"] == "unfused" and bool(p.get("branch_streams", False))),
        compressed_ctas=compressed_ctas or row_compressed_ctas(row),
        # A row without the param ran the default plan (every calibration row).
        tile_plan=TILE_PLANS.index(p.get("tile_plan", DEFAULT_TILE_PLAN)),
        wide_tile_elems=row_wide_tile_elems(row),
    )


def nsa_work(row: dict, gpu: GpuSpec | None, compressed_ctas: int | None = None) -> NsaWork:
    """``perfmodel.nsa_work`` of the call an NSA row timed (``nsa_row_shape``), on ``gpu``'s
    SMs and shared memory (the H100/H200's 132 and 227 KiB when None)."""
    p = row["params"]
    return nsa_call_work(
        nsa_row_shape(row, compressed_ctas),
        fused=p["impl"] == "fused",
        refresh=p["mode"] == "refresh",
        **sm_resources(gpu),
    )
