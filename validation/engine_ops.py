"""The engine's verify step op by op: every op of a decoder layer's forward as a callable the
GPU timer can replay on its own (``layer_ops``), each op's floor (``op_floors``: bytes, FLOPs
or one graph-replayed launch), the least a (sparse) step must read (``floor_bytes``), the blocks
a sparse step's refresh layers select from the model's own queries (``selection_stats``), the
kernel launches of its attention ops (``attention_launches``).
``validation.engine_verify`` times a whole step against them and perfmodel's verify forward for
the same point (``validation.decode_figures.predicted_verify_s``).
"""

from __future__ import annotations

import math

import torch
from ssvkit.engine.attention import AttentionConfig, TreeAttention
from ssvkit.engine.model import weight_ops
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.layer_ops import add_rms_norm, rms_norm, silu_mul
from ssvkit.kernels.linear import linear, linear_add_norm
from ssvkit.kernels.timing import (
    TimingConfig,
    bench,
)
from ssvkit.perfmodel.selection_ops import SELECTION_OPS
from ssvkit.perfmodel.step import ATTENTION_OPS

OP_TIMING = TimingConfig(warmup=3, graph_launches=32, graph_reps=10, max_total_s=1.0)


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
    rotary (rope tables gathered inside) with the KV-tail store. Where the forward chains its
    norms into its projections (``CausalLM.chains_norms``), ``input_norm``, ``post_norm`` and
    ``silu_mul`` are not ops: ``o_proj`` and ``down_proj`` add the residual and leave the next
    norm pending, ``qkv_proj`` and ``gate_up_proj`` (with SwiGLU) apply it, and the last layer's
    down projection is ``down_proj_last``, plain, before ``final_norm``."""
    model, cache = runner.model, runner.cache
    layers = model.model.layers
    num_l = len(layers)
    tt = runner.tree_tensors(tree)
    positions = cache.lens.long()[:, None] + tt.depth
    sink = cache.tail_writer(tokens.shape[1])
    x, q, qkv, inter, act, attn_o = _random_inputs(runner, tokens)
    head = model.lm_head.weight if model.lm_head is not None else model.model.embed_tokens.weight
    attend, attend_reuse, refresh_layers = _attention_calls(runner, attn, tt, positions, q, queries)

    def rope(i):
        sa = layers[i % num_l].self_attn
        return sa.rope_store(qkv, positions, model.rope_cos, model.rope_sin, sink.target(i % num_l))

    def norm(i, which):
        n = getattr(layers[i % num_l], which)
        return add_rms_norm(x, x, n.weight, n.eps)

    first, final = layers[0].input_layernorm, model.model.norm
    lin, head_op, embed_op = weight_ops(runner.backend)  # as the forward applies its weights
    ops = {
        "embed": (lambda i: embed_op(tokens, model.model.embed_tokens.weight), 1),
        "embed_norm": (lambda i: rms_norm(x, first.weight, first.eps), 1),
        "qkv_proj": (lambda i: lin(layers[i % num_l].self_attn.qkv_proj, x), num_l),
        "rope_kv_write": (rope, num_l),
        "attention": (attend, refresh_layers),
        "o_proj": (lambda i: lin(layers[i % num_l].self_attn.o_proj, attn_o), num_l),
        "post_norm": (lambda i: norm(i, "post_attention_layernorm"), num_l),
        "gate_up_proj": (lambda i: lin(layers[i % num_l].mlp.gate_up_proj, x), num_l),
        "silu_mul": (lambda i: silu_mul(inter), num_l),
        "down_proj": (lambda i: lin(layers[i % num_l].mlp.down_proj, act), num_l),
        "input_norm": (lambda i: norm(i, "input_layernorm"), num_l - 1),
        "final_norm": (lambda i: add_rms_norm(x, x, final.weight, final.eps), 1),
        "lm_head": (lambda i: head_op(x, head).float(), 1),
    }
    if model.chains_norms(tokens.numel(), runner.device):
        _chain_ops(ops, layers, x, attn_o, act)
    if num_l - refresh_layers > 0:
        # The reuse op includes one refresh call; subtract it with the refresh op's time below.
        ops["attention_reuse_plus_refresh"] = (attend_reuse, num_l - refresh_layers)
    return ops


def _chain_ops(ops: dict, layers, x: torch.Tensor, attn_o: torch.Tensor, act: torch.Tensor):
    """``ops``' projections and norms replaced by those of a forward that chains its norms into
    its projections (``engine.model.CausalLM._chained_layers``)."""
    num_l = len(layers)
    first = layers[0].input_layernorm
    o_proj = layers[0].self_attn.o_proj
    _, g, pending = linear_add_norm(attn_o, o_proj.weight, x, first.weight, first.eps)

    def proj(i, which):
        layer = layers[i % num_l]
        owner = layer.self_attn if which in ("qkv_proj", "o_proj") else layer.mlp
        return getattr(owner, which)

    def add_norm(i, which, norm):
        p = proj(i, which)
        n = layers[(i + 1) % num_l].input_layernorm if norm is None else norm(i)
        inp = attn_o if which == "o_proj" else act
        return linear_add_norm(inp, p.weight, x, n.weight, n.eps, p.bias)

    post = lambda i: layers[i % num_l].post_attention_layernorm  # noqa: E731
    for name in ("post_norm", "silu_mul", "input_norm"):
        del ops[name]
    ops |= {
        "qkv_proj": (lambda i: linear(g, proj(i, "qkv_proj").weight, pending=pending), num_l),
        "o_proj": (lambda i: add_norm(i, "o_proj", post), num_l),
        "gate_up_proj": (
            lambda i: linear(g, proj(i, "gate_up_proj").weight, pending=pending, swiglu=True),
            num_l,
        ),
        "down_proj": (lambda i: add_norm(i, "down_proj", None), num_l - 1),
        "down_proj_last": (lambda i: linear(act, proj(i, "down_proj").weight), 1),
    }


def _random_inputs(runner: ModelRunner, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Random inputs of one forward's shapes in the model's dtype: the hidden states, the
    queries, the q/k/v projection's output, the gate/up projection's output, the MLP's
    activation and the attention's output."""
    model = runner.model
    cfg = model.config
    b, t = tokens.shape
    d, h, hkv, dh = cfg.hidden_size, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
    dev, dtype = runner.device, next(model.parameters()).dtype
    x = torch.randn(b, t, d, device=dev, dtype=dtype)
    q = torch.randn(b, t, h, dh, device=dev, dtype=dtype)
    qkv = torch.randn(b, t, (h + 2 * hkv) * dh, device=dev, dtype=dtype)
    inter = torch.randn(b, t, 2 * cfg.intermediate_size, device=dev, dtype=dtype)
    act = torch.randn(b, t, cfg.intermediate_size, device=dev, dtype=dtype)
    attn_o = torch.randn(b, t, h * dh, device=dev, dtype=dtype)
    return x, q, qkv, inter, act, attn_o


