"""The engine's verify step on the GPU: one CUDA-graph replay vs the sum of its ops timed in
isolation, and vs the byte floor.

    python -m ssvkit.validation.engine_verify                    # random:llama-3.1-8b, T = 32K
    python -m ssvkit.validation.engine_verify --strategy sd_dense,sd_sparse_naive,ssv \\
        --context 32K,64K,128K --t 1,16 --gpu h200 --out validation/data/engine-verify-h200.json
    python -m ssvkit.validation.engine_verify --campaign validation/data/campaign.json --ops \\
        --out /tmp/verify-breakdown.json

For each ``t`` (the root plus ``t - 1`` chain drafts), on a KV cache of random values at
``lens = T``: the verify forward in a CUDA graph against its ops each timed alone (target: at
most 1.15x their sum) and its byte floor, beside perfmodel's (``main`` lists the fields).
``--campaign FILE`` times instead the verify forward of each (baseline, context) of an
end-to-end campaign (``validation.engine_verify_campaign``) or each cell of a scale one
(``validation.scale_verify``).
``--metadata mean`` (or ``quest``) runs the sparse strategies with block-metadata selection in
place of their NSA importance; their rows record it (``metadata``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import torch
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.timing import (
    WALL,
    TimingConfig,
    bench,
    bench_graphs,
    copy_bytes_per_s,
    empty_kernel_s,
    gemm_flops_per_s,
    provenance,
)
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.nsa_plan import TILE_PLANS
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.strategy import METADATA, Strategy
from ssvkit.validation.decode_figures import predicted_verify_s
from ssvkit.validation.engine_ops import (
    attention_launches,
    floor_bytes,
    op_floors,
    selection_stats,
    time_ops,
)
from ssvkit.validation.engine_verify_table import (
    parse_grouping,
    parse_refresh,
    row_key,
    row_lines,
    with_grouping,
    with_metadata,
    with_refresh,
)
from ssvkit.validation.records import (
    run_schedule,
)

STEP_TIMING = TimingConfig(warmup=2, graph_launches=5, graph_reps=15, reps=10, max_total_s=4.0)


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:llama-3.1-8b")
    p.add_argument(
        "--context", default="32K", help="committed tokens T (K = 1024), comma-separated"
    )
    p.add_argument("--t", default="1,5,16", help="verify rows, comma-separated")
    p.add_argument(
        "--strategy", default="sd_dense", help="baselines whose attention is used, comma-separated"
    )
    p.add_argument(
        "--metadata",
        default="nsa",
        choices=METADATA,
        help="block scores of the sparse strategies (nsa: their own; mean, quest: block metadata)",
    )
    p.add_argument(
        "--grouping",
        default=None,
        help="MODE:C, the sparse strategies' query grouping (per_query:1, union:C, shared:C) "
        "in place of their own",
    )
    p.add_argument(
        "--nsa-tile-plan",
        default=None,
        choices=TILE_PLANS,
        help="the NSA strategies' row tiles and slots (NsaVerifyConfig.tile_plan) in place of "
        "their own",
    )
    p.add_argument(
        "--refresh-every",
        default=None,
        help="N[,M...]: the sparse strategies refresh their selection every N layers in place "
        "of their own cadence, a row set per value",
    )
    p.add_argument(
        "--gpu",
        default=None,
        help="GPU registry key of the prediction (default: a scale campaign's, else h100-sxm)",
    )
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--campaign", default=None, help="time the verify steps of this campaign")
    p.add_argument("--ops", action="store_true", help="with --campaign: the op breakdown too")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out (same code commit) and measure only the others",
    )
    p.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="with --campaign: cuda, or cpu (the torch backend, timed by the wall clock)",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        help="scale campaign: start no new cell after this many seconds",
    )
    p.add_argument(
        "--available-gib",
        type=float,
        default=None,
        help="scale campaign: memory to plan with (default: the campaign's)",
    )
    p.add_argument(
        "--random-kv",
        action="store_true",
        help="scale campaign: random KV at the cells' lengths instead of prefilling their "
        "prompts (faster; sparse selections then see random keys)",
    )
    args = p.parse_args(argv)
    try:
        args.grouping = parse_grouping(args.grouping)
        args.refresh_every = parse_refresh(args.refresh_every)
    except ValueError as e:
        p.error(str(e))
    return args


def _resumed(args) -> dict | None:
    """With ``--resume``, the document in ``--out`` if it was measured at this code's commit."""
    if not (args.resume and args.out and Path(args.out).exists()):
        return None
    doc = json.loads(Path(args.out).read_text())
    if doc["provenance"]["git_commit"] != provenance()["git_commit"]:
        raise SystemExit(
            f"--resume: {args.out} was measured at {doc['provenance']['git_commit']}, "
            f"this code is {provenance()['git_commit']}"
        )
    return doc


def _write(result: dict, path: str | None) -> None:
    if path:
        atomic_write(path, json.dumps(result, indent=2) + "\n", "--out")


