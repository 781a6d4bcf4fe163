"""Output writers of a ``SimResult``: per-request CSV, Chrome trace JSON (opens in Perfetto or
chrome://tracing), a Gantt PNG of the first rounds, and the round trace (``perfmodel.trace``
format).

Each returns the file's content (text or bytes) so the caller can write everything atomically
after every output was built. Only simulated quantities go in: same config and seed, same bytes.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.numbers import interval_text
from ssvkit.perfmodel.trace import dumps_trace
from ssvkit.sim.recorder import Span
from ssvkit.sim.scenarios import SimResult

CSV_FIELDS = (
    "request",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "prompt_len",
    "target_tokens",
    "output_tokens",
    "rounds",
    "drafted",
    "accepted_drafts",
    "offloads",
    "slo_met",
)


def requests_csv(result: SimResult) -> str:
    """One row per request (times in simulated seconds; ``slo_met`` empty outside serving)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in result.requests:
        row = []
        for f in CSV_FIELDS:
            v = getattr(r, f)
            row.append("" if v is None else repr(v) if isinstance(v, float) else v)
        w.writerow(row)
    return buf.getvalue()


def _lanes(result: SimResult) -> list[str]:
    seen = dict.fromkeys(result.lanes)
    for s in result.recorder.spans:
        seen.setdefault(s.lane)
    return list(seen)


