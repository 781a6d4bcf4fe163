"""Plots of a saved sweep (PNG bytes; nothing is written here): speedup heatmaps (context x
acceptance) per baseline, Pareto fronts (per-token latency vs throughput per GPU) and a
roofline with the op groups of one cell; the capacity curves are ``sweep.capacity_plots``.
Figures with intervals (``perfmodel.intervals``: the sweep's ``<figure>_low`` and ``_high``
columns) are drawn with them: each heatmap cell's speedup interval, each baseline's error bars
on the Pareto plot; a title says where a sweep has none.

Each plot fixes the axes it does not draw: ``select`` takes a dict of column -> value and
defaults every other fixed axis to its first value in the table (grid order), and the titles
say what was fixed. Only feasible points that fit in memory are drawn.
"""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.intervals import COVERAGE
from ssvkit.perfmodel.numbers import count_label
from ssvkit.perfmodel.strategy import BASELINES

FIXED = ("model", "gpu", "tp", "context_len", "batch", "acceptance", "overlap", "kv_bytes")
HEATMAP_BASELINES = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive")
MAX_PANELS = 6
MAX_LINES = 8


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return buf.getvalue()


def _uniq(col: np.ndarray) -> list:
    """Distinct values in order of first appearance (grid order)."""
    _, first = np.unique(col, return_index=True)
    return [col[i] for i in sorted(first)]


def select(table: dict, fixed: dict, free: tuple[str, ...]) -> tuple[np.ndarray, dict]:
    """Row mask with every ``FIXED`` axis not in ``free`` pinned: to ``fixed[axis]`` when given
    (an error names the values present otherwise), else to its first value. Returns the mask
    and the pinned values."""
    mask = np.ones(len(table["model"]), dtype=bool)
    pinned = {}
    for axis in FIXED:
        if axis in free or axis not in table:
            continue
        col = table[axis]
        values = _uniq(col[mask])
        if not values:
            break
        want = fixed.get(axis)
        if want is None:
            want = values[0]
        elif not any(_same(want, v) for v in values):
            shown = ", ".join(str(v) for v in values[:12])
            raise ValueError(f"{axis} {want!r} is not in the sweep (has {shown})")
        mask &= np.array([_same(want, v) for v in col]) if col.dtype == object else col == want
        pinned[axis] = want
    usable = table.get("feasible", True) & table.get("fits_memory", True)
    return mask & usable, pinned


def _same(a, b) -> bool:
    if isinstance(b, str | np.str_):
        return str(a) == str(b)
    return math.isclose(float(a), float(b), rel_tol=1e-9)


def pinned_title(pinned: dict) -> str:
    return "  ".join(f"{k}={v}" for k, v in pinned.items())


def fill_lines(parts, width_in: float, fontsize: float) -> str:
    """``parts`` one per line, each wrapped to ``width_in`` inches of ``fontsize`` text."""
    chars = max(int(width_in * 72 / (0.6 * fontsize)), 20)
    return "\n".join(textwrap.fill(p, chars) for p in parts if p)


def wrapped_suptitle(fig, *parts: str, fontsize: float = 8) -> None:
    """A figure title wrapped to the figure's width (so it is never cut off)."""
    fig.suptitle(fill_lines(parts, fig.get_figwidth(), fontsize), fontsize=fontsize)


def _pivot(table, mask, strategy, value):
    """``value`` of ``strategy`` on the acceptance x context grid (NaN where missing)."""
    m = mask & (table["strategy"] == strategy)
    ctxs = sorted(set(table["context_len"][mask].tolist()))
    accs = sorted(set(table["acceptance"][mask].tolist()))
    grid = np.full((len(accs), len(ctxs)), np.nan)
    for c, a, v in zip(table["context_len"][m], table["acceptance"][m], value[m], strict=True):
        grid[accs.index(a), ctxs.index(c)] = v
    return grid, ctxs, accs


