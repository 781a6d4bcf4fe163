"""The verify-step table of ``docs/results/engine.md`` from an ``engine_verify`` document
(``validation/data/engine-verify-h200.json``): per strategy, context and draft rows, one
CUDA-graph replay of the verify forward against the sum of its ops and against its floor, the
attention ops' share and perfmodel's prediction, in milliseconds."""

from __future__ import annotations

from ssvkit.calibration.error_table import markdown_header, markdown_row

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


def verify_markdown(doc: dict) -> str:
    """One table row per row of ``doc``, in its order."""
    lines = markdown_header(COLUMNS)
    for r in doc["rows"]:
        lines.append(
            markdown_row(
                (
                    r["strategy"],
                    f"{r['context'] // K}K",
                    str(r["t"]),
                    f"{r['graph_s'] * 1e3:.2f}",
                    f"{r['graph_over_ops_sum']:.2f}",
                    f"{r['graph_over_floor']:.2f}",
                    f"{attention_s(r) * 1e3:.2f}",
                    f"{r['predicted_verify_s'] * 1e3:.2f}",
                )
            )
        )
    return "\n".join(lines) + "\n"
