"""What a ``torch.profiler`` session leaves behind for the timings after it: the host's launch
of a CUDA graph and the graph's CUDA-event time, before and after one profiled call, in a fresh
process with CUPTI torn down at the session's end (``TEARDOWN_CUPTI=1``, what
``validation.launch_times`` sets) and in one without (``TEARDOWN_CUPTI=0``).

    python -m ssvkit.validation.profiler_teardown --out validation/data/profiler-teardown-h200.json

The graph holds ``GRAPH_LAUNCHES`` launches of an empty Triton kernel, about as many launches as
the engine's verify step has at Llama-3.1-8B geometry (32 layers). A sample drains the stream,
records the start event, launches the replay (its host time: ``host_s``) and records the end
event (``event_s``): with the stream drained the start event fires at once, so ``event_s``
counts the host's launch of the graph, as ``kernels.timing``'s samples do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write

GRAPH_LAUNCHES = 350
SAMPLES = 21
SETTINGS = ("0", "1")


def _graph_samples(graph: torch.cuda.CUDAGraph) -> dict[str, float]:
    """Median host launch and CUDA-event time of ``SAMPLES`` replays, the stream drained before
    each."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    host, event = [], []
    for _ in range(SAMPLES):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        graph.replay()
        host.append(time.perf_counter() - t0)
        end.record()
        torch.cuda.synchronize()
        event.append(start.elapsed_time(end) * 1e-3)
    return {"host_s": statistics.median(host), "event_s": statistics.median(event)}


def child() -> dict:
    """In this process (its ``TEARDOWN_CUPTI`` as given): the graph's samples before and after
    one profiled replay."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.empty(1, device="cuda")
    for _ in range(3):
        tm.empty_kernel[(1,)](x, N=1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_LAUNCHES):
            tm.empty_kernel[(1,)](x, N=1)
    graph.replay()
    before = _graph_samples(graph)
    with profile(activities=[ProfilerActivity.CUDA]):
        graph.replay()
        torch.cuda.synchronize()
    return {"before": before, "after": _graph_samples(graph)}


def measure(setting: str) -> dict:
    """``child`` in a fresh Python process with ``TEARDOWN_CUPTI=setting``."""
    env = {**os.environ, "TEARDOWN_CUPTI": setting}
    cmd = [sys.executable, "-m", "ssvkit.validation.profiler_teardown", "--child"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"profiler_teardown: the child with TEARDOWN_CUPTI={setting}: {last}")
    return {"teardown_cupti": setting, **json.loads(done.stdout.strip().splitlines()[-1])}


def table(rows: list[dict]) -> str:
    lines = ["TEARDOWN_CUPTI  host launch us (before -> after)  graph event us (before -> after)"]
    for r in rows:
        b, a = r["before"], r["after"]
        lines.append(
            f"{r['teardown_cupti']:>14s}  {b['host_s'] * 1e6:8.1f} -> {a['host_s'] * 1e6:8.1f}"
            f"          {b['event_s'] * 1e6:8.1f} -> {a['event_s'] * 1e6:8.1f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="JSON file to write")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.exit(2, "profiler_teardown: needs a CUDA GPU\n")
    if args.child:
        print(json.dumps(child()))
        return 0
    if args.out is None:
        p.error("--out is required")
    rows = [measure(s) for s in SETTINGS]
    doc = {
        "benchmark": "profiler_teardown",
        "graph_launches": GRAPH_LAUNCHES,
        "samples": SAMPLES,
        "provenance": tm.provenance(),
        "rows": rows,
    }
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n", "--out")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
