"""The numbers users type, parsed once: counts with K/M suffixes (``8K`` = 8192, ``1M`` =
1048576), comma-separated lists of them, and finite floats. Errors are one line naming what
was parsed and the text given. ``count_label`` writes a count back the short way, ``figure``
is a number as the JSON outputs carry it, and ``interval_text`` a figure's interval as the text
outputs print it.

Counts are positive integers no larger than ``MAX_COUNT`` (2^40, past any context, batch or
token count a model or GPU takes); ``inf``, ``nan``, fractions and empty list items are refused.
"""

from __future__ import annotations

import math

MAX_COUNT = 1 << 40
SUFFIXES = {"K": 1 << 10, "M": 1 << 20}


def require_at_least_one(obj, names) -> None:
    """``ValueError`` naming the first of the attributes ``names`` of ``obj`` below 1 (a
    config's or a call shape's counts)."""
    for name in names:
        if getattr(obj, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(obj, name)}")


def parse_count(value, what: str, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer in ``[minimum, maximum]`` from an int, an integral float or a text such as
    ``32768``, ``32K`` or ``1.5K``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not an integer")
    if isinstance(value, int):
        out = value
    else:
        text = str(value).strip()
        mult = SUFFIXES.get(text[-1:].upper(), 1)
        digits = text[:-1] if mult > 1 else text
        try:
            number = float(digits) * mult
        except ValueError:
            raise ValueError(f"{what} {text!r} is not an integer (K/M suffix allowed)") from None
        if not math.isfinite(number) or not number.is_integer():
            raise ValueError(f"{what} {text!r} is not a whole number")
        out = int(number)
    if out < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    if out > maximum:
        raise ValueError(f"{what} {value} is out of range (at most {maximum})")
    return out


def parse_count_list(text: str, what: str, **bounds) -> list[int]:
    """``8K,16K,32768`` -> [8192, 16384, 32768]; an empty item is an error."""
    items = str(text).split(",")
    if any(not item.strip() for item in items):
        raise ValueError(f"{what} {text!r} has an empty item")
    return [parse_count(item, what, **bounds) for item in items]


def finite_float(value, what: str) -> float:
    """A finite float from a number or a text (``nan``, ``inf`` and booleans refused)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {value!r} is not a number") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} {value!r} is not a finite number")
    return out


def count_label(n: int) -> str:
    """``8192`` -> ``"8K"``: a multiple of 1024 in K, any other count as it is."""
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def figure(value, unit: str, provenance: str) -> dict:
    """A number as the JSON outputs carry it: value, unit and where it came from."""
    return {"value": value, "unit": unit, "provenance": provenance}


def interval_text(iv, fmt: str, scale: float = 1.0) -> str:
    """``[low, high]`` of an interval (times ``scale``) in format ``fmt``; "" for None."""
    return "" if iv is None else f"[{scale * iv[0]:{fmt}}, {scale * iv[1]:{fmt}}]"
