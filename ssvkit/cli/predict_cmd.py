"""``ssvkit predict``: step-time breakdowns, tokens/s and speedups of the baselines.

ssvkit predict                                  # Llama-3.1-8B, h100-sxm, 8K..128K
ssvkit predict --model qwen3-8b --context 16K,64K --acceptance 0.8 --json
ssvkit predict --csv out.csv --plot out.png
ssvkit predict --gpu h200                       # h100-sxm's profile on h200's ceilings
ssvkit predict --gpu a100-80g --roofline        # no Ampere profile: the datasheet roofline
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

from ssvkit.cli.options import (
    add_dataclass_options,
    add_pricing_options,
    bounded_parts,
    check_drafter_model,
    given,
    interval_legend,
    intervals_doc,
    pricing_gpu,
)
from ssvkit.cli.predict_plot import predict_plot
from ssvkit.perfmodel.baselines import base_provenance, compare, grouped_seconds
from ssvkit.perfmodel.costs import memory_shortfall
from ssvkit.perfmodel.files import check_output, write_files
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.numbers import count_label, figure, parse_count_list
from ssvkit.perfmodel.strategy import (
    BASELINES,
    DrafterSpec,
    Strategy,
    Workload,
    check_feasible,
    parse_tree,
)

HELP = "predict step times, tokens/s and speedups of ar/sd/sparse/ssv baselines"
DEFAULT_CONTEXTS = "8K,16K,32K,64K,128K"
WORKLOAD_FIELDS = (
    "batch",
    "tp",
    "acceptance",
    "overlap",
    "dtype",
    "kv_bytes",
    "elementwise",
    "loop",
)
SD_FIELDS = ("tree", "traversal")
SPARSE_FIELDS = ("top_n", "block_size", "window", "comp_block", "comp_stride", "metadata")
SSV_FIELDS = ("mode", "group_size", "refresh_every", "fusion")
DRAFTER_FIELDS = ("kind", "model", "draft_vocab", "sparsity_ratio")
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def add_arguments(p) -> None:
    p.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="registry name or path to a HF config.json (default: llama-3.1-8b)",
    )
    p.add_argument("--gpu", default="h100-sxm", help="GPU registry key (default: h100-sxm)")
    p.add_argument(
        "--context",
        default=DEFAULT_CONTEXTS,
        help=f"context lengths, comma-separated, K = 1024 (default: {DEFAULT_CONTEXTS})",
    )
    p.add_argument(
        "--strategies",
        default=",".join(BASELINES),
        help=f"baselines to compare (default: {','.join(BASELINES)})",
    )
    add_pricing_options(p)
    add_dataclass_options(p, Workload, WORKLOAD_FIELDS)
    g = p.add_argument_group("speculative strategies (sd_*, ssv)")
    add_dataclass_options(g, Strategy, SD_FIELDS, defaults=BASELINES["ssv"])
    add_dataclass_options(g, DrafterSpec, DRAFTER_FIELDS, prefix="drafter-")
    g = p.add_argument_group("sparse attention (ar_sparse, sd_sparse_naive, ssv)")
    add_dataclass_options(g, Strategy, SPARSE_FIELDS)
    g = p.add_argument_group("ssv grouping and refresh/reuse")
    add_dataclass_options(g, Strategy, SSV_FIELDS, defaults=BASELINES["ssv"])
    p.add_argument("--json", action="store_true", help="print JSON (every figure with provenance)")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="also write a roofline of the ops and speedup vs context (.png, .pdf or .svg)",
    )


def build_strategies(args) -> list[Strategy]:
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    if not names:
        raise ValueError("--strategies needs at least one name")
    drafter_kw = given(args, DRAFTER_FIELDS, prefix="drafter_")
    sd_kw = given(args, SD_FIELDS)
    sparse_kw = given(args, SPARSE_FIELDS)
    ssv_kw = given(args, SSV_FIELDS)
    out = []
    for n in names:
        s = Strategy.from_name(n)
        kw = {}
        if s.tree != "chain:0":
            kw.update(sd_kw)
            kw["drafter"] = dataclasses.replace(s.drafter, **drafter_kw)
        if s.is_sparse:
            kw.update(sparse_kw)
        if n == "ssv":
            kw.update(ssv_kw)
        out.append(dataclasses.replace(s, **kw))
    check_drafter_model(drafter_kw, out)
    return out


def interval_lines(rows) -> list[str]:
    """What the intervals are (or why there are none), the extrapolation mark and the share of
    a round priced without residuals, as the text outputs say it."""
    lines = interval_legend([r["intervals"] is not None for r in rows], rows[0]["interval_note"])
    if rows[0]["intervals"] is None:
        return lines
    if any(r["extrapolated"] for r in rows):
        lines.append(
            "* extrapolated: some op outside its class's measured range; its interval takes "
            "the leave-one-out residuals too"
        )
    share = max(r["uncovered_share"] for r in rows)
    if share >= 5e-4:
        lines.append(
            f"ops priced by the roofline (no residuals) are up to {100 * share:.1f}% of a "
            "round, inside no interval"
        )
    return lines


def _table(rows, model, gpu, workload, strategies) -> str:
    lines = _heading(rows, model, gpu, workload, strategies)
    lines += _figure_lines(rows)
    lines += _footnotes(rows, strategies)
    return "\n".join(lines)


def _heading(rows, model, gpu, workload, strategies) -> list[str]:
    """The table's first lines: the model, GPU, pricing and workload, and the draft of the
    first speculative strategy."""
    prov = base_provenance(rows[0])
    sd = next((s for s in strategies if s.tree != "chain:0"), None)
    lines = [
        f"{model.name} on {gpu.name} [{prov}]  batch {workload.batch}  tp {workload.tp}  "
        f"acceptance {workload.acceptance:g}  overlap {workload.overlap:g}  "
        f"element-wise {workload.elementwise}  loop {workload.loop}",
    ]
    if sd is not None:
        r = next(r for r in rows if r["strategy"] == sd.name)
        lines.append(
            f"draft: {sd.drafter.kind}, tree {sd.tree} ({r['num_draft_tokens']} nodes, "
            f"{r['tokens_per_round']:.2f} tokens/round)"
        )
    return lines


def _cells(r) -> tuple:
    """A row's context and strategy, then its figures as (value, interval) text pairs."""
    iv = r["intervals"] or {}
    return (
        count_label(r["context_len"]),
        r["strategy"] + ("*" if r["extrapolated"] else ""),
        bounded_parts(r["tokens_per_s"], iv.get("tokens_per_s"), ".1f"),
        bounded_parts(r["speedup_vs_ar_dense"], iv.get("speedup_vs_ar_dense"), ".2f", "x"),
        bounded_parts(r["speedup_vs_ar_sparse"], iv.get("speedup_vs_ar_sparse"), ".2f", "x"),
        bounded_parts(r["round_s"] * 1e3, _ms(iv.get("round_s")), ".2f"),
    )


