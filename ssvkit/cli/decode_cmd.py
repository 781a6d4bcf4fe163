"""``ssvkit decode``: run the real decode loop and print the measurement beside the prediction.

ssvkit decode --model tiny --context 16K --strategy ssv --max-new-tokens 256
ssvkit decode --model random:llama-3.1-8b --context 32K --strategy sd_dense --drafter-kind ngram
ssvkit decode --model tiny --device cpu --context 2K --strategy ar_dense --trace run.jsonl --json
ssvkit decode --model random:llama-3.1-8b --context 32K --strategy ssv --drafter oracle \
    --oracle-acceptance 0.9,0.8,0.7,0.6,0.5

Bad input fails with one line and exit 2 before any model is built. The prediction comes from
``perfmodel`` for ``--gpu`` at the measured acceptance and, when measured, the mean group
overlap; with ``--drafter oracle`` (``engine.oracle``) the acceptance is synthetic and labelled
so. ``docs/cli.md`` says what each flag does.
"""

from __future__ import annotations

import dataclasses
import json

from ssvkit.cli.decode_report import DecodeRun, build_report, report_text
from ssvkit.cli.options import add_dataclass_options, given, parse_one
from ssvkit.engine.settings import DecodeConfig
from ssvkit.perfmodel.files import check_output, read_bytes
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy

HELP = "run the GPU decode loop (draft, verify, accept) and compare with the prediction"
STRATEGY_FIELDS = (
    "tree",
    "traversal",
    "mode",
    "group_size",
    "top_n",
    "block_size",
    "window",
    "comp_block",
    "comp_stride",
    "metadata",
    "refresh_every",
    "fusion",
)
DRAFTER_FIELDS = ("kind", "sparsity_ratio")
DECODE_FIELDS = ("max_new_tokens", "temperature", "draft_temperature", "seed", "ngram_max_n")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_ORACLE_HELP = {f.name: f for f in dataclasses.fields(DecodeConfig)}["oracle_acceptance"].metadata[
    "help"
]


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny", help="tiny | checkpoint folder | random:NAME")
    p.add_argument(
        "--draft-model",
        default=None,
        help="draft checkpoint for drafter draft_model (default: tiny-draft with --model tiny)",
    )
    p.add_argument("--context", default="4K", help="prompt tokens (K = 1024; default 4K)")
    p.add_argument(
        "--prompt-file",
        default=None,
        help="prompt bytes (tiled to --context); default: a built-in corpus sample",
    )
    p.add_argument(
        "--strategy",
        default=None,
        help=f"baseline to run: {', '.join(BASELINES)} (default: sd_dense)",
    )
    g = p.add_argument_group("strategy fields (override the baseline's)")
    add_dataclass_options(g, Strategy, STRATEGY_FIELDS, defaults=BASELINES["ssv"])
    add_dataclass_options(g, DrafterSpec, DRAFTER_FIELDS, prefix="drafter-")
    add_dataclass_options(p, DecodeConfig, DECODE_FIELDS)
    p.add_argument(
        "--drafter",
        default=None,
        metavar="oracle",
        help="oracle: draft the target's own continuation with a synthetic acceptance "
        "(--oracle-acceptance) in place of the strategy's drafter",
    )
    p.add_argument(
        "--oracle-acceptance",
        default=None,
        metavar="A[,A...]",
        help=_ORACLE_HELP + " (values in (0, 1])",
    )
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--device", default="auto", help="cuda | cpu (default: cuda when present)")
    p.add_argument("--dtype", default="auto", help="bf16 | fp16 | fp32 (default: bf16 on cuda)")
    p.add_argument(
        "--backend", default="auto", help="triton | torch (default: triton on cuda, else torch)"
    )
    p.add_argument("--no-graphs", action="store_true", help="run eagerly (no CUDA graphs)")
    p.add_argument(
        "--serial-loop",
        action="store_true",
        help="read each round before issuing the next (default: pipelined where nothing on the "
        "host decides the next round, engine.pipeline)",
    )
    p.add_argument("--trace", metavar="FILE.jsonl", help="write the round trace (implies --stats)")
    p.add_argument(
        "--stats",
        action="store_true",
        help="record selection overlaps and PRR hit rates per round (outside the timed steps)",
    )
    p.add_argument("--controller", metavar="MODULE:ATTR", help="online controller to call")
    p.add_argument(
        "--ranking",
        metavar="FILE",
        help="start from this ranking's best strategy for the context's regime and adapt online "
        "(planner OnlineController); replaces --strategy and the strategy fields",
    )
    p.add_argument("--gpu", default="h100-sxm", help="GPU of the prediction (default h100-sxm)")
    p.add_argument("--json", action="store_true", help="print JSON (every figure with provenance)")


