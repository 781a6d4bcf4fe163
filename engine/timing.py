"""Step timers of the decode loop: CUDA events on the GPU, the wall clock on the CPU.

``mark(name)`` closes the step that began at the previous mark. On CUDA the marks are events
recorded on the stream (no synchronisation); ``read()`` returns the step durations once the
stream has passed the last mark, which the loop guarantees by reading the accepted counts
first. On the CPU every op is synchronous, so ``time.perf_counter`` deltas are the step times.

The stream is looked up once per round (``start``): ``Event.record()`` without one looks up the
current stream through torch's device-index helpers on every mark (five a round), host time on
the round's critical path.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    """Durations of consecutive named steps of one round."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.source = "cuda-events" if self.cuda else "wall-clock"
        self._stream = None
        self._marks: list[tuple[str, object]] = []

    def start(self) -> None:
        self._stream = torch.cuda.current_stream() if self.cuda else None
        self._marks = [("", self._now())]

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self._stream)
            return ev
        return time.perf_counter()

    def read(self) -> dict[str, float]:
        """Seconds per step (a repeated name accumulates), after the last mark completed."""
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self._marks, self._marks[1:], strict=False):
            dt = a.elapsed_time(b) * 1e-3 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + max(dt, 0.0)
        return out
