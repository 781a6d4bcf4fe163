"""GPU sweeps of the ops the step model counts besides the attention kernels: the linear layers
(the engine's ``kernels.linear`` at every registry model's shapes, M = 1..512 tokens) and the
element-wise ops the decode loop runs in plain torch (RMSNorm, SiLU-and-multiply, greedy
sampling over the vocabulary). One sealed row per config, CUDA-graph replay with a cold L2,
resumable (``calibration.runner``, the kernel sweep's runner too; ``ssvkit calibrate`` runs
both sweeps).

    python -m ssvkit.calibration.sweep --out calibration/profiles/h100-sxm [--budget-s 540]
    # shard 1 of 4 (one process per GPU), skipping the rows the committed file has:
    python -m ssvkit.calibration.sweep --out OUT/s1 --shard 1/4 \\
        --done-from calibration/profiles/h200/op_sweep.jsonl

Exit status 0 when every config is in the file, ``STOPPED_AT_BUDGET`` (3) when the budget left
configs out (run it again to resume). The sweep of record is ``validation.engine_op_sweep``,
which passes ``main`` the op groups of the engine's own ops besides these.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import torch
import torch.nn.functional as F
from ssvkit.calibration.kernel_plan import PlanCosts, timing_s
from ssvkit.calibration.runner import STOPPED_AT_BUDGET, Runner, done_keys, read_rows
from ssvkit.calibration.shards import Shard
from ssvkit.kernels import timing as tm
from ssvkit.kernels.linear import linear
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.models import get_model, model_names
from ssvkit.perfmodel.rows import row_key

# Token counts M: powers of two and the points halfway between them (in log space), so that a
# size the held-out hash takes out of a class still has fitted neighbours on both sides.
TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
ACT = torch.bfloat16
ROWS_FILE = "op_sweep.jsonl"
TIMING = tm.TimingConfig(warmup=3, reps=10, graph_launches=10, graph_reps=9, max_total_s=0.3)
# The engine's trained tiny pair, read as data (its config.json): the sweep times its shapes too.
TINY_PAIR = ("tiny-target", "tiny-draft")


def swept_models() -> dict[str, object]:
    """name -> ModelSpec of every model whose shapes are swept: the registry's, and the trained
    tiny pair the engine validates against (``engine/checkpoints``, when it is there)."""
    models = {name: get_model(name) for name in model_names()}
    for name in TINY_PAIR:
        folder = Path(str(files("ssvkit.engine"))) / "checkpoints" / name
        if (folder / "config.json").is_file():
            models[folder.name] = get_model(str(folder))
    return models


def resident_models(l2_bytes: int) -> dict[str, object]:
    """The swept models whose weights fit in an L2 of ``l2_bytes`` (``perfmodel.calibrated``'s
    rule for pricing a model with the L2-resident classes)."""
    return {
        name: m
        for name, m in swept_models().items()
        if m.num_params() * m.weight_bytes <= l2_bytes and not m.is_mla
    }


def linear_shapes(models: dict | None = None) -> dict[tuple[int, int], list[str]]:
    """(N, K) of every linear layer of the bf16 swept models (or ``models``) at TP = 1 ->
    model.layer names. fp8-weight models (DeepSeek-R1) are left out: their GEMMs are not bf16."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, m in (swept_models() if models is None else models).items():
        if m.weight_bytes != 2:
            continue
        d, dh = m.hidden_size, m.head_dim
        layers = {
            "qkv_proj": ((m.num_q_heads + 2 * m.num_kv_heads) * dh, d),
            "o_proj": (d, m.num_q_heads * dh),
            "lm_head": (m.vocab_size, d),
        }
        if m.is_moe:
            layers["expert_gate_up"] = (2 * m.expert_intermediate_size, d)
            layers["expert_down"] = (d, m.expert_intermediate_size)
            layers["router"] = (m.num_experts, d)
        else:
            layers["ffn_gate_up"] = (2 * m.intermediate_size, d)
            layers["ffn_down"] = (d, m.intermediate_size)
        for layer, shape in layers.items():
            shapes.setdefault(shape, []).append(f"{name}.{layer}")
    return shapes


