"""Selected-block overlap processes: per round and layer, how much the verifier queries of a group
share their selected blocks (gamma, seed 000) and how much a layer's selection shares with the
previous layer's (Jaccard, seed 001), and PRR's per-layer predictor hit rate (seed 004).

Fixed (spread 0): the configured means every round, no random draws. Spread > 0: each layer
draws from a Beta with the configured mean and standard deviation. Replay: the per-layer rows of
a trace, in order, wrapping around (a round without the field falls back to the mean).
"""

from __future__ import annotations

import numpy as np
from ssvkit.sim.acceptance import CHUNK


def beta_params(mean: float, std: float, what: str) -> tuple[float, float]:
    """Beta(a, b) with the given mean and standard deviation."""
    if not 0.0 < mean < 1.0:
        raise ValueError(f"{what}: a spread needs a mean strictly inside (0, 1), got {mean}")
    var = std * std
    kappa = mean * (1.0 - mean) / var - 1.0
    if kappa <= 0:
        raise ValueError(
            f"{what}: spread {std} is too large for mean {mean} "
            f"(must be below {np.sqrt(mean * (1 - mean)):.3f})"
        )
    return mean * kappa, (1.0 - mean) * kappa


class LayerValues:
    """A per-layer value in [0, 1] for each round: fixed, Beta-distributed or replayed."""

    def __init__(self, num_layers: int, mean: float, spread: float, rng, replay=None, what=""):
        self.num_layers = num_layers
        self.mean = mean
        self.fixed = spread == 0 and replay is None
        self._const = (tuple([float(mean)] * num_layers), float(mean))
        if replay is not None:
            rows = np.where(np.isnan(replay), mean, np.clip(replay, 0.0, 1.0))
            self._rows = [(tuple(r), float(np.mean(r))) for r in rows.tolist()]
            self._i = 0
        elif spread > 0:
            self._ab = beta_params(mean, spread, what)
            self._rng = rng
            self._rows = []
            self._i = 0
        self._replay = replay is not None

    def next(self) -> tuple[tuple[float, ...], float]:
        """``(per-layer values, their mean)`` for the next round."""
        if self.fixed:
            return self._const
        if self._replay:
            row = self._rows[self._i % len(self._rows)]
            self._i += 1
            return row
        if self._i >= len(self._rows):
            draws = self._rng.beta(*self._ab, size=(CHUNK, self.num_layers))
            self._rows = [(tuple(r), float(np.mean(r))) for r in draws.tolist()]
            self._i = 0
        row = self._rows[self._i]
        self._i += 1
        return row
