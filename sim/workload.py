"""Request streams: seeded random streams, request lengths and arrival times.

Every random quantity of a run comes from its own stream spawned from the run's seed
(``numpy.random.SeedSequence``), so changing how one process draws never shifts another's.
Lengths are lognormal around the configured means (mean-preserving; sigma 0 = fixed);
arrivals are Poisson or read from a CSV file of ``arrival_s,prompt_len,output_len``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.files import read_text

STREAMS = ("acceptance", "group_overlap", "layer_overlap", "lengths", "arrivals", "misses")


def streams(seed: int) -> dict[str, np.random.SeedSequence]:
    """One seed sequence per named stream (``STREAMS``), fixed by ``seed``."""
    return dict(zip(STREAMS, np.random.SeedSequence(seed).spawn(len(STREAMS)), strict=True))


def generators(seq: np.random.SeedSequence, n: int) -> list[np.random.Generator]:
    """``n`` independent generators under one stream (one per sequence of a batch)."""
    return [np.random.default_rng(s) for s in seq.spawn(n)]


def lengths(rng: np.random.Generator, mean: int, sigma: float, n: int) -> np.ndarray:
    """``n`` positive integer lengths, lognormal with the given mean (sigma 0: all ``mean``)."""
    if sigma == 0:
        return np.full(n, mean, dtype=int)
    z = rng.standard_normal(n)
    return np.maximum(np.rint(mean * np.exp(sigma * z - sigma * sigma / 2)), 1).astype(int)


def poisson_arrivals(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second, starting at 0."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be > 0, got {rate}")
    gaps = rng.exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def read_arrivals(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(arrival_s, prompt_len, output_len)`` from a CSV with that header, sorted by arrival
    (stable, so equal times keep file order)."""
    p = Path(path)
    rows = list(csv.DictReader(io.StringIO(read_text(p, "arrivals file"), newline="")))
    need = ("arrival_s", "prompt_len", "output_len")
    if not rows or any(k not in rows[0] for k in need):
        raise ValueError(f"arrivals file {str(p)!r} needs a header {','.join(need)} and rows")
    try:
        t = np.array([float(r["arrival_s"]) for r in rows])
        pl = np.array([int(r["prompt_len"]) for r in rows])
        ol = np.array([int(r["output_len"]) for r in rows])
    except (TypeError, ValueError):
        raise ValueError(f"arrivals file {str(p)!r} has a non-numeric value") from None
    if (t < 0).any() or not np.isfinite(t).all():
        raise ValueError(f"arrivals file {str(p)!r}: arrival_s must be finite and >= 0")
    if (pl < 1).any() or (ol < 1).any():
        raise ValueError(f"arrivals file {str(p)!r}: prompt_len and output_len must be >= 1")
    order = np.argsort(t, kind="stable")
    return t[order], pl[order], ol[order]
