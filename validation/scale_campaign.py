"""The campaign at scale: random-weight registry geometries decoded by the engine with the oracle
drafter, at long contexts and batches up to what memory allows, beside perfmodel's prediction.

    python -m ssvkit.validation.scale_campaign --gpu h200 \\
        --out build/scale-campaign.json --resume build/scale-campaign.jsonl     # on the H200
    python -m ssvkit.validation.scale_campaign --models random:PATH/config.json --contexts 256 \\
        --batches 1,2 --baselines ar_dense,ssv --new-tokens 8 --device cpu --out /tmp/s.json

Cells: model (``random:llama-3.1-8b``, GQA 4; ``random:glm-4-9b``, GQA 16) x context x batch
(``max``: the largest batch every baseline fits, ``engine.memory.max_batch``) x baseline x
oracle acceptance (the autoregressive baselines draft nothing: one cell each). ``ssv_planned``
is the offline best of the planner evaluation's space ranked for the cell (its model, context,
batch and the oracle's acceptance, priced as n-gram drafting, as ``ssvkit decode --drafter
oracle`` does). Each cell decodes greedily (``engine.loop.Engine``, CUDA graphs) and records the
steady figures (``validation.bench.steady_figures``), the acceptance labelled
``synthetic:oracle``, the measured selection overlap of sparse strategies, perfmodel's
prediction at the measured acceptance and overlap with its speedups over ``ar_dense`` and
``ar_sparse``, and every round's (context, drafted, accepted of sequence 0) -- the
``rounds_trace`` ``validation.report`` replays in the simulator on the CPU (the GPU machine
has no simpy). A cell that cannot fit is recorded as skipped with the memory arithmetic.

``--resume FILE`` appends each finished cell and skips it on a later call with the same
settings, device and commit; ``--stop-after S`` starts no cell after S seconds, so the campaign
runs as calls of at most 10 minutes. The JSON document is written whole (atomically) at the end
of each call, ``complete`` false until a call finishes every cell; ``ssvkit report --campaign``
reads it (``validation.scale_report``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time

from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy
from ssvkit.validation.bench import RunCache, steady_figures
from ssvkit.validation.e2e_campaign import NAMES, load_planner
from ssvkit.validation.records import command_line, file_label, record_path

CAMPAIGN_VERSION = 1
# The document's ``benchmark`` field: what ``ssvkit report --campaign`` recognises it by.
BENCHMARK = "scale_campaign"
MODELS = ("random:llama-3.1-8b", "random:glm-4-9b")
AUTOREGRESSIVE = ("ar_dense", "ar_sparse")
# The settings a run cache is keyed by (with the provenance but its timestamp).
CACHE_SETTINGS = ("new_tokens", "planner", "gpu", "dtype", "max_batch_limit")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="random:NAME geometries")
    p.add_argument("--contexts", default="32K,64K,128K", help="prompt tokens per sequence")
    p.add_argument("--batches", default="1,4,16,max", help="batch sizes; max: what memory allows")
    p.add_argument("--acceptances", default="0.6,0.8", help="oracle acceptance per draft")
    p.add_argument("--baselines", default=",".join(NAMES))
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence")
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation whose space ranks ssv_planned (default: the one of record)",
    )
    p.add_argument("--gpu", default="h200", help="GPU registry key of the predictions")
    p.add_argument("--device", default="auto", help="cuda | cpu")
    p.add_argument("--dtype", default="auto", help="bf16 | fp32 (default: bf16 on cuda)")
    p.add_argument("--max-batch-limit", type=int, default=512, help="largest batch 'max' tries")
    p.add_argument("--out", required=True, help="campaign JSON")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="start no cell after S seconds: the JSON holds the cells finished so far "
        "(complete: false), a later call with --resume goes on",
    )
    return p.parse_args(argv)


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    """One decode: the model, the prompt context, the batch (``label`` says ``max`` when
    memory chose it), the baseline and the oracle's acceptance (None: autoregressive)."""

    model: str
    context: int
    batch: int
    label: str
    baseline: str
    acceptance: float | None

    @property
    def key(self) -> str:
        return f"{self.model}|{self.context}|{self.batch}|{self.baseline}|{self.acceptance}"


