"""Independent launch chains of one call side by side on the GPU.

A call that launches chains which do not read one another's outputs (the unfused NSA
baseline's branches: ``kernels.nsa_unfused.nsa_verify_unfused``) forks each onto a side stream
of the device, after everything queued on the caller's stream so far, and joins them back
before the launch that reads their outputs. At the sizes of decoding each launch is bound by
its ramp and tail rather than by its bytes, so chains that overlap take the time of the longest
instead of the sum. Under CUDA-graph capture the fork and the join are the graph's branches
and their merge point.

On the CPU (the Triton interpreter) there are no streams: every chain runs in order on the
caller's, which is how their launches are ordered there anyway."""

from __future__ import annotations

import contextlib

import torch

# Side streams by (device index, slot): made once and reused by every call, so a captured
# graph and the calls after it use the same streams.
_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def side_stream(device: torch.device, slot: int) -> torch.cuda.Stream:
    """The side stream ``slot`` of CUDA ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _STREAMS.get((index, slot))
    if stream is None:
        stream = _STREAMS[(index, slot)] = torch.cuda.Stream(device=index)
    return stream


class Branches:
    """The chains one call forks (``fork``) and joins (``join``); ``enabled`` False, or a
    device other than CUDA, runs every chain on the caller's stream."""

    __slots__ = ("device", "main", "_forked")

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device = torch.device(device)
        on = enabled and self.device.type == "cuda"
        self.main = torch.cuda.current_stream(self.device) if on else None
        self._forked: list[torch.cuda.Stream] = []

    @contextlib.contextmanager
    def fork(self, slot: int):
        """Launches inside the block run on side stream ``slot``, after everything the
        caller's stream has queued so far (on the caller's stream when not enabled).

        A tensor made before the fork and read on the side stream stays valid, since the
        caller waits for the side stream (``join``) before it goes on; a tensor made on the
        side stream belongs to that stream's pool of the caching allocator, which orders its
        next use after this one.
        """
        if self.main is None:
            yield
            return
        stream = side_stream(self.device, slot)
        stream.wait_stream(self.main)
        with torch.cuda.stream(stream):
            yield
        self._forked.append(stream)

    def join(self) -> None:
        """The caller's stream waits for every chain forked so far."""
        for stream in self._forked:
            self.main.wait_stream(stream)
        self._forked.clear()
