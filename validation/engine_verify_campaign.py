"""``engine_verify --campaign FILE`` for an end-to-end campaign document: the verify forward of
each (baseline, context) the campaign ran, timed as one graph replay beside the campaign's
median ``verify`` step of the decode loop (``campaign_main``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.timing import bench, provenance
from ssvkit.planner.space import describe
from ssvkit.validation.engine_ops import time_ops
from ssvkit.validation.engine_verify import STEP_TIMING, _write, device_setup
from ssvkit.validation.records import file_label, local_model, measured_strategy


def _campaign_points(doc: dict) -> dict[tuple[str, int], dict]:
    """The campaign's rows by (baseline, context): the first row's run and every row's
    measured ``verify`` step."""
    points: dict[tuple[str, int], dict] = {}
    for r in doc["rows"]:
        key = (r["baseline"], r["context_len"])
        pt = points.setdefault(key, {"run": r, "verify_s": []})
        pt["verify_s"].append(r["measured"]["steps_s"]["verify"])
    return points


def _campaign_row(runner, name: str, ctx: int, pt: dict, args, timing) -> dict:
    """One (baseline, context) row of a campaign, on the runner prefilled at ``ctx``: its
    verify forward's time beside the campaign's median ``verify`` step (and its ops with
    ``--ops``), printed as one line."""
    s = measured_strategy(pt["run"])  # with the NSA schedule the campaign ran
    attn = AttentionConfig.from_strategy(s)
    tree = DraftTree.from_spec(s.tree, s.traversal)
    runner.prepare(attn)
    with torch.no_grad():
        if attn.kind != "dense":  # summaries of the prefilled keys
            runner.cache.rebuild_summaries()
        tokens = torch.randint(
            0, runner.model.config.vocab_size, (1, tree.num_nodes), device=args.device
        )

        def step(i):
            return runner.tree_forward(tokens, tree, attn)[0]

        graph_s = bench(step, timing, config=STEP_TIMING).median_s
        ops = time_ops(runner, attn, tree, tokens, timing=timing) if args.ops else None
    row = {
        "baseline": name,
        "context_len": ctx,
        "t": tree.num_nodes,
        "describe": describe(s),
        "graph_s": graph_s,
        "campaign_verify_s": float(sorted(pt["verify_s"])[len(pt["verify_s"]) // 2]),
        "ops": ops,
    }
    ops_sum = sum(o["median_s"] * o["count"] for o in ops.values()) if ops else None
    print(
        f"{name:16s} {ctx:6d} t={tree.num_nodes:3d}  graph {graph_s * 1e3:7.3f} ms  "
        f"campaign verify {row['campaign_verify_s'] * 1e3:7.3f} ms"
        + (f"  ops sum {ops_sum * 1e3:7.3f} ms" if ops else ""),
        flush=True,
    )
    return row


def campaign_main(args) -> dict:
    """Verify-step GPU time of every (baseline, context) of a campaign document.

    Each row runs the verify forward with the row's own tree, attention (with the NSA row
    schedule the campaign ran) and model, on the tiny pair with a corpus prompt prefilled, so
    sparse selections see real keys. The graph replayed back to back is the GPU time of the
    verify step alone, to hold beside the campaign's CUDA-event ``verify`` step of the decode
    loop; ``--ops`` adds the op breakdown. ``--device cpu`` runs it on the torch backend, timed
    by the wall clock (the tests).
    """

    from ssvkit.engine.corpus import corpus_sample

    doc = json.loads(Path(args.campaign).read_text())
    backend, dtype, timing = device_setup(args.device)
    points = _campaign_points(doc)
    contexts = sorted({c for _, c in points})
    t_max = max(contexts) + 128
    torch.manual_seed(0)
    src = resolve_source(local_model(doc["model"]))
    model = build_model(src, max_positions=t_max, device=args.device, dtype=dtype)
    runner = ModelRunner(model, batch=1, t_max=t_max, backend=backend, use_graphs=False)
    rows = []
    for ctx in contexts:
        with torch.no_grad():
            runner.prefill([corpus_sample(ctx)])
        for (name, c), pt in sorted(points.items()):
            if c == ctx:
                rows.append(_campaign_row(runner, name, ctx, pt, args, timing))
    result = {
        "benchmark": "engine_verify_campaign",
        "campaign": file_label(args.campaign),
        "campaign_commit": doc["provenance"].get("git_commit"),
        "model": doc["model"],
        "provenance": provenance(),
        "rows": rows,
    }
    _write(result, args.out)
    return result
