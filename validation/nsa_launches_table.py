"""The tables of :mod:`validation.nsa_launches`: per case and call its CUDA-graph time against
the byte floor and each launch's device time in the order the launches start (``print_table``,
``launches_markdown``). Times in microseconds."""

from __future__ import annotations

from ssvkit.calibration.error_table import markdown_header, markdown_row

K = 1024
# Short names of the kernels an NSA call launches.
LABELS = {
    "nsa_fwd_kernel": "fwd",
    "nsa_pair_fwd_kernel": "pair_fwd",
    "nsa_merge_kernel": "merge",
    "nsa_gate_kernel": "gate",
    "stored_block_score_kernel": "scores",
    "band_score_kernel": "scores",
    "block_score_kernel": "scores",
    "refresh_select_kernel": "scores+pick",
    "threshold_blocks_kernel": "pick",
    "topk_blocks_kernel": "pick",
    "union_plan_kernel": "union",
}


def case_label(r: dict) -> str:
    """``b1 t16 128K r4``: batch, draft rows, context and row schedule of a case, then the
    config fields it changed (``num_warps=8``), if any."""
    label = f"b{r['batch']} t{r['num_query_tokens']} {r['context_len'] // K}K r{r['rows_per_tile']}"
    changed = ",".join(f"{k}={v}" for k, v in r.get("config", {}).items())
    return f"{label} {changed}" if changed else label


def launches_text(call: dict) -> str:
    """Each launch as ``label time`` in the order they start, ``*`` marking a side stream's;
    torch's fills as ``fill``."""
    return ", ".join(
        f"{LABELS.get(x['kernel'], 'fill')}{'*' if x.get('side_stream') else ''} "
        f"{x['median_s'] * 1e6:.1f}"
        for x in call["launches"]
    )


def _lines(rows: list[dict]):
    for r in rows:
        for name, c in r["calls"].items():
            yield r, name, c


def print_table(rows: list[dict]) -> None:
    """One line per case and call: floor, graph time, its ratio to the floor, the launches'
    device-time sum and each launch."""
    print(f"{'case':>16s} {'call':>16s} {'floor':>6s} {'graph':>7s} {'x floor':>7s} {'sum':>7s}")
    for r, name, c in _lines(rows):
        print(
            f"{case_label(r):>16s} {name:>16s} {r['floor_s'] * 1e6:6.1f} "
            f"{c['graph_s'] * 1e6:7.1f} {c['graph_s'] / r['floor_s']:7.2f} "
            f"{c['kernel_sum_s'] * 1e6:7.1f}  {launches_text(c)}"
        )


def launches_markdown(rows: list[dict]) -> str:
    """``print_table`` as a markdown table (``*``: a launch on a side stream)."""
    head = ("case", "call", "floor us", "graph us", "x floor", "launches' sum us", "launches (us)")
    lines = markdown_header(head)
    for r, name, c in _lines(rows):
        lines.append(
            markdown_row(
                (
                    case_label(r),
                    f"`{name}`",
                    f"{r['floor_s'] * 1e6:.1f}",
                    f"{c['graph_s'] * 1e6:.1f}",
                    f"{c['graph_s'] / r['floor_s']:.2f}",
                    f"{c['kernel_sum_s'] * 1e6:.1f}",
                    launches_text(c),
                )
            )
        )
    return "\n".join(lines)
