"""The tables :mod:`validation.nsa_stages` prints: one line per case with the floor, every
call's and stage's time and the calls' ratios to the floor (``print_table``), and the calls
and stages timed without and with PDL side by side with what PDL saves (``print_pdl_table``).
Times in microseconds."""

from __future__ import annotations

from ssvkit.calibration.error_table import markdown_header, markdown_row

K = 1024

COLUMNS = {
    "reuse": "reuse",
    "reuse_folded": "reuse_fold",
    "reuse_last": "reuse_last",
    "reuse_parallel": "reuse_par",
    "reuse_unfused": "reuse_unf",
    "refresh": "refresh",
    "refresh_folded": "refr_fold",
    "refresh_unfused": "refr_unf",
    "stage_fwd_all": "fwd_all",
    "stage_merge": "merge",
    "stage_fwd_refresh_comp": "r_comp",
    "stage_scores": "scores",
    "stage_topk": "topk",
    "stage_select_folded": "sel_fold",
    "stage_union_plan": "union",
}


def print_table(rows: list[dict]) -> None:
    """One line per case: the floor, the times (us), each call's ratio to the floor and what
    folding the merge and the pick saved (negative: the fold is slower)."""
    print(
        f"{'case':>18s} {'floor':>7s}"
        + "".join(f" {n:>9s}" for n in COLUMNS.values())
        + "  reuse/floor  refresh/floor  fused/unfused  fold saves reuse, refresh (us)"
    )
    for r in rows:
        ts = {k: v * 1e6 for k, v in r["times_s"].items()}
        floor_us = r["floor_s"] * 1e6
        case = case_label(r)
        print(
            f"{case:>18s} {floor_us:7.1f}"
            + "".join(f" {ts[c]:9.1f}" for c in COLUMNS)
            + f"  {ts['reuse'] / floor_us:11.2f}  {ts['refresh'] / floor_us:13.2f}"
            + f"  {ts['reuse_unfused'] / ts['reuse']:13.2f}"
            + f"  {ts['reuse'] - ts['reuse_folded']:10.1f}, "
            + f"{ts['refresh'] - ts['refresh_folded']:.1f}"
        )


# The calls and stages timed without and with PDL, and their column labels.
PDL_PAIRS = {
    "reuse": "reuse",
    "reuse_unfused": "reuse_unf",
    "refresh": "refresh",
    "refresh_unfused": "refr_unf",
    "stage_refresh_select": "r_select",
    "select": "select",
    "stage_fwd_all": "fwd_all",
    "stage_merge": "merge",
}


def case_label(row: dict) -> str:
    case = f"b{row['batch']} t{row['num_query_tokens']} {row['context_len'] // K}K"
    if row["capacity"] > row["context_len"] + row["num_query_tokens"]:
        case += f"/{row['capacity'] // K}K"
    return case


def print_pdl_table(rows: list[dict]) -> None:
    """One line per case: each call or stage of ``PDL_PAIRS`` without PDL, with it, and what
    PDL saves (negative: slower with it). ``fwd_all`` and ``merge`` are the PDL kernels
    launched on their own: what their wait and prologue cost, with no launch to overlap."""
    cell = f"{{:>{3 * 8 + 2}s}}"
    print("\nwithout PDL, with PDL, saved (us)")
    print(f"{'case':>18s}" + "".join(" " + cell.format(n) for n in PDL_PAIRS.values()))
    for r in rows:
        ts = {k: v * 1e6 for k, v in r["times_s"].items()}
        line = f"{case_label(r):>18s}"
        for name in PDL_PAIRS:
            off, on = ts[name], ts[f"{name}_pdl"]
            line += f"   {off:7.1f} {on:7.1f} {off - on:+7.1f}"
        print(line)


# The calls of the results page's tables and their column labels.
MARKDOWN_CALLS = {
    "reuse": "reuse us",
    "reuse_folded": "reuse folded us",
    "reuse_unfused": "reuse unfused us",
    "refresh": "refresh us",
    "refresh_folded": "refresh folded us",
    "refresh_unfused": "refresh unfused us",
}
MARKDOWN_PDL = ("reuse", "reuse_unfused", "refresh", "refresh_unfused", "select")


def _context(row: dict) -> str:
    label = f"{row['context_len'] // K}K"
    if row["capacity"] > row["context_len"] + row["num_query_tokens"]:
        label += f" (cache {row['capacity'] // K}K)"
    return label


def _markdown(header: list[str], lines: list[list[str]]) -> str:
    return "\n".join(markdown_header(header) + [markdown_row(cells) for cells in lines]) + "\n"


def calls_markdown(rows: list[dict]) -> str:
    """One row per case: the floor and the default, folded and unfused calls (us)."""
    header = ["batch", "rows t", "context", "floor us", *MARKDOWN_CALLS.values()]
    lines = [
        [str(r["batch"]), str(r["num_query_tokens"]), _context(r), f"{r['floor_s'] * 1e6:.1f}"]
        + [f"{r['times_s'][c] * 1e6:.1f}" for c in MARKDOWN_CALLS]
        for r in rows
    ]
    return _markdown(header, lines)


def pdl_markdown(rows: list[dict]) -> str:
    """One row per case: each call of ``MARKDOWN_PDL`` without / with PDL (us)."""
    header = ["batch", "rows t", "context", *(c.replace("_", " ") for c in MARKDOWN_PDL)]
    lines = [
        [str(r["batch"]), str(r["num_query_tokens"]), _context(r)]
        + [
            f"{r['times_s'][c] * 1e6:.1f} / {r['times_s'][c + '_pdl'] * 1e6:.1f}"
            for c in MARKDOWN_PDL
        ]
        for r in rows
    ]
    return _markdown(header, lines)
