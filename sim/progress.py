"""Progress of a long run: a tqdm bar over the units done (tokens simulated, sweep points).

The bar goes to a terminal's stderr unless told otherwise, appears once a run has taken
``delay_s`` (short runs print nothing) and is cleared when the run ends. It is refreshed every
~1% of the total, so a report (the recorder's, every round) costs an integer addition.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """Units (``unit``, default tokens) done out of ``total`` (set by ``start``), shown under
    ``label`` on ``file`` (default stderr) when it is a terminal, or always with
    ``enabled=True``, never with ``enabled=False``."""

    def __init__(
        self,
        label: str,
        *,
        unit: str = "tok",
        file=None,
        enabled: bool | None = None,
        delay_s: float = 1.0,
    ) -> None:
        self.label, self.unit, self.delay_s = label, unit, delay_s
        self.file = file if file is not None else sys.stderr
        self.enabled = self.file.isatty() if enabled is None else enabled
        self._bar: tqdm | None = None
        self._pending = 0
        self._step = 1

    @property
    def done(self) -> int:
        """Units counted so far (0 when not shown)."""
        return 0 if self._bar is None else self._bar.n + self._pending

    def start(self, total: int) -> None:
        self.close()
        if not self.enabled:
            return
        self._bar = tqdm(
            total=total,
            desc=self.label,
            unit=self.unit,
            file=self.file,
            delay=self.delay_s,
            leave=False,
        )
        self._step = max(total // 100, 1)
        self._pending = 0

    def advance(self, tokens: int) -> None:
        if self._bar is None:
            return
        self._pending += tokens
        if self._pending >= self._step:
            self._bar.update(min(self._pending, self._bar.total - self._bar.n))
            self._pending = 0

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
