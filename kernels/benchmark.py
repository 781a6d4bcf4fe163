"""Kernel benchmark: correctness first, then the timed sweep, one JSONL row per config.

    python -m kernels.benchmark --out calibration/profiles/h100-sxm [--quick] \
        [--ops dense,sparse,repair,nsa,select] [--budget-s 540] [--json] [--geometry tiny]

1. Checks every selected op against its fp32 reference on random ragged bf16 inputs, with
   poisoned allocations; a mismatch or a NaN aborts the run (exit status 2).
2. Measures the ceilings of this run: device-to-device copy bandwidth (read + write bytes), bf16
   GEMM rate, and the time of an empty Triton kernel (launch and graph).
3. Times the sweep (Llama-3.1-8B attention: 32 query heads, 8 KV heads, d = 128, bf16; with
   ``--geometry tiny`` the engine's trained tiny pair, 8 query heads, 2 KV heads, d = 64, over
   ``TINY_SWEEP``: the shapes the validation campaign decodes with), each
   config by plain launch and by CUDA-graph replay (:mod:`kernels.timing`), and appends one row
   per (config, timing) to ``OUT/kernel_bench.jsonl``. A config whose key (op, timing and its
   defining params) is already in the file is skipped, so an interrupted run resumes. No config
   starts once the ``--budget-s`` wall limit is near.
4. Prints a summary of every row in the file.

Exit status: 0 when every config is in the file, 1 without a GPU, 2 on a correctness failure,
``STOPPED_AT_BUDGET`` (3) when the budget left configs out (run the same command again).

Byte and FLOP counts (``unique_bytes``, ``flops``) are the minimum the op's algorithm must move
and compute: the KV it needs read once, plus q, o and lse (and indices). Sparse modes count
their own traffic: ``per_query`` every row's blocks, ``union`` the deduplicated union of each
group, ``shared`` each group's representative set; ``params.global_unique_bytes`` is the floor
of any algorithm (each (sequence, KV head)'s blocks once). FLOPs count the useful products
(4 D per visible query-key pair), not masked padding.

Sparse block selections are built with an exact adjacent-query overlap: each row keeps
``round(overlap * top_n)`` blocks of its predecessor and draws the rest fresh (new to its span of
8 rows where the prefix has room), so ``f_load`` per group size is known; the row records the
value measured on the indices (``params.f_load``) beside the SSV formula's.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import itertools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kernels import timing as tm
from kernels.bench_summary import DERIVED, print_summary, summarise
from kernels.tree import ancestor_bitmask
from perfmodel.rows import seal

OPS = ("dense", "sparse", "repair", "nsa", "select")
OUT_NAME = "kernel_bench.jsonl"
STOPPED_AT_BUDGET = 3  # exit status: configs left out at the budget (benchmarks/campaign.py)
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B attention (use_geometry)
GEOMETRIES = {"llama-3.1-8b": (32, 8, 128), "tiny": (8, 2, 64)}
DTYPE = torch.bfloat16
ELEM_BYTES = 2
K = 1024
WORKING_SET_BYTES = 200 * 2**20  # 4x the H100's 50 MB L2
SPAN = 8  # rows over which fresh blocks are new: groups of C in {1, 2, 4, 8} nest in it
# Params that describe a measurement rather than define a config: not part of the resume key.
TOL = {"o": (3e-2, 3e-2), "lse": (2e-2, 2e-2)}  # bf16
DEVICE = "cuda"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _free() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True, slots=True)
class Sweep:
    """The configs timed; ``QUICK_SWEEP`` is a subset."""

    # 48K, 96K and t = 12 are calibration's held-out values: timed, never fitted.
    dense_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    dense_tokens: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)
    dense_batches: tuple[int, ...] = (1, 16)
    sparse_contexts: tuple[int, ...] = (16 * K, 64 * K)
    sparse_tokens: int = 16  # two groups of C = 8
    top_ns: tuple[int, ...] = (16, 32, 64)
    overlaps: tuple[float, ...] = (0.5, 0.7, 0.9)
    group_sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    sparse_min_large_batch: int = 16  # raised until the working set reaches 200 MB
    repair_contexts: tuple[int, ...] = (16 * K, 64 * K)
    repair_batches: tuple[int, ...] = (1, 4, 16)
    repair_top_n: int = 64
    missed_fractions: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
    other_batches: tuple[int, ...] = (1, 16)  # repair, nsa and select
    nsa_contexts: tuple[int, ...] = (16 * K, 64 * K)
    nsa_tokens: tuple[int, ...] = (16,)
    select_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    select_batches: tuple[int, ...] = (1, 4, 16)
    select_top_ns: tuple[int, ...] = (16, 64)
    block_size: int = 64
    tokens: int = 16  # draft rows of the repair, nsa and select configs


FULL_SWEEP = Sweep()
QUICK_SWEEP = Sweep(
    dense_contexts=(8 * K, 64 * K),
    dense_tokens=(1, 16, 64),
    dense_batches=(1,),
    sparse_contexts=(64 * K,),
    top_ns=(32,),
    overlaps=(0.7,),
    group_sizes=(1, 4),
    missed_fractions=(0.0, 0.25, 0.5),
    other_batches=(1,),
    nsa_contexts=(64 * K,),
    select_contexts=(64 * K,),
    select_batches=(1,),
    select_top_ns=(32,),
    repair_contexts=(64 * K,),
    repair_batches=(1,),
)


# The tiny pair's verify shapes (engine/checkpoints, docs/validation/campaign.json): contexts
# up to its 32K positions, the campaign's tree sizes (1, 3, 5, 17 rows), its NSA budget.
TINY_SWEEP = Sweep(
    dense_contexts=(2 * K, 4 * K, 8 * K, 16 * K, 30 * K),
    dense_tokens=(1, 2, 3, 4, 5, 8, 12, 16, 17, 32),
    dense_batches=(1,),
    nsa_contexts=(4 * K, 8 * K, 16 * K, 30 * K),
    nsa_tokens=(1, 3, 5, 12, 17),
    other_batches=(1,),
)


def use_geometry(name: str) -> None:
    """Time another attention geometry: the module's head counts, which every input builder,
    byte count and row reads at call time."""
    global NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM
    if name not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {', '.join(GEOMETRIES)}, got {name!r}")
    NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = GEOMETRIES[name]


class CorrectnessError(RuntimeError):
    """An op disagreed with its reference (or produced NaN): the run must not time it."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Command-line options (the CLI's help comes from the field metadata)."""

    out: Path = field(metadata={"help": "directory for kernel_bench.jsonl"})
    quick: bool = field(default=False, metadata={"help": "reduced sweep and sample counts"})
    ops: tuple[str, ...] = field(default=OPS, metadata={"help": "comma-separated ops to run"})
    budget_s: float = field(default=540.0, metadata={"help": "wall-clock limit of the run"})
    seed: int = field(default=0, metadata={"help": "seed of every input generator"})
    json: bool = field(default=False, metadata={"help": "print the summary as JSON"})
    summary_only: bool = field(
        default=False, metadata={"help": "print the summary of OUT's rows and exit (no GPU)"}
    )
    geometry: str = field(
        default="llama-3.1-8b",
        metadata={"help": "attention heads timed: llama-3.1-8b (full sweep) or tiny (TINY_SWEEP)"},
    )

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.geometry not in GEOMETRIES:
            raise ValueError(
                f"geometry must be one of {', '.join(GEOMETRIES)}, got {self.geometry!r}"
            )


