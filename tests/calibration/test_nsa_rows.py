"""The selection overlap an NSA row's measured bytes give (``calibration.nsa_rows``): the union
of the sweep's own selections, and the per-tile gamma of a row whose kernels pack its rows into
several tiles (no GPU)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.nsa_rows import (
    SWEEP_LOCAL_BLOCKS,
    SWEEP_SINK_BLOCKS,
    SWEEP_SPAN,
    given_overlap_union,
    nsa_row_overlap,
    nsa_row_shape,
    own_selection_union,
)
from ssvkit.kernels.nsa_verify import nsa_verify
from ssvkit.perfmodel.nsa_plan import tile_packing
from ssvkit.perfmodel.nsa_shape import tile_union_blocks


def _params(t, ctx=16384, heads=(32, 8, 128), rows_per_tile=None, overlap=None):
    p = ki.base_params(context_len=ctx, num_query_tokens=t, batch=2, mode="reuse", impl="fused")
    p.update(num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2])
    p.update(ki.NSA_KW)
    if rows_per_tile is not None:
        p["rows_per_tile"] = rows_per_tile
    if overlap is not None:
        p["overlap"] = overlap
    return p


def _row(p, union):
    """A row whose bytes hold ``union`` selected blocks outside the window per (sequence, KV
    head), counted as ``calibration.kernel_ops`` counts them."""
    b, t, hq, hkv, d = (
        p[k] for k in ("batch", "num_query_tokens", "num_q_heads", "num_kv_heads", "head_dim")
    )
    comp = (p["context_len"] - p["comp_block"]) // p["comp_stride"] + 1
    kv_row = 2 * d * 2
    rest = 2 * b * t * hq * d * 2 + b * hq * t * 4 + b * t * hq * 3 * 4 + b * hkv * comp * kv_row
    tokens = union * p["block_size"] + p["window"] + t
    return {"op": "nsa_verify", "params": p, "unique_bytes": rest + b * hkv * tokens * kv_row}


def test_forced_blocks_are_the_kernels_defaults():
    sig = inspect.signature(nsa_verify).parameters
    assert sig["num_sink"].default == SWEEP_SINK_BLOCKS
    assert sig["num_local"].default == SWEEP_LOCAL_BLOCKS
    assert "num_sink" not in ki.NSA_KW and "num_local" not in ki.NSA_KW
    assert SWEEP_SPAN == ki.SPAN


@pytest.mark.parametrize("rows", [1, 4, 16, 64])
def test_own_selection_union_matches_random_draws(rows):
    """The formula against rows that each keep the sink and local blocks and draw the rest of
    their top-n uniformly from the other blocks."""
    p = _params(rows, ctx=8192)
    bs, n = p["block_size"], p["top_n"]
    nb = p["context_len"] // bs
    window = set(range((p["context_len"] - p["window"]) // bs, nb))
    free = np.arange(SWEEP_SINK_BLOCKS, nb - SWEEP_LOCAL_BLOCKS)
    rng = np.random.default_rng(rows)
    counts = []
    for _ in range(400):
        picks = [rng.choice(free, n - 2, replace=False) for _ in range(rows)]
        chosen = set(np.concatenate(picks).tolist()) | set(range(SWEEP_SINK_BLOCKS))
        counts.append(len(chosen - window))
    assert own_selection_union(p, rows) == pytest.approx(np.mean(counts), rel=0.01)


def test_one_union_of_several_tiles_reads_the_tile_union_off_the_saturating_model():
    """t = 64 at GQA 4 packs 16 rows a tile: the tile's blocks follow the saturating union (the
    linear model fitted to all 64 rows would give a tile about half of them)."""
    p = _params(64)
    packed = tile_packing(64, 4, 0, "fixed")[0]
    assert packed < 64
    row = _row(p, own_selection_union(p, 64))
    shape_union = tile_union_blocks(nsa_row_shape(row), packed)
    assert shape_union == pytest.approx(own_selection_union(p, packed), rel=1e-9)
    # A measured union 10% above the model's puts 10% more in every tile.
    more = own_selection_union(p, 64) * 1.1
    tile_more = tile_union_blocks(nsa_row_shape(_row(p, more)), packed)
    assert tile_more == pytest.approx(1.1 * own_selection_union(p, packed), rel=1e-9)


@pytest.mark.parametrize(
    ("ctx", "overlap"), [(16384, 0.7), (16384, 0.5), (65536, 0.7), (8192, 0.9)]
)
def test_given_overlap_union_matches_the_sweeps_selections(ctx, overlap):
    """The formula against ``kernel_inputs.overlap_block_idx``'s selections: exact within a
    span, and within 2% past it where later spans' fresh blocks land on blocks held."""
    p = _params(64, ctx=ctx, overlap=overlap)
    idx = ki.overlap_block_idx(
        [ctx // p["block_size"]] * 4, 64, p["top_n"], overlap, np.random.default_rng(0)
    )
    for rows in (4, 8, 16, 32, 64):
        measured = np.mean(
            [len(set(idx[b, h, :rows].ravel())) for b in range(4) for h in range(idx.shape[1])]
        )
        assert given_overlap_union(p, rows) == pytest.approx(
            measured, rel=0.02 if rows > 8 else 1e-9
        )


def test_given_overlap_rows_of_several_tiles_read_the_tile_union_off_the_construction():
    p = _params(64, overlap=0.7)
    packed = tile_packing(64, 4, 0, "fixed")[0]
    row = _row(p, given_overlap_union(p, 64))
    shape_union = tile_union_blocks(nsa_row_shape(row), packed)
    assert shape_union == pytest.approx(given_overlap_union(p, packed), rel=1e-9)


def test_rows_of_one_tile_or_given_overlap_keep_the_linear_reading():
    """Rows that fit one tile (own selection or a given overlap) and a row with a row schedule
    (its bytes already a union per tile) read gamma off the linear model over their tiles."""
    for p in (_params(16), _params(16, overlap=0.5), _params(64, rows_per_tile=8)):
        t = p["num_query_tokens"]
        step = p.get("rows_per_tile") or t
        tiles = [min(step, t - i) for i in range(0, t, step)]
        gamma = 0.4
        union = sum(p["top_n"] * (1 + (r - 1) * (1 - gamma)) for r in tiles)
        assert nsa_row_overlap(_row(p, union)) == pytest.approx(gamma, abs=1e-9)