def _figure_lines(rows) -> list[str]:
    """The column heads, a rule and a line per row: its figures, each value and interval
    aligned in its column, and the round's op groups in ms."""
    cells = [_cells(r) for r in rows]
    names = ("tok/s", "vs ar_dense", "vs ar_sparse", "round ms")
    value_w = [max(len(c[i][0]) for c in cells) for i in range(2, 6)]
    iv_w = [max(len(c[i][1]) for c in cells) for i in range(2, 6)]
    width = [max(len(n), v + (i and i + 1)) for n, v, i in zip(names, value_w, iv_w, strict=True)]
    head = f"{'context':>8s} {'strategy':16s}" + "".join(
        f" {n:>{w}s}" for n, w in zip(names, width, strict=True)
    )
    head += (
        f" | {'draft':>6s} {'gemm':>6s} {'attn':>6s} {'select':>6s} {'other':>6s} {'loop':>6s}"
        "  (ms)"
    )
    lines = [head, "-" * len(head)]
    for r, c in zip(rows, cells, strict=True):
        g = grouped_seconds(r)
        lines.append(
            f"{c[0]:>8s} {c[1]:16s}{_figures(c[2:], value_w, iv_w, width)} | "
            f"{g['draft'] * 1e3:6.2f} {g['gemm'] * 1e3:6.2f} {g['attention'] * 1e3:6.2f} "
            f"{g['selection'] * 1e3:6.2f} {g['other'] * 1e3:6.2f} {g['loop'] * 1e3:6.2f}"
        )
    return lines


