"""Host cost of the loop's CUDA calls on this machine (GPU kept busy by torch.cuda._sleep)."""
# ruff: noqa: E501  (one-off device script: its printed-table f-strings)

import os
import platform
import statistics
import time

import torch

dev = torch.device("cuda")
x = torch.randn(1024, device=dev)
y = torch.randn(1024, device=dev)


def busy():
    torch.cuda._sleep(50_000_000)


def t(name, fn, n=200):
    torch.cuda.synchronize()
    busy()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    print(
        f"{name:40s} median {statistics.median(ts) * 1e6:7.1f} us  p90 {sorted(ts)[int(0.9 * n)] * 1e6:7.1f}",
        flush=True,
    )


events = []
t(
    "Event(enable_timing).record",
    lambda: events.append(torch.cuda.Event(enable_timing=True)) or events[-1].record(),
)
pool = [torch.cuda.Event(enable_timing=True) for _ in range(400)]
for e in pool:
    e.record()
torch.cuda.synchronize()
it = iter(pool)
t("reused Event.record", lambda: next(it).record())
t("torch.ones(1, device)", lambda: torch.ones(1, dtype=torch.int32, device=dev))
t("zeros_like", lambda: torch.zeros_like(x))
t("x.add_(y)", lambda: x.add_(y))
t("copy_ non_blocking d2d", lambda: x.copy_(y, non_blocking=True))
t("index x[idx]", lambda: x[torch.arange(4, device=dev)])
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        x.add_(y)
torch.cuda.current_stream().wait_stream(s)
for n in (1, 50, 200, 400):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(y)
    g.replay()
    torch.cuda.synchronize()
    t(f"graph replay {n} nodes", g.replay, 100)
print("python loop 1e5 adds:", end=" ")
t0 = time.perf_counter()
a = 0
for i in range(100000):
    a += i
print(f"{(time.perf_counter() - t0) * 1e3:.2f} ms")
print(platform.processor(), os.cpu_count())
print(open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0])
