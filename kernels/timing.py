"""The one GPU timing helper every benchmark uses (after flashinfer's ``bench_gpu_time``).

Two ways to time an op on the GPU, both with CUDA events, a warm-up, and a cold L2 per sample
(``L2_FLUSH_BYTES`` read before it, ``_L2Flusher``):

- ``launch``: one plain Python launch per sample, the stream drained before it, so the sample
  includes the host's launch path;
- ``graph``: ``graph_launches`` launches captured in one CUDA graph, replayed, the elapsed time
  divided by the launch count: what the engine sees, with launch cost hidden. The launches of a
  graph run back to back, so the caller rotates over ``num_inputs`` input sets (``fn(i)`` uses
  set ``i % num_inputs``, ``num_rotations``) whose total size exceeds the L2.

On the CPU, ``wall`` times plain calls by the host's wall clock. The ceilings measured in the
same run, a result row's provenance and the poisoning helpers of correctness checks live here too.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from ssvkit.perfmodel.numbers import require_at_least_one

L2_FLUSH_BYTES = 256 * 2**20
TIMINGS = ("launch", "graph")
# The host's wall clock (``bench_wall``): a CPU's timing, never a calibration row's.
WALL = "wall"


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """How many samples to take; the defaults give a stable median in well under a second for
    kernels of 10 us to 10 ms."""

    warmup: int = field(default=5, metadata={"help": "untimed launches before sampling"})
    reps: int = field(default=50, metadata={"help": "samples in launch mode"})
    graph_launches: int = field(default=20, metadata={"help": "launches captured per graph"})
    graph_reps: int = field(default=15, metadata={"help": "graph replays sampled"})
    flush_l2: bool = field(default=True, metadata={"help": "read 256 MB before every sample"})
    flush_write: bool = field(
        default=False,
        metadata={
            "help": "flush by writing the 256 MB instead (the rows measured before the read "
            "flush: each sample then pays the write-back of the dirty lines it leaves)"
        },
    )
    max_total_s: float = field(
        default=1.0, metadata={"help": "take fewer samples when they would exceed this"}
    )

    def __post_init__(self) -> None:
        require_at_least_one(self, ("reps", "graph_launches", "graph_reps"))
        if self.warmup < 1:
            raise ValueError(f"warmup must be >= 1 (compiles before capture), got {self.warmup}")


DEFAULT_TIMING = TimingConfig()
QUICK_TIMING = TimingConfig(warmup=3, reps=20, graph_launches=10, graph_reps=7, max_total_s=0.4)


@dataclass(frozen=True, slots=True)
class Timing:
    """Summary of one timed op, seconds per launch."""

    median_s: float
    p10_s: float
    p90_s: float
    timing: str  # launch | graph | wall
    num_samples: int


def _summarise(samples_s: list[float], timing: str) -> Timing:
    a = np.asarray(samples_s, dtype=np.float64)
    return Timing(
        median_s=float(np.median(a)),
        p10_s=float(np.percentile(a, 10)),
        p90_s=float(np.percentile(a, 90)),
        timing=timing,
        num_samples=int(a.size),
    )


class _L2Flusher:
    """Reads ``L2_FLUSH_BYTES`` (five times the H100's 50 MB L2) before a sample: the L2 then
    holds none of the inputs, and only clean lines, so the sample does not pay for writing back
    dirty lines it did not make (the previous sample's are written back during the read). A
    write flush (``flush_write``) leaves the L2 full of dirty lines, written back as the sample
    evicts them: 6-12 us a sample for the H200's weight-streaming GEMMs, none for an op that
    reads little (``validation/data/l2-flush-h200.json``)."""

    def __init__(self, config: TimingConfig, device: torch.device) -> None:
        self.write = config.flush_write
        self.buf = (
            torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
            if config.flush_l2
            else None
        )

    def __call__(self) -> None:
        if self.buf is None:
            return
        if self.write:
            self.buf.fill_(1.0)
        else:
            self.buf.sum()


def _scaled_reps(per_sample_s: float, reps: int, config: TimingConfig) -> int:
    """Fewer samples (5 at least) for slow ops, so a measurement takes about ``max_total_s``."""
    return max(5, min(reps, int(config.max_total_s / max(per_sample_s, 1e-9))))


def bench_launch(
    fn: Callable[[int], object], *, num_inputs: int = 1, config: TimingConfig = DEFAULT_TIMING
) -> Timing:
    """Time plain launches: drain the stream, flush L2, record, launch ``fn(i)``, record."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _L2Flusher(config, device)
    for i in range(config.warmup):
        fn(i % num_inputs)
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    fn(0)
    t1.record()
    torch.cuda.synchronize()
    reps = _scaled_reps(t0.elapsed_time(t1) * 1e-3, config.reps, config)
    samples = []
    for r in range(reps):
        flush()
        # Drained stream: the start event fires at once, so the host launch path is timed too.
        torch.cuda.synchronize()
        t0.record()
        fn(r % num_inputs)
        t1.record()
        torch.cuda.synchronize()
        samples.append(t0.elapsed_time(t1) * 1e-3)
    return _summarise(samples, "launch")


def bench_graph(
    fn: Callable[[int], object], *, num_inputs: int = 1, config: TimingConfig = DEFAULT_TIMING
) -> Timing:
    """Time CUDA-graph replay: ``graph_launches`` calls of ``fn`` (rotating over the input sets)
    in one graph; each sample is one replay after an L2 flush, divided by the launch count."""
    return bench_graphs([fn], num_inputs=num_inputs, config=config)[0]


def bench_graphs(
    fns: Sequence[Callable[[int], object]],
    *,
    num_inputs: int = 1,
    config: TimingConfig = DEFAULT_TIMING,
) -> list[Timing]:
    """``bench_graph`` of several functions at once, their samples interleaved: each round
    replays every graph once (after an L2 flush each), starting one graph later each round, so
    a drift of the GPU's speed over the run reaches each function alike and their ratios
    compare like with like. All graphs are captured before the first sample."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _L2Flusher(config, device)
    n = config.graph_launches
    graphs = [_captured(fn, num_inputs, config) for fn in fns]
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for graph in graphs:
        graph.replay()
    t1.record()
    torch.cuda.synchronize()
    reps = _scaled_reps(t0.elapsed_time(t1) * 1e-3, config.graph_reps, config)
    samples: list[list[float]] = [[] for _ in graphs]
    for r in range(reps):
        for k in range(len(graphs)):
            j = (r + k) % len(graphs)
            flush()
            torch.cuda.synchronize()
            t0.record()
            graphs[j].replay()
            t1.record()
            torch.cuda.synchronize()
            samples[j].append(t0.elapsed_time(t1) * 1e-3 / n)
    del graphs
    return [_summarise(s, "graph") for s in samples]


def _captured(fn: Callable[[int], object], num_inputs: int, config: TimingConfig):
    """A CUDA graph of ``graph_launches`` calls of ``fn``, warmed up (off the capture stream)
    and uploaded (replayed once)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocator) off the capture stream
        for i in range(config.warmup):
            fn(i % num_inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(config.graph_launches):
            fn(i % num_inputs)
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    return graph


def bench_wall(
    fn: Callable[[int], object], *, num_inputs: int = 1, config: TimingConfig = DEFAULT_TIMING
) -> Timing:
    """Time plain calls by the host's wall clock, for a device without CUDA events (the CPU):
    warm-up, then ``reps`` samples (fewer for slow calls, as ``bench_launch``), each one call."""
    for i in range(config.warmup):
        fn(i % num_inputs)
    t0 = time.perf_counter()
    fn(0)
    reps = _scaled_reps(time.perf_counter() - t0, config.reps, config)
    samples = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r % num_inputs)
        samples.append(time.perf_counter() - t0)
    return _summarise(samples, WALL)


def bench(
    fn: Callable[[int], object],
    timing: str,
    *,
    num_inputs: int = 1,
    config: TimingConfig = DEFAULT_TIMING,
) -> Timing:
    """Time ``fn`` in mode ``timing`` (``launch`` or ``graph``; ``wall``: the host's wall
    clock, ``bench_wall``)."""
    if timing == WALL:
        return bench_wall(fn, num_inputs=num_inputs, config=config)
    if timing == "launch":
        return bench_launch(fn, num_inputs=num_inputs, config=config)
    if timing == "graph":
        return bench_graph(fn, num_inputs=num_inputs, config=config)
    raise ValueError(f"timing must be one of {(*TIMINGS, WALL)}, got {timing!r}")


def num_rotations(working_set_bytes: int, *, max_sets: int = 8) -> int:
    """Input sets to rotate over so their total exceeds the L2 flush size (1 when one set
    already does)."""
    if working_set_bytes <= 0:
        return max_sets
    return int(min(max_sets, max(1, -(-L2_FLUSH_BYTES // working_set_bytes))))


@triton.jit
def empty_kernel(x_ptr, N: tl.constexpr):
    """A kernel that does nothing: launched on one program, the launch floor."""
    tl.static_assert(N >= 1)


def empty_kernel_s(timing: str, config: TimingConfig = DEFAULT_TIMING) -> float:
    """Median time of an empty Triton kernel in mode ``timing``: the launch floor."""
    x = torch.empty(1, device="cuda")
    return bench(lambda i: empty_kernel[(1,)](x, N=1), timing, config=config).median_s


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy_rates(nbytes: int = 2**31, config: TimingConfig = DEFAULT_TIMING) -> dict[str, float]:
    """Device-to-device copy bandwidth of ``nbytes`` (read + write bytes counted), three ways:
    ``memcpy_launch`` (``Tensor.copy_``, a cudaMemcpyAsync per launch), ``memcpy_graph`` (the
    same captured in a graph, where it may run on a copy engine) and ``triton_graph`` (a plain
    Triton load/store kernel in a graph: what a streaming kernel can reach)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    n = src.numel()
    block = 8192
    grid = (triton.cdiv(n, block),)
    cfg = TimingConfig(warmup=2, reps=config.reps, graph_launches=4, graph_reps=config.graph_reps)
    moved = 2 * n * 4
    return {
        "memcpy_launch": moved / bench(lambda i: dst.copy_(src), "launch", config=cfg).median_s,
        "memcpy_graph": moved / bench(lambda i: dst.copy_(src), "graph", config=cfg).median_s,
        "triton_graph": moved
        / bench(
            lambda i: _copy_kernel[grid](src, dst, n, BLOCK=block), "graph", config=cfg
        ).median_s,
    }


def copy_bytes_per_s(nbytes: int = 2**31, config: TimingConfig = DEFAULT_TIMING) -> float:
    """The copy ceiling: the best of ``copy_rates`` (read + write bytes per second)."""
    return max(copy_rates(nbytes, config).values())


def gemm_flops_per_s(n: int = 8192, config: TimingConfig = DEFAULT_TIMING) -> float:
    """Dense bf16 GEMM rate (``n x n x n``, 2 n^3 FLOPs) through torch/cuBLAS."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    cfg = TimingConfig(warmup=2, reps=config.reps, graph_launches=4, graph_reps=config.graph_reps)
    t = bench(lambda i: a @ b, "graph", config=cfg)
    return 2 * n**3 / t.median_s


def poison_(*tensors: torch.Tensor) -> None:
    """Fill floating tensors with NaN and integer tensors with -7 (an impossible value)."""
    for x in tensors:
        x.fill_(float("nan") if x.is_floating_point() else -7)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Make ``torch.empty``/``torch.empty_like`` return poisoned tensors inside the block, so an
    output element a kernel forgets to write shows up as NaN (or -7) instead of stale memory."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned_empty(*args, **kwargs):
        x = empty(*args, **kwargs)
        poison_(x)
        return x

    def poisoned_empty_like(*args, **kwargs):
        x = empty_like(*args, **kwargs)
        poison_(x)
        return x

    torch.empty, torch.empty_like = poisoned_empty, poisoned_empty_like
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def git_commit() -> str:
    """HEAD of the checkout holding this file, ``+dirty`` when it has uncommitted changes.

    ``SSVKIT_GIT_COMMIT`` overrides it: the GPU machine receives a copy of the working tree
    without ``.git``, so the launching side passes the commit it sent."""
    if os.environ.get("SSVKIT_GIT_COMMIT"):
        return os.environ["SSVKIT_GIT_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def provenance() -> dict[str, str]:
    """Device, versions, commit and UTC timestamp for a result row."""
    return {
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch_version": torch.__version__,
        "triton_version": triton.__version__,
        "git_commit": git_commit(),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
