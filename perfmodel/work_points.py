"""A launch plan's work counted at every point of broadcast columns: the step model prices a
grid of points whose shapes repeat (one batch, context and head geometry across strategies), so
each distinct point is counted once and the counts are scattered back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def at_distinct_points(
    shape: dict,
    work: Callable[[dict], object | None],
    fields: Sequence[str],
    *,
    floats: Sequence[str] = (),
    ceil: bool = False,
) -> dict[str, np.ndarray]:
    """``work(point)`` at every point of ``shape`` (field names to arrays or scalars that
    broadcast), one array per name of ``fields`` (the work record's attributes), evaluated once
    per distinct point. A point's values are integers (rounded; with ``ceil``, rounded up)
    except the names in ``floats``; ``work`` returns None for a point that counts nothing."""
    names = list(shape)
    args = np.broadcast_arrays(*(np.asarray(shape[n], dtype=float) for n in names))
    flat = np.stack([a.ravel() for a in args], axis=1)
    if ceil:
        flat = np.ceil(flat)
    distinct, inverse = np.unique(flat, axis=0, return_inverse=True)
    out = np.zeros((len(distinct), len(fields)))
    for i, point in enumerate(distinct):
        kw = {
            n: (float(v) if n in floats else int(round(v)))
            for n, v in zip(names, point, strict=True)
        }
        w = work(kw)
        if w is not None:
            out[i] = [getattr(w, f) for f in fields]
    return {f: out[inverse.ravel(), j].reshape(args[0].shape) for j, f in enumerate(fields)}
