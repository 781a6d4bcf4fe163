"""Costs the simulator needs beyond one whole round: prefill, per-layer and per-draft-level
splits of a round, Saguaro's pre-speculation, SparseSpec's mixed draft/verify step, host
scheduling time and KV-cache capacity (PRR's speculative attention and repair:
``perfmodel.prr_costs``).

Every function reuses the op builders (``perfmodel.ops``) and the predictor of the step model
(``perfmodel.step``) so the counts agree with it: a split of a round sums back to the step
model's round (tests check it), and a new cost (prefill attention, repair of missed blocks) is
counted in the same units and run through the same ``op_time_s``. Pure numpy; vectorised over
the ``Columns`` points or arrays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from ssvkit.perfmodel.elementwise import chains_norms, fused_elementwise
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import (
    ACT_BYTES,
    OpSum,
    attn_flops_per_row_token,
    dense_attention,
    head_ops,
    kv_token_bytes,
    linear_ops,
    local_heads,
)
from ssvkit.perfmodel.predictor import Op
from ssvkit.perfmodel.sparsespec import offload_time_s
from ssvkit.perfmodel.step import (
    Columns,
    StepPrediction,
    attention_seconds,
    predict_columns,
    selection_seconds,
)
from ssvkit.perfmodel.strategy import DrafterSpec

HEAD_OPS = (
    "verify.embed_norm",
    "verify.embed",
    "verify.rms_norm",
    "verify.lm_head",
    "verify.sampling",
)
# Seed 003's Qwen3-8B execution breakdown: 3.2 ms of CPU scheduling per step at batch 128.
HOST_PER_REQUEST_S = 3.2e-3 / 128
PREFILL_Q_TILE = 128


def _total(acc: dict, predictor) -> np.ndarray:
    return sum((predictor.op_time_s(op) for op in acc.values()), 0.0)


def prefill_ops(
    model: ModelSpec, predictor, prompt_len, batch=1, kv_bytes=2, elementwise: str = "fused"
) -> dict[str, Op]:
    """Op counts of one prefill forward over ``prompt_len`` tokens for ``batch`` sequences, the
    element-wise ops as ``elementwise`` runs them (``perfmodel.strategy.ELEMENTWISE``).

    Linear ops (projections, FFN/MoE, norms, rotary + KV write, all-reduces) run on
    ``m = batch * P`` rows with ``perfmodel.step``'s formulas. Causal attention scores
    ``P (P + 1) / 2`` (query, key) pairs per sequence and head; a FlashAttention-style kernel
    reads the keys/values once per query tile of ``PREFILL_Q_TILE`` rows, ``ceil(P / tile)
    (P + 1) / 2`` tokens on average under the causal mask. Only the last position goes through
    the LM head and sampling (the first generated token). Ignores chunked prefill and prefix
    caching.
    """
    p = np.asarray(prompt_len, dtype=float)
    b = np.asarray(batch, dtype=float) * np.ones_like(p)
    tp = predictor.tp
    hq, hkv = local_heads(model, tp)
    L = model.num_layers
    acc = OpSum()
    fused = fused_elementwise(elementwise)
    linear_ops(acc, model, b * p, tp, L, "prefill.", fused, chains_norms(elementwise))
    pairs = b * p * (p + 1) / 2
    reads = b * np.ceil(p / PREFILL_Q_TILE) * (p + 1) / 2
    qo = 2 * b * p * hq * model.head_dim * ACT_BYTES
    attn = Op(
        "attention",
        pairs * attn_flops_per_row_token(model, hq),
        reads * kv_token_bytes(model, hkv, kv_bytes) + qo,
        np.ones_like(p),
    )
    acc.add("prefill.attention", attn.scaled(L))
    head_ops(acc, model, b, tp, model.vocab_size, "prefill.", fused)
    return dict(acc)


def prefill_seconds(
    model: ModelSpec, predictor, prompt_len, batch=1, kv_bytes=2, elementwise: str = "fused"
) -> np.ndarray:
    """Seconds of ``prefill_ops`` (the time to the first token, queueing excluded)."""
    ops = prefill_ops(model, predictor, prompt_len, batch, kv_bytes, elementwise)
    return _total(ops, predictor)


@dataclass(frozen=True, slots=True)
class LayerSplit:
    """One verification (or AR) forward split by layer, per point of a ``Columns``.

    ``verify_s == R (linear + attention_refresh + selection) + (L - R) (linear +
    attention_reuse) + head + accept`` with R refresh layers (exact while the attention op stays
    on one side of the roofline at R = 0 and R = L, which memory-bound decoding does).
    """

    num_layers: int
    num_refresh: np.ndarray  # R
    linear_s: np.ndarray  # per layer: GEMMs, norms, rotary, KV append, all-reduces
    attention_refresh_s: np.ndarray  # per refresh layer (dense: every layer)
    attention_reuse_s: np.ndarray  # per reuse layer
    selection_s: np.ndarray  # per refresh layer (0 for dense attention)
    head_s: np.ndarray  # once per forward: embedding, final norm, LM head, sampling
    accept_s: np.ndarray  # acceptance bookkeeping after the forward
    verify_s: np.ndarray  # the step model's verification seconds
    draft_s: np.ndarray  # the step model's drafting seconds
    host_s: np.ndarray  # the loop's host time per round (``perfmodel.loop_host``)
    prediction: StepPrediction

    def layer_s(self, refresh: bool) -> np.ndarray:
        """Seconds of one refresh (or reuse) layer."""
        if refresh:
            return self.linear_s + self.attention_refresh_s + self.selection_s
        return self.linear_s + self.attention_reuse_s


def with_columns(c: Columns, **cols) -> Columns:
    """``c`` with the columns ``cols`` set, each broadcast to every point."""
    n = len(c)
    return dataclasses.replace(
        c, **{k: np.broadcast_to(v, (n,)).astype(float) for k, v in cols.items()}
    )


def verify_layer_split(
    model: ModelSpec, c: Columns, predictor, drafter: DrafterSpec | None = None
) -> LayerSplit:
    """Split each point's verification forward into per-layer and per-forward seconds.

    The step model counts attention and selection summed over layers with a refresh share r.
    Evaluating it again at r = 1 (every layer refreshes) and r = 0 (none does) gives the
    attention of one refresh and of one reuse layer (they differ under ``refresh_reuse``
    fusion: launches and intermediate writes, seed 000 Mechanism 2), and the selection of a
    refresh layer. ``head`` is embed/norm, LM head and sampling; the remaining verify ops are
    spread evenly over the layers (``linear_s``; the LM head's tensor-parallel gather lands
    there too, zero at tp = 1).
    """
    L = model.num_layers
    pred = predict_columns(model, c, predictor, drafter)
    p1 = predict_columns(model, with_columns(c, refresh_frac=1.0), predictor, drafter)
    p0 = predict_columns(model, with_columns(c, refresh_frac=0.0), predictor, drafter)
    zero = np.zeros(len(c))
    ops = pred.op_seconds
    head = sum((ops.get(k, zero) for k in HEAD_OPS), zero)
    accept = ops.get("verify.accept", zero)
    attn, sel = attention_seconds(ops) + zero, selection_seconds(ops) + zero
    linear = (pred.verify_s - head - accept - attn - sel) / L
    return LayerSplit(
        num_layers=L,
        num_refresh=np.rint(c.refresh_frac * L),
        linear_s=linear,
        attention_refresh_s=(attention_seconds(p1.op_seconds) + zero) / L,
        attention_reuse_s=(attention_seconds(p0.op_seconds) + zero) / L,
        selection_s=(selection_seconds(p1.op_seconds) + zero) / L,
        head_s=head,
        accept_s=accept,
        verify_s=pred.verify_s,
        draft_s=pred.draft_s,
        host_s=pred.loop_s + zero,
        prediction=pred,
    )


def draft_level_seconds(
    model: ModelSpec, c: Columns, predictor, drafter: DrafterSpec | None = None
) -> np.ndarray:
    """Drafting seconds of each tree level, ``[N, D]`` (D = deepest tree among the points).

    Level l's cost is the step model's drafting time of the tree cut after level l minus the
    tree cut after level l - 1, so the levels telescope to ``draft_s`` exactly. An EAGLE or
    draft-model drafter pays one forward per level; prompt lookup (``ngram``) pays its one scan
    in level 1; ``self_sparse`` pays one sparse target step per chain node.
    """
    n, depth = c.level_sizes.shape
    out = np.zeros((n, depth))
    prev = np.zeros(n)
    for lvl in range(depth):
        sizes = c.level_sizes.copy()
        sizes[:, lvl + 1 :] = 0
        cut = dataclasses.replace(c, level_sizes=sizes, num_draft=sizes.sum(axis=1))
        cum = predict_columns(model, cut, predictor, drafter).draft_s
        out[:, lvl] = cum - prev
        prev = cum
    return out


def speculation_seconds(
    model: ModelSpec, c: Columns, predictor, drafter: DrafterSpec | None, budget
) -> np.ndarray:
    """Saguaro's pre-speculation on the draft device: ``budget`` cached outcomes, each a chain
    of K drafts, decoded together (seed 002: B (K + 1) F branches under one custom mask).

    Counted as a draft tree with ``budget`` nodes on each of K levels: every level is one draft
    forward of ``batch * budget`` rows whose branches share the verified prefix, so the prefix
    KV is read once per sequence (the seed's "Prefix Mask") while the rows scale with the
    budget. K is the strategy's chain length (``c.num_draft``).
    """
    k = c.num_draft.astype(int)
    depth = max(int(k.max()), 1)
    sizes = np.zeros((len(c), depth))
    for i, ki in enumerate(k):
        sizes[i, :ki] = budget
    spec = dataclasses.replace(c, level_sizes=sizes, num_draft=sizes.sum(axis=1))
    return predict_columns(model, spec, predictor, drafter).draft_s


def mixed_step_seconds(
    model: ModelSpec,
    predictor,
    num_draft_seqs,
    num_verify_seqs,
    num_draft_steps,
    context_len,
    sparsity_ratio,
    kv_bytes=2,
    elementwise: str = "fused",
) -> dict[str, np.ndarray]:
    """One SparseSpec step of the unified batch (seed 003): self-speculation with the target.

    ``n_d`` sequences run one sparse draft step (one query row, attention over ``s T`` cached
    tokens, PillarAttn) and ``n_v`` run verification (``k + 1`` rows, full attention over
    ``T + k + 1`` tokens), all in one forward: the linear ops and the head run on ``m = n_d +
    n_v (k + 1)`` rows (weights read once for all), the two attention kinds are costed as two
    ops (the fused kernel dispatches each request to its own template). Returns seconds:
    ``linear_s`` (all layers), ``head_s``, ``draft_attention_s``, ``verify_attention_s`` and
    ``total_s``, the element-wise ops as ``elementwise`` runs them. Arguments broadcast.
    """
    nd, nv, k, T, s = np.broadcast_arrays(
        *(
            np.asarray(x, dtype=float)
            for x in (num_draft_seqs, num_verify_seqs, num_draft_steps, context_len, sparsity_ratio)
        )
    )
    tp = predictor.tp
    L = model.num_layers
    m = nd + nv * (k + 1)
    lin, head = OpSum(), OpSum()
    fused = fused_elementwise(elementwise)
    linear_ops(lin, model, m, tp, L, "step.", fused, chains_norms(elementwise))
    head_ops(head, model, m, tp, model.vocab_size, "step.", fused)
    on_m = m > 0
    out = {
        "linear_s": _total(lin, predictor) * on_m,
        "head_s": _total(head, predictor) * on_m,
    }
    for name, n, rows, kv in (
        ("draft_attention_s", nd, np.ones_like(nd), s * T + k),
        ("verify_attention_s", nv, k + 1, T + k + 1),
    ):
        acc = OpSum()
        shim = SimpleNamespace(tp=tp, batch=n, kv_bytes=kv_bytes)
        layers = L * np.ones_like(n)
        dense_attention(acc, model, shim, rows, kv, layers, "step.", predictor.gpu.num_sms)
        out[name] = predictor.op_time_s(acc["step.attention"]) * (n > 0)
    out["total_s"] = sum(out.values())
    return out


def host_step_seconds(num_requests, per_request_s: float = HOST_PER_REQUEST_S) -> np.ndarray:
    """CPU time to prepare one step's metadata: ``num_requests * per_request_s``.

    The default is seed 003's measurement (3.2 ms per step at batch 128 on Qwen3-8B, before
    delayed verification), i.e. 25 us per request; an assumption until a calibrated profile
    measures the host.
    """
    if per_request_s < 0:
        raise ValueError(f"per_request_s must be >= 0, got {per_request_s}")
    return np.asarray(num_requests, dtype=float) * per_request_s


def kv_capacity_tokens(
    model: ModelSpec, gpu, tp: int = 1, kv_bytes: int = 2, memory_fraction: float = 0.9
) -> int:
    """Tokens of KV cache that fit beside the weights on ``tp`` GPUs.

    ``floor((f M tp - W) / (L kv_bytes_per_token))`` with M the device memory, f the share the
    serving engine may use (activations and fragmentation take the rest), W the weight bytes.
    Ignores activation workspace beyond (1 - f) M and KV-head replication when tp > Hkv.
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must lie in (0, 1], got {memory_fraction}")
    weights = model.num_params() * model.weight_bytes
    free = memory_fraction * gpu.memory_bytes * tp - weights
    per_token = model.num_layers * model.kv_bytes_per_token(kv_bytes)
    return max(int(free // per_token), 0)


def memory_shortfall(
    model: ModelSpec, gpu, tp: int, kv_bytes: int, batch: int, context_len: int, num_draft: int = 0
) -> str | None:
    """None when the weights and ``batch * (context_len + num_draft + 1)`` KV tokens fit
    ``kv_capacity_tokens`` (90% of ``tp`` GPUs' memory), else a one-line reason."""
    cap = kv_capacity_tokens(model, gpu, tp, kv_bytes)
    on = f"{tp} x {gpu.name}"
    if cap == 0:
        weights = model.num_params() * model.weight_bytes
        return (
            f"{model.name}'s weights ({weights / 1e9:,.0f} GB) leave no room for a KV cache "
            f"on {on} ({tp * gpu.memory_bytes / 1e9:,.0f} GB)"
        )
    need = batch * (context_len + num_draft + 1)
    if need <= cap:
        return None
    return (
        f"batch {batch} x context {context_len} needs {need:,} KV tokens; {on} holds "
        f"{cap:,} beside the weights"
    )


def kv_offload_seconds(num_tokens, model: ModelSpec, gpu, kv_bytes: int = 2) -> np.ndarray:
    """PCIe time to move ``num_tokens`` tokens of KV cache (all layers) to or from host memory
    (seed 003's dynamic KV manager): ``perfmodel.sparsespec.offload_time_s`` of their bytes."""
    nbytes = (
        np.asarray(num_tokens, dtype=float) * model.num_layers * model.kv_bytes_per_token(kv_bytes)
    )
    return offload_time_s(nbytes, gpu.pcie_bytes_per_s)