def _interval_columns(table: dict, column: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The ``<column>_low`` and ``_high`` columns of a sweep; NaN where the sweep has none (a
    table written before sweeps carried intervals, or a figure without them)."""
    n = len(table["strategy"])
    if column is None or f"{column}_low" not in table:
        return np.full(n, np.nan), np.full(n, np.nan)
    return tuple(np.asarray(table[f"{column}_{x}"], dtype=float) for x in ("low", "high"))


def interval_note(low: np.ndarray, mask: np.ndarray) -> str:
    """A title's word on the intervals of the drawn rows: what they are, or that there are
    none."""
    if np.isfinite(low[mask]).any():
        return f"[low, high]: {100 * COVERAGE:.0f}% intervals (perfmodel.intervals)"
    return "no intervals (the sweep has none for this figure)"


def heatmap_baselines(table: dict) -> list[str]:
    """Baselines a heatmap can be drawn against: ar_dense and ar_sparse always (their speedup
    columns), sd_dense and sd_sparse_naive when the sweep holds them."""
    labels = set(table["strategy"].tolist())
    return [b for b in HEATMAP_BASELINES if b in ANCHOR_COLUMNS or b in labels]


ANCHOR_COLUMNS = {"ar_dense": "speedup_vs_ar_dense", "ar_sparse": "speedup_vs_ar_sparse"}


def _speedup_over(table, mask, baseline) -> np.ndarray:
    """Speedup of every row of ``mask`` over ``baseline`` at the same context and acceptance
    (the other axes are pinned by ``mask``); NaN elsewhere."""
    if baseline in ANCHOR_COLUMNS:
        return table[ANCHOR_COLUMNS[baseline]]
    ctx, acc, tps = table["context_len"], table["acceptance"], table["tokens_per_s"]
    m = mask & (table["strategy"] == baseline)
    ref = {(c, a): v for c, a, v in zip(ctx[m], acc[m], tps[m], strict=True)}
    out = np.full(len(tps), np.nan)
    rows = np.flatnonzero(mask)
    base = np.array([ref.get((ctx[i], acc[i]), np.nan) for i in rows])
    out[rows] = tps[rows] / base
    return out


def heatmap(table: dict, baseline: str, fixed: dict, strategies=None) -> bytes:
    """Speedup over ``baseline`` on context x acceptance: one panel per strategy (the listed
    ones, else the best by median speedup) and a panel of the best strategy per cell."""
    if baseline not in heatmap_baselines(table):
        raise ValueError(f"baseline {baseline!r} is not in the sweep (add it to --strategies)")
    mask, pinned = select(table, fixed, ("context_len", "acceptance"))
    speed = _speedup_over(table, mask, baseline)
    low, high = _interval_columns(table, ANCHOR_COLUMNS.get(baseline))
    cands = [s for s in _uniq(table["strategy"][mask]) if s != baseline]
    labels = _panel_strategies(table, mask, speed, cands, strategies)
    panels = [(s, *_pivot(table, mask, s, speed)) for s in labels]
    bands = {s: (_pivot(table, mask, s, low)[0], _pivot(table, mask, s, high)[0]) for s in labels}
    win = None
    if len(cands) > 1:
        best, win = _best_per_cell(table, mask, speed, cands)
        panels.append(("best per cell", best, *_pivot(table, mask, cands[0], speed)[1:]))
    plt = pyplot()
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.6 * cols, 3.6 * rows + 0.8), squeeze=False, layout="constrained"
    )
    norm = _speedup_norm(panels)
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw_panel(fig, ax, panel, norm, win, bands)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    notes = ""
    if win is not None:
        shown = sorted(set(win.ravel().tolist()))
        notes = "   ".join(f"#{k + 1} {cands[k]}" for k in shown)
    wrapped_suptitle(
        fig, f"speedup over {baseline}", pinned_title(pinned), interval_note(low, mask), notes
    )
    return png_bytes(fig)


def _panel_strategies(table, mask, speed, cands, strategies) -> list:
    """The strategies with a panel of their own: ``strategies`` when given (each one among
    ``cands``), else ``cands``, cut to the ``MAX_PANELS - 1`` of highest median speedup."""
    if strategies:
        missing = [s for s in strategies if s not in cands]
        if missing:
            raise ValueError(f"strategy {missing[0]!r} is not in the selection")
        return list(strategies)
    if len(cands) > MAX_PANELS - 1:
        med = {s: np.nanmedian(speed[mask & (table["strategy"] == s)]) for s in cands}
        return sorted(cands, key=lambda s: -med[s])[: MAX_PANELS - 1]
    return cands


def _best_per_cell(table, mask, speed, cands) -> tuple[np.ndarray, np.ndarray]:
    """The highest speedup of ``cands`` per cell, and the index in ``cands`` of the strategy
    that has it."""
    stack = np.stack([_pivot(table, mask, s, speed)[0] for s in cands])
    filled = np.where(np.isnan(stack), -np.inf, stack)
    win = np.argmax(filled, axis=0)
    return np.take_along_axis(stack, win[None], 0)[0], win


def _speedup_norm(panels):
    """A colour scale over every panel's speedups with 1x (no speedup) as its neutral centre."""
    from matplotlib.colors import TwoSlopeNorm

    finite = np.concatenate([g[np.isfinite(g)] for _, g, _, _ in panels] + [np.array([1.0])])
    vmax = max(float(finite.max()), 1.01)
    vmin = min(float(finite.min()), 0.99)
    return TwoSlopeNorm(vcenter=1.0, vmin=vmin, vmax=vmax)


def _draw_panel(fig, ax, panel, norm, win, bands) -> None:
    """One panel: the speedup grid in colour and each cell's speedup, with its interval from
    ``bands`` and, on the best-per-cell panel, the number of the strategy that wins it."""
    name, grid, ctxs, accs = panel
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdYlGn", norm=norm)
    ax.set_xticks(range(len(ctxs)), [count_label(c) for c in ctxs], fontsize=7)
    ax.set_yticks(range(len(accs)), [f"{a:g}" for a in accs], fontsize=7)
    ax.set_xlabel("context")
    ax.set_ylabel("acceptance")
    ax.set_title(fill_lines([name], 3.6, 8), fontsize=8)
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            tag = f"\n#{win[i, j] + 1}" if name == "best per cell" else ""
            lo, hi = (b[i, j] for b in bands[name]) if name in bands else (np.nan, np.nan)
            if np.isfinite(lo):
                tag += f"\n[{lo:.2f}, {hi:.2f}]"
            ax.text(j, i, f"{v:.2f}{tag}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, shrink=0.8)


def pareto_front(latency: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both lower latency and higher throughput,
    by increasing latency."""
    order = np.lexsort((-throughput, latency))
    front, best = [], -np.inf
    for i in order:
        if throughput[i] > best:
            front.append(i)
            best = throughput[i]
    return np.array(front, dtype=int)


def pareto(table: dict, fixed: dict, max_contexts: int = 4) -> bytes:
    """Per-token latency (``tpot_s``) vs tokens/s per GPU across batch sizes and strategies, one
    panel per context; the front over all strategies in black."""
    mask, pinned = select(table, fixed, ("context_len", "batch"))
    if not mask.any():
        raise ValueError("no feasible point to draw in the selection")
    ctxs = sorted(set(table["context_len"][mask].tolist()))
    if len(ctxs) > max_contexts:
        ctxs = [ctxs[round(i * (len(ctxs) - 1) / (max_contexts - 1))] for i in range(max_contexts)]
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(ctxs), figsize=(4.8 * len(ctxs), 4.2), squeeze=False, layout="constrained"
    )
    labels = _uniq(table["strategy"][mask])
    lines = [s for s in labels if s in BASELINES][:MAX_LINES] or labels[:MAX_LINES]
    for ax, c in zip(axes[0], ctxs, strict=True):
        m = mask & (table["context_len"] == c)
        lat = table["tpot_s"][m] * 1e3
        thr = table["tokens_per_s_per_gpu"][m]
        strat = table["strategy"][m]
        ax.scatter(lat, thr, s=6, color="0.75", label="all points")
        lat_iv = [x[m] * 1e3 for x in _interval_columns(table, "tpot_s")]
        thr_iv = [x[m] for x in _interval_columns(table, "tokens_per_s_per_gpu")]
        for s in lines:
            k = strat == s
            order = np.argsort(table["batch"][m][k])
            (line,) = ax.plot(lat[k][order], thr[k][order], marker="o", ms=3, lw=1, label=s)
            x, y = lat[k][order], thr[k][order]
            xe = [x - lat_iv[0][k][order], lat_iv[1][k][order] - x]
            ye = [y - thr_iv[0][k][order], thr_iv[1][k][order] - y]
            if np.isfinite(ye).all() and np.isfinite(xe).all():
                ax.errorbar(x, y, xerr=xe, yerr=ye, fmt="none", ecolor=line.get_color(), lw=0.7)
        front = pareto_front(lat, thr)
        front_kw = {"color": "k", "lw": 1.6, "marker": "o", "mfc": "none", "ms": 7}
        ax.step(lat[front], thr[front], where="post", label="Pareto front", **front_kw)
        for i in front[:: max(1, len(front) // 6)]:
            text = f"{strat[i]} b={table['batch'][m][i]}"
            ax.annotate(
                text, (lat[i], thr[i]), xytext=(6, -3), textcoords="offset points", fontsize=6
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("time per output token (ms)")
        ax.set_ylabel("tokens/s per GPU")
        ax.set_title(f"context {count_label(c)}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=6)
    note = interval_note(_interval_columns(table, "tokens_per_s_per_gpu")[0], mask)
    wrapped_suptitle(fig, "latency vs throughput", pinned_title(pinned), note)
    return png_bytes(fig)


GROUPS = ("gemm", "attention", "selection", "other", "draft")
GROUP_MARKERS = dict(zip(GROUPS, "s^Dvo", strict=True))


def roofline(table: dict, fixed: dict) -> bytes:
    """The op groups of each strategy at one cell on the GPU's roofline: arithmetic intensity
    (FLOPs / bytes) against achieved FLOP/s (FLOPs / seconds). Context defaults to the largest."""
    fixed = dict(fixed)
    if fixed.get("context_len") is None:
        fixed["context_len"] = int(np.max(table["context_len"]))
    mask, pinned = select(table, fixed, ())
    if not mask.any():
        raise ValueError("no feasible point to draw in the selection")
    prov = str(table["provenance"][mask][0])
    gpu = get_gpu(str(pinned["gpu"]), measured=not prov.startswith("datasheet"))
    peak, bw = gpu.tensor_flops_per_s("bf16"), gpu.hbm_bytes_per_s
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.2), layout="constrained")
    xs = np.logspace(-2, 4, 200)
    ax.loglog(
        xs, np.minimum(peak, xs * bw), "k-", lw=1, label=f"{gpu.name} roofline ({gpu.provenance})"
    )
    labels = _uniq(table["strategy"][mask])
    shown = [s for s in labels if s in BASELINES] or labels
    extra = [s for s in labels if s not in shown]
    if extra:
        best = mask & table["best"]
        shown += [s for s in _uniq(table["strategy"][best]) if s not in shown]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, s in enumerate(shown[:MAX_LINES]):
        i = np.flatnonzero(mask & (table["strategy"] == s))[0]
        for g in GROUPS:
            secs = table["draft_s" if g == "draft" else f"{g}_s"][i]
            f, b = table[f"{g}_flops"][i], table[f"{g}_bytes"][i]
            if f > 0 and b > 0 and secs > 0:
                ax.scatter(
                    f / b, f / secs, marker=GROUP_MARKERS[g], color=colors[k % len(colors)], s=30
                )
        ax.plot([], [], color=colors[k % len(colors)], lw=4, label=s)
    for g in GROUPS:
        ax.scatter([], [], marker=GROUP_MARKERS[g], color="0.4", label=g)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(
        fill_lines(["op groups of one round", pinned_title(pinned), f"[{prov}]"], 7, 7), fontsize=7
    )
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3, which="both")
    return png_bytes(fig)