def _attention_calls(runner: ModelRunner, attn: AttentionConfig, tt, positions, q, queries):
    """``fn(i)`` of a refresh layer's attention and of a reuse layer's (with the refresh call
    whose block indices it takes), and the number of refresh layers of one forward. A call
    takes its layer's recorded ``queries`` when given, else the random ``q``."""
    num_l = len(runner.model.model.layers)
    reuse = [layer for layer in range(num_l) if not attn.is_refresh(layer)]
    refresh = [layer for layer in range(num_l) if attn.is_refresh(layer)]

    def q_of(layer):
        return q if queries is None else queries[layer]

    # One attention state for every call, as a forward has: its NSA gates are filled once (a
    # forward's first layer does it), not in each timed call; no block indices is a refresh.
    state = TreeAttention(attn, runner.cache, tt, positions, backend=runner.backend)

    def attend(i):  # a refresh layer
        layer = refresh[i % len(refresh)] if attn.kind != "dense" else i % num_l
        state.block_idx = None
        return state(layer, q_of(layer))

    def attend_reuse(i):
        layer = reuse[i % len(reuse)]
        source = layer - layer % attn.refresh_every  # the refresh whose indices it takes
        state.block_idx = None
        state(source, q_of(source))
        return state(layer, q_of(layer))

    refresh_layers = num_l if attn.kind == "dense" else math.ceil(num_l / attn.refresh_every)
    return attend, attend_reuse, refresh_layers