# ----------------------------------------------------------------------------- setup


def build_strategy(args, draft_name: str | None) -> tuple[Strategy, str | None]:
    """The baseline with the given overrides; an EAGLE default becomes draft_model (when a draft
    model is available) or ngram, with a note."""
    s = Strategy.from_name(args.strategy or "sd_dense")
    kw = given(args, STRATEGY_FIELDS)
    dkw = given(args, DRAFTER_FIELDS, prefix="drafter_")
    note = None
    if args.drafter == "oracle":  # the oracle drafts; the prediction prices a lookup (ngram)
        dkw["kind"] = "ngram"
        note = "drafter: oracle (synthetic acceptance; the prediction prices ngram drafting)"
    elif "kind" not in dkw and s.drafter.kind == "eagle":
        dkw["kind"] = "draft_model" if draft_name else "ngram"
        note = f"drafter: {dkw['kind']} (the engine has no EAGLE heads)"
    drafter = dataclasses.replace(s.drafter, **dkw, model=draft_name or "none")
    return dataclasses.replace(s, drafter=drafter, **kw), note


def _controller_and_strategy(args, context: int, draft_name: str | None):
    """The online controller and the starting strategy: ``--ranking``'s planner controller
    and its regime's offline best, else ``--controller`` (or none) and the given strategy."""
    from ssvkit.engine.controller import load_controller

    if not args.ranking:
        return load_controller(args.controller), *build_strategy(args, draft_name)
    from ssvkit.planner.controller import OnlineController
    from ssvkit.planner.rank import load_ranking

    overrides = given(args, STRATEGY_FIELDS) or given(args, DRAFTER_FIELDS, prefix="drafter_")
    if args.controller or args.strategy or overrides:
        raise ValueError(
            "--ranking chooses the strategy and the controller: drop --controller, "
            "--strategy and the strategy fields"
        )
    ctl = OnlineController.from_ranking(load_ranking(args.ranking), batch=args.batch)
    ctl.warm()  # score the candidates before decoding, not in the first re-scoring round
    # The ranking's strategies keep their drafter labels: the controller re-scores them with the
    # ranking's models; the engine drafts with --draft-model's runner whatever the label says.
    note = f"strategy: the offline best of {args.ranking} for this context, adapted online"
    return ctl, ctl.initial_strategy(context), note


def _oracle_acceptance(args) -> tuple[float, ...] | None:
    """``--oracle-acceptance`` parsed, after the checks that the oracle can stand in here."""
    if args.drafter is None:
        if args.oracle_acceptance is not None:
            raise ValueError("--oracle-acceptance needs --drafter oracle")
        return None
    if args.drafter != "oracle":
        raise ValueError(
            f"--drafter takes oracle (other drafters: --drafter-kind), got {args.drafter!r}"
        )
    if args.ranking:
        raise ValueError("--drafter oracle: --ranking chooses the drafter; drop one of them")
    if args.drafter_kind is not None:
        raise ValueError(
            "--drafter oracle replaces the drafter (priced as ngram): drop --drafter-kind"
        )
    if args.oracle_acceptance is None:
        raise ValueError("--drafter oracle needs --oracle-acceptance (one value, or one per depth)")
    return DecodeConfig.parse_acceptance(args.oracle_acceptance)


