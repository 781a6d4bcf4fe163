"""The scale campaign's report (``validation.scale_report.build_scale``) as fixed-width text:
the campaign, the errors per group, every speedup pair, the cells, the skipped cells and the
targets."""

from __future__ import annotations

from ssvkit.calibration.error_table import ape_text_lines


def _mp(stats: dict) -> str:
    """``median/p90% (n)`` of an error summary, ``-`` without rows."""
    if not stats.get("n"):
        return "-"
    return f"{100 * stats['median_ape']:.1f}/{100 * stats['p90_ape']:.1f}% ({stats['n']})"


def _group_lines(groups: dict) -> list[str]:
    head = f"{'model':20s} {'batch':>5s} {'context':>7s}"
    figs = " ".join(f"{k:>18s}" for k in ("verify", "round", "tokens/s", "speedup"))
    lines = [f"{head} {figs} skipped acceptance"]
    for level in ("model", "batch", "context"):
        for g in groups[level]:
            key = f"{g['model']:20s} {g.get('batch', 'all')!s:>5s} {g.get('context', 'all')!s:>7s}"
            figs = " ".join(f"{_mp(g[k]):>18s}" for k in ("verify", "round", "tokens_per_s"))
            labels = ",".join(g["acceptance"]) or "-"
            lines.append(f"{key} {figs} {_mp(g['speedup']):>18s} {g['skipped']:7d} {labels}")
    return lines


def _cell_lines(rep: dict) -> list[str]:
    lines = [
        f"{'model':20s} {'context':>7s} {'batch':>5s} {'baseline':16s} {'accept':>6s} "
        f"{'tok/s run':>10s} {'tok/s meas':>11s} {'pred':>11s} {'err':>7s} "
        f"{'verify ms meas':>14s} {'pred':>8s}"
    ]
    for c in rep["cells"]:
        m, p = c["measured"], c["predicted"]
        head = (
            f"{c['model']:20s} {c['context']:7d} {c['batch']:5d} {c['baseline']:16s} "
            f"{c['acceptance'] or '-'!s:>6s} {m['run_tokens_per_s']:10.1f} "
            f"{m['tokens_per_s']:11.1f}"
        )
        if p is None:
            lines.append(f"{head}  no prediction: {c['unpredicted']}")
            continue
        err = 100 * (p["tokens_per_s"] / m["tokens_per_s"] - 1)
        verify = f"{1e3 * p['verify_s']:8.3f}" if p["verify_s"] is not None else f"{'-':>8s}"
        lines.append(
            f"{head} {p['tokens_per_s']:11.1f} {err:+6.1f}% {1e3 * m['verify_s']:14.3f} {verify}"
        )
    return lines


def text(rep: dict) -> str:
    """The report as fixed-width text: the campaign, the errors per group, every speedup pair,
    the cells, the skipped cells and the targets."""
    c, o = rep["campaign"], rep["overall"]
    lines = [
        f"scale campaign {rep['source']}: gpu {c['gpu']} ({c['device_name']}), commit "
        f"{str(c['git_commit'])[:10]}, {'complete' if c['complete'] else 'INCOMPLETE'}",
        f"acceptance: {', '.join(o['acceptance']) or '-'} (campaign: {c['acceptance']})",
        f"prediction: {rep['prediction']}",
        f"measured: {rep['measured']}",
        f"intervals: {rep['intervals']['note']}",
        "",
        "APE median/p90 (n) per model, per batch, per batch and context:",
        *_group_lines(rep["groups"]),
        "",
    ]
    pairs = [(f"speedup {k}", v) for k, v in o["speedups"].items()]
    rows = [("verify step", o["verify"]), ("round", o["round"]), ("tokens/s", o["tokens_per_s"])]
    rows.append(("simulator tokens/s (whole run)", o["simulated_tokens_per_s"]))
    lines += ape_text_lines(
        "figure (all cells)",
        rows + [("speedup (every pair)", o["speedup"]), *pairs],
        name_width=32,
        n_width=4,
        percent_widths=(8, 7, 7),
    )
    lines += ["", *_cell_lines(rep), ""]
    lines.append(f"skipped cells: {len(rep['skipped'])}")
    for s in rep["skipped"]:
        lines.append(
            f"  {s['model']} context {s['context']} batch {s['batch']} ({s['batch_label']}) "
            f"{s['baseline']} acceptance {s['acceptance'] or '-'}: {s['reason']}"
        )
    lines.append("")
    for name, t in rep["targets"].items():
        value = "-" if t["value"] is None else f"{100 * t['value']:5.1f}%"
        lines.append(
            f"{name:24s} {value:>6s}  (<= {100 * t['threshold']:.0f}%)  "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)
