"""Dense verification's row tile at 17-32 packed rows: the 64-row ``wgmma`` tile against the
32-row ``mma.sync`` one, by head geometry, batch and context.

    python -m ssvkit.validation.dense_row_tile --out validation/data/dense-row-tile-GPU.json

``perfmodel.attention_plan.dense_row_tiles`` runs a KV head's ``t x G`` packed rows in a tile
of at least ``WGMMA_MIN_ROWS`` rows from ``DenseVerifyConfig.warpgroup_rows_from`` rows on (17
by default, at head dims up to 128); with it at 33, 17-32 rows take a 32-row tile. This
benchmark times both rules on every draft width whose packed rows fall in 17-32 at each
geometry, and on one width past 32 rows, where both rules build the same tile (a control: its
ratio is the measurement's noise). Each width's calls are checked against the fp32 reference
under both rules first, on ragged inputs (a mismatch or NaN stops the run, exit status 2); then
the two rules are timed by CUDA-graph replay, interleaved (``kernels.timing.bench_graphs``, L2
flushed per sample, input sets rotated past the L2, median). ``floor_s``: the prefixes' K/V,
the draft tail's, the queries and the outputs over the copy bandwidth measured in the same
run. Needs a GPU.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import dense_verify as dv
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.attention_plan import DenseVerifyConfig, dense_row_tiles
from ssvkit.validation.bench_documents import time_geometries

K = 1024
GEOMETRIES = ("llama-3.1-8b", "tiny", "16q-2kv-d64", "glm-4-9b", "qwen3-14b")
# (batch, context): the engine's batch-1 verify step at two contexts, and a batched one.
POINTS = ((1, 32 * K), (1, 128 * K), (16, 32 * K))
RULES = {"wgmma": DenseVerifyConfig(), "mma_sync": DenseVerifyConfig(warpgroup_rows_from=33)}
TIMING = tm.TimingConfig(warmup=3, graph_launches=8, graph_reps=10, max_total_s=0.5)


def widths(group: int) -> list[int]:
    """Draft widths whose ``t x group`` packed rows fall in 17-32, then the first past 32."""
    inside = [t for t in range(1, 65) if 17 <= t * group <= 32]
    return inside + [next(t for t in range(1, 65) if t * group > 32)]


def call(sets, i: int, rule: str):
    return dv.dense_verify(*sets[i], validate=False, config=RULES[rule])


def check(t: int, seed: int) -> None:
    """Both rules at ``t`` draft rows against the fp32 reference on ragged inputs of the
    current geometry (two sequences of 4100 and 1000 tokens; raises ``CorrectnessError``)."""
    lens = [4100, 1000]
    sets = [ki.attention_inputs(2, t, 4100 + t, lens, ki.generator(seed + t))]
    ref_o, ref_lse = dv.reference_dense_verify(*sets[0])
    for rule in RULES:
        with tm.poisoned_allocations():
            o, lse = call(sets, 0, rule)
        name = f"dense_verify {ki.current_geometry()} t={t} {rule}"
        checks.check(name, o, ref_o, "o")
        checks.check(name, lse, ref_lse, "lse")


def floor_s(batch: int, ctx: int, t: int, copy_bps: float) -> float:
    """The call's byte floor: every sequence's prefix and draft tail K/V per KV head, the
    queries and the outputs (bf16), at the copy bandwidth."""
    kv = batch * ki.NUM_KV_HEADS * (ctx + t) * 2 * ki.HEAD_DIM * ki.ELEM_BYTES
    q_o = 2 * batch * t * ki.NUM_Q_HEADS * ki.HEAD_DIM * ki.ELEM_BYTES
    return (kv + q_o) / copy_bps


def time_geometry(geometry: str, seed: int, copy_bps: float) -> list[dict]:
    rows = []
    ki.use_geometry(geometry)
    group = ki.NUM_Q_HEADS // ki.NUM_KV_HEADS
    for t in widths(group):
        check(t, seed)
    for batch, ctx in POINTS:
        count = tm.num_rotations(batch * ki.NUM_KV_HEADS * ki.kv_bytes(ctx))
        for t in widths(group):
            gen = ki.generator(seed + batch + ctx + t)
            shape = (batch, t, ctx + t, [ctx] * batch, gen)
            sets = [ki.attention_inputs(*shape) for _ in range(count)]
            fns = [lambda i, s=sets, r=rule: call(s, i, r) for rule in RULES]
            timings = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
            tiles = {
                rule: dense_row_tiles(t, ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, ki.HEAD_DIM, cfg)[0]
                for rule, cfg in RULES.items()
            }
            rows.append(
                dict(
                    geometry=geometry,
                    num_q_heads=ki.NUM_Q_HEADS,
                    num_kv_heads=ki.NUM_KV_HEADS,
                    head_dim=ki.HEAD_DIM,
                    batch=batch,
                    context_len=ctx,
                    num_query_tokens=t,
                    packed_rows=t * group,
                    **{f"block_m_{rule}": tiles[rule] for rule in RULES},
                    **{f"{rule}_s": m.median_s for rule, m in zip(RULES, timings, strict=True)},
                    floor_s=floor_s(batch, ctx, t, copy_bps),
                )
            )
            del sets
            torch.cuda.empty_cache()
        print(f"timed {geometry} batch {batch} context {ctx}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """The 64-row tile's time over the 32-row tile's, per geometry and batch (median and
    range over widths and contexts), apart for the controls (both rules one tile), and each
    rule's time over the byte floor (range)."""
    out = ["| geometry | batch | packed rows | calls | wgmma / mma.sync | range | x floor |"]
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    keys = sorted({(r["geometry"], r["batch"], r["packed_rows"] > 32) for r in rows})
    for geometry, batch, control in keys:
        sel = [
            r
            for r in rows
            if (r["geometry"], r["batch"], r["packed_rows"] > 32) == (geometry, batch, control)
        ]
        x = np.array([r["wgmma_s"] / r["mma_sync_s"] for r in sel])
        fl = np.array([r["wgmma_s"] / r["floor_s"] for r in sel])
        span = "/".join(str(n) for n in sorted({r["packed_rows"] for r in sel}))
        out.append(
            f"| {geometry} | {batch} | {span}{' (control)' if control else ''} | {len(sel)} | "
            f"{np.median(x):.3f} | {x.min():.3f}-{x.max():.3f} | {fl.min():.2f}-{fl.max():.2f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m ssvkit.validation.dense_row_tile", description=__doc__)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--geometries", nargs="+", default=list(GEOMETRIES), choices=ki.GEOMETRIES)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rules = {rule: cfg.warpgroup_rows_from for rule, cfg in RULES.items()}
    return time_geometries(
        p,
        args,
        "dense_row_tile",
        lambda g, copy_bps: time_geometry(g, args.seed, copy_bps),
        table,
        TIMING,
        warpgroup_rows_from=rules,
    )


if __name__ == "__main__":
    raise SystemExit(main())
