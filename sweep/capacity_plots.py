"""Capacity curves of a saved sweep's capacity table (PNG bytes; nothing is written here): GPUs
needed vs cluster request rate per (strategy, TP), one panel per context.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.numbers import count_label
from ssvkit.sweep.plots import fill_lines, pinned_title, png_bytes, pyplot, select, wrapped_suptitle

LINE_STYLES = ("-", "--", "-.", ":")
SERIES_MARKERS = "osD^vPX*"
OFFSET_PT = 1.5  # vertical spacing of drawn capacity lines, so coinciding ones stay visible
LEGEND_IN = 4.4  # width of a capacity panel's legend text


def capacity_series(cap: dict, m: np.ndarray, rates: np.ndarray) -> list[dict]:
    """One entry per distinct curve of the rows ``m``: ``keys`` [(strategy, tp)] sharing it,
    ``rstar`` per key, ``gpus`` = ceil(R / r*) tp over ``rates`` (None when r* is not
    positive), the sized ``points`` and the ``status``."""
    out: list[dict] = []
    for i in np.flatnonzero(m):
        key = (str(cap["strategy"][i]), int(cap["tp"][i]))
        if any(key in e["keys"] for e in out):
            continue
        rstar = float(cap["replica_requests_per_s"][i])
        gpus = np.ceil(rates / rstar - 1e-9) * key[1] if rstar > 0 else None
        k = m & (cap["strategy"] == key[0]) & (cap["tp"] == key[1])
        pts = (cap["requests_per_s"][k], cap["gpus_needed"][k])
        same = [e for e in out if gpus is not None and e["gpus"] is not None]
        same = [e for e in same if np.array_equal(e["gpus"], gpus)]
        if same:
            same[0]["keys"].append(key)
            same[0]["rstar"].append(rstar)
            continue
        status = str(cap["status"][i])
        out.append(dict(keys=[key], rstar=[rstar], gpus=gpus, points=pts, status=status))
    return out


def _series_label(e: dict) -> str:
    """``name tp=N`` with r* (and the GPUs at the sized rates), ``a = b: identical here`` when
    several series draw one curve."""
    names = [f"{s} tp={tp}" for s, tp in e["keys"]]
    rstar = "/".join(f"{r:.3g}" for r in dict.fromkeys(e["rstar"]))
    if e["gpus"] is None:
        return f"{names[0]}: {e['status']}"
    gpus = ", ".join(f"{g:g}" for g in e["points"][1])
    same = ": identical here" if len(names) > 1 else ""
    return f"{' = '.join(names)}{same} (r*={rstar}/s; {gpus} GPUs)"


def _capacity_panel(ax, series: list[dict], rates, style: dict) -> None:
    from matplotlib.transforms import offset_copy

    drawn = [e for e in series if e["gpus"] is not None]
    for n, e in enumerate(drawn):
        color, ls, marker = style[e["keys"][0]]
        dy = OFFSET_PT * (n - (len(drawn) - 1) / 2)
        shift = offset_copy(ax.transData, ax.figure, y=dy, units="points")
        kw = {"color": color, "transform": shift}
        label = fill_lines([_series_label(e)], LEGEND_IN, 6)
        ax.step(
            rates, e["gpus"], where="post", ls=ls, marker=marker, markevery=[], label=label, **kw
        )
        ax.scatter(*e["points"], marker=marker, s=28, zorder=3, **kw)
    for e in series:
        if e["gpus"] is None:
            ax.plot([], [], " ", label=fill_lines([_series_label(e)], LEGEND_IN, 6))
    # Shifted artists do not grow the data limits: set them from the data.
    top = max([float(e["gpus"].max()) for e in drawn] + [1.0])
    ax.set_xlim(0, float(rates[-1]))
    ax.set_ylim(0, top * 1.06 + 0.4)
    sized = ", ".join(f"{r:g}" for r in sorted({float(r) for e in drawn for r in e["points"][0]}))
    title = f"markers and GPUs at the sized rates R = {sized}/s; lines drawn {OFFSET_PT:g} pt apart"
    ax.legend(
        fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), title=title, title_fontsize=6
    )


def capacity(cap: dict, fixed: dict, max_contexts: int = 4) -> bytes:
    """GPUs needed vs cluster request rate: ``ceil(R / r*) tp`` per (strategy, TP), one panel
    per context; markers at the rates the sweep was sized for. Each series has its own colour,
    line style and marker, lines are drawn a few points apart, and series whose curves are
    identical over the drawn rates share one line whose label says so."""
    mask, pinned = select(cap, fixed, ("tp", "context_len"))
    ctxs = sorted(set(cap["context_len"][mask].tolist()))[:max_contexts]
    if not ctxs:
        raise ValueError("the capacity table is empty")
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        1, len(ctxs), figsize=(5.2 * len(ctxs), 5.4), squeeze=False, layout="constrained"
    )
    rmax = float(np.max(cap["requests_per_s"][mask])) * 1.1
    rates = np.linspace(rmax / 400, rmax, 400)
    keys = list(dict.fromkeys(zip(cap["strategy"][mask], cap["tp"][mask].tolist(), strict=True)))
    style = {
        k: (f"C{i % 10}", LINE_STYLES[i % len(LINE_STYLES)], SERIES_MARKERS[i % 8])
        for i, k in enumerate(keys)
    }
    for ax, c in zip(axes[0], ctxs, strict=True):
        _capacity_panel(
            ax, capacity_series(cap, mask & (cap["context_len"] == c), rates), rates, style
        )
        ax.set_xlabel("cluster request rate R (requests/s)")
        ax.set_ylabel("GPUs needed")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"context {count_label(c)}", fontsize=9)
        ax.grid(alpha=0.3)
    i0 = np.flatnonzero(mask)[0]
    slo = (
        f"TTFT <= {cap['slo_ttft_s'][i0]:g} s, TPOT <= {1e3 * cap['slo_tpot_s'][i0]:g} ms for "
        f"{100 * cap['attainment'][i0]:g}% of requests"
    )
    wrapped_suptitle(fig, f"capacity ({slo}; sim:serve)", pinned_title(pinned))
    return png_bytes(fig)
