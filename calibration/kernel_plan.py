"""Plan a kernel sweep before it runs: each config's device time, the compilations it needs, and
the split of the configs between N GPUs (``--plan``, ``--shard K/N``). Host-only.

A config costs building its inputs, timing each of its rows and one compilation per Triton
specialisation that no earlier config of the same process compiled (``config_cost``,
``calibration.kernel_keys``). Compilation is much of a sweep's time, so the shards keep the
XX
assumed costs; they are planning figures, not measurements, and ``measured_text`` puts them
beside the ``wall_s`` and ``first_call_s`` a run records in its rows.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import NSA_TILE_ROWS, KernelConfig, Variant
from ssvkit.calibration.kernel_keys import SELECT_MMA_KERNELS, SMALL_KERNELS, compile_keys
from ssvkit.calibration.shards import assign
from ssvkit.kernels.timing import DEFAULT_TIMING, TimingConfig, num_rotations
from ssvkit.perfmodel.attention_plan import next_pow2
from ssvkit.perfmodel.hardware import GpuSpec

STEP_ORDER = ("sparse", "dense", "repair", "select", "nsa", "nsa_tiles")
# Attention-kernel compilations of the correctness checks a run makes before it times a step
# (``calibration.kernel_checks``): per step at the default geometry (dense: 4 row counts x 3
# split settings; NSA: both implementations' refresh and reuse calls, per row schedule of the
# nsa_tiles step), and per other geometry
# (``check_geometry``: one dense and three sparse launches).
CHECK_COMPILES = {"dense": 12, "sparse": 4, "repair": 1, "nsa": 18, "select": 3}
CHECK_COMPILES["nsa_tiles"] = len(NSA_TILE_ROWS) * CHECK_COMPILES["nsa"]  # per row schedule
GEOMETRY_CHECK_COMPILES = 4
UNITS_PER_SHARD = 4  # a unit above 1 / (this x shards) of the total is cut into chunks
# A first call longer than this compiled its kernel: a compiled launch takes micro- to
# milliseconds, a Triton compilation seconds.
COMPILED_FIRST_CALL_S = 0.5


@dataclass(frozen=True, slots=True)
class PlanCosts:
    """Assumed costs of the planning model (compilation per specialisation, fixed host cost per
    row, input building): planning figures, not measurements (``measured_text`` puts them beside
    a run's); ``--compile-s`` sets the first."""

    compile_s: float = field(
        default=2.0, metadata={"help": "seconds to compile one attention-kernel specialisation"}
    )
    small_compile_s: float = field(
        default=0.7, metadata={"help": "seconds to compile one short kernel (merge, plan, top-n)"}
    )
    select_compile_s: float = field(
        default=3.5,
        metadata={
            "help": "seconds to compile one block-scoring kernel (scores, or scores and pick)"
        },
    )
    row_overhead_s: float = field(
        default=0.05, metadata={"help": "host seconds per row and timing (launches, flushes)"}
    )
    host_row_s: float = field(
        default=4e-4, metadata={"help": "seconds to draw one row of overlapping selections"}
    )
    host_draw_s: float = field(
        default=5e-6, metadata={"help": "seconds to draw one row of uniform random blocks"}
    )
    fill_bytes_per_s: float = field(
        default=5e11, metadata={"help": "random input bytes written per second on the device"}
    )

    def __post_init__(self) -> None:
        for name in (
            "compile_s",
            "small_compile_s",
            "select_compile_s",
            "row_overhead_s",
            "host_row_s",
            "host_draw_s",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.fill_bytes_per_s > 0:
            raise ValueError(f"fill_bytes_per_s must be > 0, got {self.fill_bytes_per_s}")


def _heads(geometry: str) -> tuple[int, int, int]:
    return ki.GEOMETRIES[geometry]


def variant_work(cfg: KernelConfig, v: Variant) -> tuple[float, float]:
    """(bytes, FLOPs) of one call of ``v``: the KV it reads and its attention products."""
    hq, hkv, d = _heads(cfg.geometry)
    p = v.params
    t, bsz, ctx = p["num_query_tokens"], p["batch"], p["context_len"]
    kv_token = 2 * d * ki.ELEM_BYTES
    if v.op in ("dense_verify", "torch_sdpa"):
        tokens = ctx + t
    elif v.op == "sparse_verify":
        tokens = t * p["top_n"] * p["block_size"]
    elif v.op == "repair":
        frac = 1.0 if v.knob[0] == "recompute" else v.knob[1]
        tokens = t * round(frac * p["top_n"]) * p["block_size"]
    elif v.op == "nsa_verify":  # each row tile's selected blocks (``rows_per_tile`` rows)
        rows = min(t, p.get("rows_per_tile") or t)
        per_tile = min(ctx, rows * p["top_n"] * p["block_size"])
        tokens = math.ceil(t / rows) * per_tile + ctx // 16 + ki.NSA_KW["window"]
    else:  # select_blocks reads the block metadata (fp32 means, and maxima for quest)
        kinds = 1 if p["method"] == "mean" else 2
        return float(bsz * hkv * (ctx // p["block_size"]) * d * 4 * kinds), 0.0
    pairs = tokens if v.op != "dense_verify" else t * ctx
    return float(bsz * hkv * tokens * kv_token), float(4 * bsz * hq * d * pairs)


def timing_s(call_s: float, timing: str, tc: TimingConfig) -> float:
    """Device seconds one ``kernels.timing.bench`` of a ``call_s`` call takes."""
    if timing == "graph":
        n = tc.graph_launches
        reps = max(5, min(tc.graph_reps, int(tc.max_total_s / max(n * call_s, 1e-9))))
        return (tc.warmup + 2 * n + reps * n) * call_s
    reps = max(5, min(tc.reps, int(tc.max_total_s / max(call_s, 1e-9))))
    return (tc.warmup + 1 + reps) * call_s


@dataclass(frozen=True, slots=True)
class ConfigCost:
    """Estimated seconds of one config: building its inputs, and per variant (in the config's
    order) its timing and the specialisations its launch needs."""

    build_s: float
    timing_s: tuple[float, ...]
    keys: tuple[frozenset[tuple], ...]
    working_set_bytes: float  # the largest variant's bytes per call


def config_cost(
    cfg: KernelConfig,
    gpu: GpuSpec,
    timings: tuple[str, ...],
    costs: PlanCosts = PlanCosts(),
    tc: TimingConfig = DEFAULT_TIMING,
) -> ConfigCost:
    """The cost of timing every variant of ``cfg`` by ``timings`` on ``gpu`` (its measured
    ceilings when ``get_gpu`` found them): building its inputs (device fills at
    ``fill_bytes_per_s``, plus the host's selection drawing), and per variant the
    ``kernels.timing`` protocol (``timing_s``) applied to the kernel time its roofline gives,
    max(bytes / copy bandwidth, FLOPs / GEMM rate) + the launch overhead, plus
    ``row_overhead_s`` a row, and the specialisations its launch needs (``compile_keys``)."""
    hq, hkv, d = _heads(cfg.geometry)
    c = cfg.common
    bsz, t, ctx = c["batch"], c["num_query_tokens"], c["context_len"]
    cache_bytes = 2 * bsz * hkv * (ctx + t) * d * ki.ELEM_BYTES  # K and V of one input set
    build = cache_bytes * max(1, math.ceil(2**28 / cache_bytes)) / costs.fill_bytes_per_s
    if cfg.step == "sparse":  # kernel_inputs.overlap_block_idx, a Python loop over rows
        build += costs.host_row_s * bsz * hkv * t
    if cfg.step == "repair":  # kernel_inputs.random_block_idx per variant and input set
        rot = num_rotations(int(min(variant_work(cfg, v)[0] for v in cfg.variants)) or 1)
        build += costs.host_draw_s * bsz * hkv * t * rot * len(cfg.variants)
    peak = gpu.tensor_flops_per_s("bf16")
    times, keys, most = [], [], 0.0
    for v in cfg.variants:
        nbytes, flops = variant_work(cfg, v)
        most = max(most, nbytes)
        call = max(nbytes / gpu.hbm_bytes_per_s, flops / peak) + gpu.launch_overhead_s
        times.append(sum(timing_s(call, tg, tc) + costs.row_overhead_s for tg in timings))
        keys.append(frozenset(compile_keys(cfg, v, gpu.num_sms)))
    return ConfigCost(build, tuple(times), tuple(keys), most)


def compile_s(keys, costs: PlanCosts = PlanCosts()) -> float:
    """Seconds to compile ``keys`` (a key's first element names its kernel)."""
    return sum(_compile_s(k[0], costs) for k in keys)


def _compile_s(kernel: str, costs: PlanCosts) -> float:
    if kernel in SMALL_KERNELS:
        return costs.small_compile_s
    return costs.select_compile_s if kernel in SELECT_MMA_KERNELS else costs.compile_s


def unit_of(cfg: KernelConfig) -> str:
    """The unit a config is sharded with: its step at its geometry and row-tile class, the
    configs that share most specialisations (``STEP_ORDER`` first, so units sort in it)."""
    t = cfg.common["num_query_tokens"]
    return f"{STEP_ORDER.index(cfg.step)}:{cfg.step}@{cfg.geometry}/t{max(16, next_pow2(t))}"


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """The configs of each shard, in the order it runs them, and every config's estimate."""

    shards: tuple[tuple[KernelConfig, ...], ...]
    costs: dict[int, ConfigCost]  # by id() of a config of ``shards``
    plan_costs: PlanCosts

    def estimate(self, configs, pending=None) -> dict:
        """Estimated seconds of ``configs`` run in order, each specialisation compiled once:
        build, timing, compilation, per step too; only the variants ``pending(cfg)`` returns
        when given (a config with none costs nothing)."""
        seen: set[tuple] = set()
        out: Counter = Counter()
        steps: Counter = Counter()
        for cfg in configs:
            todo = cfg.variants if pending is None else pending(cfg)
            if not todo:
                continue
            cc = self.costs[id(cfg)]
            idx = [i for i, v in enumerate(cfg.variants) if v in todo]
            work = cc.build_s + sum(cc.timing_s[i] for i in idx)
            new = set().union(*(cc.keys[i] for i in idx)) - seen
            seen |= new
            comp = compile_s(new, self.plan_costs)
            out.update(configs=1, rows=len(idx), keys=len(new))
            out.update(work_s=work, compile_s=comp)
            steps[cfg.step] += work + comp
        return {**out, "total_s": out["work_s"] + out["compile_s"], "steps": dict(steps)}


def _units(configs, cost, count) -> dict[str, list[KernelConfig]]:
    """Unit name -> its configs; a unit above ``1 / (UNITS_PER_SHARD x count)`` of the total is
    cut into chunks of consecutive configs."""
    units: dict[str, list[KernelConfig]] = {}
    for cfg in configs:
        units.setdefault(unit_of(cfg), []).append(cfg)
    sizes = {name: cost(us) for name, us in units.items()}
    cap = max(sum(sizes.values()) / (UNITS_PER_SHARD * count), 1e-9)
    out: dict[str, list[KernelConfig]] = {}
    for name, us in units.items():
        size = math.ceil(len(us) / max(1, min(len(us), math.ceil(sizes[name] / cap))))
        for i in range(0, len(us), size):
            out[f"{name}#{i // size:03d}"] = us[i : i + size]
    return out


def plan_shards(
    configs: list[KernelConfig],
    count: int,
    gpu: GpuSpec,
    timings: tuple[str, ...],
    plan_costs: PlanCosts = PlanCosts(),
    pending=None,
) -> ShardPlan:
    """Split ``configs`` into ``count`` shards balanced by the estimated seconds of the
    variants ``pending(cfg)`` returns (all when None): configs are grouped into units that share
    their specialisations (``unit_of``: a step at one geometry and one row-tile class), a unit is
    cut into chunks when it would exceed a quarter of a shard's share (``UNITS_PER_SHARD``), and
    the units go longest first to the least loaded shard (``calibration.shards.assign``). Each
    shard runs its units in step order (``STEP_ORDER``), so a budget cut leaves the steps last in
    that order unfinished. Every shard must compute the same split:
    ``pending`` must answer from rows that do not change while the shards run (the committed
    rows, not a shard's own file)."""
    costs_by_id = {id(c): config_cost(c, gpu, timings, plan_costs) for c in configs}
    whole = ShardPlan((), costs_by_id, plan_costs)

    def cost(us):
        return whole.estimate(us, pending)["total_s"]

    units = _units(configs, cost, count)
    owner = assign([(name, cost(us)) for name, us in units.items()], count)
    shards = tuple(
        tuple(cfg for name in sorted(units) if owner[name] == k for cfg in units[name])
        for k in range(count)
    )
    return ShardPlan(shards, costs_by_id, plan_costs)


def checks_s(configs, plan_costs: PlanCosts, default_geometry: str) -> float:
    """Estimated seconds of the correctness checks a run of ``configs`` starts with."""
    steps = {c.step for c in configs}
    others = {c.geometry for c in configs if c.step in ("dense", "sparse")} - {default_geometry}
    n = sum(CHECK_COMPILES[s] for s in steps) + GEOMETRY_CHECK_COMPILES * len(others)
    return n * plan_costs.compile_s


def plan_text(plan: ShardPlan, pending, gpu: GpuSpec, shard=None) -> str:
    """Per shard (marking ``shard``): configs, rows, specialisations and estimated minutes of
    the pending work, per step; the configs whose working set fits in ``gpu``'s L2."""
    pc = plan.plan_costs
    lines = [
        f"kernel sweep plan on {gpu.name} ({gpu.num_sms} SMs, copy "
        f"{gpu.hbm_bytes_per_s / 1e12:.2f} TB/s): assumed {pc.compile_s:g} s per kernel "
        f"compilation, {pc.select_compile_s:g} s per block-scoring kernel, "
        f"{pc.small_compile_s:g} s per short kernel, {pc.row_overhead_s:g} s host "
        "time per row and timing (calibration.kernel_plan.PlanCosts)",
        f"{'shard':>7} {'configs':>8} {'rows':>6} {'compiles':>9} {'checks min':>11} "
        f"{'work min':>9} {'compile min':>12} {'total min':>10}  per step (min)",
    ]
    for k, configs in enumerate(plan.shards):
        e = plan.estimate(configs, pending)
        todo = [c for c in configs if pending(c)]
        check = checks_s(todo, pc, ki.current_geometry()) if todo else 0.0
        per = e["steps"]
        steps = ", ".join(f"{st} {per[st] / 60:.1f}" for st in STEP_ORDER if st in per)
        mark = "*" if shard is not None and shard.index == k else " "
        lines.append(
            f"{mark}{k:>6} {e.get('configs', 0):>8} {e.get('rows', 0):>6} {e.get('keys', 0):>9} "
            f"{check / 60:>11.1f} {e.get('work_s', 0) / 60:>9.1f} "
            f"{e.get('compile_s', 0) / 60:>12.1f} {(e['total_s'] + check) / 60:>10.1f}  {steps}"
        )
    every = [c for configs in plan.shards for c in configs if pending(c)]
    l2 = gpu.l2_bytes or 0
    small = Counter(c.step for c in every if plan.costs[id(c)].working_set_bytes < l2)
    total = Counter(c.step for c in every)
    lines.append(
        f"working set under the {l2 / 2**20:.0f} MiB L2 (bytes one call reads): "
        + ", ".join(f"{st} {small[st]} of {total[st]}" for st in STEP_ORDER if total[st])
    )
    return "\n".join(lines)


def measured_text(rows: list[dict], plan_costs: PlanCosts = PlanCosts()) -> str | None:
    """What earlier runs measured, beside the plan's assumptions: the rows' wall seconds and
    their first calls that compiled (``calibration.runner``); None without such rows."""
    timed = [r for r in rows if "wall_s" in r and "first_call_s" in r]
    if not timed:
        return None
    wall = [r["wall_s"] for r in timed]
    compiled = [r["first_call_s"] for r in timed if r["first_call_s"] > COMPILED_FIRST_CALL_S]
    text = (
        f"measured by earlier runs: {len(timed)} rows in {sum(wall) / 60:.1f} min, median "
        f"{statistics.median(wall):.2f} s a row; {len(compiled)} first calls compiled"
    )
    if compiled:
        text += (
            f", median {statistics.median(compiled):.2f} s "
            f"(the plan assumes {plan_costs.compile_s:g} s: --compile-s)"
        )
    return text