# --------------------------------------------------------------------------- inputs


def _lazy(module: str):
    """Import another engineer's op module; None (with a note) when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        print(f"  skipping {module}: {e}")
        return None


def _supported_kwargs(fn: Callable, **kwargs) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def binary_tree_mask(bsz: int, t: int, device) -> torch.Tensor:
    """Ancestor bitmask of a binary heap tree (node i's parent is (i - 1) // 2)."""
    parents = torch.tensor([(i - 1) // 2 for i in range(t)], dtype=torch.int32, device=device)
    return ancestor_bitmask(parents.expand(bsz, t).contiguous())


def attention_inputs(bsz, t, t_max, prefix_lens, gen, device=None):
    """Random q, k_cache, v_cache (bf16, never zeros), prefix_lens and a binary-tree mask."""
    device = device or DEVICE
    q = torch.randn((bsz, t, NUM_Q_HEADS, HEAD_DIM), generator=gen, device=device).to(DTYPE)
    kv_shape = (bsz, NUM_KV_HEADS, t_max, HEAD_DIM)
    k = torch.randn(kv_shape, generator=gen, device=device, dtype=DTYPE)
    v = torch.randn(kv_shape, generator=gen, device=device, dtype=DTYPE)
    lens = torch.tensor(prefix_lens, dtype=torch.int32, device=device)
    return q, k, v, lens, binary_tree_mask(bsz, t, device)


def overlap_block_idx(num_blocks: list[int], t: int, top_n: int, overlap: float, rng) -> np.ndarray:
    """``[B, Hkv, t, top_n]`` int32 block selections with an exact adjacent-row overlap.

    Row ``i`` keeps ``round(overlap * top_n)`` blocks of row ``i - 1`` and draws the rest from
    blocks unused in its span of ``SPAN`` rows (or, when the prefix is too short, unused by row
    ``i - 1``): a group of ``C`` rows then loads ``top_n * (1 + (C - 1) * (1 - overlap))`` blocks.
    """
    keep = round(overlap * top_n)
    out = np.empty((len(num_blocks), NUM_KV_HEADS, t, top_n), dtype=np.int32)
    for b, nb in enumerate(num_blocks):
        if nb - top_n < (top_n - keep if t > 1 else 0):
            raise ValueError(f"sequence {b}: {nb} blocks cannot hold top_n={top_n} at {overlap=}")
        for h in range(NUM_KV_HEADS):
            prev: np.ndarray | None = None
            used: set[int] = set()
            for i in range(t):
                if prev is None:
                    cur = rng.choice(nb, top_n, replace=False)
                else:
                    if i % SPAN == 0:
                        used = set(prev.tolist())
                    kept = rng.choice(prev, keep, replace=False)
                    pool = np.setdiff1d(np.arange(nb), np.fromiter(used, dtype=np.int64))
                    if pool.size < top_n - keep:
                        pool = np.setdiff1d(np.arange(nb), prev)
                    cur = np.concatenate([kept, rng.choice(pool, top_n - keep, replace=False)])
                used |= set(cur.tolist())
                out[b, h, i] = np.sort(cur)
                prev = cur
    return out


def random_block_idx(num_blocks: list[int], t: int, width: int, rng) -> np.ndarray:
    """``[B, Hkv, t, width]`` int32: independent random distinct blocks per row, ascending."""
    out = np.empty((len(num_blocks), NUM_KV_HEADS, t, width), dtype=np.int32)
    for b, nb in enumerate(num_blocks):
        for h in range(NUM_KV_HEADS):
            for i in range(t):
                out[b, h, i] = np.sort(rng.choice(nb, width, replace=False))
    return out


def group_blocks(idx: np.ndarray, group: int) -> int:
    """Distinct blocks summed over consecutive row groups of ``group`` (-1 ignored)."""
    bsz, hkv, t, n = idx.shape
    total = 0
    for g0 in range(0, t, group):
        s = np.sort(idx[:, :, g0 : g0 + group].reshape(bsz, hkv, -1), axis=-1)
        distinct = (s[..., 1:] != s[..., :-1]) & (s[..., 1:] >= 0)
        total += int(distinct.sum() + (s[..., 0] >= 0).sum())
    return total


def f_load_formula(group: int, overlap: float) -> float:
    """SSV's load fraction ``(1 + (C - 1)(1 - gamma)) / C`` (seed 000)."""
    return (1 + (group - 1) * (1 - overlap)) / group


def qol_bytes(bsz: int, t: int) -> int:
    """q read + o written (bf16) + lse written (fp32)."""
    return 2 * bsz * t * NUM_Q_HEADS * HEAD_DIM * ELEM_BYTES + bsz * NUM_Q_HEADS * t * 4


def kv_bytes(tokens: int) -> int:
    """K and V bytes of ``tokens`` positions of one KV head."""
    return 2 * tokens * HEAD_DIM * ELEM_BYTES


def base_params(**kw) -> dict:
    p = {
        "context_len": None,
        "num_query_tokens": None,
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "batch": None,
        "mode": None,
        "group_size": None,
        "overlap": None,
        "top_n": None,
        "block_size": None,
        "dtype": "bfloat16",
    }
    p.update(kw)
    return p


def row_key(op: str, timing: str, params: dict) -> str:
    defining = {k: v for k, v in params.items() if k not in DERIVED}
    return f"{op}|{timing}|{json.dumps(defining, sort_keys=True)}"


# --------------------------------------------------------------------------- runner


class Runner:
    """Owns the output file, the resume keys, the run's ceilings and the wall budget."""

    def __init__(self, opts: BenchOptions) -> None:
        self.opts = opts
        self.t0 = time.monotonic()
        self.path = opts.out / OUT_NAME
        opts.out.mkdir(parents=True, exist_ok=True)
        self.done = {row_key(r["op"], r["timing"], r["params"]) for r in read_rows(self.path)}
        self.tcfg = tm.QUICK_TIMING if opts.quick else tm.DEFAULT_TIMING
        if opts.geometry == "tiny":
            self.sweep = TINY_SWEEP
        else:
            self.sweep = QUICK_SWEEP if opts.quick else FULL_SWEEP
        self.prov = tm.provenance()
        self.longest_s = 5.0
        self.stopped = False
        self.num_written = 0
        self.ceil: dict[str, float] = {}

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def out_of_time(self) -> bool:
        if not self.stopped and self.elapsed_s() > self.opts.budget_s - 2 * self.longest_s:
            print(f"[{self.elapsed_s():6.1f}s] budget of {self.opts.budget_s:.0f} s near: stopping")
            self.stopped = True
        return self.stopped

    def pending(self, op: str, params: dict) -> list[str]:
        return [t for t in tm.TIMINGS if row_key(op, t, params) not in self.done]

    def measure_ceilings(self) -> None:
        cfg = self.tcfg
        copy_bytes = 2**31
        rates = tm.copy_rates(copy_bytes, config=cfg)
        self.ceil = {
            "copy_bytes_per_s": max(rates.values()),
            "gemm_flops_per_s": tm.gemm_flops_per_s(config=cfg),
            "launch": tm.empty_kernel_s("launch", cfg),
            "graph": tm.empty_kernel_s("graph", cfg),
        }
        c = self.ceil
        print(
            f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"GEMM {c['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s, empty kernel "
            f"{c['launch'] * 1e6:.1f} us (launch) / {c['graph'] * 1e6:.2f} us (graph)"
        )
        print("  copy rates (TB/s): " + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in rates.items()))
        for name, tmode in (("launch", "launch"), ("graph", "graph")):
            timing = tm.Timing(c[name], c[name], c[name], tmode, 1)
            self.write("empty_triton_kernel", base_params(), timing, 0, 0)
        for impl, rate in rates.items():
            secs = 2 * copy_bytes / rate  # read + write bytes
            timing = tm.Timing(
                secs, secs, secs, "launch" if impl.endswith("launch") else "graph", 1
            )
            self.write(
                "device_copy", base_params(impl=impl, nbytes=copy_bytes), timing, 2 * copy_bytes, 0
            )

    def write(self, op: str, params: dict, t: tm.Timing, unique_bytes: int, flops: int) -> None:
        key = row_key(op, t.timing, params)
        if key in self.done:
            return
        row = seal(
            {
                "op": op,
                "params": params,
                "median_s": t.median_s,
                "p10_s": t.p10_s,
                "p90_s": t.p90_s,
                "timing": t.timing,
                "unique_bytes": int(unique_bytes),
                "flops": int(flops),
                "achieved_bytes_per_s": unique_bytes / t.median_s if t.median_s > 0 else 0.0,
                "copy_bytes_per_s": self.ceil["copy_bytes_per_s"],
                "gemm_flops_per_s": self.ceil["gemm_flops_per_s"],
                "launch_s": self.ceil[t.timing],
                **self.prov,
            }
        )
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.done.add(key)
        self.num_written += 1

    def time_op(
        self,
        op: str,
        params: dict,
        fn: Callable[[int], object],
        *,
        num_inputs: int,
        unique_bytes: int,
        flops: int,
    ) -> None:
        for timing in self.pending(op, params):
            if self.out_of_time():
                return
            start = time.monotonic()
            try:
                t = tm.bench(fn, timing, num_inputs=num_inputs, config=self.tcfg)
            except torch.cuda.OutOfMemoryError:
                print(f"  {op} {timing}: out of memory, skipped")
                _free()
                return
            except Exception as e:  # one broken config must not end the sweep
                print(f"  {op} {timing}: {type(e).__name__}: {e}")
                traceback.print_exc(limit=2)
                return
            self.longest_s = max(self.longest_s, time.monotonic() - start)
            self.write(op, params, t, unique_bytes, flops)
            tbs = unique_bytes / t.median_s / 1e12
            floor = max(
                unique_bytes / self.ceil["copy_bytes_per_s"], flops / self.ceil["gemm_flops_per_s"]
            )
            short = {k: v for k, v in params.items() if v is not None and k in SHOW}
            print(
                f"[{self.elapsed_s():6.1f}s] {op:<20} {timing:<6} {t.median_s * 1e6:9.1f} us "
                f"{tbs:5.2f} TB/s {t.median_s / floor if floor else float('nan'):6.2f} x floor "
                f"({floor * 1e6:.1f} us)  {short}"
            )


SHOW = ("context_len", "num_query_tokens", "batch", "mode", "group_size", "overlap", "top_n")
SHOW += ("missed_fraction", "impl", "method")


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


# --------------------------------------------------------------------------- correctness


def _check(name: str, actual: torch.Tensor, expected: torch.Tensor, kind: str) -> None:
    atol, rtol = TOL[kind]
    if torch.isnan(actual.float()).any():
        raise CorrectnessError(f"{name}: NaN in {kind}")
    try:
        torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
    except AssertionError as e:
        raise CorrectnessError(f"{name}: {kind} mismatch\n{e}") from None


def check_dense() -> None:
    from kernels.dense_verify import dense_verify, reference_dense_verify

    gen = _gen(1)
    for t in (1, 5, 16, 64):
        args = attention_inputs(3, t, 4200, [4093, 0, 1777], gen)
        for splits in (None, 1, 7):
            with tm.poisoned_allocations():
                o, lse = dense_verify(*args, num_splits=splits)
            ro, rlse = reference_dense_verify(*args)
            _check(f"dense_verify t={t} splits={splits}", lse, rlse, "lse")
            _check(f"dense_verify t={t} splits={splits}", o, ro, "o")


def check_repair() -> None:
    from kernels.repair import reference_repair, repair

    gen = _gen(2)
    rng = np.random.default_rng(2)
    q, k, v, lens, _ = attention_inputs(2, 8, 4200, [4100, 1000], gen)
    nb = [math.ceil(n / 64) for n in (4100, 1000)]
    full = random_block_idx(nb, 8, 12, rng)
    pred = torch.from_numpy(full[..., :7].copy()).to(DEVICE)
    missed = torch.from_numpy(full[..., 7:].copy()).to(DEVICE)
    missed[0, :, :, 3:] = -1  # ragged
    o0 = torch.full_like(q, float("nan"))
    lse0 = torch.full((2, NUM_Q_HEADS, 8), float("-inf"), device=DEVICE)
    kw = dict(prefix_lens=lens, block_size=64)
    with tm.poisoned_allocations():
        o_p, lse_p = repair(q, k, v, o0, lse0, pred, **kw)
        o_u, lse_u = repair(q, k, v, o_p, lse_p, missed, **kw)
    union = torch.cat([pred, missed], dim=-1).contiguous()
    ro, rlse = reference_repair(q, k, v, o0, lse0, union, **kw)
    _check("repair(partial) + repair(missed) vs union", lse_u, rlse, "lse")
    _check("repair(partial) + repair(missed) vs union", o_u, ro, "o")


def check_sparse(mod) -> None:
    gen = _gen(3)
    rng = np.random.default_rng(3)
    lens = [4100, 1000]
    q, k, v, lens_t, mask = attention_inputs(2, 8, 4200, lens, gen)
    idx = torch.from_numpy(overlap_block_idx([n // 64 for n in lens], 8, 8, 0.7, rng)).to(DEVICE)
    for mode, group in (("per_query", 1), ("union", 2), ("union", 4), ("shared", 4)):
        kw = dict(mode=mode, group_size=group, block_size=64)
        with tm.poisoned_allocations():
            out = mod.sparse_verify(q, k, v, lens_t, mask, idx, **kw)
        ref = mod.reference_sparse_verify(q, k, v, lens_t, mask, idx, **kw)
        _check(f"sparse_verify {mode} C={group}", out[0], ref[0], "o")
        if isinstance(out, tuple) and isinstance(ref, tuple) and len(out) > 1 and len(ref) > 1:
            _check(f"sparse_verify {mode} C={group}", out[1], ref[1], "lse")


def _nsa_inputs(mod, bsz, t, prefix_lens, t_max, gen):
    q, k, v, lens, mask = attention_inputs(bsz, t, t_max, prefix_lens, gen)
    comp_k, comp_v, _ = mod.compress_kv(k, v, lens, comp_block=32, comp_stride=16)
    gates = torch.sigmoid(torch.randn((bsz, t, NUM_Q_HEADS, 3), generator=gen, device=DEVICE))
    return (q, k, v, lens, mask, comp_k, comp_v, gates)


NSA_KW = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)
NSA_REUSE_OVERLAP = 0.7


def check_nsa(mod) -> None:
    gen = _gen(4)
    args = _nsa_inputs(mod, 2, 8, [4100, 1500], 4200, gen)
    for name, fn in (
        ("nsa_verify", mod.nsa_verify),
        ("nsa_verify_unfused", mod.nsa_verify_unfused),
    ):
        with tm.poisoned_allocations():
            o, idx = fn(*args, **NSA_KW)  # refresh: computes the indices
            o2, _ = fn(*args, block_idx=idx, **NSA_KW)  # reuse: given the indices
        ro, _ = mod.reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
        _check(f"{name} refresh", o, ro, "o")
        _check(f"{name} reuse", o2, ro, "o")


def check_select(mod) -> None:
    gen = _gen(5)
    q, k, _, lens, _ = attention_inputs(2, 8, 4200, [4100, 1500], gen)
    for method in ("mean", "quest"):
        meta = mod.BlockMetadata.build(k, lens, 64, kinds=(method,))
        idx = mod.select_blocks(q, meta, lens, top_n=16, method=method)
        ref = mod.reference_select_blocks(q, k, lens, 64, top_n=16, method=method)
        # bf16 scores reorder near-ties: require almost every selected block to agree.
        hits = sum(
            len(set(a.tolist()) & set(b.tolist()))
            for a, b in zip(idx.reshape(-1, 16).cpu(), ref.reshape(-1, 16).cpu(), strict=True)
        )
        agree = hits / idx.numel()
        if agree < 0.97:
            raise CorrectnessError(f"select_blocks {method}: only {agree:.3f} of blocks agree")


# --------------------------------------------------------------------------- sweeps


def dense_sweep(r: Runner, mod=None) -> None:
    from kernels.dense_verify import dense_verify, plan_dense_verify

    sw = r.sweep
    for bsz in sw.dense_batches:
        for ctx in sw.dense_contexts:
            for t in sw.dense_tokens:
                p = base_params(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
                if not (r.pending("dense_verify", p) or r.pending("torch_sdpa", p)):
                    continue
                if r.out_of_time():
                    return
                _dense_config(r, p, dense_verify, plan_dense_verify)
                _free()


def _dense_config(r: Runner, p: dict, dense_verify, plan_dense_verify) -> None:
    bsz, ctx, t = p["batch"], p["context_len"], p["num_query_tokens"]
    length = ctx + t
    unique = bsz * NUM_KV_HEADS * kv_bytes(length) + qol_bytes(bsz, t)
    rot = tm.num_rotations(unique)
    gen = _gen(r.opts.seed + ctx + t + bsz)
    sets = [attention_inputs(bsz, t, length, [ctx] * bsz, gen) for _ in range(rot)]
    tail_pairs = int(sum(bin(int(m) & (2**64 - 1)).count("1") for m in sets[0][4][0].cpu()))
    flops = 4 * bsz * NUM_Q_HEADS * HEAD_DIM * (t * ctx + tail_pairs)
    plan = plan_dense_verify(bsz, t, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, length, sets[0][0].device)
    pd = dict(p, num_splits=plan.num_splits, rotations=rot)
    r.time_op(
        "dense_verify",
        pd,
        lambda i: dense_verify(*sets[i], validate=False),
        num_inputs=rot,
        unique_bytes=unique,
        flops=flops,
    )
    # torch SDPA on the same inputs: [B, H, t, D] queries over the first ctx + t positions.
    sdpa_sets = []
    for q, k, v, _, mask in sets:
        j = torch.arange(t, device=DEVICE)
        tail = ((mask[:, :, None] >> j) & 1).bool()  # [B, t, t]
        full = torch.ones((bsz, t, ctx), dtype=torch.bool, device=DEVICE)
        attn = None if t == 1 else torch.cat([full, tail], -1)[:, None]  # [B, 1, t, L]
        sdpa_sets.append((q.transpose(1, 2), k[:, :, :length], v[:, :, :length], attn))

    def sdpa(i):
        q, k, v, attn = sdpa_sets[i]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn, enable_gqa=True)

    r.time_op(
        "torch_sdpa",
        dict(p, rotations=rot),
        sdpa,
        num_inputs=rot,
        unique_bytes=unique,
        flops=flops,
    )


def _sparse_batch(sw: Sweep, ctx: int, top_n: int, overlap: float, rng) -> int:
    """Smallest batch >= ``sw.sparse_min_large_batch`` whose deduplicated working set reaches
    200 MB (at most 64)."""
    idx = overlap_block_idx([ctx // sw.block_size], sw.sparse_tokens, top_n, overlap, rng)
    per_seq = group_blocks(idx, sw.sparse_tokens) * kv_bytes(sw.block_size)
    return int(min(64, max(sw.sparse_min_large_batch, math.ceil(WORKING_SET_BYTES / per_seq))))


def sparse_sweep(r: Runner, mod) -> None:
    sw = r.sweep
    t, bs, groups = sw.sparse_tokens, sw.block_size, sw.group_sizes
    contexts, top_ns, overlaps = sw.sparse_contexts, sw.top_ns, sw.overlaps
    for ctx in contexts:
        for top_n in top_ns:
            for gamma in overlaps:
                big = _sparse_batch(sw, ctx, top_n, gamma, _rng(r, ctx, top_n, gamma))
                for bsz in (1, big):
                    variants = [("per_query", 1)] + [("union", c) for c in groups]
                    variants += [("shared", c) for c in groups if c > 1]
                    common = dict(
                        context_len=ctx,
                        num_query_tokens=t,
                        batch=bsz,
                        overlap=gamma,
                        top_n=top_n,
                        block_size=bs,
                        tree="binary",
                    )
                    todo = [
                        (m, c)
                        for m, c in variants
                        if r.pending("sparse_verify", base_params(mode=m, group_size=c, **common))
                    ]
                    if not todo:
                        continue
                    if r.out_of_time():
                        return
                    _sparse_config(r, mod, common, todo)
                    _free()


def _rng(r: Runner, *key: float) -> np.random.Generator:
    """A generator per config, so a resumed run rebuilds the same selections."""
    return np.random.default_rng([r.opts.seed, *(int(round(k * 1000)) for k in key)])


def _sparse_config(r: Runner, mod, common: dict, todo) -> None:
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    top_n, gamma, bs = common["top_n"], common["overlap"], common["block_size"]
    length = ctx + t
    rng = _rng(r, ctx, top_n, gamma, bsz)
    idx_np = overlap_block_idx([ctx // bs] * bsz, t, top_n, gamma, rng)
    per_query_blocks = bsz * NUM_KV_HEADS * t * top_n
    global_blocks = group_blocks(idx_np, t)
    fixed = bsz * NUM_KV_HEADS * kv_bytes(t) + qol_bytes(bsz, t) + idx_np.nbytes
    rot = tm.num_rotations(global_blocks * kv_bytes(bs) + fixed)
    gen = _gen(r.opts.seed + ctx + top_n + bsz)
    sets = []
    for _ in range(rot):
        args = attention_inputs(bsz, t, length, [ctx] * bsz, gen)
        sets.append((*args, torch.from_numpy(idx_np).to(DEVICE)))
    flops = 4 * bsz * NUM_Q_HEADS * HEAD_DIM * t * (top_n * bs + (t + 1) / 2)
    for mode, group in todo:
        if mode == "per_query":
            blocks = per_query_blocks
        elif mode == "union":
            blocks = group_blocks(idx_np, group)
        else:
            blocks = bsz * NUM_KV_HEADS * math.ceil(t / group) * top_n
        p = base_params(mode=mode, group_size=group, **common)
        p.update(
            f_load=group_blocks(idx_np, group) / per_query_blocks,
            f_load_formula=f_load_formula(group, round(gamma * top_n) / top_n),
            global_unique_bytes=global_blocks * kv_bytes(bs) + fixed,
            rotations=rot,
        )
        kw = dict(mode=mode, group_size=group, block_size=bs)
        kw.update(_supported_kwargs(mod.sparse_verify, validate=False))

        def fn(i, kw=kw):
            return mod.sparse_verify(*sets[i], **kw)

        r.time_op(
            "sparse_verify",
            p,
            fn,
            num_inputs=rot,
            unique_bytes=blocks * kv_bytes(bs) + fixed,
            flops=int(flops),
        )


def repair_sweep(r: Runner, mod=None) -> None:
    sw = r.sweep
    t, bs, top_n = sw.tokens, sw.block_size, sw.repair_top_n
    fractions = sw.missed_fractions
    for bsz, ctx in itertools.product(sw.repair_batches, sw.repair_contexts):
        common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n, block_size=bs)
        variants = [("repair", f) for f in fractions] + [("recompute", 1.0)]
        todo = [
            (m, f)
            for m, f in variants
            if r.pending("repair", base_params(mode=m, missed_fraction=f, **common))
        ]
        if not todo:
            continue
        if r.out_of_time():
            return
        _repair_config(r, common, todo)
        _free()


def _repair_config(r: Runner, common: dict, todo) -> None:
    """One KV cache; the rotation sets differ in their selections (so in the blocks read)."""
    from kernels.repair import repair

    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    top_n, bs = common["top_n"], common["block_size"]
    gen = _gen(r.opts.seed + bsz)
    q, k, v, lens, _ = attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    o = torch.randn_like(q)
    lse = torch.randn((bsz, NUM_Q_HEADS, t), generator=gen, device=DEVICE) + 10.0
    empty = (torch.zeros_like(q), torch.full_like(lse, float("-inf")))
    qo = 3 * bsz * t * NUM_Q_HEADS * HEAD_DIM * ELEM_BYTES + 2 * bsz * NUM_Q_HEADS * t * 4
    for mode, frac in todo:
        width = round(frac * top_n)
        blocks = bsz * NUM_KV_HEADS * t * width
        unique = blocks * kv_bytes(bs) + qo + blocks * 4
        rot = tm.num_rotations(unique)
        rng = _rng(r, ctx, top_n, bsz, frac)
        missed = [
            torch.from_numpy(random_block_idx([ctx // bs] * bsz, t, width, rng))
            .contiguous()
            .to(DEVICE)
            for _ in range(rot)
        ]
        state = (o, lse) if mode == "repair" else empty
        p = base_params(mode=mode, missed_fraction=frac, **common)
        p.update(rotations=rot, missed_blocks=width)

        def fn(i, missed=missed, state=state):
            kw = dict(prefix_lens=lens, block_size=bs, validate=False)
            return repair(q, k, v, *state, missed[i], **kw)

        flops = 4 * bsz * NUM_Q_HEADS * HEAD_DIM * t * width * bs
        r.time_op("repair", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


def nsa_sweep(r: Runner, mod) -> None:
    for bsz, t in itertools.product(r.sweep.other_batches, r.sweep.nsa_tokens):
        for ctx, overlap in itertools.product(r.sweep.nsa_contexts, (None, NSA_REUSE_OVERLAP)):
            # overlap None: the reuse layer takes the refresh path's indices (random q, so the
            # rows barely overlap); NSA_REUSE_OVERLAP: indices with that exact adjacent-row
            # overlap, the regime SSV measured (50-90%), for the reuse path only.
            modes = ("reuse", "refresh") if overlap is None else ("reuse",)
            variants = [(m, i) for m in modes for i in ("fused", "unfused")]
            common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
            common.update(top_n=NSA_KW["top_n"], block_size=NSA_KW["block_size"])
            if overlap is not None:
                common["overlap"] = overlap
            extra = dict(window=NSA_KW["window"], comp_block=32, comp_stride=16)
            todo = [
                (m, i)
                for m, i in variants
                if r.pending("nsa_verify", base_params(mode=m, impl=i, **common, **extra))
            ]
            if not todo:
                continue
            if r.out_of_time():
                return
            _nsa_config(r, mod, common, extra, todo)
            _free()


def _nsa_bytes(idx: torch.Tensor, ctx: int, t: int) -> int:
    """Minimum bytes of one NSA call: per (sequence, KV head) the union of its rows' selected
    blocks and the window, the tail, the compressed tokens; q, o and the gates."""
    bs, window = NSA_KW["block_size"], NSA_KW["window"]
    bsz = idx.shape[0]
    idx_np = idx.cpu().numpy()
    win_blocks = set(range((ctx - window) // bs, ctx // bs))
    tokens = 0
    for b in range(bsz):
        for h in range(NUM_KV_HEADS):
            sel = set(idx_np[b, h].ravel().tolist()) - {-1}
            tokens += len(sel | win_blocks) * bs + t
    comp_tokens = (ctx - 32) // 16 + 1  # complete windows of 32 tokens at stride 16
    gates_bytes = bsz * t * NUM_Q_HEADS * 3 * 4
    comp = bsz * NUM_KV_HEADS * kv_bytes(comp_tokens)
    return kv_bytes(tokens) + comp + qol_bytes(bsz, t) + gates_bytes


def _nsa_config(r: Runner, mod, common, extra, todo) -> None:
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    gen = _gen(r.opts.seed + ctx + bsz)
    first = _nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen)
    overlap = common.get("overlap")
    rng = np.random.default_rng(r.opts.seed + ctx + bsz)

    def indices(args):
        if overlap is None:  # the refresh layer's own selection
            return mod.nsa_verify(*args, **NSA_KW, validate=False)[1]
        nb = [ctx // NSA_KW["block_size"]] * bsz
        idx = overlap_block_idx(nb, t, NSA_KW["top_n"], overlap, rng)
        return torch.from_numpy(idx).to(DEVICE)

    idx = indices(first)
    unique = _nsa_bytes(idx, ctx, t)
    rot = tm.num_rotations(unique)
    sets = [first] + [_nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen) for _ in range(rot - 1)]
    # Reuse layers take the indices of the refresh layer before them: each set's own.
    idxs = [idx] + [indices(a) for a in sets[1:]]
    comp_tokens = (ctx - 32) // 16 + 1
    pairs = comp_tokens + NSA_KW["top_n"] * NSA_KW["block_size"] + NSA_KW["window"] + t / 2
    flops = int(4 * bsz * NUM_Q_HEADS * HEAD_DIM * t * pairs)
    for mode, impl in todo:
        fn_op = mod.nsa_verify if impl == "fused" else mod.nsa_verify_unfused
        p = base_params(mode=mode, impl=impl, **common, **extra)
        p.update(rotations=rot)

        def fn(i, fn_op=fn_op, mode=mode):
            kw = dict(NSA_KW, validate=False)
            if mode == "reuse":
                kw["block_idx"] = idxs[i]
            return fn_op(*sets[i], **kw)

        r.time_op("nsa_verify", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


def select_sweep(r: Runner, mod) -> None:
    t, bs = r.sweep.tokens, r.sweep.block_size
    for bsz in r.sweep.select_batches:
        for ctx in r.sweep.select_contexts:
            for top_n in r.sweep.select_top_ns:
                for method in ("mean", "quest"):
                    common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n)
                    p = base_params(block_size=bs, method=method, **common)
                    if not r.pending("select_blocks", p):
                        continue
                    if r.out_of_time():
                        return
                    _select_config(r, mod, p)
                    _free()


def _select_config(r: Runner, mod, p: dict) -> None:
    bsz, ctx, t = p["batch"], p["context_len"], p["num_query_tokens"]
    top_n, bs, method = p["top_n"], p["block_size"], p["method"]
    gen = _gen(r.opts.seed + ctx + bsz)
    q, k, _, lens, _ = attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    meta = mod.BlockMetadata.build(k, lens, bs, kinds=(method,))
    nb = math.ceil((ctx + t) / bs)
    kinds = 1 if method == "mean" else 2
    unique = (
        bsz * NUM_KV_HEADS * nb * HEAD_DIM * 4 * kinds
        + bsz * t * NUM_Q_HEADS * HEAD_DIM * ELEM_BYTES
        + bsz * NUM_KV_HEADS * t * top_n * 4
    )
    rot = tm.num_rotations(unique)
    # Rotation sets: fresh queries and copies of the metadata (distinct memory, same values).
    sets = [(q, meta)]
    for _ in range(rot - 1):
        copies = {
            f.name: getattr(meta, f.name).clone()
            for f in dataclasses.fields(meta)
            if isinstance(getattr(meta, f.name), torch.Tensor)
        }
        sets.append((torch.randn_like(q), dataclasses.replace(meta, **copies)))
    p = dict(p, rotations=rot)
    flops = 2 * bsz * NUM_KV_HEADS * t * nb * HEAD_DIM * kinds

    def fn(i):
        qi, mi = sets[i]
        return mod.select_blocks(qi, mi, lens, top_n=top_n, method=method)

    r.time_op("select_blocks", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


# --------------------------------------------------------------------------- entry point


def parse_args(argv: list[str] | None = None) -> BenchOptions:
    fields = {f.name: f for f in dataclasses.fields(BenchOptions)}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help=fields["out"].metadata["help"])
    ap.add_argument("--quick", action="store_true", help=fields["quick"].metadata["help"])
    ap.add_argument("--ops", default=",".join(OPS), help=fields["ops"].metadata["help"])
    budget = fields["budget_s"]
    ap.add_argument("--budget-s", type=float, default=budget.default, help=budget.metadata["help"])
    ap.add_argument(
        "--seed", type=int, default=fields["seed"].default, help=fields["seed"].metadata["help"]
    )
    ap.add_argument("--json", action="store_true", help=fields["json"].metadata["help"])
    ap.add_argument(
        "--summary-only", action="store_true", help=fields["summary_only"].metadata["help"]
    )
    geometry = fields["geometry"]
    ap.add_argument("--geometry", default=geometry.default, help=geometry.metadata["help"])
    a = ap.parse_args(argv)
    ops = tuple(o.strip() for o in a.ops.split(",") if o.strip())
    return BenchOptions(
        out=a.out,
        quick=a.quick,
        ops=ops,
        budget_s=a.budget_s,
        seed=a.seed,
        json=a.json,
        summary_only=a.summary_only,
        geometry=a.geometry,
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.summary_only:
        summary = summarise(read_rows(opts.out / "kernel_bench.jsonl"))
        print(json.dumps(summary, indent=1) if opts.json else "", end="")
        if not opts.json:
            print_summary(summary)
        return 0
    if not torch.cuda.is_available():
        print("kernels.benchmark needs a CUDA GPU", file=sys.stderr)
        return 1
    use_geometry(opts.geometry)
    r = Runner(opts)
    print(
        f"{r.prov['device_name']}  torch {r.prov['torch_version']}  triton "
        f"{r.prov['triton_version']}  commit {r.prov['git_commit']}  -> {r.path}"
    )
    mods = {
        "sparse": _lazy("kernels.sparse_verify") if "sparse" in opts.ops else None,
        "nsa": _lazy("kernels.nsa_verify") if "nsa" in opts.ops else None,
        "select": _lazy("kernels.select_blocks") if "select" in opts.ops else None,
    }
    checks = {
        "dense": check_dense,
        "repair": check_repair,
        "sparse": lambda: check_sparse(mods["sparse"]),
        "nsa": lambda: check_nsa(mods["nsa"]),
        "select": lambda: check_select(mods["select"]),
    }
    try:
        for op in opts.ops:
            if op in mods and mods[op] is None:
                continue
            checks[op]()
            print(f"correctness: {op} ok")
    except CorrectnessError as e:
        print(f"\nCORRECTNESS FAILURE, nothing timed: {e}", file=sys.stderr)
        return 2
    torch.cuda.synchronize()
    r.measure_ceilings()
    sweeps = {
        "dense": dense_sweep,
        "sparse": sparse_sweep,
        "repair": repair_sweep,
        "nsa": nsa_sweep,
        "select": select_sweep,
    }
    for op in opts.ops:
        if op in mods and mods[op] is None:
            continue
        sweeps[op](r, mods.get(op))
        if r.stopped:
            break
    print(
        f"\n{r.num_written} rows written in {r.elapsed_s():.0f} s"
        + (" (stopped at the budget; rerun to resume)" if r.stopped else "")
    )
    summary = summarise(read_rows(r.path))
    if opts.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return STOPPED_AT_BUDGET if r.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
