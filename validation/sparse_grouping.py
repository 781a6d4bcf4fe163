"""Grouped sparse verification against per-query loads, in time and in measured DRAM bytes.

    python -m ssvkit.validation.sparse_grouping --out validation/data/sparse-grouping-h200.json

The grouping target: for working sets beyond L2, ``union`` (exact) and ``shared`` (approx) at
group size C must beat ``per_query`` by at least ``TARGET_SHARE`` of the ratio of their DRAM
bytes, ``speedup >= TARGET_SHARE * dram_per_query / dram_mode``. The bytes are measured per
call by Nsight Compute (``DRAM_METRICS``, L2 flushed before each kernel), the times by
CUDA-graph replay (``kernels.timing``, L2 flushed per sample, median), on the kernel sweep's
sparse configs at their large batch, or at ``--batch`` (``config_inputs``: at batch 1, the
engine's verify step, the working set is one sequence's blocks). The run has three steps in one
command: correctness (``check``: a mismatch or NaN stops the run, exit status 2), the byte
count in a child process under ``ncu`` (``--ncu`` names the binary; ``ncu_bytes``), then the
timing in this process (``report``). Needs a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import sparse_batch
from ssvkit.calibration.kernel_sweep import FULL_SWEEP
from ssvkit.kernels import sparse_verify as sv
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write

TARGET_SHARE = 0.7
K = 1024
CONTEXTS = (16 * K, 64 * K)
TOP_NS = (16, 32, 64)
OVERLAPS = (0.5, 0.7, 0.9)
GROUPS = (2, 3, 4, 6, 8)
TIMING = tm.TimingConfig(warmup=3, graph_launches=8, graph_reps=10, max_total_s=0.5)
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


@triton.jit
def _call_boundary_kernel(x_ptr):
    """Marks the start of one timed call in the profiler's kernel list."""
    tl.store(x_ptr, 1)


def variants() -> list[tuple[str, int]]:
    return [("per_query", 1)] + [(m, c) for m in ("union", "shared") for c in GROUPS]


def configs(args) -> list[dict]:
    return [
        dict(context_len=ctx, top_n=n, overlap=g)
        for ctx in args.contexts
        for n in args.top_ns
        for g in args.overlaps
    ]