# Profiled calls of each attention op (``attention_launches``): the median of each launch's.
LAUNCH_CALLS = 9


def attention_launches(
    runner: ModelRunner,
    attn: AttentionConfig,
    tree: DraftTree,
    tokens: torch.Tensor,
    queries: list[torch.Tensor] | None = None,
    calls: int = LAUNCH_CALLS,
) -> dict[str, list[dict]]:
    """Each kernel launch of a sparse step's attention ops (``validation.launch_times``): a
    refresh layer's call (``attention``, two layers' queries in turn) and a reuse layer's call
    alone (``attention_reuse``, the block indices of its refresh computed once before), each
    launch with its median device time; empty for a dense step. Needs a CUDA GPU."""
    from ssvkit.validation.launch_times import launch_times

    if attn.kind == "dense":
        return {}
    tt = runner.tree_tensors(tree)
    positions = runner.cache.lens.long()[:, None] + tt.depth
    q = _random_inputs(runner, tokens)[1]
    attend, _, _ = _attention_calls(runner, attn, tt, positions, q, queries)
    out = {"attention": launch_times(attend, calls)}
    num_l = len(runner.model.model.layers)
    reuse = [layer for layer in range(num_l) if not attn.is_refresh(layer)]
    if reuse:
        layer = reuse[0]
        source = layer - layer % attn.refresh_every
        state = TreeAttention(attn, runner.cache, tt, positions, backend=runner.backend)
        state(source, q if queries is None else queries[source])
        q_layer = q if queries is None else queries[layer]
        out["attention_reuse"] = launch_times(lambda i: state(layer, q_layer), calls)
    return out


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
    layer's least read with them (``layer_bytes``): the distinct selected blocks (block-sparse
    attention's lists hold its sink and window blocks), NSA's window and compressed tokens,
    and the tail, K and V. None for dense attention."""
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
    tokens = u * attn.block_size + tree.num_nodes
    if attn.kind == "nsa":
        # NSA's picks leave out its window and compressed tokens, which its branches read.
        tokens += min(attn.window, lens) + max(0, (lens - attn.comp_block) // attn.comp_stride + 1)
    elem = next(runner.model.parameters()).element_size()
    batch = cache.lens.shape[0]
    layer_bytes = 2 * batch * cfg.num_kv_heads * tokens * cfg.head_dim * elem
    return {
        "unique_blocks": u,
        "streamed_blocks": st,
        "top_n": attn.top_n,
        "layer_bytes": int(layer_bytes),
    }


def op_floors(
    model, t: int, kv_bytes: int, ceilings: dict, chained: bool = False
) -> dict[str, float]:
    """Each op's floor in seconds: max(bytes / copy rate, FLOPs / GEMM rate, one graph-replayed
    launch), with the ceilings measured in the same run. Bytes: a projection reads its weight
    and its ``t`` input rows and writes its output rows; attention at least a layer's share of
    the step's least KV read (``floor_bytes``); an element-wise op reads and writes its rows.
    ``chained`` (``layer_ops``' chained forward): ``o_proj`` and ``down_proj`` also read the
    residual and write the sum's product by the norm's weight, ``gate_up_proj`` writes
    ``silu(gate) * up``, and ``down_proj_last`` is a plain down projection."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    d, inter, dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_q_heads + 2 * cfg.num_kv_heads) * dh
    q_out = cfg.num_q_heads * dh
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
    if chained:
        moved["down_proj_last"] = moved["down_proj"]
        flops["down_proj_last"] = flops["down_proj"]
        for name in ("o_proj", "down_proj"):
            moved[name] += 2 * d * rows
        moved["gate_up_proj"] -= inter * rows
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


def time_ops(runner, attn, tree, tokens, queries=None, timing: str = "graph") -> dict:
    """Every op of ``layer_ops`` timed alone (``kernels.timing.bench`` in mode ``timing``,
    rotating over the layers): ``{name: {median_s, count}}``, the reuse layers' attention less
    the refresh call it includes."""
    ops = {}
    for name, (fn, count) in layer_ops(runner, attn, tree, tokens, queries).items():
        tm = bench(fn, timing, num_inputs=runner.config.num_layers, config=OP_TIMING)
        ops[name] = {"median_s": tm.median_s, "count": count}
    if "attention_reuse_plus_refresh" in ops:
        reuse = ops.pop("attention_reuse_plus_refresh")
        ops["attention_reuse"] = {
            "median_s": max(reuse["median_s"] - ops["attention"]["median_s"], 0.0),
            "count": reuse["count"],
        }
    return ops


# Each group of the engine's ops (``layer_ops``, as the Triton backend runs them: residual adds
# fused into the norms; rotary, its tables and the KV-tail store in one launch) and the step
# model's verify ops (``perfmodel.step``, names without the ``verify.`` prefix) that price the
# same work, those of either element-wise implementation (``perfmodel.ops``). Attention is one
# group: the step model prices block-metadata selection and the reuse layers' sparse attention
# over every layer, the engine times refresh and reuse layers apart. The step model's sampling
# and acceptance run in the engine's accept step.
OP_GROUPS = {
    "norms": (
        ("embed", "embed_norm", "input_norm", "post_norm", "final_norm"),
        ("norms", "residual", "embed_norm", "add_rms_norm", "rms_norm", "embed"),
    ),
    "qkv_proj": (("qkv_proj",), ("qkv_proj",)),
    "rope_kv_write": (
        ("rope_kv_write",),
        ("rope", "rope_row", "kv_write", "kv_write_row", "rope_tables", "rope_kv_write"),
    ),
    "attention": (("attention", "attention_reuse"), (*ATTENTION_OPS, *SELECTION_OPS.values())),
    "o_proj": (("o_proj",), ("o_proj",)),
    "gate_up_proj": (("gate_up_proj",), ("ffn_gate_up",)),
    "silu_mul": (("silu_mul",), ("ffn_act", "ffn_act_row", "silu_mul")),
    "down_proj": (("down_proj", "down_proj_last"), ("ffn_down",)),
    "lm_head": (("lm_head",), ("lm_head",)),
}


def op_groups(ops: dict | None, pred) -> dict:
    """Per ``OP_GROUPS`` group, the measured seconds of its engine ops per forward (median x
    count; None without ``ops``) and the predicted seconds of its step-model ops (``pred``: a
    one-point ``perfmodel.step.StepPrediction``); ``other`` holds the step model's verify ops of
    no group (MoE, all-reduce), predicted only."""
    from ssvkit.validation.decode_figures import ACCEPT_STEP_OPS

    predicted = {
        k.removeprefix("verify."): float(v[0])
        for k, v in pred.op_seconds.items()
        if k.startswith("verify.") and k not in ACCEPT_STEP_OPS and float(v[0]) > 0
    }
    out = {}
    for group, (engine_ops, model_ops) in OP_GROUPS.items():
        measured = None
        if ops is not None:
            measured = sum(ops[o]["median_s"] * ops[o]["count"] for o in engine_ops if o in ops)
        out[group] = {
            "measured_s": measured,
            "predicted_s": sum(predicted.pop(o, 0.0) for o in model_ops),
        }
    out["other"] = {"measured_s": None, "predicted_s": sum(predicted.values()), "ops": predicted}
    return out
