"""Output writers of a ``SimResult``: per-request CSV, Chrome trace JSON (opens in Perfetto or
chrome://tracing), Gantt PNG, and the round trace (``sim.trace`` format).

Each returns the file's content (text or bytes) so the caller can write everything atomically
after every output was built. Only simulated quantities go in: same config and seed, same bytes.
"""

from __future__ import annotations

import csv
import io
import json

from sim.scenarios import SimResult
from sim.trace import dumps_trace

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


def gantt_png(result: SimResult) -> bytes:
    """A Gantt chart of the recorded spans (one row per lane), as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = _lanes(result)
    spans = result.recorder.spans
    colors = plt.get_cmap("tab20").colors
    names = list(dict.fromkeys(s.name.split(" ")[0] for s in spans))
    color = {n: colors[i % len(colors)] for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(lanes)))
    row = {lane: i for i, lane in enumerate(lanes)}
    for s in spans:
        key = s.name.split(" ")[0]
        ax.broken_barh(
            [(s.start_s * 1e3, s.dur_s * 1e3)],
            (row[s.lane] - 0.4, 0.8),
            facecolors=color[key],
            edgecolor="white",
            linewidth=0.4,
        )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms)")
    cfg = result.config
    f = result.figures
    ax.set_title(
        f"{cfg.scenario} / {result.strategy.name}: "
        f"{f['simulated_tokens_per_s']['value']:.1f} tok/s simulated, "
        f"{f['analytic_tokens_per_s']['value']:.1f} analytic "
        f"(first {cfg.timeline_rounds} rounds; costs {result.trace_header.get('provenance')})",
        fontsize=9,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in names[:12]]
    if handles:
        ax.legend(handles, names[:12], fontsize=7, loc="upper right", ncol=min(6, len(handles)))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
