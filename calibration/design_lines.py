"""The calibration design's lines: axis-aligned sets of configs at the shapes the per-class fits
and the campaigns need (``kernel_design`` adds its Latin-hypercube points to them).

``LINES`` is the full grid at Llama-3.1-8B attention (``FULL_SWEEP``) with every group size 1-8
and without torch SDPA, keyed as the committed rows are, so a GPU's committed rows are not
measured again; each other ``*_LINES`` covers one regime the grid and the points leave out, and
its ``*_configs`` function builds its configs. What each covers and why:
docs/results/calibration.md, "The calibration design".
"""

from __future__ import annotations

import dataclasses

from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import FULL_SWEEP, KernelConfig

K = 1024
LINES = dataclasses.replace(FULL_SWEEP, sdpa=False, group_sizes=tuple(range(1, 9)))
ENGINE_LINES = dict(
    cells={
        "llama-3.1-8b": (
            (32 * K, (1, 4, 16, 25)),
            (64 * K, (1, 4, 12, 16)),
            (128 * K, (1, 4, 6, 16)),
        ),
        "glm-4-9b": ((32 * K, (1, 4, 16, 78)), (64 * K, (1, 4, 16, 39)), (128 * K, (1, 4, 16, 19))),
    },
    schedules=((1, 0), (9, 0), (17, 0), (33, 0), (17, 1), (17, 4)),  # (t, rows_per_tile)
)
# NSA's row schedules at a second geometry where unions of four are not the packed tiles (GQA 8,
# D = 128: eight draft rows fill a packed tile), so that leaving Llama-3.1-8B's geometry out
# still leaves the schedules rows to fit (the leave-one-head-geometry-out set).
SCHEDULE_LINES = dict(
    geometry="qwen3-30b-a3b",
    cells=((32 * K, (1, 4, 16)), (128 * K, (1, 4, 16))),
    schedules=((9, 4), (17, 1), (17, 4), (33, 4)),  # (t, rows_per_tile)
)
# Block selection and sparse verification at two more head geometries each (the lines' are at
# Llama-3.1-8B's), for the leave-one-head-geometry-out set.
SELECT_LINES = dict(
    geometries=("glm-4-9b", "16q-2kv-d64"),
    contexts=(16 * K, 64 * K, 128 * K),
    batches=(1, 4, 16),
    top_ns=(16, 64),
    t=16,
)
SPARSE_LINES = dict(
    geometries=("glm-4-9b", "qwen3-30b-a3b"),
    contexts=(32 * K, 128 * K),
    batches=(1, 16),
    top_ns=(16, 64),
    overlap=0.7,
    group_sizes=(1, 2, 4, 8),
    t=16,
)
# Block selection and sparse verification at one to three draft rows (decoding without a draft,
# short chains), where a call's few lists split many ways: the points' sparse rows start at four
# draft rows and the other lines are at 16. Two head geometries, so that leaving one out leaves
# rows of the regime to fit; group sizes 2 and 3 where the rows allow them.
FEW_ROWS_LINES = dict(
    geometries=("llama-3.1-8b", "qwen3-30b-a3b"),
    t=(1, 2, 3),
    contexts=(32 * K, 128 * K),
    batches=(1, 16),
    top_ns=(16, 64),
    overlap=0.7,
    select_t=(1, 3),
)
# Block selection at contexts between the powers of two (none held out): a score row of
# ``NB`` blocks is picked as a power-of-two chunk and a tail of up to as many blocks
# (``kernels.top_blocks``), and the other lines' contexts are powers of two whose rows end
# one block past the chunk, so their tails are the shortest. Two head geometries, both metadata
# kinds, one and two launches.
BETWEEN_LINES = dict(
    top_ns={"llama-3.1-8b": (16, 64), "glm-4-9b": (16,)},
    contexts=(24 * K, 40 * K, 80 * K, 112 * K),
    batches=(1, 16),
    t=16,
)
# Block selection past 16 query rows, where the score tile holds 32 and 64 query rows (64 over
# four warps in 16-block tiles, and 16-block tiles wherever the query is 256 fp32 columns wide;
# ``perfmodel.select_work.score_tile``), at batch 1 and at batches whose score programs fill
# the GPU: the other lines time such rows at a few points only, too few to tell how a tile's
# cost grows with its query rows in either regime. Three head dimensions, both metadata kinds,
# one and two launches. The full grid at 64K; a coarser one (``other_t``, ``other_batches``) at
# a shorter and a longer context, so that rows past 32 query rows are not all of one context
# and leaving a context out tests the context, not the query rows.
SCORE_ROWS_LINES = dict(
    geometries=("llama-3.1-8b", "16q-2kv-d64", "8q-4kv-d256"),
    t=(20, 24, 32, 40, 48, 64),
    batches=(1, 4, 16),
    context=64 * K,
    other_contexts=(16 * K, 128 * K),
    other_t=(24, 40, 64),
    other_batches=(1, 16),
    top_n=16,
)
# The planner evaluation at batch 32 on the trained tiny pair (its regimes' contexts, 15,360 and
# 30,720 tokens): NSA at the target's attention for its chains and trees (1, 9 and 17 rows, top
# 16 and 32 blocks), dense verification at the target's (1-33 rows) and at the draft model's (the
# rows of its level forwards, 1-9).
PLANNER_LINES = dict(
    contexts=(15 * K, 30 * K),
    batch=32,
    nsa=dict(geometry="tiny", t=(1, 9, 17), top_ns=(16, 32)),
    dense={"tiny": (1, 9, 17, 33), "tiny-draft": (1, 2, 3, 5, 9)},
)
WAVE_LINES = dict(batch=(16, 17, 20, 24, 30), t=(16, 17, 32), ctx=(32 * K, 64 * K))


