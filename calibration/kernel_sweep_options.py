"""The kernel sweep's command-line options (:mod:`calibration.kernel_sweep`): ``SweepOptions``
and ``parse_args``, which checks them (a ``ValueError`` naming a bad one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_design import design_configs
from ssvkit.calibration.kernel_grid import (
    FULL_SWEEP,
    QUICK_SWEEP,
    STEPS,
    TINY_SWEEP,
    KernelConfig,
    Sweep,
    sweep_configs,
)
from ssvkit.calibration.kernel_plan import PlanCosts
from ssvkit.calibration.shards import Shard
from ssvkit.calibration.unseen_design import unseen_configs
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.rows import check_redo

OPS = STEPS
OUT_NAME = "kernel_bench.jsonl"
GRIDS = ("lines", "calibration", "unseen")
DESCRIPTION = (
    "The kernel sweep: correctness first, then the timed sweep, one sealed row per config."
)


def _help(name: str) -> str:
    return next(f for f in dataclasses.fields(SweepOptions) if f.name == name).metadata["help"]


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Command-line options (the CLI's help comes from the field metadata)."""

    out: Path = field(metadata={"help": "directory for kernel_bench.jsonl"})
    quick: bool = field(default=False, metadata={"help": "reduced sweep and sample counts"})
    ops: tuple[str, ...] = field(default=OPS, metadata={"help": "comma-separated ops to run"})
    budget_s: float = field(default=540.0, metadata={"help": "wall-clock limit of the run"})
    seed: int = field(default=0, metadata={"help": "seed of every input generator"})
    json: bool = field(default=False, metadata={"help": "print the summary as JSON"})
    summary_only: bool = field(
        default=False, metadata={"help": "print the summary of OUT's rows and exit (no GPU)"}
    )
    geometry: str = field(
        default="llama-3.1-8b",
        metadata={"help": "attention heads of --grid lines: llama-3.1-8b (full sweep) or tiny"},
    )
    grid: str = field(
        default="lines",
        metadata={
            "help": "lines (the Sweep at --geometry), calibration (every geometry) or unseen "
            "(the test design: calls no calibration row times)"
        },
    )
    gpu: str | None = field(
        default=None, metadata={"help": "registry GPU whose SMs and ceilings --plan/--shard use"}
    )
    shard: Shard | None = field(default=None, metadata={"help": "time shard K/N of the configs"})
    plan: bool = field(default=False, metadata={"help": "print the shards' estimates and exit"})
    done_from: tuple[Path, ...] = field(
        default=(), metadata={"help": "rows file whose configs count as done (repeatable)"}
    )
    redo: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "rows of --done-from to measure again, comma-separated: an op "
            "(nsa_verify), an op and params it has (nsa_verify:mode=refresh:impl=fused), or "
            "stale (the rows whose kernels' launch plan changed since they were timed, "
            "calibration.stale_rows)"
        },
    )
    timings: tuple[str, ...] = field(
        default=tm.TIMINGS, metadata={"help": "comma-separated timings: launch, graph"}
    )
    compile_s: float | None = field(
        default=None, metadata={"help": "planning: seconds per kernel compilation (default 2)"}
    )
    compile_jobs: int = field(
        default=1,
        metadata={
            "help": "host processes that compile the run's kernels before it times them "
            "(calibration.kernel_warm; 1: each config compiles at its first call)"
        },
    )
    warm: Shard | None = field(
        default=None,
        metadata={"help": "a --compile-jobs worker: call share K/N of the pending ops once"},
    )

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.compile_jobs < 1:
            raise ValueError(f"compile_jobs must be >= 1, got {self.compile_jobs}")
        if self.geometry not in ki.GEOMETRIES:
            raise ValueError(
                f"geometry must be one of {', '.join(ki.GEOMETRIES)}, got {self.geometry!r}"
            )
        if self.grid not in GRIDS:
            raise ValueError(f"grid must be one of {', '.join(GRIDS)}, got {self.grid!r}")
        check_redo(self.redo)
        if not self.timings or not set(self.timings) <= set(tm.TIMINGS):
            raise ValueError(f"timings must be a non-empty subset of {tm.TIMINGS}")
        if (self.shard is not None or self.plan) and self.gpu is None:
            raise ValueError("--shard and --plan split by estimated time: give --gpu")
        if self.gpu is not None:
            get_gpu(self.gpu, measured=False)  # a one-line error naming an unknown GPU
        rows = (self.out / OUT_NAME).resolve()
        if self.shard is not None and any(Path(p).resolve() == rows for p in self.done_from):
            raise ValueError(
                f"--done-from {rows} is the file this shard writes: the split must not move "
                "while it runs (give each shard its own --out)"
            )

    @property
    def sweep(self) -> Sweep:
        """The grid of ``--grid lines``."""
        if self.geometry == "tiny":
            return TINY_SWEEP
        return QUICK_SWEEP if self.quick else FULL_SWEEP

    def configs(self) -> list[KernelConfig]:
        """Every config of the chosen grid and ops, in run order (host only)."""
        if self.grid == "calibration":
            return design_configs(self.ops, self.seed)
        if self.grid == "unseen":
            return unseen_configs(self.ops, self.seed)
        return sweep_configs(self.sweep, self.ops, self.geometry, self.seed)

    def plan_costs(self) -> PlanCosts:
        return PlanCosts() if self.compile_s is None else PlanCosts(compile_s=self.compile_s)


