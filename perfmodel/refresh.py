"""Refresh/reuse schedules over layers (seed 000 "Core Mechanism 2": refresh layers recompute
the selected blocks, reuse layers inherit them and run one fused kernel). The step model prices a
refresh interval; seed 001's anchor layers (Jaccard, eqs. 7-9) and the schedule-cost formula are
in ``perfmodel.seed_formulas``.
"""

from __future__ import annotations

import numpy as np


def schedule_every(num_layers: int, refresh_every: int, first_refresh: int = 0) -> np.ndarray:
    """Boolean refresh vector r of length L: layer j refreshes when
    ``(j - first_refresh) % refresh_every == 0`` and j >= first_refresh; layer 0 always
    refreshes (nothing precedes it to reuse)."""
    if num_layers < 1 or refresh_every < 1:
        raise ValueError(
            f"num_layers and refresh_every must be >= 1, got {num_layers}, {refresh_every}"
        )
    j = np.arange(num_layers)
    r = (j >= first_refresh) & ((j - first_refresh) % refresh_every == 0)
    r[0] = True
    return r