def config_inputs(
    cfg: dict, seed: int, batch: int | None = None
) -> tuple[dict, list[tuple], np.ndarray]:
    """The inputs of one config at ``batch`` (None: the sweep's large batch): rotation sets and
    the block indices.

    As the kernel sweep's sparse configs at their large batch (``calibration.kernel_ops``: the
    smallest batch >= 16 whose deduplicated working set reaches 200 MB), Llama-3.1-8B attention,
    t = 16 rows of a binary tree, blocks of 64, exact adjacent-row overlap."""
    sw = FULL_SWEEP
    ctx, top_n, gamma = cfg["context_len"], cfg["top_n"], cfg["overlap"]
    t, bs = sw.sparse_tokens, sw.block_size
    rng = np.random.default_rng([seed, ctx, top_n, int(gamma * 1000)])
    bsz = sparse_batch(sw, ctx, top_n, gamma, rng) if batch is None else batch
    idx_np = ki.overlap_block_idx([ctx // bs] * bsz, t, top_n, gamma, rng)
    fixed = bsz * ki.NUM_KV_HEADS * ki.kv_bytes(t) + ki.qol_bytes(bsz, t) + idx_np.nbytes
    rot = tm.num_rotations(ki.group_blocks(idx_np, t) * ki.kv_bytes(bs) + fixed)
    gen = ki.generator(seed + ctx + top_n + bsz)
    idx = torch.from_numpy(idx_np).cuda()
    sets = [(*ki.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen), idx) for _ in range(rot)]
    params = dict(cfg, batch=bsz, num_query_tokens=t, block_size=bs, rotations=rot, fixed=fixed)
    return params, sets, idx_np


def counted_bytes(mode: str, c: int, idx_np: np.ndarray) -> int:
    """The kernel sweep's count: K/V of the blocks the mode's algorithm loads."""
    bsz, hkv, t, top_n = idx_np.shape
    if mode == "per_query":
        blocks = bsz * hkv * t * top_n
    elif mode == "union":
        blocks = ki.group_blocks(idx_np, c)
    else:
        blocks = bsz * hkv * math.ceil(t / c) * top_n
    return blocks * ki.kv_bytes(FULL_SWEEP.block_size)


def floor_bytes(mode: str, c: int, idx_np: np.ndarray, fixed: int) -> int:
    """The least DRAM traffic of the mode's result: each (sequence, KV head)'s blocks once
    (for ``shared``, the blocks of its groups' first rows), plus the tail, q, o, lse and the
    indices (``fixed``)."""
    t = idx_np.shape[2]
    rows = idx_np[:, :, ::c] if mode == "shared" else idx_np
    return ki.group_blocks(rows, t) * ki.kv_bytes(FULL_SWEEP.block_size) + fixed


def call(sets, i: int, mode: str, c: int):
    """One call as a user makes it: the union plan is built inside, so both a union call's
    time and its bytes include the plan kernel."""
    return sv.sparse_verify(*sets[i], mode=mode, group_size=c, block_size=64, validate=False)


def check(sets) -> None:
    """Every variant against the fp32 reference on one config's first set (exits on a
    mismatch or NaN)."""
    for mode, c in variants():
        kw = dict(mode=mode, group_size=c, block_size=64)
        with tm.poisoned_allocations():
            o, lse = sv.sparse_verify(*sets[0], **kw)
        ref_o, ref_lse = sv.reference_sparse_verify(*sets[0], **kw)
        checks.check(f"sparse_verify {mode} C={c}", o, ref_o, "o")
        checks.check(f"sparse_verify {mode} C={c}", lse, ref_lse, "lse")
        del ref_o, ref_lse
        torch.cuda.empty_cache()


def time_all(args) -> list[dict]:
    rows = []
    for cfg in configs(args):
        params, sets, idx_np = config_inputs(cfg, args.seed, args.batch)
        for mode, c in variants():
            timing = tm.bench(
                lambda i, s=sets, m=mode, c=c: call(s, i, m, c),
                "graph",
                num_inputs=len(sets),
                config=TIMING,
            )
            rows.append(
                dict(
                    params,
                    mode=mode,
                    group_size=c,
                    median_s=timing.median_s,
                    p10_s=timing.p10_s,
                    p90_s=timing.p90_s,
                    counted_bytes=counted_bytes(mode, c, idx_np),
                    floor_bytes=floor_bytes(mode, c, idx_np, params["fixed"]),
                )
            )
        print(f"timed {params}", file=sys.stderr, flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def profile_calls(args) -> None:
    """The child under ncu: per config, warm up, then one marker and one call per variant
    inside the profiled range."""
    marker = torch.zeros(1, dtype=torch.int32, device="cuda")
    for cfg in configs(args):
        _, sets, _ = config_inputs(cfg, args.seed, args.batch)
        for mode, c in variants():
            call(sets, 0, mode, c)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for mode, c in variants():
            _call_boundary_kernel[(1,)](marker)
            call(sets, 0, mode, c)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del sets
        torch.cuda.empty_cache()


def ncu_bytes(args) -> list[dict]:
    """Run the profiled child; per call, the summed DRAM bytes and kernel time of its kernels."""
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "calls"
        child = [sys.executable, "-m", "ssvkit.validation.sparse_grouping", "--child"]
        child += ["--seed", str(args.seed)]
        child += ["--contexts", *map(str, args.contexts), "--top-ns", *map(str, args.top_ns)]
        child += ["--overlaps", *map(str, args.overlaps)]
        child += [] if args.batch is None else ["--batch", str(args.batch)]
        base = [args.ncu, "--quiet", "--clock-control", "none", "--profile-from-start", "off"]
        metrics = ",".join((*DRAM_METRICS, "gpu__time_duration.sum"))
        subprocess.run([*base, "--metrics", metrics, "-o", str(rep), *child], check=True)
        out = subprocess.run(
            [args.ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw", "--print-units"]
            + ["base", "--metrics", metrics],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    table = list(csv.DictReader(line for line in out.splitlines() if line.startswith('"')))
    if not table or "Kernel Name" not in table[0]:
        raise RuntimeError(f"unexpected ncu CSV:\n{out[:2000]}")
    calls: list[dict] = []
    for rec in table:
        name = rec["Kernel Name"]
        if not name or rec.get("ID", "").strip() == "":  # the units row
            continue
        if "_call_boundary_kernel" in name:
            calls.append(dict(dram_bytes=0, kernel_s=0.0, kernels=[]))
            continue
        if not calls:
            raise RuntimeError(f"kernel {name} ran before the first marker")
        calls[-1]["dram_bytes"] += sum(_number(rec[m]) for m in DRAM_METRICS)
        calls[-1]["kernel_s"] += _number(rec["gpu__time_duration.sum"]) * 1e-9
        calls[-1]["kernels"].append(name.split("(")[0])
    return calls


def _number(text: str) -> float:
    """A value of ncu's CSV, which groups thousands with commas."""
    return float(text.replace(",", ""))


def report(rows: list[dict], calls: list[dict], ceilings: dict) -> list[dict]:
    """The timed rows with their profiled calls' DRAM bytes, each against its config's
    ``per_query`` row: speedup, DRAM and counted byte ratios and the target; ``floor_s`` is
    max(floor bytes / copy bandwidth, FLOPs / GEMM rate), both ceilings measured in the run
    (``floor_bytes``)."""
    if len(calls) != len(rows):
        raise RuntimeError(f"{len(calls)} profiled calls for {len(rows)} timed ones")
    for row, c in zip(rows, calls, strict=True):
        row.update(c)
    n = len(variants())
    for i in range(0, len(rows), n):
        base = rows[i]
        for row in rows[i : i + n]:
            row["speedup"] = base["median_s"] / row["median_s"]
            row["dram_ratio"] = base["dram_bytes"] / row["dram_bytes"]
            row["counted_ratio"] = base["counted_bytes"] / row["counted_bytes"]
            row["target_speedup"] = TARGET_SHARE * row["dram_ratio"]
            row["met"] = bool(row["speedup"] >= row["target_speedup"])
            flops = 4 * row["batch"] * ki.NUM_Q_HEADS * ki.HEAD_DIM * row["num_query_tokens"]
            flops *= row["top_n"] * row["block_size"] + (row["num_query_tokens"] + 1) / 2
            row["floor_s"] = max(
                row["floor_bytes"] / ceilings["copy_bytes_per_s"],
                flops / ceilings["gemm_flops_per_s"],
            )
            row["floor_ratio"] = row["median_s"] / row["floor_s"]
    return rows


def print_table(rows: list[dict]) -> None:
    head = (
        "ctx   top_n ovl  batch mode      C    us     DRAM MB  spd   dram_x  count_x  /floor  met"
    )
    print(head)
    for r in rows:
        print(
            f"{r['context_len'] // K:>3}K {r['top_n']:>5} {r['overlap']:.1f} {r['batch']:>5} "
            f"{r['mode']:<9} {r['group_size']:>2} {r['median_s'] * 1e6:7.1f} "
            f"{r['dram_bytes'] / 1e6:8.1f} {r['speedup']:5.2f} {r['dram_ratio']:6.2f} "
            f"{r['counted_ratio']:7.2f} {r['floor_ratio']:6.2f}  {'yes' if r['met'] else 'NO'}"
        )
    for mode in ("union", "shared"):
        for c in GROUPS:
            sel = [r for r in rows if r["mode"] == mode and r["group_size"] == c]
            print(f"{mode} C={c}: target met in {sum(r['met'] for r in sel)}/{len(sel)} configs")


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="JSON document to write (with --child: unused)")
    p.add_argument("--ncu", default="ncu", help="Nsight Compute command line binary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    p.add_argument("--top-ns", type=int, nargs="+", default=list(TOP_NS))
    p.add_argument("--overlaps", type=float, nargs="+", default=list(OVERLAPS))
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences a call (default: the sweep's large batch)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        p.error(f"--batch must be >= 1, got {args.batch}")
    if not torch.cuda.is_available():
        sys.exit("sparse_grouping needs a CUDA GPU")
    if args.child:
        profile_calls(args)
        return
    if args.out is None:
        p.error("--out is required")
    ceilings = dict(copy_bytes_per_s=tm.copy_bytes_per_s(), gemm_flops_per_s=tm.gemm_flops_per_s())
    try:
        check(config_inputs(configs(args)[0], args.seed, args.batch)[1])
    except checks.CorrectnessError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    torch.cuda.empty_cache()
    calls = ncu_bytes(args)
    rows = report(time_all(args), calls, ceilings)
    doc = dict(
        provenance=tm.provenance(),
        args=dict(
            seed=args.seed,
            contexts=args.contexts,
            top_ns=args.top_ns,
            overlaps=args.overlaps,
            batch=args.batch,
        ),
        target_share=TARGET_SHARE,
        ceilings=ceilings,
        rows=rows,
    )
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print_table(rows)


if __name__ == "__main__":
    main()
