"""The draft model's share of a round on the GPU, graph by graph and op by op, beside perfmodel's
draft ops for the same point.

    python -m ssvkit.validation.draft_step --batch 32 --contexts 15360,30720 \\
        --trees chain:2,chain:4,best:8:4,best:16:6 --gpu h200 \\
        --out build/draft-step.json --resume build/draft-step.jsonl [--stop-after 480]

A draft model's round (``engine.draft_model.ModelDrafter``) is three CUDA graphs: the catch-up
(a one-node forward of the kept leaf its last round never ran, and its commit), the expansion
(one forward of the draft model per tree level over the root and the nodes drafted so far, each
followed by its children's draw) and the commit of the accepted path's draft KV.
``measure_case`` times each graph and each level's forward, alone and op by op, per (context,
tree), beside the step model's draft ops (``predicted``). ``--device cpu`` runs it on the
torch backend timed by the wall clock (the tests).
"""

from __future__ import annotations

import json
import time

import torch
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.draft_model import ModelDrafter
from ssvkit.engine.drafter import LevelPlan
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload
from ssvkit.validation.bench import RunCache
from ssvkit.validation.engine_ops import time_ops
from ssvkit.validation.engine_verify import STEP_TIMING, device_setup
from ssvkit.validation.records import local_model

DENSE = AttentionConfig(kind="dense")


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="engine/checkpoints/tiny-target", help="target model")
    p.add_argument("--draft-model", default="engine/checkpoints/tiny-draft", help="draft model")
    p.add_argument("--batch", type=int, default=32, help="sequences decoded together")
    p.add_argument("--contexts", default="15360,30720", help="tokens in each sequence's cache")
    p.add_argument("--trees", default="chain:2,chain:4,best:8:4,best:16:6", help="tree specs")
    p.add_argument("--acceptance", type=float, default=0.7, help="alpha best:N trees take")
    p.add_argument("--temperature", type=float, default=1.0, help="the draws' temperature")
    p.add_argument("--gpu", default="h200", help="GPU registry key of the prediction")
    p.add_argument("--device", default="cuda", help="cuda | cpu")
    p.add_argument("--out", default=None, help="write the JSON document here")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    p.add_argument("--stop-after", type=float, default=None, metavar="S")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.exit(2, f"draft_step: --batch must be >= 1, got {args.batch}\n")
    if not 0 < args.acceptance < 1:
        p.exit(2, f"draft_step: --acceptance must lie in (0, 1), got {args.acceptance}\n")
    try:
        args.contexts = sorted(parse_count_list(args.contexts, "--contexts"))
        args.trees = [x.strip() for x in args.trees.split(",")]
        for spec in args.trees:  # each a tree the engine can draft
            DraftTree.from_spec(spec, "bfs", args.acceptance)
    except ValueError as e:
        p.exit(2, f"draft_step: {e}\n")
    return args


def predicted(args, ctx: int, tree: DraftTree) -> dict:
    """The step model's draft ops of one round at (``ctx``, ``tree``, ``args.batch``): the level
    forwards' and the catch-up's seconds, and the catch-up's probability a round."""
    target = get_model(str(resolve_source(local_model(args.model)).path))
    draft = str(resolve_source(local_model(args.draft_model)).path)
    parents = ",".join(str(p - 1) for p in tree.parents[1:])
    s = Strategy(
        name="draft_step",
        tree=f"parents:{parents}",
        drafter=DrafterSpec(kind="draft_model", model=draft),
        traversal="bfs",
    )
    backend = "triton" if args.device == "cuda" else "torch"
    w = Workload(
        context_len=ctx,
        batch=args.batch,
        acceptance=args.acceptance,
        elementwise=elementwise_of_backend(backend),
    )
    cols = build_columns(target, [(s, w)])
    pred = predict_columns(
        target, cols, make_predictor(get_gpu(args.gpu), "bf16", cols.tp), s.drafter
    )
    ops = {k: float(v[0]) for k, v in pred.op_seconds.items() if k.startswith("draft.")}
    catch = sum(v for k, v in ops.items() if k.startswith("draft.model.catch_up."))
    prob = float(1.0 - (1.0 - cols.full_depth[0]) ** args.batch)
    return {
        "levels_s": sum(v for k, v in ops.items() if not k.startswith("draft.model.catch_up.")),
        "catch_up_s": catch / prob if prob > 0 else 0.0,
        "catch_up_probability": prob,
        "ops": ops,
        "provenance": pred.provenance,
    }