def _list(text: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in text.split(",") if o.strip())


def parse_args(argv: list[str] | None = None) -> SweepOptions:
    """The options of the command line (``ValueError`` naming a bad one)."""
    fields = {f.name: f for f in dataclasses.fields(SweepOptions)}
    ap = OneLineParser(description=DESCRIPTION)
    ap.add_argument("--out", type=Path, required=True, help=_help("out"))
    ap.add_argument("--quick", action="store_true", help=_help("quick"))
    ap.add_argument("--ops", default=",".join(OPS), help=_help("ops"))
    budget = fields["budget_s"]
    ap.add_argument("--budget-s", type=float, default=budget.default, help=budget.metadata["help"])
    ap.add_argument("--seed", type=int, default=fields["seed"].default, help=_help("seed"))
    ap.add_argument("--json", action="store_true", help=_help("json"))
    ap.add_argument("--summary-only", action="store_true", help=_help("summary_only"))
    ap.add_argument("--geometry", default=fields["geometry"].default, help=_help("geometry"))
    ap.add_argument("--grid", default="lines", help=_help("grid"))
    ap.add_argument("--gpu", default=None, help=_help("gpu"))
    ap.add_argument("--shard", default=None, metavar="K/N", help=_help("shard"))
    ap.add_argument("--plan", action="store_true", help=_help("plan"))
    ap.add_argument("--done-from", type=Path, action="append", default=[], help=_help("done_from"))
    ap.add_argument("--redo", default="", help=_help("redo"))
    ap.add_argument("--timings", default=",".join(tm.TIMINGS), help=_help("timings"))
    ap.add_argument("--compile-s", type=float, default=None, help=_help("compile_s"))
    ap.add_argument("--compile-jobs", type=int, default=1, help=_help("compile_jobs"))
    ap.add_argument("--warm", default=None, metavar="K/N", help=_help("warm"))
    a = ap.parse_args(argv)
    return SweepOptions(
        out=a.out,
        quick=a.quick,
        ops=_list(a.ops),
        budget_s=a.budget_s,
        seed=a.seed,
        json=a.json,
        summary_only=a.summary_only,
        geometry=a.geometry,
        grid=a.grid,
        gpu=a.gpu,
        shard=None if a.shard is None else Shard.parse(a.shard),
        plan=a.plan,
        done_from=tuple(a.done_from),
        redo=_list(a.redo),
        timings=_list(a.timings),
        compile_s=a.compile_s,
        compile_jobs=a.compile_jobs,
        warm=None if a.warm is None else Shard.parse(a.warm),
    )
