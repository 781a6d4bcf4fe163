"""``ssvkit predict --plot``: the verify ops of the longest context on the GPU's roofline, and
each baseline's speedup over ``ar_dense`` against the context length, in one figure.

Colour and marker say which strategy, in both panels; ops that land on one spot of the
roofline share a number, listed beside the panel. A calibrated prediction draws its intervals
(``perfmodel.intervals``): each op's achieved FLOP/s as a vertical bar, each speedup as a band;
the title says when there are none. The figure is rendered in the format asked for (PNG, PDF or
SVG).
"""

from __future__ import annotations

import io
import textwrap

import numpy as np

from ssvkit.perfmodel.baselines import base_provenance
from ssvkit.perfmodel.intervals import COVERAGE
from ssvkit.perfmodel.numbers import count_label
from ssvkit.perfmodel.strategy import BASELINES

FORMATS = ("png", "pdf", "svg")
MARKERS = "osD^vPX*hp<>"
ROOFLINE_AXES_IN = (7.0, 4.4)  # the roofline panel's size, for telling points apart
LABEL_BOX = {"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.8}
# No timestamps in the file: same rows, same bytes.
METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None}, "svg": {"Date": None}}


def _style(rows) -> dict[str, tuple[str, str]]:
    """(colour, marker) per strategy: a baseline's are the same in every figure."""
    names = list(dict.fromkeys(r["strategy"] for r in rows))
    ordered = list(BASELINES) + [n for n in names if n not in BASELINES]
    styles = {n: (f"C{i % 10}", MARKERS[i % len(MARKERS)]) for i, n in enumerate(ordered)}
    return {n: styles[n] for n in ordered if n in names}


def _op_points(rows, ctx: int) -> list[tuple]:
    """(strategy, op, FLOP/byte, FLOP/s, (FLOP/s low, high) or None) of every verify op with
    FLOPs, bytes and time."""
    out = []
    for r in rows:
        if r["context_len"] != ctx:
            continue
        op_iv = (r.get("intervals") or {}).get("op_s", {})
        for k, t in r["op_s"].items():
            f, b = r["op_flops"][k], r["op_bytes"][k]
            if k.startswith("verify.") and f > 0 and b > 0 and t > 0:
                iv = op_iv.get(k)
                rate_iv = None if iv is None else (f / iv[1], f / iv[0])
                out.append((r["strategy"], k.split(".", 1)[1], f / b, f / t, rate_iv))
    return out


def clusters(points, span_in: tuple[float, float], limits, min_in: float = 0.12) -> list[list]:
    """Points closer than ``min_in`` inches on a log-log axes of ``span_in`` inches with
    ``limits`` ((x0, x1), (y0, y1)), joined transitively; clusters by increasing x, then y."""
    lx0, lx1 = np.log10(limits[0])
    ly0, ly1 = np.log10(limits[1])
    xy = np.array([[np.log10(p[2]), np.log10(p[3])] for p in points]).reshape(-1, 2)
    inches = (xy - [lx0, ly0]) / [lx1 - lx0, ly1 - ly0] * span_in
    group = list(range(len(points)))
    for i in range(len(points)):
        for j in range(i):
            if np.hypot(*(inches[i] - inches[j])) < min_in and group[i] != group[j]:
                old = group[i]
                group = [group[j] if g == old else g for g in group]
    out: dict[int, list] = {}
    for g, p in zip(group, points, strict=True):
        out.setdefault(g, []).append(p)
    return sorted(out.values(), key=lambda c: (min(p[2] for p in c), min(p[3] for p in c)))


def _key(cluster) -> str:
    return textwrap.fill(
        ", ".join(dict.fromkeys(p[1] for p in cluster)), 44, subsequent_indent="    "
    )