def _figures(items, value_w, iv_w, width) -> str:
    out = ""
    for (v, i), vw, iw, w in zip(items, value_w, iv_w, width, strict=True):
        text = f"{v:>{vw}s}" + (f" {i:<{iw}s}" if iw else "")
        out += f" {text:>{w}s}"
    return out


def _footnotes(rows, strategies) -> list[str]:
    """The lines under the table: the intervals, where NSA's selection is counted and the
    ops priced by a stand-in class."""
    lines = interval_lines(rows)
    if rows[0]["intervals"] is not None:
        lines.append(
            "draft .. loop: parts of round ms (loop: the decode loop's host time); each op's "
            "interval is in --json and --csv"
        )
    if any(s.is_sparse and s.metadata == "nsa" for s in strategies):
        lines.append(
            "NSA strategies select inside their refresh attention call: in attn, not select."
        )
    stood_in = sorted({x for r in rows for x in r["stand_ins"]})
    if stood_in:
        names = sorted({r["strategy"] for r in rows if r["stand_ins"]})
        lines.append(
            f"stand-in ({', '.join(names)}): the profile has no rows of "
            + ", ".join(x.split(" <- ")[0] for x in stood_in)
            + "; priced with the rates of "
            + ", ".join(x.split(" <- ")[1] for x in stood_in)
            + " at their own bytes and launch geometry; their intervals take the leave-one-out"
            " residuals too."
        )
    return lines


def _ms(iv):
    return None if iv is None else [x * 1e3 for x in iv]


def _json(rows, model, gpu, workload, notes) -> str:
    out_rows = []
    for r in rows:
        p = r["provenance"]
        iv = r["intervals"] or {}
        op_iv = iv.get("op_s", {})

        def fig(key, unit, r=r, p=p, iv=iv):
            return {**figure(r[key], unit, p), "interval": iv.get(key)}

        out_rows.append(
            {
                "context_len": r["context_len"],
                "strategy": r["strategy"],
                "tokens_per_s": fig("tokens_per_s", "tokens/s"),
                "speedup_vs_ar_dense": fig("speedup_vs_ar_dense", "x"),
                "speedup_vs_ar_sparse": fig("speedup_vs_ar_sparse", "x"),
                "tokens_per_round": figure(r["tokens_per_round"], "tokens", "model:acceptance"),
                "round_s": fig("round_s", "s"),
                "draft_s": fig("draft_s", "s"),
                "verify_s": fig("verify_s", "s"),
                "uncovered_share": figure(r.get("uncovered_share"), "fraction of round_s", p),
                "ops": {
                    k: {
                        "time": {**figure(v, "s", p), "interval": op_iv.get(k)},
                        "residuals": r["op_residuals"].get(k),
                        "flops": figure(r["op_flops"][k], "FLOP", "model:counts"),
                        "bytes": figure(r["op_bytes"][k], "B", "model:counts"),
                    }
                    for k, v in r["op_s"].items()
                },
            }
        )
    return json.dumps(
        {
            "model": model.name,
            "gpu": gpu.name,
            "provenance": base_provenance(rows[0]),
            "ceilings": gpu.provenance,
            "intervals": intervals_doc(
                rows[0]["interval_note"] if rows[0]["intervals"] is None else None
            ),
            "workload": dataclasses.asdict(workload),
            "notes": notes,
            "rows": out_rows,
        },
        indent=2,
    )


