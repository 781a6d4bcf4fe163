"""The calibration design of a GPU's kernel sweep (``kernel_sweep --grid calibration``): the
axis-aligned lines the per-class fits need (``design_lines``), plus Latin-hypercube points
across head geometries.

- **Lines**: ``design_lines.LINES``, the full grid at Llama-3.1-8B attention, and lines at the
  shapes the fits and the campaigns need beyond it (``design_lines``' ``*_LINES``, and
  ``HEAD_DIM_LINES`` here, which are points at one geometry).
- **Points** (``POINTS``): per step, ``n`` points whose axes each take their levels equally
  often (``lattice_lhs``), head geometry (``GEOMETRIES``) one of the axes, so every level of
  every axis is measured at several values of the others, which the leave-one-out sets of
  ``ssvkit validate`` test on.

What each line covers and why: docs/results/calibration.md, "The calibration design".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.calibration import design_lines as dl
from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.design_lines import LINES, K
from ssvkit.calibration.kernel_grid import KernelConfig, sweep_configs

GEOMETRIES = ("llama-3.1-8b", "glm-4-9b", "qwen3-14b", "qwen3-30b-a3b", "16q-2kv-d64", "tiny")
GROUP_SIZES = LINES.group_sizes
TOKENS = (1, 2, 3, 4, 5, 7, 8, 11, 12, 16, 23, 32, 45, 64)
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DENSE_CONTEXTS = (4 * K, 8 * K, 16 * K, 24 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
CONTEXTS = DENSE_CONTEXTS[2:]
SELECT_CONTEXTS = (16 * K, 32 * K, 48 * K, 64 * K, 128 * K)
OVERLAPS = (0.5, 0.6, 0.7, 0.8, 0.9)
TOP_NS = (16, 32, 64)
FRACTION_PAIRS = ((0.05, 0.3), (0.1, 0.4), (0.2, 0.5))
# Every step at a head dimension above the points' (64 and 128): at Gemma-3-4B's 8 query / 4 KV
# heads of 256, per step a Latin hypercube over the step's own axes (``POINTS``), so that each
# attention and selection class has rows of tiles that wide.
HEAD_DIM_LINES = dict(
    geometry="8q-4kv-d256",
    points={"dense": 16, "sparse": 16, "repair": 8, "select": 12, "nsa": 8},
    seed=256,
)
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
    ``steps``; a config whose rows an earlier one already times is dropped."""
    configs = sweep_configs(LINES, steps, "llama-3.1-8b", seed)
    if "dense" in steps:
        configs += dl.wave_configs()
    extra = dl.engine_configs() + dl.schedule_configs() + dl.geometry_configs()
    extra += dl.planner_configs() + head_dim_configs() + dl.few_rows_configs()
    extra += dl.between_configs() + dl.score_rows_configs()
    extra += [cfg for step in steps for cfg in point_configs(step, seed)]
    seen = {_identity(c) for c in configs}
    for cfg in extra:
        if cfg.step in steps and _identity(cfg) not in seen:
            seen.add(_identity(cfg))
            configs.append(cfg)
    return configs


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


def _identity(cfg: KernelConfig) -> tuple:
    return (cfg.step, cfg.geometry, tuple(sorted(map(str, cfg.common.items()))))