def device_setup(device: str):
    """(backend, dtype, timing) of a run on ``device``: the GPU runs the Triton backend in bf16
    and times CUDA-graph replays; the CPU runs the torch backend in fp32 by the wall clock."""
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        return "triton", torch.bfloat16, "graph"
    return "torch", torch.float32, WALL


def main(argv=None) -> dict:
    """Time the verify step per (context, strategy, t), or the verify steps of ``--campaign``.

    Returns
    -------
    dict
        The document, written to ``--out`` when given (after every row, so an interrupted run
        keeps its rows; ``--resume`` keeps those measured at this commit) and printed a line per
        row. Without ``--campaign`` its ``rows``, per (strategy, context, t), timed with
        ``kernels.timing`` (CUDA events, cold L2, median); dense cost does not depend on the
        tree's shape, so ``t`` rows are a chain:

        - ``graph_s``: ``ModelRunner.tree_forward`` (embedding ... LM head, with the strategy's
          attention and the KV-tail write) captured in a CUDA graph, per replay; the strategies
          of one (context, t) are timed together, their replays interleaved
          (``kernels.timing.bench_graphs``), on the same tokens;
        - ``eager_s``: the same forward launched from Python;
        - ``ops_sum_s``: every op of the forward timed alone in its own graph (the model's own
          modules, rotating over the layers' weights and KV so each launch is cold), times its
          count per forward; ``graph_s / ops_sum_s`` is what the loop adds (target: <= 1.15);
        - ``floor_s``: (weights read + KV read) / the copy bandwidth measured in the same run
          (``kernels.timing.copy_bytes_per_s``), and ``graph_s / floor_s``; a sparse step's KV
          read is the least its attention must read (``floor_bytes``); each op's ``floor_s`` and
          ``over_floor`` likewise (``op_floors``: bytes, FLOPs or one graph-replayed launch,
          whichever is largest);
        - ``selection`` (sparse steps): the blocks the refresh layers select from the model's
          own queries in one recorded forward (``selection_stats``), and each attention op's
          time against the least read with that selection (``floor_selected_s``,
          ``over_floor_selected``); the attention ops are timed with those recorded queries;
          each attention op's ``launches`` (``engine_ops.attention_launches``): its kernel
          launches with their device times, a reuse layer's without its refresh's;
        - ``predicted_verify_s``: perfmodel's verify forward for the same point (calibrated
          profile; without the sampling and acceptance ops, which the timed forward does not
          run).
    """
    args = parse_args(argv)
    if args.campaign:
        from ssvkit.validation.scale_report import is_scale_campaign

        doc = json.loads(Path(args.campaign).read_text())
        if is_scale_campaign(doc):
            from ssvkit.validation.scale_verify import scale_main

            return scale_main(args, doc)
        from ssvkit.validation.engine_verify_campaign import campaign_main

        return campaign_main(args)
    args.gpu = args.gpu or "h100-sxm"
    contexts = sorted(parse_count_list(args.context, "--context"))
    ts = [int(x) for x in args.t.split(",")]
    strategies = _strategies(args)
    src = resolve_source(args.model)
    t_max = max(contexts) + max(ts) + 1
    torch.manual_seed(0)
    model = build_model(src, max_positions=t_max, device="cuda", dtype=torch.bfloat16)
    runner = ModelRunner(model, batch=1, t_max=t_max, backend="triton", use_graphs=False)
    runner.cache.kv.normal_()
    resumed = _resumed(args)
    ceilings = _ceilings(resumed)
    rows = [] if resumed is None else resumed["rows"]
    done = {
        (*row_key(r["strategy"], r.get("metadata", "nsa"), r), r["context"], r["t"]) for r in rows
    }
    result = {
        "benchmark": "engine_verify",
        "model": args.model,
        **ceilings,
        "provenance": provenance(),
        "rows": rows,
    }
    for context in contexts:
        runner.cache.set_lens(torch.tensor([context], dtype=torch.int32))
        attns = [(s, AttentionConfig.from_strategy(s)) for s in strategies]
        for _, attn in attns:  # every summary before any capture: graphs read them by address
            runner.prepare(attn)
        for t in ts:
            todo = [
                (s, attn)
                for s, attn in attns
                if (*row_key(s.name, s.metadata, {"attention": asdict(attn)}), context, t)
                not in done
            ]
            if not todo:
                continue
            step = _step_inputs(runner.model, t)
            graph_s = _graph_times(runner, todo, step)
            for (strategy, attn), g in zip(todo, graph_s, strict=True):
                row = _verify_row(runner, strategy, attn, args, context, step, g, ceilings)
                rows.append(row)
                _write(result, args.out)  # each finished row survives an interrupted run
    _write(result, args.out)
    return result


