"""Arrival counters: the last program of a group finishes the group's work in the same launch.

Several programs of one launch write partial results of one output (the slots of an NSA row
tile, the score tiles of a selection row). Instead of a second launch that combines them, each
program, after writing its part, increments the output's counter (``last_to_arrive``); the one
that reads back ``arrivals - 1`` is the last, combines the parts and writes the output, and sets
the counter back to 0. A launch therefore leaves its counters as it found them (zero): the next
launch and every replay of a CUDA graph find them ready, with no memset and no host work.

Memory order (Triton 3.6 inserts no CTA barrier around an atomic): a CTA barrier first puts
every thread's partial stores before the one thread's increment, whose ``acq_rel`` at GPU scope
releases them; the increment that reads ``arrivals - 1`` acquires the others' releases, and a
second barrier orders it before the last program's threads read the parts (with L2 loads,
``cache_modifier=".cg"``, so no stale L1 line is read).

``arrival_counters`` hands out one zeroed buffer per device, kept for the life of the process
(a captured graph holds its address); launches that share it must be ordered on one stream, as
the launches of a CUDA graph and of the engine's step are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Counters of the first buffer of a device: every launch of the engine's shapes fits in it.
MIN_COUNTERS = 4096
_BUFFERS: dict[str, list[torch.Tensor]] = {}


def arrival_counters(num: int, device: torch.device) -> torch.Tensor:
    """An int32 buffer of at least ``num`` zeroed counters on ``device``, which every kernel
    using ``last_to_arrive`` leaves zeroed. Buffers are kept (never freed), so a CUDA graph
    captured with one stays valid when a larger one is made. Inside a graph capture a buffer
    too small is not replaced: the call gets a zeroed buffer of its own, whose zeroing the
    graph replays (a capture normally follows a warm-up run that made the buffer)."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    bufs = _BUFFERS.setdefault(str(device), [])
    if bufs and bufs[-1].numel() >= num:
        return bufs[-1]
    size = max(MIN_COUNTERS, triton.next_power_of_2(num))
    buf = torch.zeros(size, dtype=torch.int32, device=device)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        bufs.append(buf)
    return buf


@triton.jit
def last_to_arrive(counter_ptr, arrivals):
    """Count this program's arrival at ``counter_ptr`` (one of ``arrivals`` programs); True in
    the last to arrive, which may then read every program's stores and which sets the counter
    back to 0. Call it at the top level of a kernel (every thread of the program reaches its
    barriers), after the program's partial stores."""
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    last = seen == arrivals - 1
    tl.store(counter_ptr, 0, mask=last)
    return last