def _csv(rows) -> str:
    buf = io.StringIO()
    ops = sorted({k for r in rows for k in r["op_s"]})
    figures = [
        "tokens_per_s",
        "speedup_vs_ar_dense",
        "speedup_vs_ar_sparse",
        "round_s",
        "draft_s",
        "verify_s",
    ]
    w = csv.writer(buf)
    w.writerow(
        [
            "context_len",
            "strategy",
            *[f"{f}{x}" for f in figures for x in ("", "_low", "_high")],
            "tokens_per_round",
            *[f"{k}_s{x}" for k in ops for x in ("", "_low", "_high")],
            "uncovered_share",
            "extrapolated",
            "provenance",
        ]
    )
    for r in rows:
        iv = r["intervals"] or {}
        op_iv = iv.get("op_s", {})
        w.writerow(
            [
                r["context_len"],
                r["strategy"],
                *[x for f in figures for x in (r[f], *(iv.get(f) or ("", "")))],
                r["tokens_per_round"],
                *[
                    x
                    for k in ops
                    for x in (r["op_s"].get(k, 0.0), *(op_iv.get(k) or _zero_or_blank(r, k)))
                ],
                r.get("uncovered_share", ""),
                r["extrapolated"],
                r["provenance"],
            ]
        )
    return buf.getvalue()


def _zero_or_blank(row, op) -> tuple:
    """The CSV's interval cells of an op a row does not run (0 s: a zero-width interval) or
    of a prediction without intervals (blank)."""
    return (0.0, 0.0) if row["intervals"] is not None and op not in row["op_s"] else ("", "")


def check_outputs(args) -> None:
    """Refuse bad output paths before anything is computed: a folder, a missing or read-only
    folder, a plot format matplotlib is not asked to write (the extension picks it)."""
    if args.csv:
        check_output(args.csv, "--csv")
    if args.plot:
        check_output(args.plot, "--plot", PLOT_SUFFIXES)


def memory_notes(model, gpu, workload, contexts, strategies) -> list[str]:
    """One line per context past the model's trained positions or the GPUs' memory;
    ``ValueError`` when no context fits at all (absurd batches and contexts)."""
    drafts = max(len(parse_tree(s.tree)) for s in strategies)
    w = workload
    short = {
        T: memory_shortfall(model, gpu, w.tp, w.kv_bytes, w.batch, T, drafts) for T in contexts
    }
    if all(short.values()):
        raise ValueError(f"no --context fits in memory: {short[min(contexts)]}")
    notes = [f"context {T} does not fit: {why}" for T, why in short.items() if why]
    limit = model.max_position_embeddings
    past = [T for T in contexts if limit and T > limit]
    if past:
        notes.append(
            f"context {', '.join(map(str, past))} is past {model.name}'s {limit} trained "
            "positions (ssvkit rank skips such regimes)"
        )
    return notes


def run(args) -> int:
    model = get_model(args.model)
    gpu = pricing_gpu(args, args.gpu)
    contexts = parse_count_list(args.context, "--context")
    check_outputs(args)
    workload = Workload(**{"context_len": contexts[0], **given(args, WORKLOAD_FIELDS)})
    strategies = build_strategies(args)
    for s in strategies:
        for T in contexts:
            check_feasible(s, dataclasses.replace(workload, context_len=T), model)
    notes = memory_notes(model, gpu, workload, contexts, strategies)
    rows = compare(model, gpu, strategies, contexts, workload)
    # Everything is computed before anything is written: bad input never leaves a file behind.
    outputs = []
    if args.csv:
        outputs.append((args.csv, _csv(rows), "--csv"))
    if args.plot:
        fmt = Path(args.plot).suffix.lower().lstrip(".")
        outputs.append((args.plot, predict_plot(rows, gpu, workload.dtype, fmt), "--plot"))
    write_files(outputs)
    if args.json:
        print(_json(rows, model, gpu, workload, notes))
    else:
        print("\n".join([_table(rows, model, gpu, workload, strategies)] + notes))
    return 0