def gemm_sweep(s: Runner, models: dict | None = None) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    for (n, k), users in sorted(linear_shapes(models).items()):
        w_bytes = n * k * 2
        rot = s.rotations(w_bytes)
        weights = [torch.randn(n, k, generator=gen, device="cuda", dtype=ACT) for _ in range(rot)]
        for m in TOKENS:
            if s.out_of_time():
                return
            xs = [torch.randn(m, k, generator=gen, device="cuda", dtype=ACT) for _ in range(rot)]
            params = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "used_by": users}
            s.time_op(
                "gemm",
                params,
                lambda i, xs=xs, ws=weights: linear(xs[i], ws[i]),
                num_inputs=rot,
                unique_bytes=w_bytes + 2 * (m * k + m * n),
                flops=2 * m * n * k,
            )


def _rmsnorm(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)  # engine.model.RMSNorm


def _silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)  # engine.model.MLP, between its two GEMMs
    return F.silu(gate) * up


def _greedy(logits):
    return logits.float().argmax(-1)  # engine.acceptance at temperature 0


def elementwise_sweep(s: Runner, models: dict | None = None) -> None:
    """The element-wise ops as the engine runs them (``impl: engine`` in the params)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    extra_vocabs = {256, 32000} if models is None else set()
    models = (swept_models() if models is None else models).values()
    widths = sorted({m.hidden_size for m in models})
    vocabs = sorted({m.vocab_size for m in models} | extra_vocabs)
    ffn = sorted({m.intermediate_size for m in models})
    for m in TOKENS:
        for d in widths:
            rot = s.rotations(m * d * 2 * 2)
            xs = [torch.randn(m, d, generator=gen, device="cuda", dtype=ACT) for _ in range(rot)]
            w = torch.randn(d, generator=gen, device="cuda", dtype=ACT)
            s.time_op(
                "rmsnorm",
                {"m": m, "d": d, "dtype": "bfloat16", "impl": "engine"},
                lambda i, xs=xs, w=w: _rmsnorm(xs[i], w),
                num_inputs=rot,
                unique_bytes=2 * m * d * 2 + d * 2,
                flops=5 * m * d,
            )
        for f in ffn:
            gu = [
                torch.randn(m, 2 * f, generator=gen, device="cuda", dtype=ACT)
                for _ in range(s.rotations(m * 2 * f * 2))
            ]
            s.time_op(
                "silu_mul",
                {"m": m, "f": f, "dtype": "bfloat16", "impl": "engine"},
                lambda i, gu=gu: _silu_mul(gu[i]),
                num_inputs=len(gu),
                unique_bytes=3 * m * f * 2,
                flops=5 * m * f,
            )
        for v in vocabs:
            rot = s.rotations(m * v * 4)
            ls = [torch.randn(m, v, generator=gen, device="cuda") for _ in range(rot)]
            s.time_op(
                "sampling",
                {"m": m, "vocab": v, "dtype": "float32", "impl": "engine"},
                lambda i, ls=ls: _greedy(ls[i]),
                num_inputs=rot,
                unique_bytes=m * v * 4,
                flops=m * v,
            )


def new_runner(
    out: Path, budget_s: float, shard: Shard | None = None, done_from: tuple[Path, ...] = ()
) -> Runner:
    """The runner of the op rows: CUDA-graph replay only, float work counts."""
    return Runner(
        out / ROWS_FILE,
        budget_s,
        config=TIMING,
        timings=("graph",),
        shard=shard,
        done_from=done_from,
    )


PLAN_REFERENCE = Path(__file__).resolve().parent / "profiles" / "h100-sxm" / ROWS_FILE


def plan_text(count: int, done: set[str], reference: Path = PLAN_REFERENCE) -> str:
    """Per shard of ``count``: the reference file's configs it owns, those not in ``done``,
    and their estimated minutes (the reference's measured call times under ``TIMING``, plus
    ``PlanCosts.row_overhead_s`` a row). The reference (``PLAN_REFERENCE``) is the H100's op rows,
    of the same registry's shapes."""
    overhead = PlanCosts().row_overhead_s
    n, todo, secs = Counter(), Counter(), Counter()
    for r in read_rows(reference):
        if r["timing"] != "graph":
            continue
        k = next(i for i in range(count) if Shard(i, count).owns(row_key(r["op"], "", r["params"])))
        n[k] += 1
        if row_key(r["op"], "graph", r["params"]) not in done:
            todo[k] += 1
            secs[k] += timing_s(r["median_s"], "graph", TIMING) + overhead
    lines = [
        f"op sweep plan: the configs of {reference.parent.name}/{reference.name} "
        f"({sum(n.values())}), split by key hash",
        f"{'shard':>6} {'configs':>8} {'pending':>8} {'est. min':>9}",
    ]
    for k in range(count):
        lines.append(f"{k:>6} {n[k]:>8} {todo[k]:>8} {secs[k] / 60:>9.1f}")
    return "\n".join(lines)


