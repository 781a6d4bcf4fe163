"""The verify-step table of ``docs/results/engine.md`` from an ``engine_verify`` document
(``validation/data/engine-verify-h200.json``): per strategy, context and draft rows, one
CUDA-graph replay of the verify forward against the sum of its ops and against its floor, the
attention ops' share and perfmodel's prediction, in milliseconds: the one the document stored,
or (``current_predictions``) the committed profile's now, which moves with every refit."""

from __future__ import annotations

import dataclasses

from ssvkit.calibration.error_table import markdown_header, markdown_row
from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.nsa_plan import DEFAULT_TILE_PLAN
from ssvkit.perfmodel.strategy import PACKED_ROWS, Strategy, with_nsa_rows_per_tile
from ssvkit.validation.decode_figures import predicted_verify_s
from ssvkit.validation.records import NSA_SCHEDULE

K = 1024
COLUMNS = (
    "strategy",
    "context",
    "t",
    "graph ms",
    "graph / ops",
    "graph / floor",
    "attention ms",
    "predicted ms",
)


def attention_s(row: dict) -> float:
    """The attention ops' time in one step: each attention op (refresh and reuse layers apart)
    timed alone, times the layers that run it."""
    ops = row["ops"].items()
    return sum(op["median_s"] * op["count"] for name, op in ops if name.startswith("attention"))


def parse_grouping(text: str | None) -> tuple[str, int] | None:
    """``--grouping MODE:C`` as (mode, C); ``ValueError`` names a bad value."""
    if text is None:
        return None
    mode, _, c = text.partition(":")
    if mode not in ("per_query", "union", "shared") or not c.isdigit() or int(c) < 1:
        raise ValueError(
            f"--grouping must be MODE:C (per_query:1, union:C, shared:C), got {text!r}"
        )
    if mode == "per_query" and int(c) != 1:
        raise ValueError(f"--grouping per_query takes C = 1, got {text!r}")
    return mode, int(c)


def with_grouping(strategy: Strategy, grouping: tuple[str, int] | None) -> Strategy:
    """``strategy`` with the query grouping ``grouping`` where it is sparse and selects by
    block metadata (NSA selects per row whatever the grouping)."""
    if grouping is None or not strategy.is_sparse or strategy.metadata == "nsa":
        return strategy
    return dataclasses.replace(strategy, mode=grouping[0], group_size=grouping[1])


def parse_refresh(text: str | None) -> tuple[int, ...] | None:
    """``--refresh-every N[,M...]`` as a tuple of cadences; ``ValueError`` names a bad value."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--refresh-every must be layers >= 1, comma-separated, got {text!r}")
    return tuple(dict.fromkeys(int(p) for p in parts))


def with_refresh(strategy: Strategy, refresh_every: int | None) -> Strategy:
    """``strategy`` refreshing its selection every ``refresh_every`` layers where it is sparse
    (dense attention has no selection)."""
    if refresh_every is None or not strategy.is_sparse:
        return strategy
    return dataclasses.replace(strategy, refresh_every=refresh_every)


def row_key(name: str, metadata: str, row: dict) -> tuple:
    """What tells one row's strategy from another's: its baseline, block scores, query grouping
    (none for dense and NSA attention), refresh cadence (none for dense attention) and NSA tile
    plan (NSA attention only; a row without one ran the default) as its attention ran them."""
    a = row.get("attention", {})
    grouping = (a["mode"], a["group_size"]) if a.get("kind") == "sparse" else None
    refresh = a.get("refresh_every") if a.get("kind") in ("sparse", "nsa") else None
    plan = a.get("tile_plan", DEFAULT_TILE_PLAN) if a.get("kind") == "nsa" else None
    return name, metadata, grouping, refresh, plan


def with_metadata(strategy: Strategy, metadata: str) -> Strategy:
    """``strategy`` with ``metadata``'s block scores where it is sparse (dense ones have none)."""
    if not strategy.is_sparse:
        return strategy
    return dataclasses.replace(strategy, metadata=metadata)


def row_strategy(row: dict) -> Strategy:
    """The strategy a row measured: its baseline with the block scores, the query grouping, the
    NSA row schedule and the compressed branch's tiles it ran."""
    s = Strategy.from_name(row["strategy"])
    if s.is_sparse:
        s = dataclasses.replace(s, metadata=row.get("metadata", s.metadata))
        _, _, grouping, refresh, _ = row_key(s.name, s.metadata, row)
        if grouping is not None:
            s = dataclasses.replace(s, mode=grouping[0], group_size=grouping[1])
        s = with_refresh(s, refresh)
    a = row.get("attention", {})
    tiles = a.get("context_tiles", s.nsa_context_tiles)
    s = dataclasses.replace(
        s, nsa_context_tiles=tiles, nsa_tile_plan=a.get("tile_plan", DEFAULT_TILE_PLAN)
    )
    return with_nsa_rows_per_tile(s, row.get(NSA_SCHEDULE, PACKED_ROWS))


