"""``ssvkit simulate``: discrete-event simulation of the decode loop, the asynchronous designs
(PRR, Saguaro SSD, SparseSpec) and serving, with per-request CSV, Chrome trace and Gantt PNG.

ssvkit simulate ssv --num-tokens 2048 --json
ssvkit simulate ssd --batch 8 --ssd-fallback auto --out-dir out/
ssvkit simulate serve --context 8K --num-tokens 256 --serve-rate 2 --num-requests 300 --no-files
ssvkit simulate sd_dense --acceptance-model trace --trace run.jsonl --trace-out replay.jsonl
"""

from __future__ import annotations

import dataclasses
import json
from argparse import SUPPRESS
from pathlib import Path

from ssvkit.cli.options import (
    add_dataclass_options,
    add_pricing_options,
    check_drafter_model,
    given,
    parse_one,
)
from ssvkit.perfmodel.files import check_folder, check_output, write_files
from ssvkit.perfmodel.numbers import interval_text
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy
from ssvkit.sim.config import (
    LOOP_SCENARIOS,
    SCENARIOS,
    PrrConfig,
    ServeConfig,
    SimConfig,
    SparseSpecConfig,
    SsdConfig,
    default_strategy,
)

HELP = "simulate the draft/verify loop, PRR, Saguaro SSD, SparseSpec or serving (simpy)"
RUN_FIELDS = (
    "model",
    "gpu",
    "num_tokens",
    "length_spread",
    "num_requests",
    "batch",
    "tp",
    "kv_bytes",
    "elementwise",
    "loop",
    "acceptance",
    "acceptance_model",
    "acceptance_table",
    "trace",
    "loop_overhead_s",
    "overlap",
    "overlap_spread",
    "layer_overlap",
    "kv_capacity_tokens",
    "memory_fraction",
    "context_bucket",
    "timeline_rounds",
    "seed",
)
STRATEGY_FIELDS = (
    "tree",
    "traversal",
    "top_n",
    "block_size",
    "window",
    "comp_stride",
    "metadata",
    "mode",
    "group_size",
    "refresh_every",
    "fusion",
)
DRAFTER_FIELDS = ("kind", "model", "draft_vocab", "sparsity_ratio")
SUBCONFIGS = (
    ("ssd", SsdConfig, "Saguaro SSD (ssd)"),
    ("prr", PrrConfig, "predict-reuse-repair (prr)"),
    ("sparsespec", SparseSpecConfig, "SparseSpec (sparsespec)"),
    ("serve", ServeConfig, "serving (serve)"),
)
DEFAULT_FILES = {
    "csv": "sim-{scenario}-requests.csv",
    "chrome": "sim-{scenario}.chrome.json",
    "gantt": "sim-{scenario}-gantt.png",
}
OPTION = {"csv": "--csv", "chrome": "--chrome", "gantt": "--gantt", "trace": "--trace-out"}
SUFFIXES = {"gantt": (".png",)}


def _fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def add_arguments(p) -> None:
    p.add_argument("scenario", metavar="SCENARIO", help=f"one of {', '.join(SCENARIOS)}")
    p.add_argument(
        "--context",
        default="32K",
        help="prompt tokens per request, K = 1024 (default: 32K)",
    )
    # --context-len is accepted too, out of the help, so scripts written with it still run.
    p.add_argument("--context-len", dest="context", default=SUPPRESS, help=SUPPRESS)
    add_dataclass_options(p, SimConfig, RUN_FIELDS)
    add_pricing_options(p)
    p.add_argument("--per-layer", action="store_true", help="one event per layer and draft level")
    p.add_argument(
        "--static-batch",
        action="store_true",
        help="finished sequences keep their slots until the batch ends (an engine's fixed batch)",
    )
    g = p.add_argument_group("strategy (defaults: the scenario's baseline)")
    g.add_argument(
        "--strategy",
        default=None,
        help="baseline to run for prr/ssd/sparsespec/serve (default: the scenario's own)",
    )
    add_dataclass_options(g, Strategy, STRATEGY_FIELDS)
    add_dataclass_options(g, DrafterSpec, DRAFTER_FIELDS, prefix="drafter-")
    for prefix, cls, title in SUBCONFIGS:
        add_dataclass_options(p.add_argument_group(title), cls, _fields(cls), prefix=f"{prefix}-")
    o = p.add_argument_group("outputs")
    o.add_argument("--out-dir", help="folder for the default output files (default: .)")
    o.add_argument("--csv", metavar="FILE", help=f"per-request CSV ({DEFAULT_FILES['csv']})")
    o.add_argument("--chrome", metavar="FILE", help=f"Chrome trace ({DEFAULT_FILES['chrome']})")
    o.add_argument("--gantt", metavar="FILE", help=f"Gantt PNG ({DEFAULT_FILES['gantt']})")
    o.add_argument("--trace-out", metavar="FILE", help="also write the round trace (JSONL)")
    o.add_argument("--no-files", action="store_true", help="write no file (summary only)")
    p.add_argument("--json", action="store_true", help="print JSON (every figure with provenance)")


