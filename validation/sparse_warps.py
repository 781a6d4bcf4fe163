"""Warps per program of grouped sparse verification: 4 against 8, by packed rows and head dim.

    python -m ssvkit.validation.sparse_warps --geometries GEOMETRY \
        --out validation/data/sparse-warps-GPU-GEOMETRY.json

A ``sparse_verify`` program packs ``C x G`` query-head rows (``M_PAD`` padded) over K/V tiles of
head dimension ``D``; its fp32 accumulator holds ``M_PAD x D`` elements, 32 registers a thread
of 4 warps at 32 x 128 and 64 at 64 x 128. ``perfmodel.sparse_plan.sparse_tile_shape``
gives a program 4 warps up to ``FOUR_WARP_ACC_ELEMS`` accumulator elements and
``FOUR_WARP_MAX_ROWS`` rows, else 8 (the ``default`` column); this benchmark times both
counts at each geometry's group sizes, so the rule is chosen from measurements at every
accumulator size. Each geometry's inputs are checked
against the fp32 reference at both counts first, on ragged inputs (a mismatch or NaN stops the
run, exit status 2); then each variant is timed by CUDA-graph replay, the two counts
interleaved (``kernels.timing.bench_graphs``, L2 flushed per sample, input sets rotated past
the L2, median). ``floor_s``: the distinct K/V blocks the call reads over each (sequence, KV
head), queries and outputs, over the copy bandwidth measured in the same run. Needs a GPU.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import sparse_verify as sv
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.sparse_plan import SparseVerifyConfig, sparse_tile_shape
from ssvkit.validation.bench_documents import time_geometries
from ssvkit.validation.sparse_tiles import distinct_blocks

K = 1024
WARPS = (4, 8)
GEOMETRIES = ("tiny", "16q-2kv-d64", "llama-3.1-8b", "llama-3.1-70b", "glm-4-9b")
# (batch, context): a working set beyond L2, and the engine's batch-1 verify step.
POINTS = ((8, 32 * K), (1, 128 * K))
GROUPS = (1, 2, 3, 4, 5, 6, 8)
TIMING = tm.TimingConfig(warmup=3, graph_launches=8, graph_reps=10, max_total_s=0.5)


def variants() -> list[tuple[str, int]]:
    return [("union", c) for c in GROUPS] + [("shared", c) for c in GROUPS if c > 1]


def point_inputs(batch: int, ctx: int, args) -> tuple[list[tuple], np.ndarray]:
    """Rotation sets of the current geometry at ``batch`` x ``ctx`` (t draft rows of a binary
    tree, ``top_n`` blocks of 64 a row at exact adjacent-row overlap), enough of them that a
    graph's calls read no K/V another left in L2 (``kernels.timing.num_rotations``), and the
    selections."""
    rng = np.random.default_rng([args.seed, batch, ctx])
    idx = ki.overlap_block_idx([ctx // 64] * batch, args.t, args.top_n, args.overlap, rng)
    gen = ki.generator(args.seed + batch + ctx)
    idx_t = torch.from_numpy(idx).cuda()
    shape = (batch, args.t, ctx + args.t, [ctx] * batch, gen)
    count = tm.num_rotations(distinct_blocks(idx, 1) * ki.kv_bytes(64))
    return [(*ki.attention_inputs(*shape), idx_t) for _ in range(count)], idx


def call(sets, i: int, mode: str, c: int, warps: int):
    cfg = SparseVerifyConfig(num_warps=warps)
    return sv.sparse_verify(*sets[i], mode=mode, group_size=c, validate=False, config=cfg)


def check(args) -> None:
    """Every variant at both warp counts against the fp32 reference on ragged inputs of the
    current geometry (two sequences of 4100 and 1000 tokens, 8 blocks a row at adjacent-row
    overlap 0.7; raises ``CorrectnessError``)."""
    lens = [4100, 1000]
    rng = np.random.default_rng(args.seed)
    idx = ki.overlap_block_idx([n // 64 for n in lens], args.t, 8, 0.7, rng)
    gen = ki.generator(args.seed)
    sets = [(*ki.attention_inputs(2, args.t, 4200, lens, gen), torch.from_numpy(idx).cuda())]
    for mode, c in variants():
        ref_o, ref_lse = sv.reference_sparse_verify(*sets[0], mode=mode, group_size=c)
        for warps in WARPS:
            with tm.poisoned_allocations():
                o, lse = call(sets, 0, mode, c, warps)
            name = f"sparse_verify {ki.current_geometry()} {mode} C={c} {warps} warps"
            checks.check(name, o, ref_o, "o")
            checks.check(name, lse, ref_lse, "lse")


def floor_s(idx: np.ndarray, mode: str, c: int, q: torch.Tensor, copy_bps: float) -> float:
    """The call's byte floor: the distinct K/V blocks each (sequence, KV head) reads (for
    ``shared``, its groups' first rows'), queries and outputs, at the copy bandwidth."""
    blocks = distinct_blocks(idx, c if mode == "shared" else 1)
    return (blocks * 64 * q.shape[3] * 4 + 2 * q.numel() * q.element_size()) / copy_bps


def time_geometry(geometry: str, args, copy_bps: float) -> list[dict]:
    rows = []
    ki.use_geometry(geometry)
    check(args)
    for batch, ctx in POINTS:
        sets, idx = point_inputs(batch, ctx, args)
        for mode, c in variants():
            m_pad, default, _ = sparse_tile_shape(
                SparseVerifyConfig(), c, ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, 64, ki.HEAD_DIM
            )
            fns = [lambda i, s=sets, w=w, m=mode, c=c: call(s, i, m, c, w) for w in WARPS]
            t4, t8 = tm.bench_graphs(fns, num_inputs=len(sets), config=TIMING)
            rows.append(
                dict(
                    geometry=geometry,
                    num_q_heads=ki.NUM_Q_HEADS,
                    num_kv_heads=ki.NUM_KV_HEADS,
                    head_dim=ki.HEAD_DIM,
                    batch=batch,
                    context_len=ctx,
                    num_query_tokens=args.t,
                    top_n=args.top_n,
                    overlap=args.overlap,
                    mode=mode,
                    group_size=c,
                    m_pad=m_pad,
                    default_warps=default,
                    warps_4_s=t4.median_s,
                    warps_8_s=t8.median_s,
                    floor_s=floor_s(idx, mode, c, sets[0][0], copy_bps),
                )
            )
        print(f"timed {geometry} batch {batch} context {ctx}", file=sys.stderr, flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    """4 warps' time over 8 warps', per accumulator size (M_PAD x D) and batch: median and
    range, the default's warps, and the faster count's time over the byte floor (range)."""
    out = ["| M_PAD x D | batch | calls | 4 / 8 warps median | range | default | faster x floor |"]
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    keys = sorted({(r["m_pad"], r["head_dim"], r["batch"]) for r in rows})
    for m_pad, d, batch in keys:
        sel = [r for r in rows if (r["m_pad"], r["head_dim"], r["batch"]) == (m_pad, d, batch)]
        x = np.array([r["warps_4_s"] / r["warps_8_s"] for r in sel])
        warps = sorted({r["default_warps"] for r in sel})
        best = np.array([min(r["warps_4_s"], r["warps_8_s"]) / r["floor_s"] for r in sel])
        out.append(
            f"| {m_pad} x {d} | {batch} | {len(sel)} | {np.median(x):.2f} | "
            f"{x.min():.2f}-{x.max():.2f} | {'/'.join(map(str, warps))} | "
            f"{best.min():.2f}-{best.max():.2f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m ssvkit.validation.sparse_warps", description=__doc__)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--geometries", nargs="+", default=list(GEOMETRIES), choices=ki.GEOMETRIES)
    p.add_argument("--t", type=int, default=16, help="draft rows")
    p.add_argument("--top-n", type=int, default=32)
    p.add_argument("--overlap", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.t <= 64:
        p.error(f"--t must be in 1..64, got {args.t}")
    if not 1 <= args.top_n <= min(ctx for _, ctx in POINTS) // (2 * 64):
        p.error(f"--top-n must be in 1..{min(ctx for _, ctx in POINTS) // 128}, got {args.top_n}")
    if not 0.0 <= args.overlap <= 1.0:
        p.error(f"--overlap must be in [0, 1], got {args.overlap}")
    return time_geometries(
        p, args, "sparse_warps", lambda g, copy_bps: time_geometry(g, args, copy_bps), table, TIMING
    )


if __name__ == "__main__":
    raise SystemExit(main())
