"""Predicted-against-measured scatter plots: one colour and marker per baseline (its place in
the order given, the same in every plot of a report), each prediction's interval as a vertical
bar where it has one, and the predicted = measured line. The end-to-end report's PNGs and the
scale campaign report's ``--plot`` draw through here.
"""

from __future__ import annotations

import io
import textwrap

MARKERS = "osD^vP"


def scatter(
    label: str,
    points,
    order,
    fmt: str = "png",
    log: bool = False,
    note: str | None = None,
) -> bytes:
    """The figure of ``points`` ``(baseline, measured, predicted)`` or ``(baseline, measured,
    predicted, [low, high] or None)`` as ``fmt`` bytes (png, pdf, svg); ``log`` draws both axes
    in log scale (points over decades: batches and contexts); ``note`` is printed under the
    title, wrapped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5.5))
    points = [(*p[:3], p[3] if len(p) > 3 else None) for p in points]
    for i, b in enumerate(order):
        sel = [(m, p) for n, m, p, _ in points if n == b]
        if sel:
            marker = MARKERS[i % len(MARKERS)]
            ax.plot(*zip(*sel, strict=True), marker, color=f"C{i}", label=b, alpha=0.8, ls="")
        bars = [(m, p, iv) for n, m, p, iv in points if n == b and iv is not None]
        if bars:
            ax.errorbar(
                [m for m, _, _ in bars],
                [p for _, p, _ in bars],
                yerr=[[p - iv[0] for _, p, iv in bars], [iv[1] - p for _, p, iv in bars]],
                fmt="none",
                ecolor=f"C{i}",
                elinewidth=0.8,
                alpha=0.6,
            )
    vals = [v for _, m, p, iv in points for v in (m, p, *(iv or ()))]
    lo, hi = min(vals) * 0.9, max(vals) * 1.1
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    ax.set_title(
        f"{label}: predicted vs measured" + (f"\n{textwrap.fill(note, 64)}" if note else ""),
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    plt.close(fig)
    return buf.getvalue()