def _number_ops(ax, pts, limits) -> None:
    """A number beside each cluster of points and, right of the axes, the ops each holds."""
    groups = clusters(pts, ROOFLINE_AXES_IN, limits)
    for i, c in enumerate(groups, 1):
        x, y = max((p[2], p[3]) for p in c)
        ax.annotate(
            str(i), (x, y), xytext=(5, 3), textcoords="offset points", fontsize=7, bbox=LABEL_BOX
        )
    key = "\n".join(f"{i:>2}  {_key(c)}" for i, c in enumerate(groups, 1))
    ax.text(
        1.02,
        1,
        f"ops at each numbered point\n{key}",
        transform=ax.transAxes,
        va="top",
        fontsize=7,
        family="monospace",
    )


def _roofline_panel(ax, rows, gpu, dtype: str, style: dict) -> None:
    ctx = max(r["context_len"] for r in rows)
    pts = _op_points(rows, ctx)
    peak, bw = gpu.tensor_flops_per_s(dtype), gpu.hbm_bytes_per_s
    ai = [p[2] for p in pts] or [peak / bw]
    xlim = (min(ai) / 3, max(max(ai), peak / bw) * 3)
    ylim = (min([p[4][0] if p[4] else p[3] for p in pts] or [peak]) / 3, peak * 3)
    xs = np.logspace(*np.log10(xlim), 200)
    roof = f"roofline: {peak / 1e12:,.0f} TFLOP/s {dtype}, {bw / 1e12:.2f} TB/s"
    ax.loglog(xs, np.minimum(peak, xs * bw), "k-", lw=1, label=roof)
    for s, (color, marker) in style.items():
        mine = [p for p in pts if p[0] == s]
        bars = [p for p in mine if p[4] is not None]
        if bars:
            ax.errorbar(
                [p[2] for p in bars],
                [p[3] for p in bars],
                yerr=[[p[3] - p[4][0] for p in bars], [p[4][1] - p[3] for p in bars]],
                fmt="none",
                ecolor=color,
                elinewidth=0.8,
                alpha=0.7,
            )
        ax.scatter(
            [p[2] for p in mine],
            [p[3] for p in mine],
            marker=marker,
            s=36,
            facecolors="none",
            edgecolors=color,
            lw=1.3,
            label=s,
        )
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    _number_ops(ax, pts, (xlim, ylim))
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"verify ops at context {count_label(ctx)} ({ctx} tokens)", fontsize=10)
    ax.grid(alpha=0.3, which="major")


def _speedup_panel(ax, rows, style: dict) -> None:
    contexts = sorted({r["context_len"] for r in rows})
    for name, (color, marker) in style.items():
        mine = sorted((r for r in rows if r["strategy"] == name), key=lambda r: r["context_len"])
        xs = [r["context_len"] for r in mine]
        ax.plot(
            xs,
            [r["speedup_vs_ar_dense"] for r in mine],
            color=color,
            marker=marker,
            mfc="none",
            label=name,
        )
        ivs = [(r.get("intervals") or {}).get("speedup_vs_ar_dense") for r in mine]
        if all(iv is not None for iv in ivs):
            lo, hi = zip(*ivs, strict=True)
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [count_label(c) for c in contexts])
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("speedup over ar_dense")
    bands = rows[0].get("intervals") is not None
    ax.set_title(
        "speedup over ar_dense vs context"
        + (f" (bands: {100 * COVERAGE:.0f}% intervals)" if bands else " (no intervals)"),
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def predict_plot(rows, gpu, dtype, fmt: str = "png") -> bytes:
    """The roofline and speedup figure of ``compare`` rows, as ``fmt`` bytes (png, pdf, svg)."""
    if fmt not in FORMATS:
        raise ValueError(f"plot format {fmt!r}: choose from {', '.join(FORMATS)}")
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 5.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=(1.35, 1))
    style = _style(rows)
    _roofline_panel(ax1, rows, gpu, dtype, style)
    _speedup_panel(ax2, rows, style)
    prov = base_provenance(rows[0])
    fig.suptitle(f"{gpu.name}, {dtype}: predicted costs [{prov}]", fontsize=11)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "ssvkit", "svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, dpi=120, metadata=METADATA[fmt])
    return buf.getvalue()