def wave_configs() -> list[KernelConfig]:
    """The dense configs of ``WAVE_LINES`` that the lines do not time already."""
    w = WAVE_LINES
    lines = {
        (b, t, ctx)
        for b in LINES.dense_batches
        for t in LINES.dense_tokens
        for ctx in LINES.dense_contexts
    }
    with ki.geometry("llama-3.1-8b"):
        return [
            kg.dense_config(ctx, t, b, sdpa=False)
            for b in w["batch"]
            for ctx in w["ctx"]
            for t in w["t"]
            if (b, t, ctx) not in lines
        ]


def engine_configs() -> list[KernelConfig]:
    """The NSA configs of ``ENGINE_LINES``: refresh and reuse, fused and unfused, on the
    refresh path's own indices; a schedule that runs the packed tiles is timed as packed."""
    out = []
    for geometry, cells in ENGINE_LINES["cells"].items():
        with ki.geometry(geometry):
            for ctx, batches in cells:
                for b in batches:
                    for t, rows in ENGINE_LINES["schedules"]:
                        rows = 0 if rows and kg.nsa_tiles_packed(t, rows) else rows
                        out.append(kg.nsa_config(ctx, t, b, None, rows))
    return out


def schedule_configs() -> list[KernelConfig]:
    """The NSA configs of ``SCHEDULE_LINES``: each row schedule's refresh and reuse, fused and
    unfused, on the refresh path's own indices."""
    sl = SCHEDULE_LINES
    with ki.geometry(sl["geometry"]):
        return [
            kg.nsa_config(ctx, t, b, None, rows)
            for ctx, batches in sl["cells"]
            for b in batches
            for t, rows in sl["schedules"]
            if not kg.nsa_tiles_packed(t, rows)
        ]


def geometry_configs() -> list[KernelConfig]:
    """The select_blocks configs of ``SELECT_LINES`` (each metadata kind in one and two
    launches) and the sparse_verify configs of ``SPARSE_LINES``."""
    sl, sp = SELECT_LINES, SPARSE_LINES
    out = []
    for geometry in sl["geometries"]:
        with ki.geometry(geometry):
            out += [
                kg.select_config(ctx, sl["t"], b, top_n, method)
                for ctx in sl["contexts"]
                for b in sl["batches"]
                for top_n in sl["top_ns"]
                for method in ("mean", "quest")
            ]
    variants = kg.sparse_variants(sp["group_sizes"])
    for geometry in sp["geometries"]:
        with ki.geometry(geometry):
            out += [
                kg.sparse_config(ctx, sp["t"], b, top_n, sp["overlap"], variants)
                for ctx in sp["contexts"]
                for b in sp["batches"]
                for top_n in sp["top_ns"]
            ]
    return out


def few_rows_configs() -> list[KernelConfig]:
    """The configs of ``FEW_ROWS_LINES``: select_blocks (each metadata kind, one and two
    launches, top_n 16) and sparse_verify (``per_query``, and ``union`` and ``shared`` at each
    group size from 2 to t) per geometry, context and batch."""
    fl = FEW_ROWS_LINES
    out = []
    for geometry in fl["geometries"]:
        with ki.geometry(geometry):
            for ctx in fl["contexts"]:
                for b in fl["batches"]:
                    out += [
                        kg.select_config(ctx, t, b, 16, method)
                        for t in fl["select_t"]
                        for method in ("mean", "quest")
                    ]
                    for t in fl["t"]:
                        variants = kg.sparse_variants(tuple(range(2, t + 1)))
                        out += [
                            kg.sparse_config(ctx, t, b, top_n, fl["overlap"], variants)
                            for top_n in fl["top_ns"]
                        ]
    return out


def between_configs() -> list[KernelConfig]:
    """The select_blocks configs of ``BETWEEN_LINES`` (each metadata kind, one and two
    launches) per geometry, context, batch and top_n."""
    bl = BETWEEN_LINES
    out = []
    for geometry, top_ns in bl["top_ns"].items():
        with ki.geometry(geometry):
            out += [
                kg.select_config(ctx, bl["t"], b, top_n, method)
                for ctx in bl["contexts"]
                for b in bl["batches"]
                for top_n in top_ns
                for method in ("mean", "quest")
            ]
    return out


def score_rows_configs() -> list[KernelConfig]:
    """The select_blocks configs of ``SCORE_ROWS_LINES`` (each metadata kind, one and two
    launches) per geometry, context, query rows and batch."""
    sl = SCORE_ROWS_LINES
    grids = [(sl["context"], sl["t"], sl["batches"])]
    grids += [(ctx, sl["other_t"], sl["other_batches"]) for ctx in sl["other_contexts"]]
    out = []
    for geometry in sl["geometries"]:
        with ki.geometry(geometry):
            out += [
                kg.select_config(ctx, t, b, sl["top_n"], method)
                for ctx, ts, batches in grids
                for t in ts
                for b in batches
                for method in ("mean", "quest")
            ]
    return out


def planner_configs() -> list[KernelConfig]:
    """The configs of ``PLANNER_LINES``: NSA (packed rows) and dense verification."""
    pl = PLANNER_LINES
    out = []
    with ki.geometry(pl["nsa"]["geometry"]):
        for ctx in pl["contexts"]:
            for t in pl["nsa"]["t"]:
                out += [kg.nsa_config(ctx, t, pl["batch"], None, 0, n) for n in pl["nsa"]["top_ns"]]
    for geometry, ts in pl["dense"].items():
        with ki.geometry(geometry):
            for ctx in pl["contexts"]:
                out += [kg.dense_config(ctx, t, pl["batch"], sdpa=False) for t in ts]
    return out
