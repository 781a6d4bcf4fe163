"""A test design of kernel calls the calibration design never times (``kernel_sweep --grid
unseen``): head geometries outside it (one of them of a head dimension it has none of), and draft
rows, batches, contexts, top-n and overlaps between or beyond its levels, so that every call
differs from every fit row in its geometry and in most of its other parameters.

Its rows are not fit rows: they live under ``calibration/profiles/<gpu>/unseen/``, which the
profile's fit does not read, and ``ssvkit validate --sets unseen`` predicts them with the
committed profile, fitted on the calibration rows (``calibration.unseen_set``). The design is a
seeded Latin hypercube per step (``kernel_design.lattice_lhs``), as the calibration design's
points are, over the levels below.
"""

from __future__ import annotations

from ssvkit.calibration import kernel_design as kd
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_design import K, Points, lattice_lhs
from ssvkit.calibration.kernel_grid import KernelConfig

# Head geometries no calibration row has: GQA 8 at 64 query heads (Llama-3.1-70B, Qwen3-32B),
# GQA 7 (Qwen2.5-7B), GQA 3, GQA 6 at two KV heads, and a head dimension of 256 (Gemma-2-9B).
GEOMETRIES = ("llama-3.1-70b", "28q-4kv-d128", "24q-8kv-d128", "12q-2kv-d128", "16q-8kv-d256")
TOKENS = (6, 10, 14, 20, 27, 40)
BATCHES = (5, 10, 20, 40)
CONTEXTS = (20 * K, 40 * K, 56 * K, 80 * K, 112 * K)
TOP_NS = (24, 48)
OVERLAPS = (0.55, 0.65, 0.75, 0.85)
GROUP_SIZES = (3, 5, 6, 7)
FRACTION_PAIRS = ((0.15, 0.35),)
POINTS = {
    "dense": Points(16, dict(t=TOKENS, batch=(1, *BATCHES), ctx=CONTEXTS)),
    "sparse": Points(
        16,
        dict(
            t=TOKENS[1:],
            batch=(1, *BATCHES),
            ctx=CONTEXTS,
            top_n=TOP_NS,
            overlap=OVERLAPS,
            group=GROUP_SIZES,
        ),
    ),
    "repair": Points(8, dict(t=TOKENS, batch=(1, *BATCHES), ctx=CONTEXTS, top_n=TOP_NS)),
    "select": Points(8, dict(t=TOKENS, batch=(1, *BATCHES), ctx=CONTEXTS, top_n=TOP_NS)),
    "nsa": Points(8, dict(t=(1, 6, 10, 20, 40), batch=(1, 5, 10), ctx=CONTEXTS)),
}
STEPS = tuple(POINTS)
SEED = 7919  # apart from the calibration design's seeds


def unseen_configs(steps: tuple[str, ...] = STEPS, seed: int = 0) -> list[KernelConfig]:
    """The configs of ``steps`` (those of ``POINTS``; other steps have none), in step order;
    a point whose KV cache would pass ``kernel_design.MAX_CACHE_TOKENS`` is dropped
    (``kernel_design.fits``)."""
    out = []
    for step in steps:
        if step not in POINTS:
            continue
        axes = kd.point_axes(step, GEOMETRIES, POINTS[step].axes, FRACTION_PAIRS)
        for pt in lattice_lhs(axes, POINTS[step].n, SEED + seed + kd.STEPS_SEED[step]):
            g, t, b, ctx = pt["geometry"], pt["t"], pt["batch"], pt["ctx"]
            if not kd.fits(g, b, ctx):
                continue
            with ki.geometry(g):
                out.append(kd.point_config(step, pt, t, b, ctx))
    return out
