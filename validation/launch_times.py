"""Each kernel launch of one call on the GPU with its device time (``torch.profiler``): where the
time of a latency-bound call of several launches goes (``validation.nsa_launches``,
``validation.engine_verify``'s attention ops).

The benchmarks that profile also time: each profiled session ends with CUPTI torn down
(``TEARDOWN_CUPTI=1``, read by the profiler's Kineto at the session's end). Left attached, CUPTI
adds host time to every later kernel launch in the process, which the CUDA-event timings after
the session count: a graph's launch and its time grow with its kernel count
(``validation.profiler_teardown``, ``validation/data/profiler-teardown-h200.json``)."""

from __future__ import annotations

import os
import statistics

import torch


def launch_times(fn, calls: int, inputs: int = 2) -> list[dict]:
    """The kernel launches of one ``fn(i)`` call in the order they start, each with its median
    device time (``torch.profiler``'s CUDA activity) over ``calls`` profiled calls (``fn(i)``
    for ``i`` rotating over ``inputs`` input sets) and whether it ran on a side stream (not the
    stream of the call's last launch; the unfused NSA calls' branches side by side,
    ``NsaVerifyConfig.branch_streams``). A launch is matched across calls by its stream and its
    place on it: launches on different streams may start in another order from call to call."""
    from torch.profiler import ProfilerActivity, profile

    os.environ["TEARDOWN_CUPTI"] = "1"
    for i in range(3):
        fn(i % inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i % inputs)
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    per_call, rest = divmod(len(kernels), calls)
    if rest or not per_call:
        raise SystemExit(f"launch_times: {len(kernels)} kernels over {calls} calls")
    times: dict[tuple, list[float]] = {}
    order, names = [], {}
    for c in range(calls):
        chunk = kernels[c * per_call : (c + 1) * per_call]
        main = chunk[-1].device_resource_id
        seen: dict[int, int] = {}
        for e in chunk:
            stream = e.device_resource_id
            key = (stream != main, stream, seen.setdefault(stream, 0))
            seen[stream] += 1
            name = kernel_name(e.name)
            if names.setdefault(key, name) != name:
                raise SystemExit(f"launch_times: launch {key} differs between calls: {name}")
            times.setdefault(key, []).append((e.time_range.end - e.time_range.start) * 1e-6)
            if c == 0:
                order.append(key)
    return [
        {"kernel": names[k], "side_stream": k[0], "median_s": statistics.median(times[k])}
        for k in order
    ]


def kernel_name(name: str) -> str:
    """A profiler kernel name without its template arguments (torch's fill kernels)."""
    return name.split("<")[0].removeprefix("void ").split("(")[0]