def measure_case(runner: ModelRunner, args, ctx: int, spec: str, timing: str) -> dict:
    """One (context, tree) case: each graph of the draft model's round, each level's forward
    alone and op by op, and the prediction.

    The draft model's KV cache holds random values at ``lens = ctx`` for every one of
    ``args.batch`` sequences; times are ``kernels.timing``'s in mode ``timing`` (CUDA events,
    cold L2, median; the wall clock on the CPU):

    - ``expand_s``, ``catch_up_s``, ``commit_s``: each graph replayed alone; the catch-up and
      the commit run with no sequence due (their launches and reads are the same, the cache's
      lengths stay put across replays);
    - ``levels``: each level's forward replayed alone (``level_s``) and op by op
      (``validation.engine_ops.time_ops``: ``ops_sum_s``); ``expand_s`` less the level forwards
      is the draws and the glue between levels;
    - ``predicted``: the step model's draft ops for the same tree, context and batch, grouped as
      the level forwards and the catch-up (``catch_up_s`` per forward: its ops over the
      probability the model gives a round of needing one).
    """
    from ssvkit.kernels.timing import bench

    b, dev = args.batch, runner.device
    runner.cache.set_lens(torch.full((b,), ctx, dtype=torch.int32))
    tree = DraftTree.from_spec(spec, "bfs", args.acceptance)
    drafter = ModelDrafter(runner, args.temperature)
    vocab = runner.model.config.vocab_size
    roots = torch.randint(0, vocab, (b,), device=dev)
    single = DraftTree.from_parents([-1])
    none_due = torch.zeros(b, dtype=torch.int32, device=dev)
    lp = LevelPlan.build(tree)
    depth = lp.dtree.max_depth
    _, _, v2d = drafter.expander.plan(tree)
    path = torch.zeros((b, depth + 1), dtype=torch.int64, device=dev)

    def expand(i):
        return drafter.expander.expand(roots, tree).tokens

    def catch_up(i):
        runner.tree_forward(roots[:, None], single, DENSE)
        runner.cache.commit(torch.zeros_like(roots)[:, None], none_due)

    def commit(i):
        runner.cache.commit(v2d[path[:, :depth]], torch.clamp(none_due, max=depth))

    with torch.no_grad():
        row = {
            "context": ctx,
            "tree": spec,
            "nodes": tree.num_nodes - 1,
            "depth": depth,
            "expand_s": bench(expand, timing, config=STEP_TIMING).median_s,
            "catch_up_s": bench(catch_up, timing, config=STEP_TIMING).median_s,
            "commit_s": bench(commit, timing, config=STEP_TIMING).median_s,
            "levels": [],
        }
        for level in range(depth):
            sub = lp.level_tree(level)
            tokens = torch.randint(0, vocab, (b, sub.num_nodes), device=dev)

            def forward(i, tokens=tokens, sub=sub):
                return runner.tree_forward(tokens, sub, DENSE)[0]

            ops = time_ops(runner, DENSE, sub, tokens, timing=timing)
            row["levels"].append(
                {
                    "rows": sub.num_nodes,
                    "level_s": bench(forward, timing, config=STEP_TIMING).median_s,
                    "ops_sum_s": sum(o["median_s"] * o["count"] for o in ops.values()),
                    "ops": ops,
                }
            )
    row["levels_s"] = sum(lv["level_s"] for lv in row["levels"])
    row["predicted"] = predicted(args, ctx, tree)
    return row


def print_row(row: dict) -> None:
    pr = row["predicted"]
    print(
        f"{row['context']:6d} {row['tree']:12s} expand {row['expand_s'] * 1e6:7.1f} us "
        f"(levels {row['levels_s'] * 1e6:7.1f}, predicted {pr['levels_s'] * 1e6:7.1f})  "
        f"catch-up {row['catch_up_s'] * 1e6:6.1f} us (predicted {pr['catch_up_s'] * 1e6:6.1f})  "
        f"commit {row['commit_s'] * 1e6:6.1f} us",
        flush=True,
    )


def main(argv=None) -> int:
    """Measure every (context, tree) case, a line each, and write ``--out`` when given.

    Each finished case is kept in the ``--resume`` run cache (JSONL, keyed by the settings and
    the commit); ``--stop-after S`` starts no case after S seconds (the document then says
    ``complete: false``). Exit status 0; 2 on bad input or a device that is not available.
    """
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        backend, dtype, timing = device_setup(args.device)
    except ValueError as e:
        print(f"draft_step: {e}")
        return 2
    settings = {
        k: getattr(args, k)
        for k in ("model", "draft_model", "batch", "acceptance", "temperature", "gpu", "device")
    }
    settings.update({k: v for k, v in provenance().items() if k != "timestamp"})
    cache = RunCache(args.resume, settings) if args.resume else None
    torch.manual_seed(0)
    src = resolve_source(local_model(args.draft_model))
    t_max = max(args.contexts) + 64
    model = build_model(src, max_positions=t_max, device=args.device, dtype=dtype)
    runner = ModelRunner(model, batch=args.batch, t_max=t_max, backend=backend, use_graphs=False)
    runner.cache.kv.normal_()
    rows, complete = [], True
    for ctx in args.contexts:
        for spec in args.trees:
            key = f"{ctx}|{spec}"
            if (cache is None or key not in cache.runs) and args.stop_after is not None:
                if time.perf_counter() - t0 > args.stop_after:
                    complete = False
                    continue
            run = lambda ctx=ctx, spec=spec: measure_case(runner, args, ctx, spec, timing)  # noqa: E731
            rows.append(run() if cache is None else cache.get(key, run))
            print_row(rows[-1])
    doc = {
        "benchmark": "draft_step",
        "complete": complete,
        "settings": settings,
        "contexts": args.contexts,
        "trees": args.trees,
        "provenance": provenance(),
        "rows": rows,
    }
    if args.out:
        atomic_write(args.out, json.dumps(doc, indent=1) + "\n", "--out")
    if not complete:
        print("stopped by --stop-after: run again with --resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
