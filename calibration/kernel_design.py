"""The calibration design of a GPU's kernel sweep (``kernel_sweep --grid calibration``): the
axis-aligned lines the per-class fits need, plus Latin-hypercube points across head geometries.

- **Lines**: ``LINES``, the full grid at Llama-3.1-8B attention (``FULL_SWEEP``) with every
  group size 1-8 and without torch SDPA, keyed as the committed rows are, so a GPU's committed
  rows are not measured again; and lines at the shapes the fits and the campaigns need beyond
  it (``WAVE_LINES``, ``ENGINE_LINES``, ``SCHEDULE_LINES``, ``SELECT_LINES``, ``SPARSE_LINES``,
  ``FEW_ROWS_LINES``, ``BETWEEN_LINES``, ``SCORE_ROWS_LINES``, ``PLANNER_LINES``).
- **Points** (``POINTS``): per step, ``n`` points whose axes each take their levels equally
  often (``lattice_lhs``), head geometry (``GEOMETRIES``) one of the axes, so every level of
  every axis is measured at several values of the others, which the leave-one-out sets of
  ``ssvkit validate`` test on.

What each line covers and why: docs/results/calibration.md, "The calibration design".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import FULL_SWEEP, KernelConfig, sweep_configs

K = 1024
GEOMETRIES = ("llama-3.1-8b", "glm-4-9b", "qwen3-14b", "qwen3-30b-a3b", "16q-2kv-d64", "tiny")
GROUP_SIZES = tuple(range(1, 9))
LINES = dataclasses.replace(FULL_SWEEP, sdpa=False, group_sizes=GROUP_SIZES)
TOKENS = (1, 2, 3, 4, 5, 7, 8, 11, 12, 16, 23, 32, 45, 64)
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DENSE_CONTEXTS = (4 * K, 8 * K, 16 * K, 24 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
CONTEXTS = DENSE_CONTEXTS[2:]
SELECT_CONTEXTS = (16 * K, 32 * K, 48 * K, 64 * K, 128 * K)
OVERLAPS = (0.5, 0.6, 0.7, 0.8, 0.9)
TOP_NS = (16, 32, 64)
FRACTION_PAIRS = ((0.05, 0.3), (0.1, 0.4), (0.2, 0.5))
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
# one and two launches.
SCORE_ROWS_LINES = dict(
    geometries=("llama-3.1-8b", "16q-2kv-d64", "8q-4kv-d256"),
    t=(20, 24, 32, 40, 48, 64),
    batches=(1, 4, 16),
    context=64 * K,
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
# Every step at a head dimension above the points' (64 and 128): at Gemma-3-4B's 8 query / 4 KV
# heads of 256, per step a Latin hypercube over the step's own axes (``POINTS``), so that each
# attention and selection class has rows of tiles that wide.
HEAD_DIM_LINES = dict(
    geometry="8q-4kv-d256",
    points={"dense": 16, "sparse": 16, "repair": 8, "select": 12, "nsa": 8},
    seed=256,
)
WAVE_LINES = dict(batch=(16, 17, 20, 24, 30), t=(16, 17, 32), ctx=(32 * K, 64 * K))
# The largest KV cache (tokens x KV heads) a point may allocate: 64 sequences of 128K at 8 KV
# heads, 34 GB of bf16 K and V at d = 128.
MAX_CACHE_TOKENS = 64 * 128 * K * 8


@dataclass(frozen=True, slots=True)
class Points:
    """How many Latin-hypercube points each step gets, and its axes' levels."""

    n: int
    axes: dict


POINTS = {
    "dense": Points(72, dict(t=TOKENS, batch=BATCHES, ctx=DENSE_CONTEXTS)),
    "sparse": Points(
        96,
        dict(
            t=TOKENS[3:],
            batch=BATCHES,
            ctx=CONTEXTS,
            top_n=TOP_NS,
            overlap=OVERLAPS,
            group=GROUP_SIZES,
        ),
    ),
    "repair": Points(24, dict(t=TOKENS, batch=BATCHES, ctx=CONTEXTS, top_n=TOP_NS)),
    "select": Points(24, dict(t=TOKENS, batch=BATCHES, ctx=SELECT_CONTEXTS, top_n=TOP_NS[::2])),
    "nsa": Points(18, dict(t=(1, 2, 4, 8, 16, 32, 64), batch=BATCHES[:9], ctx=CONTEXTS)),
    "nsa_tiles": Points(
        12, dict(t=(2, 4, 8, 16, 32, 64), batch=BATCHES[:9], ctx=CONTEXTS, rows=kg.NSA_TILE_ROWS)
    ),
}