def default_groups() -> dict[str, Callable]:
    """The op groups this module times, by name (looked up at call time)."""
    return {"gemm": gemm_sweep, "elementwise": elementwise_sweep}


def main(argv: list[str] | None = None, groups: dict[str, Callable] | None = None) -> int:
    """Run the op ``groups`` (name -> ``fn(runner, models=None)``; default ``default_groups``)
    that ``--ops`` selects, and ``resident``: every group again at the L2-resident models.
    ``--shard K/N`` times the configs whose resume key hashes to K (``calibration.shards``: the
    configs take alike times, so equal counts balance the shards); ``--plan`` prints each
    shard's count and estimated time without a GPU (``plan_text``)."""
    groups = default_groups() if groups is None else groups
    names = (*groups, "resident")
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the rows file")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall-clock limit (s)")
    ap.add_argument("--ops", default=",".join(names), help=", ".join(names))
    ap.add_argument("--shard", metavar="K/N", help="time shard K of N of the configs")
    ap.add_argument(
        "--done-from",
        type=Path,
        action="append",
        default=[],
        help="rows file whose configs count as done (repeatable)",
    )
    ap.add_argument("--plan", action="store_true", help="print the shards' estimates and exit")
    args = ap.parse_args(argv)
    ops = {o.strip() for o in args.ops.split(",") if o.strip()}
    bad = sorted(ops - set(names))
    try:  # bad input: one line, exit 2 (3 means stopped at the budget)
        if bad:
            raise ValueError(f"unknown op group {bad[0]!r}; expected {', '.join(names)}")
        shard = None if args.shard is None else Shard.parse(args.shard)
    except ValueError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    if args.plan:
        done = done_keys([args.out / ROWS_FILE, *args.done_from])
        print(plan_text(shard.count if shard else 1, done))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("calibration sweeps need a CUDA GPU")
    s = new_runner(args.out, args.budget_s, shard, tuple(args.done_from))
    s.measure_ceilings()
    c = s.ceil
    print(
        f"{s.prov['device_name']}: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, GEMM "
        f"{c['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s, graph launch {c['graph'] * 1e6:.2f} us"
    )
    for name, fn in groups.items():
        if name in ops:
            fn(s)
    if "resident" in ops:
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        models = resident_models(l2)
        print(f"L2-resident rows ({l2 / 2**20:.0f} MiB L2): {', '.join(models) or 'no model'}")
        s.resident = True
        for fn in groups.values():
            fn(s, models)
    print(
        f"{s.num_written} rows written to {s.path}; {len(s.done)} in the file"
        + (" (stopped at the budget: run again to resume)" if s.stopped else "")
    )
    return STOPPED_AT_BUDGET if s.stopped else 0


if __name__ == "__main__":
    raise SystemExit(main())
