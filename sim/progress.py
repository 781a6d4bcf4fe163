"""Progress of a long simulation: a tqdm bar on stderr over the output tokens simulated.

The bar appears only once a run has taken a second (short runs print nothing), only on a
terminal (tqdm's default), and is cleared when the run ends. The recorder reports every round;
the bar is refreshed every ~1% of the total, so a round costs an integer addition.
"""

from __future__ import annotations

from tqdm import tqdm


class Progress:
    """Tokens simulated out of ``total`` (set by ``start``), shown under ``label``."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar: tqdm | None = None
        self._pending = 0
        self._step = 1

    def start(self, total: int) -> None:
        self.close()
        self._bar = tqdm(total=total, desc=self.label, unit="tok", delay=1.0, leave=False)
        self._step = max(total // 100, 1)
        self._pending = 0

    def advance(self, tokens: int) -> None:
        self._pending += tokens
        if self._pending >= self._step and self._bar is not None:
            self._bar.update(min(self._pending, self._bar.total - self._bar.n))
            self._pending = 0

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
