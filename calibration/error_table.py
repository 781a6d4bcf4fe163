"""Error summaries as table rows: the count and the median, p90 and max absolute percentage
error of a ``calibration.fit.error_stats`` dict, as fixed-width text or a markdown row; and
the markdown table rows every generated table writes (``markdown_row``, ``markdown_header``).

``ssvkit validate`` and ``ssvkit report`` print these tables; the README's calibration
summary and the end-to-end report write them in markdown. A summary without rows (``n`` 0 or
absent) shows ``-`` in place of its figures.
"""

from __future__ import annotations

APE_KEYS = ("median_ape", "p90_ape", "max_ape")


def ape_percents(stats: dict) -> tuple[str, str, str]:
    """Median, p90 and max APE as ``"12.3%"``, or ``"-"`` each when ``stats`` has no rows."""
    if not stats.get("n"):
        return ("-", "-", "-")
    return tuple(f"{100 * stats[k]:.1f}%" for k in APE_KEYS)


def ape_text_lines(
    first: str,
    rows,
    *,
    name_width: int,
    n_width: int,
    percent_widths: tuple[int, int, int],
) -> list[str]:
    """A header (``first`` over the names, then n, median, p90, max) and one line per
    ``(name, stats)`` of ``rows``: names left-aligned in ``name_width``, the count and the
    percents right-aligned in their widths."""
    widths = (n_width, *percent_widths)

    def line(name: str, cells) -> str:
        return f"{name:{name_width}s} " + " ".join(
            f"{c:>{w}s}" for c, w in zip(cells, widths, strict=True)
        )

    out = [line(first, ("n", "median", "p90", "max"))]
    for name, stats in rows:
        n = str(stats["n"]) if stats.get("n") else "-"
        out.append(line(name, (n, *ape_percents(stats))))
    return out


def markdown_row(cells) -> str:
    """``| a | b | ... |``: one markdown table row of ``cells`` (texts)."""
    return "| " + " | ".join(cells) + " |"


def markdown_header(names) -> list[str]:
    """A markdown table's header row of ``names`` and its ``| --- |`` rule."""
    names = list(names)
    return [markdown_row(names), markdown_row("---" for _ in names)]


def ape_markdown_row(name: str, stats: dict, *extra: str) -> str:
    """``| name | n | median | p90 | max |`` with any ``extra`` cells appended."""
    return markdown_row((name, str(stats.get("n", 0)), *ape_percents(stats), *extra))
