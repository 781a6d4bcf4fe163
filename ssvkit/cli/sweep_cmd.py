"""``ssvkit sweep``: what-if grids (models x GPUs x TP x context x batch x acceptance x
strategies), the best strategy per cell, and GPUs needed for R requests/s under SLOs.

ssvkit sweep --context 8K,32K,128K --batch 1,8,32 --acceptance 0.6,0.7,0.8 --out sweep.csv
ssvkit sweep --grid grid.yaml --out sweep.parquet --scheduler tcp://10.0.0.5:8786
ssvkit sweep --strategies sd_dense,ssv --vary group_size=2,4,8 --simulate --out sim.csv
ssvkit sweep --context 32K --capacity-rates 10,50 --capacity-slo-tpot-s 0.05 --out cap.csv
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from ssvkit.cli.options import (
    add_dataclass_options,
    add_pricing_options,
    finite,
    given,
)
from ssvkit.cli.sweep_report import sweep_json, sweep_summary
from ssvkit.perfmodel.files import check_output, write_files
from ssvkit.perfmodel.numbers import count_label
from ssvkit.sweep.grid import ALIASES, load_grid, spec_from_doc
from ssvkit.sweep.spec import CapacitySpec, SimulateSpec, SweepSpec

HELP = "evaluate grids of models x GPUs x TP x context x batch x acceptance x strategies"
# SweepSpec list fields and their option names (predict's names where they exist).
LIST_OPTIONS = {
    "models": "model",
    "gpus": "gpu",
    "tp": "tp",
    "context_len": "context",
    "batch": "batch",
    "acceptance": "acceptance",
    "overlap": "overlap",
    "kv_bytes": "kv-bytes",
    "strategies": "strategies",
}
SIM_FIELDS = tuple(f.name for f in dataclasses.fields(SimulateSpec))
CAP_FIELDS = tuple(f.name for f in dataclasses.fields(CapacitySpec))
CAP_SCALARS = tuple(n for n in CAP_FIELDS if n not in ("rates", "strategies"))


def _default_text(name: str) -> str:
    f = next(f for f in dataclasses.fields(SweepSpec) if f.name == name)
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if name == "strategies":
        return ",".join(s.label for s in value)
    if name == "context_len":
        return ",".join(count_label(v) for v in value)
    return ",".join(str(v) for v in value)


def add_arguments(p) -> None:
    g = p.add_argument_group("grid (comma-separated lists; flags override --grid)")
    g.add_argument("--grid", metavar="FILE", help="YAML or JSON grid file (keys: sweep/grid.py)")
    for f in dataclasses.fields(SweepSpec):
        if f.name in LIST_OPTIONS:
            g.add_argument(
                f"--{LIST_OPTIONS[f.name]}",
                dest=f.name,
                default=None,
                metavar="A,B,...",
                help=f"{f.metadata['help']} (default: {_default_text(f.name)})",
            )
    g.add_argument(
        "--vary",
        action="append",
        metavar="FIELD=V1,V2",
        help="a copy of each strategy per value of a strategy field (repeatable), e.g. "
        "group_size=2,4,8; tree fields apply to speculative strategies, sparse ones to sparse, "
        "grouping ones (mode, group_size, refresh_every, fusion) to grouped ones like ssv",
    )
    add_pricing_options(g)
    s = p.add_argument_group("simulation (a discrete-event run per point)")
    s.add_argument("--simulate", action="store_true", help="run the simulator at every point")
    add_dataclass_options(s, SimulateSpec, SIM_FIELDS, prefix="sim-")
    c = p.add_argument_group("capacity (GPUs for R requests/s under SLOs, simulated serving)")
    c.add_argument(
        "--capacity-rates",
        metavar="R1,R2",
        help="cluster request rates to size for; turns the capacity search on",
    )
    c.add_argument(
        "--capacity-strategies", metavar="A,B", help="strategy labels to size (default: all)"
    )
    add_dataclass_options(c, CapacitySpec, CAP_SCALARS, prefix="capacity-")
    r = p.add_argument_group("running and output")
    r.add_argument("--out", metavar="FILE", help="write the table (.csv, or .parquet: extra)")
    r.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    r.add_argument("--scheduler", metavar="ADDR", help="Dask scheduler, e.g. tcp://host:8786")
    r.add_argument(
        "--scheduler-timeout-s",
        type=finite,
        default=10.0,
        help="seconds to wait for the scheduler (default: 10)",
    )
    r.add_argument(
        "--partition-points",
        type=int,
        default=None,
        help="points per task (default: 5000; 8 with --simulate)",
    )
    r.add_argument("--top", type=int, default=20, help="best-per-cell rows printed (default: 20)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    r.add_argument("--dry-run", action="store_true", help="print the grid's size and stop")
    p.add_argument("--json", action="store_true", help="print JSON (every figure with provenance)")


def build_spec(args) -> SweepSpec:
    doc = load_grid(args.grid) if args.grid else {}
    where = Path(args.grid).name if args.grid else "sweep"
    doc = {ALIASES.get(k, k): v for k, v in doc.items()}
    for name in LIST_OPTIONS:
        v = getattr(args, name)
        if v is not None:
            items = [x.strip() for x in v.split(",")]
            if not all(items):
                raise ValueError(f"--{LIST_OPTIONS[name]} {v!r} has an empty item")
            doc[name] = items
    if args.vary:
        vary = dict(doc.get("vary") or {})
        for item in args.vary:
            key, eq, values = item.partition("=")
            if not eq or not values.strip():
                raise ValueError(f"--vary {item!r} is not FIELD=V1,V2,...")
            items = [v.strip() for v in values.split(",")]
            if not all(items):
                raise ValueError(f"--vary {item!r} has an empty item")
            vary[key.strip()] = items
        doc["vary"] = vary
    if args.roofline:
        doc["roofline"] = True
    if args.any_architecture:
        doc["any_architecture"] = True
    sim = given(args, SIM_FIELDS, prefix="sim_")
    if args.simulate or sim:
        base = doc.get("simulate") if isinstance(doc.get("simulate"), dict) else {}
        doc["simulate"] = {**base, **sim}
    cap = given(args, CAP_SCALARS, prefix="capacity_")
    if args.capacity_rates:
        cap["rates"] = args.capacity_rates
    if args.capacity_strategies:
        cap["strategies"] = args.capacity_strategies
    if cap:
        if "rates" not in cap and not isinstance(doc.get("capacity"), dict):
            raise ValueError("capacity options need --capacity-rates (the rates to size for)")
        base = doc.get("capacity") if isinstance(doc.get("capacity"), dict) else {}
        doc["capacity"] = {**base, **cap}
    return spec_from_doc(doc, where)


def _check_extras(args) -> None:
    """Fail before computing when an option needs the ``sweep`` extra."""
    from ssvkit.sweep.table import require_pyarrow, table_format

    if args.out:
        if table_format(args.out) == "parquet":
            require_pyarrow("Parquet output")
    if args.scheduler:
        try:
            import dask.distributed  # noqa: F401
        except ImportError:
            raise ValueError(
                "--scheduler needs dask.distributed: pip install 'ssvkit[sweep]'"
            ) from None


def check_outputs(args, spec: SweepSpec) -> None:
    """Every file the sweep writes, checked before it runs."""
    from ssvkit.sweep.table import sibling

    if args.out:
        check_output(args.out, "--out", (".csv", ".parquet"))
        if spec.capacity is not None:
            check_output(sibling(args.out, "capacity"), "--out's capacity table")


def check_some_point_fits(spec: SweepSpec) -> None:
    """``ValueError`` before running when no point of the grid can run: the smallest batch and
    context on every (model, GPU, TP, KV width) combination whose TP divides the heads."""
    from ssvkit.perfmodel.costs import memory_shortfall
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model

    reasons = []
    for m, g, tp, kv in itertools.product(spec.models, spec.gpus, spec.tp, spec.kv_bytes):
        model, gpu = get_model(m), get_gpu(g, measured=not spec.roofline)
        if tp > 1 and model.num_q_heads % tp:
            reasons.append(f"tp={tp} does not divide {model.name}'s {model.num_q_heads} heads")
            continue
        why = memory_shortfall(model, gpu, tp, kv, min(spec.batch), min(spec.context_len))
        if why is None:
            return
        reasons.append(why)
    raise ValueError(f"no point of the grid can run: {reasons[0]}")


def run(args) -> int:
    from ssvkit.sweep.runner import plan, run_sweep
    from ssvkit.sweep.table import encode, sibling

    spec = build_spec(args)
    _check_extras(args)
    if args.scheduler_timeout_s <= 0:
        raise ValueError(f"--scheduler-timeout-s must be > 0, got {args.scheduler_timeout_s}")
    counts = {"--top": args.top, "--partition-points": args.partition_points}
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    check_outputs(args, spec)
    check_some_point_fits(spec)
    if args.dry_run:
        _, _, parts = plan(spec, args.partition_points)
        print(f"sweep: {spec.num_points:,} points ({spec.shape()}), {len(parts)} partitions")
        return 0
    result = run_sweep(
        spec,
        workers=args.workers,
        scheduler=args.scheduler,
        partition_points=args.partition_points,
        progress=not args.no_progress,
        scheduler_timeout_s=args.scheduler_timeout_s,
    )
    # Everything is computed before anything is written: a failure leaves no file behind.
    outputs = {}
    if args.out:
        meta = {"spec": spec.to_doc(), "facts": result.facts}
        outputs["table"] = (Path(args.out), encode(result.table, args.out, meta))
        if result.capacity is not None:
            path = sibling(args.out, "capacity")
            outputs["capacity"] = (path, encode(result.capacity, path, meta))
    write_files((path, data, "--out") for path, data in outputs.values())
    files = {k: str(p) for k, (p, _) in outputs.items()}
    print(sweep_json(result, files) if args.json else sweep_summary(result, files, args.top))
    return 0
