"""Simulation configs: one frozen dataclass per concern, checked on construction.

``SimConfig`` says what runs (scenario, model, GPU, strategy, request shape, acceptance, seed);
``SsdConfig``, ``PrrConfig``, ``SparseSpecConfig`` and ``ServeConfig`` hold the knobs of one
design each. Every field has a one-line help string: ``ssvkit simulate`` builds its options from
them, so help and defaults cannot drift. Derived copies via ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.costs import HOST_PER_REQUEST_S
from ssvkit.perfmodel.elementwise import ELEMENTWISE
from ssvkit.perfmodel.hardware import suggest
from ssvkit.perfmodel.loop_host import LOOPS
from ssvkit.perfmodel.prr import PAPER_HIT_RATE
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

SCENARIOS = (
    "ar_dense",
    "ar_sparse",
    "sd_dense",
    "sd_sparse_naive",
    "ssv",
    "prr",
    "ssd",
    "sparsespec",
    "serve",
)
LOOP_SCENARIOS = SCENARIOS[:5]
# Scenarios that decode one fixed batch (the others admit num_requests requests over time).
BATCH_SCENARIOS = (*LOOP_SCENARIOS, "prr", "ssd")
ACCEPTANCE_MODELS = ("iid", "positional", "tree", "trace")
# Most output tokens one run simulates (all requests together): every round stays in memory
# (``sim.recorder``), and beyond this a run takes minutes.
MAX_SIM_TOKENS = 10_000_000
# Largest batch the b* search of Saguaro's fallback tabulates (one entry per batch size).
MAX_SSD_BATCH = 1 << 16


def _check_int(obj, names, lo):
    for name in names:
        v = getattr(obj, name)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


def _check_range(obj, names, lo, hi, lo_open=False):
    for name in names:
        v = getattr(obj, name)
        ok = isinstance(v, int | float) and math.isfinite(v) and (v > lo if lo_open else v >= lo)
        if not ok or v > hi:
            left = "(" if lo_open else "["
            raise ValueError(f"{name} must lie in {left}{lo}, {hi}], got {v!r}")


def _check_choice(name, value, allowed):
    if value not in allowed:
        hint = suggest(str(value), list(allowed))
        if "did you mean" not in hint:
            hint = f" (one of {', '.join(allowed)})"
        raise ValueError(f"unknown {name} {value!r}{hint}")


@dataclass(frozen=True, slots=True)
class SsdConfig:
    """Saguaro speculative speculative decoding (seed 002)."""

    budget: int = field(default=8, metadata={"help": "speculation-cache budget B per sequence"})
    hit_at_one: float = field(default=0.5, metadata={"help": "hit rate h1 of a single guess"})
    exponent: float = field(default=0.5, metadata={"help": "power-law exponent r of h(F)"})
    fallback: str = field(
        default="auto", metadata={"help": "on a miss: auto (b*) | primary | backup"}
    )
    backup_acceptance: float = field(
        default=0.2, metadata={"help": "per-draft acceptance of the backup speculator"}
    )
    max_batch: int = field(default=256, metadata={"help": "largest batch searched for b*"})

    def __post_init__(self) -> None:
        _check_int(self, ("budget", "max_batch"), 1)
        if self.max_batch > MAX_SSD_BATCH:
            raise ValueError(f"max_batch must be <= {MAX_SSD_BATCH}, got {self.max_batch}")
        _check_range(self, ("hit_at_one", "backup_acceptance"), 0.0, 1.0)
        _check_range(self, ("exponent",), 0.0, 100.0, lo_open=True)
        _check_choice("fallback", self.fallback, ("auto", "primary", "backup"))


@dataclass(frozen=True, slots=True)
class PrrConfig:
    """Predict, reuse and repair (seed 004)."""

    hit_source: str = field(
        default="fixed", metadata={"help": "fixed (hit_rate) | ema (Holt predictor) | trace"}
    )
    hit_rate: float = field(
        default=PAPER_HIT_RATE,
        metadata={"help": "share of true top-n blocks predicted (seed 004: 0.98)"},
    )
    budget_ratio: float = field(default=1.0, metadata={"help": "predicted blocks / top_n, rho"})
    ema_drift: float = field(
        default=0.01, metadata={"help": "ema: per-step drift of the synthetic block scores"}
    )

    def __post_init__(self) -> None:
        _check_choice("hit_source", self.hit_source, ("fixed", "ema", "trace"))
        _check_range(self, ("hit_rate", "ema_drift"), 0.0, 1.0)
        _check_range(self, ("budget_ratio",), 0.0, 64.0, lo_open=True)


@dataclass(frozen=True, slots=True)
class SparseSpecConfig:
    """SparseSpec's unified batch, delayed verification and KV offload (seed 003)."""

    delayed: str = field(default="on", metadata={"help": "delayed verification: on | off"})
    host_per_request_s: float = field(
        default=HOST_PER_REQUEST_S,
        metadata={"help": "CPU scheduling seconds per request (seed 003: 3.2 ms per 128)"},
    )
    offload_threshold: float = field(
        default=0.95, metadata={"help": "resident KV share of capacity that triggers offload"}
    )

    def __post_init__(self) -> None:
        _check_choice("delayed", self.delayed, ("on", "off"))
        _check_range(self, ("host_per_request_s",), 0.0, 1.0)
        _check_range(self, ("offload_threshold",), 0.0, 1.0, lo_open=True)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Online serving: arrivals, continuous batching under a KV capacity, SLOs."""

    arrival: str = field(default="poisson", metadata={"help": "poisson | trace (arrivals file)"})
    rate: float = field(default=2.0, metadata={"help": "Poisson arrival rate (requests/s)"})
    arrivals_file: str = field(
        default="", metadata={"help": "CSV of arrival_s,prompt_len,output_len (arrival=trace)"}
    )
    max_batch: int = field(default=64, metadata={"help": "most requests decoding together"})
    slo_ttft_s: float = field(default=2.0, metadata={"help": "time-to-first-token SLO (s)"})
    slo_tpot_s: float = field(default=0.05, metadata={"help": "time-per-output-token SLO (s)"})

    def __post_init__(self) -> None:
        _check_choice("arrival", self.arrival, ("poisson", "trace"))
        _check_range(self, ("rate",), 0.0, 1e9, lo_open=True)
        _check_range(self, ("slo_ttft_s", "slo_tpot_s"), 0.0, 1e9, lo_open=True)
        _check_int(self, ("max_batch",), 1)
        if self.arrival == "trace" and not self.arrivals_file:
            raise ValueError("arrival=trace needs arrivals_file")


def default_strategy(scenario: str) -> Strategy:
    """The strategy a scenario runs unless the caller gives one."""
    if scenario in LOOP_SCENARIOS:
        return Strategy.from_name(scenario)
    if scenario == "prr":
        return dataclasses.replace(Strategy.from_name("ar_sparse"), name="prr")
    if scenario == "ssd":
        return dataclasses.replace(Strategy.from_name("sd_dense"), name="ssd", tree="chain:4")
    if scenario == "sparsespec":
        return Strategy(name="sparsespec", tree="chain:4", drafter=DrafterSpec(kind="self_sparse"))
    return Strategy.from_name("sd_dense")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulation run. ``strategy=None`` takes the scenario's default strategy."""

    scenario: str = field(default="ssv", metadata={"help": "scenario to simulate"})
    model: str = field(default="llama-3.1-8b", metadata={"help": "model registry name or config"})
    gpu: str = field(default="h100-sxm", metadata={"help": "GPU registry key"})
    roofline: bool = field(default=False, metadata={"help": "the bare datasheet roofline"})
    any_architecture: bool = field(
        default=False,
        metadata={"help": "a GPU without a profile of its architecture borrows another's"},
    )
    strategy: Strategy | None = field(default=None, metadata={"help": "strategy tuple"})
    context_len: int = field(default=32768, metadata={"help": "prompt tokens per request"})
    num_tokens: int = field(default=512, metadata={"help": "output tokens per request (mean)"})
    length_spread: float = field(
        default=0.0, metadata={"help": "lognormal sigma of prompt/output lengths (0 = fixed)"}
    )
    num_requests: int = field(default=1, metadata={"help": "requests (serve, sparsespec)"})
    batch: int = field(
        default=0, metadata={"help": "sequences decoded together (0: 1, sparsespec 32)"}
    )
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree of the target"})
    kv_bytes: int = field(default=2, metadata={"help": "bytes per KV-cache element"})
    elementwise: str = field(
        default="fused",
        metadata={"help": "the engine's element-wise ops: fused (triton backend) | torch"},
    )
    loop: str = field(
        default="pipelined",
        metadata={
            "help": "the engine's decode loop: pipelined (a round issued before the host reads "
            "the last, where the strategy allows) | serial"
        },
    )
    acceptance: float = field(default=0.7, metadata={"help": "per-draft acceptance alpha"})
    acceptance_model: str = field(
        default="iid", metadata={"help": "iid | positional | tree | trace"}
    )
    acceptance_table: str = field(
        default="",
        metadata={"help": "positional: a1,a2,..; tree: rows 'p0,p1;p0,p1' [depth][rank]"},
    )
    trace: str = field(default="", metadata={"help": "trace (JSONL) to replay"})
    overlap: float = field(default=0.75, metadata={"help": "adjacent-query block overlap gamma"})
    overlap_spread: float = field(
        default=0.0, metadata={"help": "std-dev of per-layer overlaps (Beta; 0 = fixed)"}
    )
    layer_overlap: float = field(
        default=0.8, metadata={"help": "Jaccard overlap of adjacent layers' selections"}
    )
    per_layer: bool = field(default=False, metadata={"help": "one event per layer and level"})
    static_batch: bool = field(
        default=False,
        metadata={"help": "finished sequences keep their slots: every round costs the batch"},
    )
    kv_capacity_tokens: int = field(
        default=0, metadata={"help": "KV-cache capacity in tokens (0: from GPU memory)"}
    )
    memory_fraction: float = field(
        default=0.9, metadata={"help": "device-memory share for weights + KV cache"}
    )
    context_bucket: int = field(default=1024, metadata={"help": "cost-table context step"})
    loop_overhead_s: float = field(
        default=0.0,
        metadata={
            "help": "host time per round added to the step model's (which prices the "
            "decode loop's own where the GPU's host ships a fit, perfmodel.loop_host)"
        },
    )
    timeline_rounds: int = field(
        default=48, metadata={"help": "rounds/steps drawn in the Chrome trace and Gantt"}
    )
    seed: int = field(default=0, metadata={"help": "seed of every random stream"})
    ssd: SsdConfig = field(default_factory=SsdConfig, metadata={"help": "Saguaro knobs"})
    prr: PrrConfig = field(default_factory=PrrConfig, metadata={"help": "PRR knobs"})
    sparsespec: SparseSpecConfig = field(
        default_factory=SparseSpecConfig, metadata={"help": "SparseSpec knobs"}
    )
    serve: ServeConfig = field(default_factory=ServeConfig, metadata={"help": "serving knobs"})

    def __post_init__(self) -> None:
        _check_choice("scenario", self.scenario, SCENARIOS)
        _check_choice("acceptance_model", self.acceptance_model, ACCEPTANCE_MODELS)
        _check_choice("elementwise", self.elementwise, ELEMENTWISE)
        _check_choice("loop", self.loop, LOOPS)
        _check_int(self, ("context_len", "num_tokens", "num_requests", "tp", "kv_bytes"), 1)
        _check_int(self, ("context_bucket",), 16)
        _check_int(self, ("batch", "kv_capacity_tokens", "timeline_rounds", "seed"), 0)
        _check_range(self, ("acceptance", "overlap", "layer_overlap"), 0.0, 1.0)
        _check_range(self, ("loop_overhead_s",), 0.0, 1.0)
        _check_range(self, ("overlap_spread",), 0.0, 0.5)
        _check_range(self, ("length_spread",), 0.0, 3.0)
        _check_range(self, ("memory_fraction",), 0.0, 1.0, lo_open=True)
        if self.acceptance_model == "trace" and not self.trace:
            raise ValueError("acceptance_model=trace needs a trace file (trace)")
        if self.prr.hit_source == "trace" and not self.trace:
            raise ValueError("PRR hit_source=trace needs a trace file (trace)")
        if self.acceptance_model in ("positional",) and not self.acceptance_table:
            raise ValueError("acceptance_model=positional needs acceptance_table a1,a2,...")
        self._check_used_and_bounded()
        s = self.resolved_strategy
        if self.scenario == "prr" and not s.is_sparse:
            raise ValueError(f"scenario prr needs a sparse strategy, got {s.name!r} (dense)")
        if self.scenario in ("ssd", "sparsespec") and not (
            s.tree.startswith("chain:") and s.tree != "chain:0"
        ):
            raise ValueError(
                f"scenario {self.scenario} drafts chains: tree must be chain:K, K >= 1"
            )

    def _check_used_and_bounded(self) -> None:
        """Options the scenario would ignore are refused, and the run's size is bounded."""
        if self.acceptance_table and self.acceptance_model not in ("positional", "tree"):
            raise ValueError(
                f"acceptance_table is read by acceptance_model positional or tree, not "
                f"{self.acceptance_model}"
            )
        if self.scenario in BATCH_SCENARIOS and self.num_requests != 1:
            raise ValueError(
                f"scenario {self.scenario} decodes one batch (batch); num_requests is for "
                "serve and sparsespec"
            )
        if self.serve.arrivals_file and self.serve.arrival != "trace":
            raise ValueError("serve arrivals_file is read with arrival=trace")
        if self.serve.arrival == "trace" and self.scenario != "serve":
            raise ValueError(f"serve arrival=trace is for scenario serve, not {self.scenario}")
        sequences = {
            "serve": self.num_requests,
            "sparsespec": max(self.num_requests, self.resolved_batch),
        }.get(self.scenario, self.resolved_batch)
        if self.num_tokens * sequences > MAX_SIM_TOKENS:
            raise ValueError(
                f"num_tokens={self.num_tokens} x {sequences} sequences = "
                f"{self.num_tokens * sequences:,} tokens to simulate; a run takes at most "
                f"{MAX_SIM_TOKENS:,}"
            )

    @property
    def resolved_strategy(self) -> Strategy:
        return self.strategy if self.strategy is not None else default_strategy(self.scenario)

    @property
    def resolved_batch(self) -> int:
        if self.batch:
            return self.batch
        return {"sparsespec": 32, "serve": self.serve.max_batch}.get(self.scenario, 1)