def build_strategy(args) -> Strategy | None:
    overrides = given(args, STRATEGY_FIELDS)
    drafter = given(args, DRAFTER_FIELDS, prefix="drafter_")
    if args.strategy is None and not overrides and not drafter:
        return None
    if args.strategy is not None:
        if args.scenario in LOOP_SCENARIOS and args.strategy != args.scenario:
            raise ValueError(
                f"scenario {args.scenario} runs its own baseline; --strategy is for "
                "prr, ssd, sparsespec and serve"
            )
        base = Strategy.from_name(args.strategy)
    else:
        if args.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {args.scenario!r}")
        base = default_strategy(args.scenario)
    if drafter:
        overrides["drafter"] = dataclasses.replace(base.drafter, **drafter)
    strategy = dataclasses.replace(base, **overrides)
    check_drafter_model(drafter, [strategy])
    return strategy


def build_config(args) -> SimConfig:
    if args.scenario not in SCENARIOS:
        SimConfig(scenario=args.scenario)  # raises the one-line error with a suggestion
    subs = {
        prefix: cls(**given(args, _fields(cls), prefix=f"{prefix}_"))
        for prefix, cls, _ in SUBCONFIGS
    }
    return SimConfig(
        scenario=args.scenario,
        context_len=parse_one(args.context, "--context"),
        roofline=args.roofline,
        any_architecture=args.any_architecture,
        per_layer=args.per_layer,
        static_batch=args.static_batch,
        strategy=build_strategy(args),
        **given(args, RUN_FIELDS),
        **subs,
    )


def _outputs(args, scenario: str) -> dict[str, Path]:
    """The files to write, each checked before the run (``--no-files`` with a file option is
    a contradiction, not a silent drop)."""
    named = [f"--{k}" for k in DEFAULT_FILES if getattr(args, k)]
    named += ["--out-dir"] if args.out_dir is not None else []
    if args.no_files and named:
        flags = ", ".join(named)
        raise ValueError(f"--no-files writes no file, but {flags} asks for one: drop one of them")
    paths = {}
    if not args.no_files:
        out = Path(args.out_dir or ".")
        if any(not getattr(args, k) for k in DEFAULT_FILES):
            check_folder(out, "--out-dir")
        paths = {
            k: Path(getattr(args, k) or out / v.format(scenario=scenario))
            for k, v in DEFAULT_FILES.items()
        }
    if args.trace_out:
        paths["trace"] = Path(args.trace_out)
    for kind, p in paths.items():
        check_output(p, OPTION[kind], SUFFIXES.get(kind, ()))
    return paths


def _summary(result, files) -> str:
    cfg, f = result.config, result.figures
    lines = [
        f"{cfg.scenario}: {result.strategy.name} on {result.trace_header['model']} / "
        f"{result.trace_header.get('gpu')} [{result.trace_header.get('provenance')}]  "
        f"seed {cfg.seed}",
    ]
    for name, fig in f.items():
        v = fig["value"]
        text = f"{v:,.6g}" if isinstance(v, float) else str(v)
        if fig.get("interval"):
            text += " " + interval_text(fig["interval"], ",.6g")
        lines.append(f"  {name:28s} {text} {fig['unit']}  ({fig['provenance']})")
    for kind, path in files.items():
        lines.append(f"  wrote {kind}: {path}")
    return "\n".join(lines)


def run(args) -> int:
    from ssvkit.sim.scenarios import simulate
    from ssvkit.sim.writers import chrome_trace, gantt_png, requests_csv, trace_jsonl

    cfg = build_config(args)
    files = _outputs(args, cfg.scenario)
    result = simulate(cfg, progress=True)
    # Everything is built before anything is written: bad input never leaves a file behind.
    builders = {
        "csv": requests_csv,
        "chrome": chrome_trace,
        "gantt": gantt_png,
        "trace": trace_jsonl,
    }
    write_files((path, builders[kind](result), OPTION[kind]) for kind, path in files.items())
    if args.json:
        doc = {
            "scenario": cfg.scenario,
            "strategy": dataclasses.asdict(result.strategy),
            "model": result.trace_header["model"],
            "gpu": result.trace_header.get("gpu"),
            "seed": cfg.seed,
            "figures": result.figures,
            "files": {k: str(v) for k, v in files.items()},
        }
        print(json.dumps(doc, indent=2))
    else:
        print(_summary(result, {k: str(v) for k, v in files.items()}))
    return 0