def _strategies(args) -> list[Strategy]:
    """The strategies of ``--strategy`` under the options that replace their own metadata,
    grouping, NSA tile plan and refresh cadence (one strategy per cadence)."""
    strategies = [
        with_grouping(with_metadata(Strategy.from_name(n.strip()), args.metadata), args.grouping)
        for n in args.strategy.split(",")
    ]
    if args.nsa_tile_plan is not None:
        strategies = [
            dataclasses.replace(s, nsa_tile_plan=args.nsa_tile_plan)
            if s.is_sparse and s.metadata == "nsa"
            else s
            for s in strategies
        ]
    if args.refresh_every is not None:
        strategies = list(
            dict.fromkeys(with_refresh(s, r) for s in strategies for r in args.refresh_every)
        )
    return strategies


def _ceilings(resumed: dict | None) -> dict:
    """The ceilings every row's floors use: measured once per document, or the resumed
    document's."""
    keys = ("copy_bytes_per_s", "gemm_flops_per_s", "graph_launch_s")
    if resumed is not None:
        return {k: resumed[k] for k in keys}
    return {
        "copy_bytes_per_s": copy_bytes_per_s(),
        "gemm_flops_per_s": gemm_flops_per_s(),
        "graph_launch_s": empty_kernel_s("graph"),
    }


def _step_inputs(model, t: int) -> tuple[DraftTree, torch.Tensor]:
    """The verify step's tree and tokens at ``t`` rows: a chain (dense cost does not depend on
    the tree's shape), the same tokens for every strategy of the row set."""
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    return tree, torch.randint(0, model.config.vocab_size, (1, t), device="cuda")


def _graph_times(runner, todo: list, step: tuple) -> list[float]:
    """Each strategy's verify step per CUDA-graph replay, their samples interleaved
    (``kernels.timing.bench_graphs``): the strategies of one (context, t) are compared under
    the same GPU clock."""
    tree, tokens = step
    for _, attn in todo:
        attn.check_tree(tokens.shape[1], runner.model.config.gqa_group)

    def forward(attn):
        return lambda i: runner.tree_forward(tokens, tree, attn)[0]

    with torch.no_grad():
        timings = bench_graphs([forward(attn) for _, attn in todo], config=STEP_TIMING)
    return [tm.median_s for tm in timings]


def _verify_row(runner, strategy, attn, args, context: int, step, graph_s, ceilings) -> dict:
    """One (strategy, context, t) row: its graph time (``_graph_times``), eager and op-sum
    times against the floor, and each op's time against its own floor (``op_floors``)."""
    copy_bps = ceilings["copy_bytes_per_s"]
    model = runner.model
    tree, tokens = step
    t = tokens.shape[1]

    def run(i):
        return runner.tree_forward(tokens, tree, attn)[0]

    with torch.no_grad():
        eager_s = bench(run, "launch", config=STEP_TIMING).median_s
        queries = runner.tree_forward(tokens, tree, attn, record=True)[2]
        selection = selection_stats(runner, attn, tree, queries)
        ops = time_ops(runner, attn, tree, tokens, queries)
        for name, launches in attention_launches(runner, attn, tree, tokens, queries).items():
            ops[name]["launches"] = launches
    ops_sum = sum(o["median_s"] * o["count"] for o in ops.values())
    w_bytes, kv_bytes = floor_bytes(model, runner.cache, t, attn)
    chained = model.chains_norms(tokens.numel(), runner.device)
    for name, floor in op_floors(model, t, kv_bytes, ceilings, chained).items():
        if name in ops:
            ops[name]["floor_s"] = floor
            ops[name]["over_floor"] = ops[name]["median_s"] / floor
    if selection is not None:
        layer_floor = selection["layer_bytes"] / copy_bps
        for name in ("attention", "attention_reuse"):
            if name in ops:
                ops[name]["floor_selected_s"] = layer_floor
                ops[name]["over_floor_selected"] = ops[name]["median_s"] / layer_floor
    floor_s = (w_bytes + kv_bytes) / copy_bps
    elementwise = elementwise_of_backend(runner.backend)
    pred_s, pred_prov = predicted_verify_s(strategy, args.model, context, t, args.gpu, elementwise)
    row = {
        "strategy": strategy.name,
        "metadata": strategy.metadata,
        "attention": dataclasses.asdict(attn),
        **run_schedule(strategy),
        "t": t,
        "context": context,
        "graph_s": graph_s,
        "eager_s": eager_s,
        "ops_sum_s": ops_sum,
        "graph_over_ops_sum": graph_s / ops_sum,
        "weights_bytes": w_bytes,
        "kv_bytes": kv_bytes,
        "floor_s": floor_s,
        "graph_over_floor": graph_s / floor_s,
        "achieved_bytes_per_s": (w_bytes + kv_bytes) / graph_s,
        "predicted_verify_s": pred_s,
        "prediction_provenance": pred_prov,
        "selection": selection,
        "ops": ops,
    }
    print("\n".join(row_lines(row)), flush=True)
    return row


if __name__ == "__main__":
    main()