def chrome_trace(result: SimResult) -> str:
    """Chrome trace-event JSON: one thread per lane, complete ("X") events in microseconds."""
    lanes = _lanes(result)
    tid = {lane: i for i, lane in enumerate(lanes)}
    cfg = result.config
    events = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"sim {cfg.scenario}"}}
    ]
    for lane, i in tid.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": lane}}
        )
        events.append(
            {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": i, "args": {"sort_index": i}}
        )
    for s in result.recorder.spans:
        ev = {
            "name": s.name,
            "cat": s.lane,
            "ph": "X",
            "pid": 0,
            "tid": tid[s.lane],
            "ts": s.start_s * 1e6,
            "dur": s.dur_s * 1e6,
        }
        if s.args:
            ev["args"] = s.args
        events.append(ev)
    other = {
        "scenario": cfg.scenario,
        "strategy": result.strategy.name,
        "model": result.trace_header["model"],
        "gpu": result.trace_header.get("gpu"),
        "seed": cfg.seed,
        "provenance": result.figures["simulated_tokens_per_s"]["provenance"],
    }
    return json.dumps(
        {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other},
        separators=(",", ":"),
    )


def trace_jsonl(result: SimResult) -> str:
    """The round trace (versioned JSONL, docs/trace-format.md)."""
    header = dict(result.trace_header)
    names = set(result.recorder.strategy)
    strategies = dict(header["strategies"])
    base = result.strategy.name
    for n in sorted(names - set(strategies)):
        strategies[n] = {"derived_from": base}
    header["strategies"] = strategies
    return dumps_trace(header, result.recorder.trace_rounds())


GANTT_MAX_BARS_PER_LANE = 150
GANTT_DPI = 100
GANTT_MAX_LANES = 20


def event_kind(name: str) -> str:
    """A span's kind, its name without the words that number it ("repair 3 L7" -> "repair")."""
    words = [w for w in name.split() if not any(c.isdigit() for c in w)]
    return " ".join(words).rstrip(":") or name


@dataclass(frozen=True, slots=True)
class GanttWindow:
    """The rounds a Gantt chart shows: the spans that overlap ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    num_rounds: int
    spans: list[Span]
    capped: bool


def gantt_window(result: SimResult, max_bars_per_lane: int = GANTT_MAX_BARS_PER_LANE):
    """The first recorded rounds whose spans fit ``max_bars_per_lane`` per lane (at least one
    round). Rounds are the recorder's (``t_s``); rounds sharing a start (a batch step) go
    together; spans before the first round belong to it. The scenario's own lanes set the
    window; spans of other lanes (a request's whole life in serving) are kept where they
    overlap it."""
    rec = result.recorder
    core = [s for s in rec.spans if s.lane in result.lanes] or rec.spans
    if not core:
        return GanttWindow(0.0, 0.0, 0, [], False)
    span_start = np.array([s.start_s for s in core])
    bounds = np.unique(np.asarray(rec.t_s, dtype=float))
    step = np.maximum(np.searchsorted(bounds, span_start, side="right") - 1, 0)
    lane_ix = np.unique([s.lane for s in core], return_inverse=True)[1]
    num_steps = int(step.max()) + 1
    counts = np.zeros((num_steps, int(lane_ix.max()) + 1), dtype=int)
    np.add.at(counts, (step, lane_ix), 1)
    fits = np.cumsum(counts, axis=0).max(axis=1) <= max_bars_per_lane
    shown = num_steps if fits.all() else max(int(np.argmin(fits)), 1)
    start_s = float(min(span_start.min(), bounds[0] if len(bounds) else np.inf))
    limit_s = float(bounds[shown]) if shown < len(bounds) else np.inf
    end_s = min(limit_s, max(s.start_s + s.dur_s for s in core if s.start_s < limit_s))
    keep = [s for s in rec.spans if s.start_s < end_s and s.start_s + s.dur_s > start_s]
    t_s = np.asarray(rec.t_s)
    num_rounds = int(np.count_nonzero((t_s >= start_s) & (t_s < end_s)))
    return GanttWindow(start_s, end_s, num_rounds, keep, shown < num_steps)


def _bars(spans, min_s: float, gap_s: float) -> list[tuple[float, float]]:
    """(start, width) in ms: ``gap_s`` short of the span (back-to-back spans stay apart), at
    least ``min_s`` wide."""
    return [(1e3 * s.start_s, 1e3 * max(s.dur_s - gap_s, min_s)) for s in spans]


def _gantt_title(result: SimResult, win: GanttWindow, max_bars_per_lane: int) -> str:
    cfg, f, rec = result.config, result.figures, result.recorder
    total_s = f["simulated_time_s"]["value"]
    what = f"first {win.num_rounds} of {rec.num_rounds} rounds"
    if win.capped:
        what += (
            f" (at most {max_bars_per_lane} events per lane; the Chrome trace has the first "
            f"{cfg.timeline_rounds} steps)"
        )
    return (
        f"{cfg.scenario} / {result.strategy.name}: {what}, "
        f"{1e3 * win.start_s:,.1f}-{1e3 * win.end_s:,.1f} ms of {1e3 * total_s:,.1f} ms\n"
        f"{f['simulated_tokens_per_s']['value']:.1f} tokens/s simulated, "
        f"{f['analytic_tokens_per_s']['value']:.1f} analytic"
        f"{_bracketed(f['analytic_tokens_per_s'].get('interval'))}; "
        f"costs {result.trace_header.get('provenance')}"
    )


def _bracketed(iv) -> str:
    return f" {interval_text(iv, '.1f')}" if iv else ""


def _gantt_lanes(result: SimResult, win: GanttWindow, max_lanes: int) -> tuple[list[str], str]:
    """The lanes with events in the window (at most ``max_lanes``) and a note on the others."""
    all_lanes = _lanes(result)
    busy = {s.lane for s in win.spans}
    lanes = [lane for lane in all_lanes if lane in busy]
    notes = []
    if len(lanes) > max_lanes:
        notes.append(f"{len(lanes) - max_lanes} more lanes not drawn: {lanes[max_lanes]}, ...")
        lanes = lanes[:max_lanes]
    idle = [lane for lane in all_lanes if lane not in busy]
    if idle:
        notes.append(f"no events in this window: {', '.join(idle)}")
    return lanes, "".join(f"; {n}" for n in notes)


def gantt_figure(result: SimResult, max_bars_per_lane: int = GANTT_MAX_BARS_PER_LANE):
    """A Gantt chart of the first rounds (``gantt_window``): one row per lane with events, one
    colour per event kind, one collection per (lane, kind)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    win = gantt_window(result, max_bars_per_lane)
    lanes, note = _gantt_lanes(result, win, GANTT_MAX_LANES)
    row = {lane: i for i, lane in enumerate(lanes)}
    groups: dict[tuple[str, str], list[Span]] = {}
    for s in win.spans:
        if s.lane in row:
            groups.setdefault((s.lane, event_kind(s.name)), []).append(s)
    kinds = list(dict.fromkeys(kind for _, kind in groups))
    color = dict(zip(kinds, _palette(len(kinds)), strict=True))
    fig = Figure(figsize=(12, 1.9 + 0.4 * max(len(lanes), 1)), layout="constrained")
    ax = fig.add_subplot()
    px_s = max(win.end_s - win.start_s, 1e-12) / (0.8 * 12 * GANTT_DPI)
    for (lane, kind), spans in groups.items():
        bars = _bars(spans, px_s, px_s)
        ax.broken_barh(bars, (row[lane] - 0.38, 0.76), facecolors=color[kind], linewidth=0)
    ax.set_yticks(range(len(lanes)), lanes)
    if lanes:
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        pad_ms = 0.01e3 * (win.end_s - win.start_s)  # room for the last round's instant events
        ax.set_xlim(1e3 * win.start_s - pad_ms, 1e3 * win.end_s + pad_ms)
    else:
        ax.text(0.5, 0.5, "no events recorded (--timeline-rounds 0)", ha="center", va="center")
    ax.set_xlabel(f"simulated time (ms); events under a pixel drawn 1 px wide{note}", fontsize=8)
    ax.set_title(_gantt_title(result, win, max_bars_per_lane), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    if kinds:
        handles = [Patch(color=color[k], label=k) for k in kinds]
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1))
    return fig


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap.colors[i % len(cmap.colors)] for i in range(n)]


def gantt_png(result: SimResult) -> bytes:
    """``gantt_figure`` as PNG bytes (no timestamp: same run, same bytes)."""
    fig = gantt_figure(result)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=GANTT_DPI, metadata={"Software": None})
    return buf.getvalue()
