"""A plain-text progress bar on stderr (no dependency).

On a terminal it redraws one line in place at most five times a second; elsewhere (CI logs,
pipes) it prints a line at each tenth of the work, so logs stay short.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """``update(n)`` adds n done units of ``total``; ``close()`` ends the line."""

    def __init__(self, label: str, total: int, unit: str = "points", stream=None, enabled=True):
        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and self.total > 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._last_tenth = -1
        if self.enabled:
            self._draw(force=True)

    def update(self, n: int) -> None:
        self.done = min(self.total, self.done + int(n))
        if self.enabled:
            self._draw()

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        width = 24
        full = int(round(frac * width))
        elapsed = time.perf_counter() - self.t0
        eta = f"  eta {elapsed / frac - elapsed:5.1f} s" if 0 < frac < 1 else ""
        return (
            f"{self.label} [{'#' * full}{'.' * (width - full)}] {100 * frac:3.0f}% "
            f"{self.done:,}/{self.total:,} {self.unit}  {elapsed:5.1f} s{eta}"
        )

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            if force or self.done == self.total or now - self._last_draw >= 0.2:
                self.stream.write("\r" + self.line())
                self.stream.flush()
                self._last_draw = now
            return
        tenth = int(10 * self.done / self.total)
        if force or tenth > self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()
        self.enabled = False
