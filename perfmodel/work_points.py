"""A launch plan's work counted at every point of broadcast columns: the step model prices a
grid of points whose shapes repeat (one batch, context and head geometry across strategies), so
each distinct point is counted once and the counts are scattered back. The counts of a point
are also kept for the process (``memo_key``): sweeps, rankings and simulations price the same
points again and again, and a launch plan's count is a pure function of its point."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# Counted points kept for the process, by (memo key, field names, point); cleared when full.
_COUNTED: dict[tuple, list[float] | None] = {}
COUNTED_LIMIT = 1 << 18


def at_distinct_points(
    shape: dict,
    work: Callable[[dict], object | None],
    fields: Sequence[str],
    *,
    floats: Sequence[str] = (),
    ceil: bool = False,
    memo_key: tuple | None = None,
) -> dict[str, np.ndarray]:
    """``work(point)`` at every point of ``shape`` (field names to arrays or scalars that
    broadcast), one array per name of ``fields`` (the work record's attributes), evaluated once
    per distinct point. A point's values are integers (rounded; with ``ceil``, rounded up)
    except the names in ``floats``; ``work`` returns None for a point that counts nothing.
    ``memo_key`` names ``work`` and every argument it takes besides the point (a plan
    function's GPU and mode): a point counted under the same key is not counted again."""
    names = list(shape)
    args = np.broadcast_arrays(*(np.asarray(shape[n], dtype=float) for n in names))
    flat = np.stack([a.ravel() for a in args], axis=1)
    if ceil:
        flat = np.ceil(flat)
    distinct, inverse = np.unique(flat, axis=0, return_inverse=True)
    out = np.zeros((len(distinct), len(fields)))
    prefix = None if memo_key is None else (memo_key, tuple(names), tuple(fields), tuple(floats))
    for i, point in enumerate(distinct):
        key = None if prefix is None else (prefix, tuple(point.tolist()))
        if key is not None and key in _COUNTED:
            counts = _COUNTED[key]
        else:
            kw = {
                n: (float(v) if n in floats else int(round(v)))
                for n, v in zip(names, point, strict=True)
            }
            w = work(kw)
            counts = None if w is None else [getattr(w, f) for f in fields]
            if key is not None:
                if len(_COUNTED) >= COUNTED_LIMIT:
                    _COUNTED.clear()
                _COUNTED[key] = counts
        if counts is not None:
            out[i] = counts
    return {f: out[inverse.ravel(), j].reshape(args[0].shape) for j, f in enumerate(fields)}
