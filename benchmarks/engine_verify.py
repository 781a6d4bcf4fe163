"""The engine's verify step on the GPU: one CUDA-graph replay vs the sum of its ops timed in
isolation, and vs the byte floor.

    python benchmarks/engine_verify.py                       # random:llama-3.1-8b, T = 32K
    python benchmarks/engine_verify.py --t 1,5,16 --out docs/notes/engine-verify-h100.json
    python benchmarks/engine_verify.py --strategy sd_dense,sd_sparse_naive,ssv \
        --context 32K,64K,128K --t 1,16 --gpu h200 --out docs/validation/engine-verify-h200.json

For each ``t`` (verify rows: the root plus ``t - 1`` chain drafts; dense cost does not depend on
the tree's shape) it measures, with ``kernels.timing`` (CUDA events, cold L2, median):

- ``graph_s``: ``ModelRunner.tree_forward`` (embedding ... LM head, with the strategy's attention
  and the KV-tail write) captured in a CUDA graph, per replay;
- ``eager_s``: the same forward launched from Python;
- ``ops_sum_s``: every op of the forward timed alone in its own graph (the model's own modules,
  rotating over the layers' weights and KV so each launch is cold), times its count per forward;
  ``graph_s / ops_sum_s`` is what the loop adds (target: <= 1.15);
- ``floor_s``: (weights read + KV read) / the copy bandwidth measured in the same run
  (``kernels.timing.copy_bytes_per_s``), and ``graph_s / floor_s``; a sparse step's KV read is
  the least its attention must read (``floor_bytes``); each op's ``floor_s`` and ``over_floor``
  likewise (``op_floors``: bytes, FLOPs or one graph-replayed launch, whichever is largest);
- ``selection`` (sparse steps): the blocks the refresh layers select from the model's own
  queries in one recorded forward (``selection_stats``), and each attention op's time against
  the least read with that selection (``floor_selected_s``, ``over_floor_selected``); the
  attention ops are timed with those recorded queries;
- ``predicted_verify_s``: perfmodel's verify step for the same point (calibrated profile).

The KV cache holds random values at ``lens = T`` (no prefill needed for timing). Writes one JSON
document (rows + provenance) to ``--out`` when given, and prints a table.

``--campaign FILE`` (a ``benchmarks/validation_campaign.py`` document) measures instead the
verify forward of every (baseline, context) of that campaign with its own tree, attention and
model (the tiny pair: a corpus prompt is prefilled, so sparse selections see real keys): the
graph replayed back to back is the GPU time of the verify step alone, to hold beside the
campaign's CUDA-event ``verify`` step of the decode loop. ``--ops`` adds the op breakdown there.

    python benchmarks/engine_verify.py --campaign docs/validation/campaign.json --ops \
        --out docs/notes/validation-h100/verify-breakdown.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from pathlib import Path

import torch

from engine.attention import AttentionConfig, TreeAttention
from engine.checkpoint import build_model, resolve_source
from engine.runner import ModelRunner
from engine.tree import DraftTree
from kernels.layer_ops import add_rms_norm, rms_norm, silu_mul
from kernels.timing import (
    TimingConfig,
    bench,
    copy_bytes_per_s,
    empty_kernel_s,
    gemm_flops_per_s,
    provenance,
)
from perfmodel.calibrated import make_predictor
from perfmodel.hardware import get_gpu
from perfmodel.models import get_model
from perfmodel.step import build_columns, predict_columns
from perfmodel.strategy import Strategy, Workload

STEP_TIMING = TimingConfig(warmup=2, graph_launches=5, graph_reps=10, reps=10, max_total_s=2.0)
OP_TIMING = TimingConfig(warmup=3, graph_launches=32, graph_reps=10, max_total_s=1.0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:llama-3.1-8b")
    p.add_argument(
        "--context", default="32K", help="committed tokens T (K = 1024), comma-separated"
    )
    p.add_argument("--t", default="1,5,16", help="verify rows, comma-separated")
    p.add_argument(
        "--strategy", default="sd_dense", help="baselines whose attention is used, comma-separated"
    )
    p.add_argument("--gpu", default="h100-sxm", help="GPU registry key of the prediction")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--campaign", default=None, help="time the verify steps of this campaign")
    p.add_argument("--ops", action="store_true", help="with --campaign: the op breakdown too")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out (same code commit) and measure only the others",
    )
    return p.parse_args(argv)


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


def _int(text: str) -> int:
    t = text.strip().upper()
    return int(float(t[:-1]) * 1024) if t.endswith("K") else int(t)


def layer_ops(
    runner: ModelRunner,
    attn: AttentionConfig,
    tree: DraftTree,
    tokens: torch.Tensor,
    queries: list[torch.Tensor] | None = None,
):
    """``name -> (fn(i), count per forward)`` for every op of one tree forward on the Triton
    backend (``engine.model``'s fused path); ``fn(i)`` uses layer ``i % L``'s weights and cache.
    The attention ops take each layer's recorded ``queries`` (the step's own selections) when
    given, else random queries.

    Norms: ``embed_norm`` is the first layer's input norm; each later one is ``input_norm``, the
    MLP's residual add fused with it, as ``final_norm`` is with the final norm; ``post_norm`` is
    the attention's residual add fused with the post-attention norm. ``rope_kv_write`` is the q/k
    rotary (rope tables gathered inside) with the KV-tail store."""
    model, cache = runner.model, runner.cache
    layers = model.model.layers
    num_l = len(layers)
    cfg = model.config
    b, t = tokens.shape
    d, h, hkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dev, dtype = runner.device, next(model.parameters()).dtype
    tt = runner.tree_tensors(tree)
    positions = cache.lens.long()[:, None] + tt.depth
    sink = cache.tail_writer(t)
    x = torch.randn(b, t, d, device=dev, dtype=dtype)
    q = torch.randn(b, t, h, dh, device=dev, dtype=dtype)
    qkv = torch.randn(b, t, (h + 2 * hkv) * dh, device=dev, dtype=dtype)
    inter = torch.randn(b, t, 2 * cfg.intermediate_size, device=dev, dtype=dtype)
    act = torch.randn(b, t, cfg.intermediate_size, device=dev, dtype=dtype)
    attn_o = torch.randn(b, t, h * dh, device=dev, dtype=dtype)
    head = model.lm_head.weight if model.lm_head is not None else model.model.embed_tokens.weight

    reuse = [layer for layer in range(num_l) if not attn.is_refresh(layer)]
    refresh = [layer for layer in range(num_l) if attn.is_refresh(layer)]

    def q_of(layer):
        return q if queries is None else queries[layer]

    def attend(i):  # a refresh layer (a fresh state always refreshes)
        layer = refresh[i % len(refresh)] if attn.kind != "dense" else i % num_l
        a = TreeAttention(attn, cache, tt, positions, backend=runner.backend)
        return a(layer, q_of(layer))

    def attend_reuse(i):
        layer = reuse[i % len(reuse)]
        source = layer - layer % attn.refresh_every  # the refresh whose indices it takes
        a = TreeAttention(attn, cache, tt, positions, backend=runner.backend)
        a(source, q_of(source))
        return a(layer, q_of(layer))

    def rope(i):
        sa = layers[i % num_l].self_attn
        return sa.rope_store(qkv, positions, model.rope_cos, model.rope_sin, sink.target(i % num_l))

    def norm(i, which):
        n = getattr(layers[i % num_l], which)
        return add_rms_norm(x, x, n.weight, n.eps)

    refresh_layers = num_l if attn.kind == "dense" else math.ceil(num_l / attn.refresh_every)
    first, final = layers[0].input_layernorm, model.model.norm
    ops = {
        "embed": (lambda i: model.model.embed_tokens(tokens), 1),
        "embed_norm": (lambda i: rms_norm(x, first.weight, first.eps), 1),
        "qkv_proj": (lambda i: layers[i % num_l].self_attn.qkv_proj(x), num_l),
        "rope_kv_write": (rope, num_l),
        "attention": (attend, refresh_layers),
        "o_proj": (lambda i: layers[i % num_l].self_attn.o_proj(attn_o), num_l),
        "post_norm": (lambda i: norm(i, "post_attention_layernorm"), num_l),
        "gate_up_proj": (lambda i: layers[i % num_l].mlp.gate_up_proj(x), num_l),
        "silu_mul": (lambda i: silu_mul(inter), num_l),
        "down_proj": (lambda i: layers[i % num_l].mlp.down_proj(act), num_l),
        "input_norm": (lambda i: norm(i, "input_layernorm"), num_l - 1),
        "final_norm": (lambda i: add_rms_norm(x, x, final.weight, final.eps), 1),
        "lm_head": (lambda i: torch.nn.functional.linear(x, head).float(), 1),
    }
    if num_l - refresh_layers > 0:
        # The reuse op includes one refresh call; subtract it with the refresh op's time below.
        ops["attention_reuse_plus_refresh"] = (attend_reuse, num_l - refresh_layers)
    return ops


def floor_bytes(model, cache, t: int, attn: AttentionConfig | None = None) -> tuple[int, int]:
    """(weights read, KV read) in bytes by one forward: every weight except the embedding
    table (t rows of it), and every layer's KV. Dense reads K and V over ``T + t`` positions;
    NSA at least the compressed tokens, ``top_n`` selected blocks (rows that all agree), the
    window and the tail; sparse at least ``top_n`` blocks, the window and the tail."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    emb = cfg.vocab_size * cfg.hidden_size
    weights = (cfg.num_params() - (0 if cfg.tie_word_embeddings else emb)) * elem
    weights += t * cfg.hidden_size * elem
    lens = int(cache.lens.max())
    tokens = lens + t
    if attn is not None and attn.kind != "dense":
        sparse = min(attn.top_n * attn.block_size + attn.window, lens) + t
        if attn.kind == "nsa":
            sparse += max(0, (lens - attn.comp_block) // attn.comp_stride + 1)
        tokens = min(tokens, sparse)
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * tokens * cfg.head_dim * elem
    return weights, kv


def selection_stats(runner, attn: AttentionConfig, tree: DraftTree, queries) -> dict | None:
    """The blocks a sparse step's refresh layers select from the model's own ``queries`` (one
    recorded forward), per (sequence, KV head), averaged over the refresh layers: the distinct
    blocks of all rows (``unique_blocks``, the least any kernel must read) and the blocks the
    kernel streams (``streamed_blocks``: each row tile's union, or each row's own list). A
    layer's least read with them (``layer_bytes``): the compressed tokens (NSA), the distinct
    selected blocks, the window and the tail, K and V. None for dense attention."""
    if attn.kind == "dense":
        return None
    cache, cfg = runner.cache, runner.model.config
    tt = runner.tree_tensors(tree)
    positions = cache.lens.long()[:, None] + tt.depth
    unique, streamed = [], []
    for layer in range(cfg.num_layers):
        if not attn.is_refresh(layer):
            continue
        a = TreeAttention(attn, cache, tt, positions, backend=runner.backend)
        a(layer, queries[layer])
        idx = a.block_idx.long()  # [B, Hkv, t, n]
        flat = idx.flatten(2).sort(-1).values
        distinct = (flat[..., 1:] != flat[..., :-1]) & (flat[..., 1:] >= 0)
        unique.append((distinct.sum(-1) + (flat[..., 0] >= 0)).float().mean().item())
        counts = getattr(a.plan, "counts", None)
        if counts is not None:
            streamed.append(counts.sum(-1).float().mean().item())
        else:
            streamed.append((idx >= 0).sum((-1, -2)).float().mean().item())
    u, st = sum(unique) / len(unique), sum(streamed) / len(streamed)
    lens = int(cache.lens.max())
    tokens = u * attn.block_size + min(attn.window, lens) + tree.num_nodes
    if attn.kind == "nsa":
        tokens += max(0, (lens - attn.comp_block) // attn.comp_stride + 1)
    elem = next(runner.model.parameters()).element_size()
    batch = cache.lens.shape[0]
    layer_bytes = 2 * batch * cfg.num_kv_heads * tokens * cfg.head_dim * elem
    return {
        "unique_blocks": u,
        "streamed_blocks": st,
        "top_n": attn.top_n,
        "layer_bytes": int(layer_bytes),
    }


def op_floors(model, t: int, kv_bytes: int, ceilings: dict) -> dict[str, float]:
    """Each op's floor in seconds: max(bytes / copy rate, FLOPs / GEMM rate, one graph-replayed
    launch), with the ceilings measured in the same run. Bytes: a projection reads its weight
    and its ``t`` input rows and writes its output rows; attention at least a layer's share of
    the step's least KV read (``floor_bytes``); an element-wise op reads and writes its rows."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    d, inter, dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * dh
    q_out = cfg.num_heads * dh
    gemms = {
        "qkv_proj": (d, qkv),
        "o_proj": (q_out, d),
        "gate_up_proj": (d, 2 * inter),
        "down_proj": (inter, d),
        "lm_head": (d, cfg.vocab_size),
    }
    flops = {k: 2 * t * n_in * n_out for k, (n_in, n_out) in gemms.items()}
    moved = {k: (n_in * n_out + t * (n_in + n_out)) * elem for k, (n_in, n_out) in gemms.items()}
    rows = t * elem
    moved |= {
        "embed": 2 * d * rows,
        "embed_norm": 2 * d * rows + d * elem,
        "input_norm": 4 * d * rows + d * elem,
        "post_norm": 4 * d * rows + d * elem,
        "final_norm": 4 * d * rows + d * elem,
        "rope_kv_write": 2 * qkv * rows,
        "silu_mul": 3 * inter * rows,
        "attention": kv_bytes // cfg.num_layers,
        "attention_reuse": kv_bytes // cfg.num_layers,
    }
    return {
        k: max(
            b / ceilings["copy_bytes_per_s"],
            flops.get(k, 0) / ceilings["gemm_flops_per_s"],
            ceilings["graph_launch_s"],
        )
        for k, b in moved.items()
    }


def predicted_verify_s(strategy: Strategy, model_name: str, context: int, t: int, gpu: str):
    try:
        spec = get_model(
            model_name.split(":", 1)[1] if model_name.startswith("random:") else model_name
        )
        s = dataclasses.replace(strategy, tree=f"chain:{t - 1}")
        cols = build_columns(spec, [(s, Workload(context_len=context))])
        pred = predict_columns(spec, cols, make_predictor(get_gpu(gpu)), s.drafter)
        return float(pred.verify_s[0]), pred.provenance
    except ValueError as e:
        return None, str(e).splitlines()[0]


def _write(result: dict, path: str | None) -> None:
    if path:
        out = Path(path)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, out)


def _time_ops(runner, attn, tree, tokens, queries=None) -> dict:
    ops = {}
    for name, (fn, count) in layer_ops(runner, attn, tree, tokens, queries).items():
        tm = bench(fn, "graph", num_inputs=runner.config.num_layers, config=OP_TIMING)
        ops[name] = {"median_s": tm.median_s, "count": count}
    if "attention_reuse_plus_refresh" in ops:
        reuse = ops.pop("attention_reuse_plus_refresh")
        ops["attention_reuse"] = {
            "median_s": max(reuse["median_s"] - ops["attention"]["median_s"], 0.0),
            "count": reuse["count"],
        }
    return ops


def campaign_main(args) -> dict:
    """Verify-step GPU time of every (baseline, context) of a campaign document."""
    from calibration.report import _strategy, local_model
    from engine.corpus import corpus_sample

    doc = json.loads(Path(args.campaign).read_text())
    points: dict[tuple[str, int], dict] = {}
    for r in doc["rows"]:
        key = (r["baseline"], r["context_len"])
        pt = points.setdefault(key, {"strategy": r["strategy"], "verify_s": []})
        pt["verify_s"].append(r["measured"]["steps_s"]["verify"])
    contexts = sorted({c for _, c in points})
    t_max = max(contexts) + 128
    torch.manual_seed(0)
    src = resolve_source(local_model(doc["model"]))
    model = build_model(src, max_positions=t_max, device="cuda", dtype=torch.bfloat16)
    runner = ModelRunner(model, batch=1, t_max=t_max, backend="triton", use_graphs=False)
    rows = []
    for ctx in contexts:
        with torch.no_grad():
            runner.prefill([corpus_sample(ctx)])
        for (name, c), pt in sorted(points.items()):
            if c != ctx:
                continue
            s = _strategy(pt["strategy"])
            attn = AttentionConfig.from_strategy(s)
            tree = DraftTree.from_spec(s.tree, s.traversal)
            runner.prepare(attn)
            with torch.no_grad():
                if attn.kind != "dense":  # summaries of the prefilled keys
                    runner.cache.rebuild_summaries()
                tokens = torch.randint(
                    0, model.config.vocab_size, (1, tree.num_nodes), device="cuda"
                )

                def step(i, tree=tree, tokens=tokens, attn=attn):
                    return runner.tree_forward(tokens, tree, attn)[0]

                graph_s = bench(step, "graph", config=STEP_TIMING).median_s
                ops = _time_ops(runner, attn, tree, tokens) if args.ops else None
            row = {
                "baseline": name,
                "context_len": ctx,
                "t": tree.num_nodes,
                "describe": describe_strategy(s),
                "graph_s": graph_s,
                "campaign_verify_s": float(sorted(pt["verify_s"])[len(pt["verify_s"]) // 2]),
                "ops": ops,
            }
            rows.append(row)
            ops_sum = sum(o["median_s"] * o["count"] for o in ops.values()) if ops else None
            print(
                f"{name:16s} {ctx:6d} t={tree.num_nodes:3d}  graph {graph_s * 1e3:7.3f} ms  "
                f"campaign verify {row['campaign_verify_s'] * 1e3:7.3f} ms"
                + (f"  ops sum {ops_sum * 1e3:7.3f} ms" if ops else ""),
                flush=True,
            )
    result = {
        "benchmark": "engine_verify_campaign",
        "campaign": args.campaign,
        "campaign_commit": doc["provenance"].get("git_commit"),
        "model": doc["model"],
        "provenance": provenance(),
        "rows": rows,
    }
    _write(result, args.out)
    return result


def describe_strategy(s: Strategy) -> str:
    from planner.space import describe

    return describe(s)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.campaign:
        return campaign_main(args)
    contexts = sorted(_int(c) for c in args.context.split(","))
    ts = [int(x) for x in args.t.split(",")]
    strategies = [Strategy.from_name(name.strip()) for name in args.strategy.split(",")]
    src = resolve_source(args.model)
    t_max = max(contexts) + max(ts) + 1
    torch.manual_seed(0)
    model = build_model(src, max_positions=t_max, device="cuda", dtype=torch.bfloat16)
    runner = ModelRunner(model, batch=1, t_max=t_max, backend="triton", use_graphs=False)
    runner.cache.kv.normal_()
    resumed = _resumed(args)
    if resumed is None:  # the ceilings every row's floors use, measured once per document
        ceilings = {
            "copy_bytes_per_s": copy_bytes_per_s(),
            "gemm_flops_per_s": gemm_flops_per_s(),
            "graph_launch_s": empty_kernel_s("graph"),
        }
    else:
        ceilings = {
            k: resumed[k] for k in ("copy_bytes_per_s", "gemm_flops_per_s", "graph_launch_s")
        }
    rows = [] if resumed is None else resumed["rows"]
    done = {(r["strategy"], r["context"], r["t"]) for r in rows}
    result = {
        "benchmark": "engine_verify",
        "model": args.model,
        **ceilings,
        "provenance": provenance(),
        "rows": rows,
    }
    for context in contexts:
        runner.cache.set_lens(torch.tensor([context], dtype=torch.int32))
        for strategy in strategies:
            attn = AttentionConfig.from_strategy(strategy)
            runner.prepare(attn)
            for t in ts:
                if (strategy.name, context, t) in done:
                    continue
                rows.append(_verify_row(runner, strategy, attn, args, context, t, ceilings))
                _write(result, args.out)  # each finished row survives an interrupted run
    _write(result, args.out)
    return result


def _verify_row(runner, strategy, attn, args, context: int, t: int, ceilings: dict) -> dict:
    """One (strategy, context, t) row: graph, eager and op-sum times against the floor, and
    each op's time against its own floor (``op_floors``)."""
    copy_bps = ceilings["copy_bytes_per_s"]
    model = runner.model
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    attn.check_tree(t, model.config.gqa_group)
    tokens = torch.randint(0, model.config.vocab_size, (1, t), device="cuda")

    def step(i):
        return runner.tree_forward(tokens, tree, attn)[0]

    with torch.no_grad():
        graph_s = bench(step, "graph", config=STEP_TIMING).median_s
        eager_s = bench(step, "launch", config=STEP_TIMING).median_s
        queries = runner.tree_forward(tokens, tree, attn, record=True)[2]
        selection = selection_stats(runner, attn, tree, queries)
        ops = _time_ops(runner, attn, tree, tokens, queries)
    ops_sum = sum(o["median_s"] * o["count"] for o in ops.values())
    w_bytes, kv_bytes = floor_bytes(model, runner.cache, t, attn)
    for name, floor in op_floors(model, t, kv_bytes, ceilings).items():
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
    pred_s, pred_prov = predicted_verify_s(strategy, args.model, context, t, args.gpu)
    row = {
        "strategy": strategy.name,
        "attention": dataclasses.asdict(attn),
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
    print(
        f"{strategy.name:16s} T={context:7d} t={t:3d}  graph {graph_s * 1e3:7.3f} ms  "
        f"eager {eager_s * 1e3:7.3f} ms  ops sum {ops_sum * 1e3:7.3f} ms "
        f"(graph/sum {row['graph_over_ops_sum']:.3f})  floor {floor_s * 1e3:6.3f} ms "
        f"(graph/floor {row['graph_over_floor']:.2f}, "
        f"{row['achieved_bytes_per_s'] / 1e12:.2f} TB/s)  predicted "
        + (f"{pred_s * 1e3:.3f} ms" if pred_s else pred_prov),
        flush=True,
    )
    print(
        "    op / floor: "
        + ", ".join(f"{k} {o['over_floor']:.2f}" for k, o in ops.items() if "over_floor" in o),
        flush=True,
    )
    if selection is not None:
        print(
            f"    selection: {selection['unique_blocks']:.0f} distinct / "
            f"{selection['streamed_blocks']:.0f} streamed blocks per (sequence, KV head) "
            f"(top_n {selection['top_n']}); attention / floor with them: "
            + ", ".join(
                f"{k} {o['over_floor_selected']:.2f}"
                for k, o in ops.items()
                if "over_floor_selected" in o
            ),
            flush=True,
        )
    return row


if __name__ == "__main__":
    main()