def _device(args):
    import torch

    want = args.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {want!r}")
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    dtype = args.dtype if args.dtype != "auto" else ("bf16" if want == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    backend = args.backend if args.backend != "auto" else ("triton" if want == "cuda" else "torch")
    if backend not in ("torch", "triton"):
        raise ValueError(f"--backend must be triton or torch, got {backend!r}")
    if backend == "triton" and want == "cpu" and dtype == "bf16":
        raise ValueError("the Triton interpreter's bf16 dot is broken: use --dtype fp32 on cpu")
    graphs = want == "cuda" and backend == "triton" and not args.no_graphs
    return want, getattr(torch, DTYPES[dtype]), backend, graphs


def _prompts(args, context: int, batch: int, vocab: int) -> list[list[int]]:
    from ssvkit.engine.corpus import corpus_sample, encode

    if args.prompt_file:
        data = encode(read_bytes(args.prompt_file, "--prompt-file"))
        if not data:
            raise ValueError(f"prompt file {args.prompt_file!r} is empty")
        ids = (data * (-(-context // len(data))))[:context]
        rows = [ids] * batch
    else:
        ids = corpus_sample(context * batch)
        rows = [ids[i * context : (i + 1) * context] for i in range(batch)]
    return [[t % vocab for t in r] for r in rows]


def _decode_run(args, context: int) -> tuple[DecodeRun, object]:
    """The run's models, strategy, tree and device setup, checked (``DecodeRun`` without its
    oracle drafter), and the online controller. The draft model is resolved only when the
    strategy drafts with it."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.strategy_check import check_strategy

    target_src = resolve_source(args.model)
    draft_name = args.draft_model or ("tiny-draft" if args.model == "tiny" else None)
    controller, strategy, note = _controller_and_strategy(args, context, draft_name)
    uses_draft = strategy.drafter.kind == "draft_model" and strategy.tree != "chain:0"
    draft_src = resolve_source(draft_name) if uses_draft and draft_name else None
    device, dtype, backend, graphs = _device(args)
    tree, _ = check_strategy(
        strategy, target_src.config, draft_src.config if draft_src else None, backend
    )
    run = DecodeRun(
        strategy, tree, target_src, draft_src, context, device, dtype, backend, graphs, note
    )
    return run, controller


def _oracle_decode(decode: DecodeConfig, run: DecodeRun) -> DecodeConfig:
    """The decode settings of ``--drafter oracle``, checked against the tree; a sparse strategy
    records its selections (random weights select unlike trained ones: the prediction takes
    the measured overlap)."""
    if not run.tree.num_drafts:
        raise ValueError(f"--drafter oracle needs a strategy that drafts; tree {run.strategy.tree}")
    decode.oracle_profile(run.tree.max_depth)
    if run.strategy.is_sparse:
        return dataclasses.replace(decode, record_stats=True)
    return decode


def _check_memory(run: DecodeRun, decode: DecodeConfig, batch: int, t_max: int) -> None:
    """Refuse a run whose peak memory (``engine.memory.plan_memory``: weights, KV cache,
    summaries, the draft model, and the larger of the prefill and verify peaks) cannot fit."""
    import torch

    from ssvkit.engine.memory import available_memory, plan_memory

    have, where = available_memory(run.device)
    plan = plan_memory(
        run.target_src.config,
        run.strategy,
        batch=batch,
        context=run.context,
        t_max=t_max,
        available_bytes=have,
        elem_bytes=torch.tensor([], dtype=run.dtype).element_size(),
        draft=run.draft_src.config if run.draft_src else None,
        scores=run.device != "cuda",
        stats=decode.record_stats,
    )
    if not plan.fits:
        raise ValueError(f"{plan.refusal()} {where}")


# ----------------------------------------------------------------------------- run


def _decode_config(args, oracle) -> DecodeConfig:
    """The decode settings the options give (``--draft-temperature`` as a number)."""
    kw = given(args, DECODE_FIELDS)
    if "draft_temperature" in kw:
        try:
            kw["draft_temperature"] = float(kw["draft_temperature"])
        except ValueError:
            bad = kw["draft_temperature"]
            raise ValueError(f"--draft-temperature {bad!r} is not a number") from None
    return DecodeConfig(
        **kw,
        record_stats=bool(args.stats or args.trace),
        oracle_acceptance=oracle,
        pipeline=not args.serial_loop,
    )


def _cache_positions(context: int, decode: DecodeConfig, tree, controller, config) -> int:
    """Cache positions of one sequence: the context, the new tokens and the largest verify
    tail (a controller may switch to any tree: the largest the kernels take); ``ValueError``
    past the model's positions."""
    from ssvkit.engine.controller import KeepStrategy
    from ssvkit.kernels.tree import MAX_TREE_NODES

    tail = tree.num_nodes if isinstance(controller, KeepStrategy) else MAX_TREE_NODES
    t_max = context + decode.max_new_tokens + tail + 1
    limit = config.max_position_embeddings
    if t_max > limit:
        raise ValueError(
            f"context {context} + {decode.max_new_tokens} new tokens + {tail} tail "
            f"rows = {t_max} positions exceed the model's {limit}"
        )
    return t_max


def _trace_writer(args, run: DecodeRun, decode: DecodeConfig):
    """The ``--trace`` writer (None without the option)."""
    if not args.trace:
        return None
    import torch

    from ssvkit.engine.trace_writer import TraceWriter

    return TraceWriter(
        args.trace,
        run.target_src.name,
        run.target_src.config.num_layers,
        device=run.device,
        gpu=torch.cuda.get_device_name() if run.device == "cuda" else "cpu",
        backend=run.backend,
        seed=decode.seed,
        dtype=str(run.dtype).removeprefix("torch."),
        graphs=run.graphs,
    )


def _runner(src, *, batch: int, t_max: int, device, dtype, backend, graphs):
    """A runner of the model ``src`` built on ``device``."""
    from ssvkit.engine.checkpoint import build_model
    from ssvkit.engine.runner import ModelRunner

    model = build_model(src, max_positions=t_max, device=device, dtype=dtype)
    return ModelRunner(model, batch=batch, t_max=t_max, backend=backend, use_graphs=graphs)


def _engine(args, run: DecodeRun, decode: DecodeConfig, t_max: int, controller, trace):
    """The engine over the target's runner and, when the run drafts with a draft model, the
    draft model's runner."""
    from ssvkit.engine.loop import Engine

    runner_kw = dict(batch=args.batch, t_max=t_max, device=run.device, dtype=run.dtype)
    target = _runner(run.target_src, backend=run.backend, graphs=run.graphs, **runner_kw)
    draft = None
    if run.draft_src is not None:
        draft = _runner(run.draft_src, backend=run.backend, graphs=run.graphs, **runner_kw)
    return Engine(
        target, run.strategy, decode, draft_runner=draft, controller=controller, trace=trace
    )


def run(args) -> int:
    import torch

    context = parse_one(args.context, "--context")
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if args.trace:
        check_output(args.trace, "--trace")
    oracle = _oracle_acceptance(args)
    decode = _decode_config(args, oracle)
    run, controller = _decode_run(args, context)
    if oracle is not None:
        decode = _oracle_decode(decode, run)
    t_max = _cache_positions(context, decode, run.tree, controller, run.target_src.config)
    _check_memory(run, decode, args.batch, t_max)
    prompts = _prompts(args, context, args.batch, run.target_src.config.vocab_size)
    trace = _trace_writer(args, run, decode)
    # Input checked: from here on models are built and the device is used.
    engine = _engine(args, run, decode, t_max, controller, trace)
    if oracle is not None:  # kept if a controller switches
        run = dataclasses.replace(run, oracle=engine.drafter)
    result = engine.generate(prompts)
    report = build_report(args, result, run)
    switches = getattr(controller, "switches", None)
    if switches is not None:
        report["switches"] = switches
    if run.device == "cuda":
        report["device_name"] = torch.cuda.get_device_name()
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return 0
