"""Arrival counters: a step that depends on other programs' results runs in the same launch.

Several programs of one launch write parts of one output (the slots of an NSA row tile, the
score ranges of a selection's rows). Instead of a second launch that combines them, the step
that needs them runs in the launch: the last program to arrive does it (``last_to_arrive``),
or extra programs of the launch, as many as the step has parts, wait for the parts on tickets
(``take_ticket``, ``arrive``, ``wait_for``, ``leave``), which cannot deadlock.

Either way a launch leaves its counters as it found them (zero): the next launch and every
replay of a CUDA graph find them ready, with no memset and no host work. The counters are
``arrival_counters``' buffer, one per device and lane; launches that share it must be ordered on
one stream. Launches that may run at the same time (a call's chains forked onto side streams,
``kernels.branch_streams``) take different lanes: two grids counting on one counter at once
would hand out one ticket sequence between them, and a waiting program could wait forever.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Counters of the first buffer of a device: every launch of the engine's shapes fits in it.
MIN_COUNTERS = 4096
_BUFFERS: dict[tuple[str, int], list[torch.Tensor]] = {}


def arrival_counters(num: int, device: torch.device, lane: int = 0) -> torch.Tensor:
    """An int32 buffer of at least ``num`` zeroed counters on ``device`` for launches of
    ``lane``, which every kernel using ``last_to_arrive`` leaves zeroed. Buffers are kept
    (never freed), so a CUDA graph captured with one stays valid when a larger one is made.
    Inside a graph capture a buffer too small is not replaced: the call gets a zeroed buffer of
    its own, whose zeroing the graph replays (a capture normally follows a warm-up run that
    made the buffer).

    Launches of one lane share its buffer and must be ordered on one stream, as the launches of
    a CUDA graph and of the engine's step are; a chain forked onto a side stream takes a lane of
    its own (``kernels.pdl.LaunchChain.lane``), so its counters are never another running
    launch's.
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if lane < 0:
        raise ValueError(f"lane must be >= 0, got {lane}")
    device = torch.device(device)
    bufs = _BUFFERS.setdefault((_key(device), lane), [])
    if bufs and bufs[-1].numel() >= num:
        return bufs[-1]
    size = max(MIN_COUNTERS, triton.next_power_of_2(num))
    buf = torch.zeros(size, dtype=torch.int32, device=device)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        bufs.append(buf)
    return buf


def counter_buffers(device: torch.device) -> tuple[torch.Tensor, ...]:
    """Every counter buffer made on ``device`` so far, of every lane: all zero whenever no
    launch using them is running."""
    key = _key(torch.device(device))
    return tuple(b for (dev, _), bufs in _BUFFERS.items() if dev == key for b in bufs)


def _key(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


@triton.jit
def last_to_arrive(counter_ptr, arrivals):
    """Count this program's arrival at ``counter_ptr`` (one of ``arrivals`` programs); True in
    the last to arrive, which may then read every program's stores and which sets the counter
    back to 0. Call it at the top level of a kernel (every thread of the program reaches its
    barriers), after the program's partial stores. For a step one program does well.

    Memory order (Triton 3.6 inserts no CTA barrier around an atomic): a CTA barrier first puts
    every thread's stores before the one thread's increment, whose release (``acq_rel``) at GPU
    scope publishes them; the increment that sees every arrival acquires them, and a second
    barrier orders it before the program's threads read the parts (with L2 loads,
    ``cache_modifier=".cg"``, so no stale L1 line is read).
    """
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    last = seen == arrivals - 1
    tl.store(counter_ptr, 0, mask=last)
    return last


@triton.jit
def take_ticket(counter_ptr):
    """This program's place in start order among the launch's (a 1-D grid); the last ticket
    sets the counter back to 0 (every other program has taken its ticket by then).

    Every program takes a ticket when it starts, and tickets, not program ids, assign the work:
    producers first, then the steps that wait on them (``wait_for``), so a waiting program only
    waits on producers that already hold a ticket, i.e. are running, whatever order the GPU
    starts programs in: waiting cannot deadlock. The last waiter of an output zeroes its
    counters (``leave``).
    """
    ticket = tl.atomic_add(counter_ptr, 1, sem="relaxed", scope="gpu")
    tl.store(counter_ptr, 0, mask=ticket == tl.num_programs(0) - 1)
    return ticket


@triton.jit
def arrive(counter_ptr):
    """Publish this program's stores and count it at ``counter_ptr``. Call it at the top level
    of the program's branch, after its stores: a CTA barrier puts every thread's stores before
    the one thread's increment, whose release at GPU scope publishes them."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def wait_for(counter_ptr, arrivals):
    """Wait until ``arrivals`` programs have arrived at ``counter_ptr``; their stores are then
    visible to every thread of this program: the poll that sees every arrival acquires them and
    a CTA barrier orders it before the reads (read them with ``.cg`` loads, so no stale L1 line
    is read)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < arrivals:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def leave(arrive_ptr, done_ptr, waiters):
    """Count this program out of the ``waiters`` that waited at ``arrive_ptr``; the last sets
    both counters back to 0 (every waiter has stopped reading ``arrive_ptr`` by then)."""
    done = tl.atomic_add(done_ptr, 1, sem="relaxed", scope="gpu")
    if done == waiters - 1:
        tl.store(arrive_ptr, 0)
        tl.store(done_ptr, 0)
