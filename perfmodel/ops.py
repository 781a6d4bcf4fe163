"""Op builders of a forward: per-op counts (FLOPs, device-memory bytes, launches, link bytes)
of the dense layers, the dense attention, and the head of one forward, vectorised over the
points of a ``perfmodel.columns.Columns`` table.

Each builder adds its ops, named ``prefix + op``, to an ``OpSum``; ``perfmodel.step``
assembles a verification (or AR) forward and the drafting from them, and ``perfmodel.costs``
reuses them for the other stages. The measured class an op is priced by is its ``kernel``.
The element-wise ops come in the engine's two implementations
(``perfmodel.elementwise.ELEMENTWISE``), chosen per point by ``fused`` (``linear_ops``).
Assumptions: bf16 activations (``ACT_BYTES``); weights at the model's ``weight_bytes``, every
weight read once per forward by the memory-bound ops; GEMM activations read and written once.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES
from ssvkit.perfmodel.attention_work import dense_tile_costs
from ssvkit.perfmodel.columns import Columns
from ssvkit.perfmodel.dense_work import dense_work_arrays
from ssvkit.perfmodel.linear_rule import chained_norms
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.predictor import Op
from ssvkit.perfmodel.torch_plan import KV_WRITE_STORES, index_put_steps

ACT_BYTES = 2  # bf16 activations
F32 = 4
I32 = 4  # int32 selected block ids
I64 = 8  # int64 token ids, positions and cache slots
# The classes of the fused path's ops (kernel families: ``add_rms_norm`` per hidden width,
# ``add_rms_norm/d{d}``, like the torch norm's), each one launch a call.
FUSED_CLASSES = ("add_rms_norm", "rope_kv_write", "silu_mul_fused", "embed")


def gemm(m, n, k, weight_bytes) -> Op:
    """``[m, k] x [k, n]``: 2 m n k FLOPs; weights once, activations in and out once; a
    reduction of depth k."""
    ones = np.ones_like(m)
    return Op(
        "gemm",
        2 * m * n * k,
        n * k * weight_bytes + (m * k + m * n) * ACT_BYTES,
        ones,
        kernel="gemm",
        depth=k * ones,
    )


def elementwise(nbytes, flops, launches, kernel=None, calls=None, depth=0.0) -> Op:
    """An element-wise op; ``kernel`` names its measured class, ``calls`` its invocations
    (default: one per launch), ``depth`` the serial chain its calls sum to (``Op``)."""
    ones = np.ones_like(nbytes)
    return Op(
        "elementwise",
        flops,
        nbytes,
        launches * ones,
        kernel=kernel,
        calls=None if calls is None else calls * ones,
        depth=depth * ones,
    )


class OpSum(dict):
    """Ops by name; ``add`` sums an op into the one of its name (in insertion order)."""

    def add(self, name: str, op: Op) -> None:
        self[name] = self[name] + op if name in self else op

    def add_where(self, name: str, op: Op, on) -> None:
        """Add ``op`` repeated ``on`` times per point (0 where a point does not run it), when
        some point runs it."""
        if np.any(on):
            self.add(name, op.scaled(on))


def local_heads(model: ModelSpec, tp):
    """Query and KV heads on one tensor-parallel rank."""
    hq = np.ceil(model.num_q_heads / tp)
    hkv = np.ceil(model.num_kv_heads / tp)  # KV heads replicate when tp > Hkv
    return hq, hkv


def kv_token_bytes(model: ModelSpec, hkv, kv_bytes):
    """KV bytes of one token in one layer on one rank (MLA's latent is not split by TP)."""
    if model.is_mla:
        return model.kv_bytes_per_token(1) * kv_bytes * np.ones_like(hkv)
    return 2 * hkv * model.head_dim * kv_bytes


def attn_flops_per_row_token(model: ModelSpec, hq):
    """FLOPs of one query row (all its heads) against one cached token: QK^T and PV.
    MLA in its absorbed form scores over the latent + rope dims and mixes the latent."""
    if model.is_mla:
        return 2 * hq * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
    return 4 * hq * model.head_dim


def linear_ops(acc: OpSum, model: ModelSpec, m, tp, layers, prefix: str, fused, chains) -> None:
    """Norms, QKV/O projections, rotary + KV append, FFN or MoE, TP all-reduces: per layer
    counts times ``layers`` (an array or scalar; MoE layers counted in proportion), the
    element-wise ops of the implementation ``fused`` picks per point (1: fused, 0: torch), its
    norms chained into its projections where ``chains`` (1) lets it.

    ``torch`` runs separate residual adds, a torch RMSNorm, rotary with q's copy, the KV store
    as two indexed assignments and SiLU * up over strided views (and the rope tables gathered
    per forward, ``head_ops``). ``fused`` (``engine.model``'s triton backend) runs per layer two
    ``add_rms_norm`` launches (a residual add with the norm after it; the last one is the
    final norm), one ``rope_kv_write`` (rotary of q and k with the KV-cache store, tables
    gathered inside) and one ``silu_mul``, each one launch a call priced by its kernel's class
    (``FUSED_CLASSES``); where it chains its norms into its projections
    (``linear_rule.chained_norms``), only the final norm's ``add_rms_norm`` a forward and no
    ``silu_mul`` (the epilogues' few bytes ride in the projections' times: the chained
    projections time as the plain ones)."""
    d = model.hidden_size
    moe_share = model.num_moe_layers / model.num_layers if model.is_moe else 0.0
    dense_layers = layers * (1 - moe_share)
    moe_layers = layers * moe_share
    chain = chained_norms(model, m, tp, fused * chains)
    _attention_block_ops(acc, model, m, tp, layers, prefix, fused, chain)
    if not model.is_moe or moe_share < 1:
        _ffn_ops(acc, model, m, tp, dense_layers, prefix, fused, chain)
    if model.is_moe:
        _moe_ops(acc, model, m, tp, moe_layers, prefix)
    ar = Op("comm", np.zeros_like(m), np.zeros_like(m), 2.0 * (tp > 1), 2 * m * d * ACT_BYTES)
    acc.add(prefix + "allreduce", ar.scaled(layers))


def _attention_block_ops(
    acc: OpSum, model: ModelSpec, m, tp, layers, prefix: str, fused, chain
) -> None:
    """The block's two norms and residual adds (in the projections where ``chain``: the final
    norm alone then), the QKV projection, rotary + KV append and the output projection."""
    d, wb = model.hidden_size, model.weight_bytes
    hq, hkv = local_heads(model, tp)
    attn_w = model.attention_weight_params()
    torch_layers = layers * (1.0 - fused)
    norms = elementwise(8 * m * d * ACT_BYTES + 2 * d * wb, 10 * m * d, 2, f"rmsnorm/d{d}")
    acc.add_where(prefix + "norms", norms, torch_layers)
    # The two residual adds of a pre-norm block (separate kernels in the engine).
    residual = elementwise(2 * 3 * m * d * ACT_BYTES, 2 * m * d, 2, "residual_add")
    acc.add_where(prefix + "residual", residual, torch_layers)
    # Chained, the final norm alone: one a forward that runs layers.
    norm_calls = fused * (2 * layers * (1.0 - chain) + chain * np.minimum(layers, 1.0))
    acc.add_where(prefix + "add_rms_norm", add_rms_norm_op(model, m), norm_calls)
    if model.is_mla:
        qkv = Op(
            "gemm",
            2 * m * attn_w["qkv"] / tp,
            attn_w["qkv"] / tp * wb + m * d * ACT_BYTES * 2,
            np.ones_like(m),
            kernel="gemm",
            depth=d * np.ones_like(m),
        )
    else:
        qkv = gemm(m, (hq + 2 * hkv) * model.head_dim, d, wb)
    acc.add(prefix + "qkv_proj", qkv.scaled(layers))
    if np.any(1.0 - fused):
        _rope_kv_ops(acc, model, m, hq, hkv, torch_layers, prefix)
    acc.add_where(prefix + "rope_kv_write", rope_kv_write_op(model, m, hq, hkv), layers * fused)
    acc.add(prefix + "o_proj", gemm(m, d, hq * model.head_dim, wb).scaled(layers))


def add_rms_norm_op(model: ModelSpec, m) -> Op:
    """One ``add_rms_norm`` call over ``m`` rows: reads the residual and the delta, writes
    their sum and its norm, reads the weight."""
    d = model.hidden_size
    return elementwise(
        4 * m * d * ACT_BYTES + d * model.weight_bytes, 6 * m * d, 1, f"add_rms_norm/d{d}"
    )


def rope_kv_write_op(model: ModelSpec, m, hq, hkv) -> Op:
    """One ``rope_kv_write`` call over ``m`` rows: reads q, k and v of the projection, the
    rows' positions and slots and their cos/sin table rows; writes the rotated q and stores k
    and v in the cache."""
    dh = model.head_dim
    kv = m * kv_token_bytes(model, hkv, ACT_BYTES)  # k and v, read and stored once each
    q = m * hq * dh * ACT_BYTES
    io = 2 * q + 2 * kv + m * dh * F32 + 2 * m * I64
    return elementwise(io, 6 * m * (hq + hkv) * dh, 1, "rope_kv_write")


def _rope_kv_ops(acc: OpSum, model: ModelSpec, m, hq, hkv, layers, prefix: str) -> None:
    """Rotary on q and k, and the KV tail written into the cache, as torch ops. Ops whose
    single row takes another (cheaper) torch path than several rows: one measured class each,
    masked by m."""
    qk_elems = m * (hq + hkv) * model.head_dim
    one_row = (m == 1) * 1.0
    # Rotary on q and k in one pass (float32 inside), then q's contiguous copy for attention
    # (a no-op for one row: its q slice is already contiguous).
    rope_io = (
        2 * qk_elems * ACT_BYTES
        + 2 * m * hq * model.head_dim * ACT_BYTES
        + 2 * m * model.head_dim * F32
    )
    for name, on, kernel in (
        ("rope", 1.0 - one_row, "rope_qk"),
        ("rope_row", one_row, "rope_qk/m1"),
    ):
        op = elementwise(on * rope_io, on * 6 * qk_elems, on, kernel, on)
        acc.add(prefix + name, op.scaled(layers))
    # The KV tail written into the cache: an indexed store of K and V, whose threads each store
    # up to 4 elements in series (perfmodel.torch_plan).
    kv_io = 2 * m * kv_token_bytes(model, hkv, ACT_BYTES)  # read k, v and write them
    kv_elems = m * kv_token_bytes(model, hkv, ACT_BYTES) / (2 * ACT_BYTES)  # per store
    kv_chain = KV_WRITE_STORES * index_put_steps(kv_elems)
    for name, on, kernel in (
        ("kv_write", 1.0 - one_row, "kv_write"),
        ("kv_write_row", one_row, "kv_write/m1"),
    ):
        op = elementwise(on * kv_io, 0 * m, 2 * on, kernel, on, on * kv_chain)
        acc.add(prefix + name, op.scaled(layers))


def _ffn_ops(acc: OpSum, model: ModelSpec, m, tp, layers, prefix: str, fused, chain) -> None:
    """The dense FFN: gate/up GEMM, SiLU(gate) * up (in the gate/up GEMM where ``chain``),
    down GEMM."""
    d, wb = model.hidden_size, model.weight_bytes
    one_row = (m == 1) * 1.0
    f = model.intermediate_size / tp
    acc.add(prefix + "ffn_gate_up", gemm(m, 2 * f, d, wb).scaled(layers))
    # SiLU(gate) * up over the GEMM's two halves: torch's strided views for several rows, a
    # contiguous one for a single row (a cheaper path): one measured class each; or one fused
    # launch that reads both halves and writes the product.
    if np.any(1.0 - fused):
        for name, on, kernel in (
            ("ffn_act", 1.0 - one_row, "silu_mul"),
            ("ffn_act_row", one_row, "silu_mul/m1"),
        ):
            act = elementwise(on * 3 * m * f * ACT_BYTES, on * 5 * m * f, on, kernel, on)
            acc.add(prefix + name, act.scaled(layers * (1.0 - fused)))
    fused_act = elementwise(3 * m * f * ACT_BYTES, 5 * m * f, 1, "silu_mul_fused")
    acc.add_where(prefix + "silu_mul", fused_act, layers * fused * (1.0 - chain))
    acc.add(prefix + "ffn_down", gemm(m, d, f, wb).scaled(layers))


def _moe_ops(acc: OpSum, model: ModelSpec, m, tp, layers, prefix: str) -> None:
    """The MoE layer: router, the routed experts a forward touches, the shared experts. M
    routed tokens touch ``E (1 - (1 - k/E)^M)`` routed experts in expectation (independent
    uniform routing), each touched expert's weights read once."""
    d, wb = model.hidden_size, model.weight_bytes
    e, k, de = model.num_experts, model.experts_per_token, model.expert_intermediate_size
    acc.add(prefix + "moe_router", gemm(m, e, d, wb).scaled(layers))
    touched = e * (1 - (1 - k / e) ** m)
    w = touched * 3 * d * de / tp
    experts = Op(
        "gemm",
        2 * m * k * 3 * d * de / tp,
        w * wb + m * k * (2 * d + 3 * de / tp) * ACT_BYTES,
        4 * np.ones_like(m),
    )
    acc.add(prefix + "moe_experts", experts.scaled(layers))
    if model.num_shared_experts:
        fs = model.num_shared_experts * de / tp
        shared = gemm(m, 2 * fs, d, wb) + gemm(m, d, fs, wb)
        acc.add(prefix + "moe_shared", shared.scaled(layers))


def head_ops(acc: OpSum, model: ModelSpec, m, tp, vocab, prefix: str, fused) -> None:
    """Embedding gather, the norm outside the layers, LM head GEMM and sampling over the
    vocabulary; the torch path gathers the rope tables here too, the fused path (``fused``
    1) runs the embedding gather and the first layer's input norm (``rms_norm``, the
    ``add_rms_norm`` kernel without the add) as one launch each."""
    d, wb = model.hidden_size, model.weight_bytes
    v = vocab / tp
    torch_on = 1.0 - fused
    # torch: the gather and the final norm, priced as one norm call (two launches).
    embed_norm = elementwise(m * d * (wb + 3 * ACT_BYTES), 5 * m * d, 2, f"rmsnorm/d{d}")
    acc.add_where(prefix + "embed_norm", embed_norm, torch_on)
    # The rows' rotary factors, gathered from the tables once per forward.
    rope_tables = elementwise(3 * m * model.head_dim * F32, 0 * m, 1, "rope_tables")
    acc.add_where(prefix + "rope_tables", rope_tables, torch_on)
    # fused: the gather (token ids in, rows of the table out) and the first layer's input norm
    # (the final norm is the last layer's second ``add_rms_norm``).
    embed = elementwise(m * d * (wb + ACT_BYTES) + m * I64, 0 * m, 1, "embed")
    acc.add_where(prefix + "embed", embed, fused)
    first_norm = elementwise(2 * m * d * ACT_BYTES + d * wb, 5 * m * d, 1, f"add_rms_norm/d{d}")
    acc.add_where(prefix + "rms_norm", first_norm, fused)
    acc.add(prefix + "lm_head", gemm(m, v, d, wb))
    # Softmax and sampling/acceptance over the vocabulary: one measured call (two launches),
    # whose rows each walk their v logits (the class's latency floor, depth v).
    acc.add(
        prefix + "sampling",
        elementwise(
            2 * m * v * F32, 6 * m * v, 2, f"sampling/v{vocab_shard(vocab, tp)}", 1, depth=v
        ),
    )
    # The vocabulary-parallel logits are gathered across TP ranks.
    acc.add(prefix + "allreduce", Op("comm", 0 * m, 0 * m, 1.0 * (tp > 1), m * v * F32))


def vocab_shard(vocab: int, tp) -> int:
    """The vocabulary one rank samples over, for the class name (one name per op: when the
    points disagree on tp, the unsharded vocabulary)."""
    tps = np.unique(np.asarray(tp))
    return int(round(vocab / tps[0])) if tps.size == 1 else int(vocab)


def dense_attention(
    acc: OpSum, model: ModelSpec, c: Columns, rows, kv_tokens, layers, prefix: str, num_sms: int
) -> None:
    """Dense attention of ``rows`` query rows per sequence over ``kv_tokens`` cached tokens
    (prefix plus draft tail): KV read once per KV head (GQA rows packed), split-KV + merge.
    Its FLOPs are those of the row tiles the kernel runs, and its row tile is the kernel's
    (``attention_work.dense_verify_tiles``). The op carries the kernel's launch-plan counts on
    ``num_sms`` SMs (``perfmodel.dense_work``) as its ``slot_plan``, which the calibrated class
    prices; an MLA model's attention, which the kernel does not run, keeps its algorithmic
    counts."""
    hq, hkv = local_heads(model, c.tp)
    b = c.batch
    qo = 2 * b * rows * hq * model.head_dim * ACT_BYTES + b * rows * hq * F32
    padded, row_cost = dense_tile_costs(rows, hq, hkv, model.head_dim)
    op = Op(
        "attention",
        b * rows * kv_tokens * attn_flops_per_row_token(model, hq) * padded,
        b * kv_tokens * kv_token_bytes(model, hkv, c.kv_bytes) + qo,
        2.0 * np.ones_like(rows),
        kernel="dense_verify",
        calls=np.ones_like(rows),  # split-KV kernel + merge: one dense_verify call
        tile_rows=row_cost * np.ones_like(rows),
        slot_plan=None
        if model.is_mla
        else _dense_plan_op(model, b, rows, kv_tokens, hq, hkv, num_sms),
        head_dim=model.head_dim,
    )
    acc.add(prefix + "attention", op.scaled(layers))


def _dense_plan_op(model: ModelSpec, batch, rows, kv_tokens, hq, hkv, num_sms: int) -> Op:
    """One ``dense_verify`` call per point counted by its launch plan (``perfmodel.dense_work``):
    the counts the calibrated class is fitted on (``calibration.features``); a point of no
    rows or sequences counts nothing."""
    shape = {
        "batch": batch,
        "t": rows,
        "context_len": np.maximum(np.asarray(kv_tokens, dtype=float) - rows, 0.0),
        "num_q_heads": hq,
        "num_kv_heads": hkv,
        "head_dim": model.head_dim,
    }
    w = dense_work_arrays(shape, num_sms=num_sms, smem_per_sm_bytes=DEFAULT_SMEM_PER_SM_BYTES)
    on = (w["chain_tiles"] > 0) * 1.0
    return Op(
        "attention",
        w["flops"],
        w["requested_bytes"],
        on + w["splits"],
        kernel="dense_verify",
        calls=on,
        dedup_bytes=w["unique_bytes"],
        depth=w["chain_tiles"],
        serial_steps=w["merge_steps"],
        tile_rows=w["sm_rows"],
        stage_counts=(w["splits"], w["tail_bytes"]),
    )