def strategy_label(row: dict) -> str:
    """The row's baseline, with its block scores, query grouping, refresh cadence and NSA tile
    plan where they are not the baseline's own."""
    metadata = row.get("metadata", "nsa")
    own = Strategy.from_name(row["strategy"])
    _, _, grouping, refresh, plan = row_key(row["strategy"], metadata, row)
    parts = [] if metadata == "nsa" else [metadata]
    if grouping is not None and grouping != (own.mode, own.group_size):
        parts.append(f"{grouping[0]} C={grouping[1]}")
    if refresh is not None and refresh != own.refresh_every:
        parts.append(f"refresh every {refresh}")
    if plan is not None and plan != own.nsa_tile_plan:
        parts.append(f"tile plan {plan}")
    return row["strategy"] + (f" ({', '.join(parts)})" if parts else "")


def current_predictions(doc: dict, gpu: str) -> list[float | None]:
    """perfmodel's verify forward of every row of ``doc`` with ``gpu``'s committed profile, the
    engine's element-wise ops as the document's run had them."""
    elementwise = elementwise_of_run(doc["provenance"])
    return [
        predicted_verify_s(row_strategy(r), doc["model"], r["context"], r["t"], gpu, elementwise)[0]
        for r in doc["rows"]
    ]


def verify_markdown(doc: dict, predicted: list[float | None] | None = None) -> str:
    """One table row per row of ``doc``, by context, then strategy (in the order they first
    appear), then t; the prediction column from ``predicted`` (one per row of ``doc``,
    ``current_predictions``) or, without it, the document's."""
    lines = markdown_header(COLUMNS)
    rows = doc["rows"]
    preds = [r["predicted_verify_s"] for r in rows] if predicted is None else list(predicted)
    if len(preds) != len(rows):
        raise ValueError(f"{len(preds)} predictions for {len(rows)} rows")
    first: dict[str, int] = {}
    for r in rows:
        first.setdefault(strategy_label(r), len(first))
    order = sorted(
        range(len(rows)),
        key=lambda i: (rows[i]["context"], first[strategy_label(rows[i])], rows[i]["t"]),
    )
    for r, pred in ((rows[i], preds[i]) for i in order):
        lines.append(
            markdown_row(
                (
                    strategy_label(r),
                    f"{r['context'] // K}K",
                    str(r["t"]),
                    f"{r['graph_s'] * 1e3:.2f}",
                    f"{r['graph_over_ops_sum']:.2f}",
                    f"{r['graph_over_floor']:.2f}",
                    f"{attention_s(r) * 1e3:.2f}",
                    "-" if pred is None else f"{pred * 1e3:.2f}",
                )
            )
        )
    return "\n".join(lines) + "\n"


def row_lines(row: dict) -> list[str]:
    """An ``engine_verify`` row as the lines it prints: the step against its ops' sum, its floor
    and its prediction; each op against its floor; each attention op's launches; a sparse
    step's selection."""
    ops, sel, pred = row["ops"], row["selection"], row["predicted_verify_s"]
    lines = [
        f"{strategy_label(row):16s} T={row['context']:7d} t={row['t']:3d}  "
        f"graph {row['graph_s'] * 1e3:7.3f} ms  eager {row['eager_s'] * 1e3:7.3f} ms  "
        f"ops sum {row['ops_sum_s'] * 1e3:7.3f} ms (graph/sum {row['graph_over_ops_sum']:.3f})  "
        f"floor {row['floor_s'] * 1e3:6.3f} ms (graph/floor {row['graph_over_floor']:.2f}, "
        f"{row['achieved_bytes_per_s'] / 1e12:.2f} TB/s)  predicted "
        + (f"{pred * 1e3:.3f} ms" if pred else row["prediction_provenance"]),
        "    op / floor: "
        + ", ".join(f"{k} {o['over_floor']:.2f}" for k, o in ops.items() if "over_floor" in o),
    ]
    for name, op in ops.items():
        if "launches" in op:
            lines.append(
                f"    {name} launches (us): "
                + ", ".join(f"{x['kernel']} {x['median_s'] * 1e6:.1f}" for x in op["launches"])
            )
    if sel is not None:
        lines.append(
            f"    selection: {sel['unique_blocks']:.0f} distinct / {sel['streamed_blocks']:.0f} "
            f"streamed blocks per (sequence, KV head) (top_n {sel['top_n']}); attention / floor "
            "with them: "
            + ", ".join(
                f"{k} {o['over_floor_selected']:.2f}"
                for k, o in ops.items()
                if "over_floor_selected" in o
            )
        )
    return lines