def lattice_lhs(axes: dict[str, tuple], n: int, seed: int) -> list[dict]:
    """``n`` points: on each axis, slot ``j`` of ``n`` takes level ``floor(j L / n)`` of its
    ``L`` levels (each level about ``n / L`` times), and the slots are permuted per axis by
    one seeded generator, axes in the order given."""
    rng = np.random.default_rng(seed)
    cols = {}
    for name, levels in axes.items():
        slots = [levels[j * len(levels) // n] for j in range(n)]
        cols[name] = [slots[i] for i in rng.permutation(n)]
    return [{name: cols[name][i] for name in axes} for i in range(n)]


def fits(geometry: str, batch: int, ctx: int) -> bool:
    """Whether a point's KV cache stays within ``MAX_CACHE_TOKENS``."""
    return batch * ki.GEOMETRIES[geometry][1] * ctx <= MAX_CACHE_TOKENS


def point_axes(step: str, geometries: tuple, axes: dict, fraction_pairs: tuple) -> dict:
    """The Latin-hypercube axes of ``step``: head geometry, the step's ``axes``, and the
    step's own (repair's missed-fraction pairs, selection's metadata kind, NSA's overlap)."""
    out = {"geometry": geometries, **axes}
    if step == "repair":
        out["fractions"] = fraction_pairs
    if step in ("select", "nsa", "nsa_tiles"):
        out["variant"] = ("mean", "quest") if step == "select" else (None, kg.NSA_REUSE_OVERLAP)
    return out


def point_configs(step: str, seed: int = 0) -> list[KernelConfig]:
    """The Latin-hypercube configs of ``step`` (``POINTS``), geometry an axis of its own."""
    spec = POINTS[step]
    axes = point_axes(step, GEOMETRIES, spec.axes, FRACTION_PAIRS)
    out = []
    for pt in lattice_lhs(axes, spec.n, seed + STEPS_SEED[step]):
        g, t, b, ctx = pt["geometry"], pt["t"], pt["batch"], pt["ctx"]
        if not fits(g, b, ctx):
            continue
        with ki.geometry(g):
            if step == "nsa_tiles" and kg.nsa_tiles_packed(t, pt["rows"]):
                continue  # the packed tiles: the nsa step's rows
            out.append(point_config(step, pt, t, b, ctx))
    return out


STEPS_SEED = {step: i for i, step in enumerate(kg.STEPS)}


def point_config(step: str, pt: dict, t: int, b: int, ctx: int) -> KernelConfig:
    """The config of one Latin-hypercube point ``pt`` of ``step`` at the geometry in use."""
    if step == "dense":
        return kg.dense_config(ctx, t, b, sdpa=False)
    if step == "sparse":
        c = min(pt["group"], t)
        variants = [("per_query", 1), ("union", c)] + ([("shared", c)] if c > 1 else [])
        return kg.sparse_config(ctx, t, b, pt["top_n"], pt["overlap"], variants)
    if step == "repair":
        return kg.repair_config(ctx, t, b, pt["top_n"], pt["fractions"])
    if step == "select":
        return kg.select_config(ctx, t, b, pt["top_n"], pt["variant"])
    return kg.nsa_config(ctx, t, b, pt["variant"], pt.get("rows", 0))


def design_configs(steps: tuple[str, ...] = kg.STEPS, seed: int = 0) -> list[KernelConfig]:
    """The lines (with the wave lines when dense verification is a step), then the points, of
    ``steps``; a point whose rows the lines already time is dropped."""
    configs = sweep_configs(LINES, steps, "llama-3.1-8b", seed)
    if "dense" in steps:
        configs += wave_configs()
    extra = engine_configs() + schedule_configs() + geometry_configs() + planner_configs()
    extra += head_dim_configs() + few_rows_configs() + between_configs() + score_rows_configs()
    configs += [c for c in extra if c.step in steps]
    seen = {_identity(c) for c in configs}
    for step in steps:
        for cfg in point_configs(step, seed):
            if _identity(cfg) not in seen:
                seen.add(_identity(cfg))
                configs.append(cfg)
    return configs


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
    launches) per geometry, query rows and batch."""
    sl = SCORE_ROWS_LINES
    out = []
    for geometry in sl["geometries"]:
        with ki.geometry(geometry):
            out += [
                kg.select_config(sl["context"], t, b, sl["top_n"], method)
                for t in sl["t"]
                for b in sl["batches"]
                for method in ("mean", "quest")
            ]
    return out


def head_dim_configs() -> list[KernelConfig]:
    """The configs of ``HEAD_DIM_LINES``: per step, its Latin-hypercube points over the step's
    own axes at the lines' geometry, those within the cache limit."""
    hl = HEAD_DIM_LINES
    g = hl["geometry"]
    out = []
    for step, n in hl["points"].items():
        axes = point_axes(step, (g,), POINTS[step].axes, FRACTION_PAIRS)
        with ki.geometry(g):
            for pt in lattice_lhs(axes, n, hl["seed"] + STEPS_SEED[step]):
                if fits(g, pt["batch"], pt["ctx"]):
                    out.append(point_config(step, pt, pt["t"], pt["batch"], pt["ctx"]))
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


def _identity(cfg: KernelConfig) -> tuple:
    return (cfg.step, cfg.geometry, tuple(sorted(map(str, cfg.common.items()))))