@dataclasses.dataclass
class Setup:
    """What every cell shares: the parsed axes, the device and dtype, the planner's space and
    the memory the device offers."""

    models: list[str]
    contexts: list[int]
    batches: list[str]
    acceptances: list[float]
    baselines: list[str]
    device: str
    dtype: object
    space: object
    available_bytes: int
    args: argparse.Namespace


def setup(args) -> Setup:
    """The campaign's axes checked (``ValueError`` in one line on bad input)."""
    import torch
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import available_memory

    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if not m.startswith("random:"):
            raise ValueError(
                f"--models takes random:NAME geometries (the oracle drafts), got {m!r}"
            )
        resolve_source(m)
    names = [x for x in args.baselines.split(",") if x]
    bad = [x for x in names if x not in NAMES]
    if bad:
        raise ValueError(f"unknown baseline {bad[0]!r}; expected {', '.join(NAMES)}")
    batches = [b for b in args.batches.split(",") if b]
    parse_count_list(",".join(b for b in batches if b != "max") or "1", "--batches")
    try:
        acceptances = [float(a) for a in args.acceptances.split(",") if a]
    except ValueError:
        raise ValueError(f"--acceptances {args.acceptances!r} is not a list of numbers") from None
    if not acceptances or not all(0 < a <= 1 for a in acceptances):
        raise ValueError(f"--acceptances must be values in (0, 1], got {args.acceptances!r}")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    dtype = {"auto": None, "bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype, "bad")
    if dtype == "bad":
        raise ValueError(f"--dtype must be bf16 or fp32, got {args.dtype!r}")
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    _, space = load_planner(args.planner)
    return Setup(
        models=models,
        contexts=parse_count_list(args.contexts, "--contexts"),
        batches=batches,
        acceptances=acceptances,
        baselines=names,
        device=device,
        dtype=dtype,
        space=dataclasses.replace(space, drafters=("ngram",), draft_model=None),
        available_bytes=available_memory(device)[0],
        args=args,
    )


def oracle_strategy(name: str, acceptance: float | None) -> Strategy:
    """A baseline with the oracle priced as n-gram drafting, ``best:N`` resolved at the
    oracle's acceptance."""
    from ssvkit.planner.rank import concrete

    s = BASELINES[name]
    if acceptance is None:
        return s
    s = dataclasses.replace(s, drafter=DrafterSpec(kind="ngram"))
    return dataclasses.replace(concrete(s, acceptance), name=name)


def planned_strategy(st: Setup, cell: Cell) -> Strategy:
    """``ssv_planned``: the offline best of the planner's space for the cell's model, context
    and batch, with the oracle's acceptance as the drafter's profile."""
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.planner.profile import RegimeProfile
    from ssvkit.planner.rank import rank, strategy_from_json

    profile = RegimeProfile(
        acceptance={"default": {"ngram": cell.acceptance}}, source="synthetic:oracle"
    )
    model = get_model(cell.model.removeprefix("random:"))
    ranking = rank(
        model,
        get_gpu(st.args.gpu),
        st.space,
        profile,
        batch=cell.batch,
        regimes={"cell": cell.context},
    )
    if "cell" not in ranking["regimes"]:
        raise ValueError(f"the planner ranks nothing here: {ranking.get('skipped')}")
    best = ranking["regimes"]["cell"]["ranking"][0]["strategy"]
    return dataclasses.replace(strategy_from_json(best), name="ssv_planned")


def cells_for(st: Setup, model: str, context: int, t_max: int) -> list[Cell]:
    """The cells of one (model, context): every batch x baseline x acceptance."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import max_batch

    cfg = resolve_source(model).config
    elem = 2 if str(st.dtype).endswith("bfloat16") else 4
    out = []
    for label in st.batches:
        if label == "max":
            batch = min(
                max_batch(
                    cfg,
                    context,
                    oracle_strategy(n, None if n in AUTOREGRESSIVE else st.acceptances[0]),
                    st.available_bytes,
                    t_max=t_max,
                    elem_bytes=elem,
                    scores=st.device != "cuda",
                    stats=True,
                    limit=st.args.max_batch_limit,
                )
                for n in st.baselines
                if n != "ssv_planned"
            )
            batch = max(batch, 1)  # recorded as skipped when not even one fits
        else:
            batch = int(label)
        for name in st.baselines:
            for a in [None] if name in AUTOREGRESSIVE else st.acceptances:
                out.append(Cell(model, context, batch, label, name, a))
    return out


def cache_positions(st: Setup, context: int) -> int:
    """Cache positions per sequence: the prompt, the new tokens and the largest verify tail
    the kernels take (``ssv_planned`` may pick any tree)."""
    from ssvkit.kernels.tree import MAX_TREE_NODES

    return context + st.args.new_tokens + MAX_TREE_NODES + 1


class Runners:
    """The loaded model and the runner of the current (batch, cache positions), replaced when
    the next cell needs another; the model stays loaded across its cells."""

    def __init__(self, st: Setup) -> None:
        self.st = st
        self.key = None
        self.model = None
        self.runner = None

    def get(self, model: str, batch: int, t_max: int, max_t: int):
        import torch
        from ssvkit.engine.checkpoint import build_model, resolve_source
        from ssvkit.engine.runner import ModelRunner

        st = self.st
        if self.key is None or self.key[0] != model:
            self.model = self.runner = None
            _release(st.device)
            src = resolve_source(model)
            self.model = build_model(src, max_positions=max_t, device=st.device, dtype=st.dtype)
        if self.key != (model, batch, t_max):
            self.runner = None
            _release(st.device)
            cuda = st.device == "cuda"
            self.runner = ModelRunner(
                self.model,
                batch=batch,
                t_max=t_max,
                backend="triton" if cuda else "torch",
                use_graphs=cuda,
            )
            self.key = (model, batch, t_max)
        self.runner.graphs.clear()  # a cell's graphs, not the last cell's, hold memory
        torch.manual_seed(0)
        return self.runner


def _release(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def prompts_for(context: int, batch: int, vocab: int) -> list[list[int]]:
    """Code prompts, one window of the built-in corpus per sequence."""
    from ssvkit.validation.prompts import prompt_tokens

    return [
        [t % vocab for t in prompt_tokens("code", context, offset=b * context)]
        for b in range(batch)
    ]


def measure_cell(st: Setup, runners: Runners, cell: Cell, strategy: Strategy, plan) -> dict:
    """One cell decoded: its steady figures, acceptance, selection overlap, prediction and
    rounds' trace."""
    from ssvkit.engine.loop import Engine
    from ssvkit.engine.settings import DecodeConfig
    from ssvkit.engine.strategy_check import check_strategy
    from ssvkit.validation.decode_figures import fit_acceptance, mean_selection

    runner = runners.get(cell.model, cell.batch, plan.t_max, cache_positions(st, max(st.contexts)))
    tree, _ = check_strategy(strategy, runner.config, None, runner.backend)
    oracle = (cell.acceptance,) if tree.num_drafts else None
    decode = DecodeConfig(
        max_new_tokens=st.args.new_tokens,
        record_stats=strategy.is_sparse,
        oracle_acceptance=oracle,
    )
    engine = Engine(runner, strategy, decode)
    prompts = prompts_for(cell.context, cell.batch, runner.config.vocab_size)
    gc.collect()
    gc.disable()
    try:
        result = engine.generate(prompts)
    finally:
        gc.enable()
    fig = steady_figures(result)
    source = "synthetic:oracle" if oracle else "measured"
    parents = [p - 1 for p in tree.parents[1:]]
    alpha = fit_acceptance(parents, fig["mean_accepted"]) if parents else 0.0
    selection = {
        k: mean_selection(result, k)
        for k in ("group_overlap", "layer_overlap", "predict_hit", "reuse_hit")
    }
    fig["rounds_trace"] = [[max(r.context_lens), r.drafted, r.accepted[0]] for r in result.rounds]
    fig["accepted_per_sequence"] = [list(r.accepted) for r in result.rounds]
    return {
        "measured": fig,
        "prefill_s": result.prefill_s,
        "timer": result.timer,
        "measured_acceptance": {
            "source": source,
            "mean_accepted": fig["mean_accepted"],
            "rate": result.acceptance_rate(),
            "fitted_alpha": alpha,
            "oracle": list(oracle) if oracle else None,
            "diverged": len(engine.drafter.diverged) if oracle else 0,
            "off_plan": engine.drafter.off_plan if oracle else 0,
        },
        "selection": selection,
        "prediction": predictions(st, cell, strategy, alpha, selection["group_overlap"]),
    }


def predictions(st: Setup, cell: Cell, strategy: Strategy, alpha: float, overlap) -> dict:
    """perfmodel's prediction at the measured acceptance and overlap (the mean context of the
    run), with its speedups over the autoregressive baselines predicted alike."""
    from ssvkit.validation.decode_figures import predict, ratio_interval

    name = cell.model.removeprefix("random:")
    ctx = cell.context + st.args.new_tokens // 2
    pred = predict(strategy, name, None, ctx, cell.batch, alpha, overlap, st.args.gpu)
    if "error" in pred:
        return pred
    if cell.acceptance is not None:
        pred["acceptance"] = "synthetic:oracle"
    pred["speedup"], pred["speedup_intervals"] = {}, {}
    for base in AUTOREGRESSIVE:
        ar = predict(BASELINES[base], name, None, ctx, cell.batch, 0.0, overlap, st.args.gpu)
        if "tokens_per_s" in ar:
            pred["speedup"][base] = pred["tokens_per_s"] / ar["tokens_per_s"]
            same = (ar["tokens_per_s"], ar["round_log_bounds"]) == (
                pred["tokens_per_s"],
                pred["round_log_bounds"],
            )
            pred["speedup_intervals"][base] = ratio_interval(
                pred["speedup"][base], ar["round_log_bounds"], pred["round_log_bounds"], same
            )
    return pred


def run_cell(st: Setup, runners: Runners, cell: Cell) -> dict:
    """One cell's row value: measured, or skipped with the reason (memory, positions, a
    strategy the engine cannot run)."""
    import torch
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import plan_memory
    from ssvkit.engine.strategy_check import check_strategy
    from ssvkit.kernels.timing import provenance
    from ssvkit.planner.space import describe

    cfg = resolve_source(cell.model).config
    t_max = cache_positions(st, cell.context)
    try:
        if cell.baseline == "ssv_planned":
            strategy = planned_strategy(st, cell)
        else:
            strategy = oracle_strategy(cell.baseline, cell.acceptance)
        check_strategy(strategy, cfg, None, "triton" if st.device == "cuda" else "torch")
    except ValueError as e:
        return {"status": "skipped", "reason": str(e).splitlines()[0]}
    cuda = st.device == "cuda"
    out = {
        "strategy": dataclasses.asdict(strategy),
        "describe": describe(strategy),
        "provenance": {
            **provenance(),
            "dtype": str(st.dtype).removeprefix("torch."),
            "backend": "triton" if cuda else "torch",
            "cuda_graphs": cuda,
            "new_tokens": st.args.new_tokens,
            "temperature": 0.0,
        },
    }
    if t_max > cfg.max_position_embeddings:
        reason = f"{t_max} cache positions exceed the model's {cfg.max_position_embeddings}"
        return {**out, "status": "skipped", "reason": reason}
    plan = plan_memory(
        cfg,
        strategy,
        batch=cell.batch,
        context=cell.context,
        t_max=t_max,
        available_bytes=st.available_bytes,
        elem_bytes=torch.tensor([], dtype=st.dtype).element_size(),
        scores=st.device != "cuda",
        stats=strategy.is_sparse,
    )
    out["memory"] = plan.to_json()
    if not plan.fits:
        return {**out, "status": "skipped", "reason": plan.refusal()}
    t0 = time.perf_counter()
    out.update(measure_cell(st, runners, cell, strategy, plan))
    return {**out, "status": "measured", "wall_s": time.perf_counter() - t0}


def measure_rows(st: Setup, cache: RunCache | None, stop_at: float) -> tuple[list[dict], bool]:
    """Every cell, through the run cache when there is one, as the campaign's rows; False
    with the rows so far when ``time.perf_counter()`` passes ``stop_at`` before a cell that
    must be decoded."""
    runners = Runners(st)
    rows = []
    for model in st.models:
        for ctx in st.contexts:
            for cell in cells_for(st, model, ctx, cache_positions(st, ctx)):
                cached = cache is not None and cell.key in cache.runs
                if not cached and time.perf_counter() > stop_at:
                    return rows, False
                call = lambda cell=cell: run_cell(st, runners, cell)  # noqa: E731
                value = call() if cache is None else cache.get(cell.key, call)
                rows.append({**dataclasses.asdict(cell), **value})
                print(_line(rows[-1]), flush=True)
    return rows, True


def _line(row: dict) -> str:
    head = (
        f"{row['model']:22s} ctx {row['context']:6d} b {row['batch']:3d} "
        f"{row['baseline']:16s} a {row['acceptance'] or '-':>4}"
    )
    if row["status"] != "measured":
        return f"{head}  skipped: {row['reason']}"
    m, p = row["measured"], row["prediction"]
    pred = f"{p['tokens_per_s']:10.1f}" if "tokens_per_s" in p else "       n/a"
    return (
        f"{head} {m['tokens_per_s']:10.1f} tok/s (predicted {pred}), "
        f"{m['mean_accepted'] + 1:.2f} tokens/round, verify {m['steps_s']['verify'] * 1e3:.3f} ms"
    )


def main(argv=None) -> int:
    from ssvkit.kernels.timing import provenance

    args = parse_args(argv)
    try:
        st = setup(args)
        cache = None
        if args.resume:
            prov = {k: v for k, v in provenance().items() if k != "timestamp"}
            settings = {
                **{k: getattr(args, k) for k in CACHE_SETTINGS},
                "planner": file_label(args.planner),
                "device": st.device,
                **prov,
            }
            cache = RunCache(args.resume, settings)
    except ValueError as e:
        print(f"scale_campaign: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    stop_at = t0 + args.stop_after if args.stop_after is not None else float("inf")
    rows, complete = measure_rows(st, cache, stop_at)
    doc = {
        "benchmark": BENCHMARK,
        "version": CAMPAIGN_VERSION,
        "complete": complete,
        "provenance": {
            **provenance(),
            "command": command_line(
                "ssvkit.validation.scale_campaign", sys.argv[1:] if argv is None else argv
            ),
            "wall_s": time.perf_counter() - t0,
            "runs_from_cache": cache.reused if cache else 0,
        },
        "gpu": args.gpu,
        "device": st.device,
        "dtype": str(st.dtype).removeprefix("torch."),
        "available_bytes": st.available_bytes,
        "new_tokens": args.new_tokens,
        "planner": file_label(args.planner),
        "acceptance": "synthetic:oracle",
        "prompt": "code, one corpus window per sequence",
        "rows": rows,
    }
    atomic_write(args.out, json.dumps(doc) + "\n")
    left = "" if complete else " (stopped by --stop-after: run again with --resume)"
    print(f"\n({time.perf_counter() - t0:.0f} s) {len(rows)} cells -> {args.out}{left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
