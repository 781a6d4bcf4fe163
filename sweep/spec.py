"""What a sweep covers: the grid axes, its strategies, and the optional simulation and capacity
searches, as frozen dataclasses checked on construction (``sweep.grid`` builds them from flags
or a YAML/JSON grid file). Every field has a one-line help string; ``ssvkit sweep`` builds its
options from them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import get_gpu, suggest
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import BASELINES, Strategy
from ssvkit.sim.config import MAX_SIM_TOKENS, ServeConfig

SERVE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
AXES = ("context_len", "batch", "tp", "acceptance", "overlap", "kv_bytes")  # product_columns order


@dataclass(frozen=True, slots=True)
class SweepStrategy:
    """One strategy of the grid: the ``Strategy`` (its ``name`` is the row label) and the
    DESIGN.md baseline it derives from (the ``base`` column; the simulator runs that loop)."""

    base: str
    strategy: Strategy

    @property
    def label(self) -> str:
        return self.strategy.name

    @property
    def speculative(self) -> bool:
        return self.strategy.tree not in ("chain:0", "none")


@dataclass(frozen=True, slots=True)
class SimulateSpec:
    """A discrete-event run (``sim.scenarios.simulate``) of every feasible point."""

    num_tokens: int = field(default=256, metadata={"help": "output tokens simulated per point"})
    seed: int = field(default=0, metadata={"help": "seed of every simulated point"})
    max_points: int = field(
        default=5000, metadata={"help": "refuse to simulate more points than this"}
    )

    def __post_init__(self) -> None:
        _positive_int(self, ("num_tokens", "max_points"))
        _positive_int(self, ("seed",), lo=0)
        if self.num_tokens > MAX_SIM_TOKENS:
            raise ValueError(
                f"simulate.num_tokens={self.num_tokens} exceeds the {MAX_SIM_TOKENS:,} tokens a "
                "simulated run takes"
            )


@dataclass(frozen=True, slots=True)
class CapacitySpec:
    """GPUs needed to serve ``rates`` requests/s under TTFT/TPOT SLOs, from the simulator's
    serving scenario (one replica = ``tp`` GPUs; see ``sweep.capacity``)."""

    rates: tuple[float, ...] = field(
        default=(10.0,), metadata={"help": "cluster request rates R to size for (requests/s)"}
    )
    slo_ttft_s: float = field(
        default=SERVE_DEFAULTS["slo_ttft_s"], metadata={"help": "time-to-first-token SLO (s)"}
    )
    slo_tpot_s: float = field(
        default=SERVE_DEFAULTS["slo_tpot_s"], metadata={"help": "time-per-output-token SLO (s)"}
    )
    attainment: float = field(
        default=0.9, metadata={"help": "share of requests that must meet both SLOs"}
    )
    num_requests: int = field(default=200, metadata={"help": "requests per simulated run"})
    output_tokens: int = field(default=256, metadata={"help": "output tokens per request"})
    max_batch: int = field(
        default=SERVE_DEFAULTS["max_batch"], metadata={"help": "most requests per replica batch"}
    )
    iterations: int = field(default=7, metadata={"help": "bisection steps of the rate search"})
    seed: int = field(default=0, metadata={"help": "seed of the arrival and acceptance streams"})
    strategies: tuple[str, ...] = field(
        default=(), metadata={"help": "strategy labels to size (default: all)"}
    )
    max_cells: int = field(
        default=64, metadata={"help": "refuse searches over more (cell, strategy) pairs"}
    )

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("capacity.rates needs at least one rate")
        for r in self.rates:
            if not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
                raise ValueError(f"capacity.rates must be positive numbers, got {r!r}")
        for name in ("slo_ttft_s", "slo_tpot_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"capacity.{name} must be > 0, got {v!r}")
        if not (isinstance(self.attainment, int | float) and 0 < self.attainment <= 1):
            raise ValueError(f"capacity.attainment must lie in (0, 1], got {self.attainment!r}")
        _positive_int(self, ("num_requests", "output_tokens", "max_batch", "max_cells"))
        _positive_int(self, ("iterations", "seed"), lo=0)
        if self.num_requests * self.output_tokens > MAX_SIM_TOKENS:
            raise ValueError(
                f"capacity.num_requests x output_tokens = "
                f"{self.num_requests * self.output_tokens:,} exceeds the {MAX_SIM_TOKENS:,} "
                "tokens a simulated run takes"
            )


def _positive_int(obj, names, lo=1) -> None:
    for name in names:
        v = getattr(obj, name)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


def default_strategies() -> tuple[SweepStrategy, ...]:
    return tuple(SweepStrategy(name, s) for name, s in BASELINES.items())


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """The grid: models x GPUs x the workload axes x strategies, and what to run on it."""

    models: tuple[str, ...] = field(
        default=("llama-3.1-8b",), metadata={"help": "model registry names or config.json paths"}
    )
    gpus: tuple[str, ...] = field(default=("h100-sxm",), metadata={"help": "GPU registry keys"})
    tp: tuple[int, ...] = field(default=(1,), metadata={"help": "tensor-parallel degrees"})
    context_len: tuple[int, ...] = field(
        default=(8192, 16384, 32768, 65536, 131072),
        metadata={"help": "context lengths, K = 1024"},
    )
    batch: tuple[int, ...] = field(default=(1,), metadata={"help": "sequences decoded together"})
    acceptance: tuple[float, ...] = field(
        default=(0.7,), metadata={"help": "per-draft acceptance alpha"}
    )
    overlap: tuple[float, ...] = field(
        default=(0.75,), metadata={"help": "adjacent-query block overlap gamma"}
    )
    kv_bytes: tuple[int, ...] = field(default=(2,), metadata={"help": "bytes per KV-cache element"})
    strategies: tuple[SweepStrategy, ...] = field(
        default_factory=default_strategies,
        metadata={"help": "DESIGN.md baselines (custom strategies: in a grid file)"},
    )
    roofline: bool = field(default=False, metadata={"help": "the bare datasheet roofline"})
    any_architecture: bool = field(
        default=False,
        metadata={"help": "a GPU without a profile of its architecture borrows another's"},
    )
    simulate: SimulateSpec | None = field(
        default=None, metadata={"help": "a discrete-event run per point"}
    )
    capacity: CapacitySpec | None = field(
        default=None, metadata={"help": "GPUs needed for R requests/s under SLOs"}
    )

    def __post_init__(self) -> None:
        for name in ("models", "gpus", *AXES, "strategies"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name} needs at least one value")
            keys = [v.label for v in values] if name == "strategies" else list(values)
            dup = next((v for v, n in _counts(keys).items() if n > 1), None)
            if dup is not None:
                raise ValueError(f"{name} lists {dup!r} twice")
        for name in ("tp", "context_len", "batch", "kv_bytes"):
            for v in getattr(self, name):
                if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                    raise ValueError(f"{name} must hold integers >= 1, got {v!r}")
        for name in ("acceptance", "overlap"):
            for v in getattr(self, name):
                if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
                    raise ValueError(f"{name} must lie in [0, 1], got {v!r}")
        for m in self.models:
            get_model(m)
        for s in self.strategies:
            if s.strategy.drafter.kind == "draft_model":
                get_model(s.strategy.drafter.model)  # fail here, not in a worker
        if self.roofline and self.any_architecture:
            raise ValueError("roofline and any_architecture exclude each other")
        for g in self.gpus:
            gpu = get_gpu(g, measured=not self.roofline, any_architecture=self.any_architecture)
            make_predictor(gpu)  # a GPU no profile may price fails here, not in a worker
        if self.capacity is not None:
            labels = {s.label for s in self.strategies}
            for name in self.capacity.strategies:
                if name not in labels:
                    raise ValueError(
                        f"capacity strategy {name!r} is not in the sweep{suggest(name, [*labels])}"
                    )
        if self.simulate is not None and self.num_points > self.simulate.max_points:
            raise ValueError(
                f"simulating {self.num_points:,} points exceeds simulate.max_points="
                f"{self.simulate.max_points:,} (a DES run takes ~0.1 s per point)"
            )

    @property
    def num_workload_points(self) -> int:
        return math.prod(len(getattr(self, a)) for a in AXES)

    @property
    def num_points(self) -> int:
        return len(self.models) * len(self.gpus) * len(self.strategies) * self.num_workload_points

    def shape(self) -> str:
        """``2 models x 1 GPU x ...`` for summaries."""
        parts = [
            (len(self.models), "model", "models"),
            (len(self.gpus), "GPU", "GPUs"),
            (len(self.tp), "TP degree", "TP degrees"),
            (len(self.context_len), "context", "contexts"),
            (len(self.batch), "batch", "batches"),
            (len(self.acceptance), "acceptance", "acceptances"),
            (len(self.overlap), "overlap", "overlaps"),
            (len(self.kv_bytes), "KV width", "KV widths"),
            (len(self.strategies), "strategy", "strategies"),
        ]
        return " x ".join(f"{n} {one if n == 1 else many}" for n, one, many in parts)

    def to_doc(self) -> dict:
        """A JSON-able description (stored beside results; ``spec_from_doc`` reads it back)."""
        doc = {n: list(getattr(self, n)) for n in ("models", "gpus", *AXES)}
        doc["strategies"] = [_strategy_doc(s) for s in self.strategies]
        doc["roofline"] = self.roofline
        if self.any_architecture:
            doc["any_architecture"] = True
        for name in ("simulate", "capacity"):
            sub = getattr(self, name)
            if sub is not None:
                doc[name] = {
                    k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(sub).items()
                }
        return doc


def _counts(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _strategy_doc(s: SweepStrategy) -> dict:
    base = BASELINES[s.base]
    doc = {"name": s.label, "base": s.base}
    for f in dataclasses.fields(Strategy):
        if f.name in ("name", "drafter"):
            continue
        v = getattr(s.strategy, f.name)
        if v != getattr(base, f.name):
            doc[f.name] = v
    if s.strategy.drafter != base.drafter:
        doc["drafter"] = {
            k: v for k, v in dataclasses.asdict(s.strategy.drafter).items() if v is not None
        }
    return doc
