"""The step model: per-op counts of one AR decode step or one draft/verify round.

For (model, strategy, workload) it counts, per op, FLOPs, device-memory bytes, kernel launches
and link bytes of: the QKV/O and FFN (or MoE) GEMMs, norms, rotary embedding and KV append,
block selection, each attention branch, TP all-reduces, LM head and sampling, and the drafter.
A predictor (``perfmodel.predictor``) turns counts into seconds; tokens/s follow from the
expected tokens per round (``perfmodel.acceptance``). Everything is vectorised over a
``Columns`` table of strategy/workload points, so a grid of 10^5 points evaluates in one pass.

Assumptions (each op's formula is in the function that builds it):

- bf16 activations; weights at the model's ``weight_bytes``; KV at ``kv_bytes``.
- Memory-bound ops read every weight once per forward; GEMM activations are read/written once.
- A verification forward runs ``t = K + 1`` query rows per sequence (the last accepted token
  and the K draft nodes); an AR step runs one.
- Sparse attention follows NSA (seed 000): compressed, selected and sliding-window branches,
  each query attends to ``T / stride + n B + w`` tokens plus its draft-tree ancestors. Grouping
  changes only the bytes loaded (``sparse.blocks_loaded_per_layer``), never the FLOPs.
- Refresh layers (a fraction 1 / refresh_every of layers) run block selection; reuse layers do
  not. Without fusion every layer launches the three branches and a combine kernel and round-
  trips the branch outputs through memory; with ``refresh_reuse`` fusion a refresh layer runs
  a partially fused pair of kernels and a reuse layer one fused kernel (seed 000, Mechanism 2).
- Caches are ignored: repeated block loads of ``per_query`` kernels count as device-memory
  traffic (the calibrated predictor corrects for L2 hits).
- MoE: the routed experts a forward touches are ``E (1 - (1 - k/E)^M)`` in expectation for M
  routed tokens (independent uniform routing); each touched expert's weights are read once.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, fields

import numpy as np

from perfmodel.acceptance import tree_level_sizes
from perfmodel.models import ModelSpec
from perfmodel.nsa_plan import merge_steps, mma_row_cost
from perfmodel.predictor import (
    RESIDENT_KINDS,
    RESIDENT_SUFFIX,
    Op,
    RooflinePredictor,
    weights_fit_l2,
)
from perfmodel.sparse import blocks_loaded_per_layer
from perfmodel.strategy import (
    DrafterSpec,
    Strategy,
    Workload,
    check_feasible,
    parse_tree,
    tree_expected_tokens,
)
from perfmodel.torch_plan import KV_WRITE_STORES, index_put_steps, topn_counts

MODE_CODES = {"per_query": 0, "union": 1, "shared": 2}
DRAFTER_CODES = {"eagle": 0, "draft_model": 1, "ngram": 2, "self_sparse": 3}
META_VECTORS = {"nsa": 0, "mean": 1, "quest": 2}
ACT_BYTES = 2  # bf16 activations
F32 = 4
I32 = 4  # int32 selected block ids


@dataclass(slots=True)
class Columns:
    """One row per evaluated point (all arrays of one length N)."""

    context_len: np.ndarray
    batch: np.ndarray
    tp: np.ndarray
    acceptance: np.ndarray
    overlap: np.ndarray
    kv_bytes: np.ndarray
    num_draft: np.ndarray  # K draft nodes
    expected_tokens: np.ndarray  # tokens per round (1 for AR)
    level_sizes: np.ndarray  # [N, D] draft nodes per tree level (drafting forwards)
    drafter: np.ndarray  # DRAFTER_CODES
    sparsity_ratio: np.ndarray  # self_sparse drafter's KV share
    sparse: np.ndarray  # 0 dense, 1 NSA-style sparse
    mode: np.ndarray  # MODE_CODES
    group_size: np.ndarray
    top_n: np.ndarray
    block_size: np.ndarray
    window: np.ndarray
    comp_stride: np.ndarray
    meta_vectors: np.ndarray  # META_VECTORS
    refresh_frac: np.ndarray  # share of layers that refresh (run selection)
    fused: np.ndarray  # 1 = refresh_reuse kernels

    def __len__(self) -> int:
        return len(self.context_len)

    @property
    def rows(self) -> np.ndarray:
        """Query rows per sequence in the verification forward."""
        return self.num_draft + 1.0


def _tree_columns(tree: str, acceptance: float):
    parents = parse_tree(tree, acceptance)
    return len(parents), tree_expected_tokens(parents, acceptance), tree_level_sizes(parents)


def _strategy_columns(s: Strategy, num_layers: int) -> dict:
    return {
        "drafter": DRAFTER_CODES[s.drafter.kind],
        "sparsity_ratio": s.drafter.sparsity_ratio,
        "sparse": float(s.is_sparse),
        "mode": MODE_CODES[s.mode],
        "group_size": s.group_size,
        "top_n": s.top_n,
        "block_size": s.block_size,
        "window": s.window,
        "comp_stride": s.comp_stride,
        "meta_vectors": META_VECTORS[s.metadata],
        "refresh_frac": np.ceil(num_layers / s.refresh_every) / num_layers,
        "fused": float(s.fusion == "refresh_reuse"),
    }


def build_columns(model: ModelSpec, points: list[tuple[Strategy, Workload]]) -> Columns:
    """Columns for explicit (strategy, workload) pairs; each pair is checked for feasibility."""
    if not points:
        raise ValueError("no (strategy, workload) points to evaluate")
    rows, levels = [], []
    for s, w in points:
        check_feasible(s, w, model)
        k, e, lv = _tree_columns(s.tree, w.acceptance)
        rows.append(
            {
                "context_len": w.context_len,
                "batch": w.batch,
                "tp": w.tp,
                "acceptance": w.acceptance,
                "overlap": w.overlap,
                "kv_bytes": w.kv_bytes,
                "num_draft": k,
                "expected_tokens": e,
                **_strategy_columns(s, model.num_layers),
            }
        )
        levels.append(lv)
    return _assemble(rows, levels)


def _assemble(rows: list[dict], levels: list[list[int]]) -> Columns:
    depth = max((len(lv) for lv in levels), default=0)
    lv = np.zeros((len(rows), max(depth, 1)))
    for i, sizes in enumerate(levels):
        lv[i, : len(sizes)] = sizes
    cols = {
        f.name: np.array([r[f.name] for r in rows], dtype=float)
        for f in fields(Columns)
        if f.name != "level_sizes"
    }
    return Columns(level_sizes=lv, **cols)


def product_columns(model: ModelSpec, strategies: list[Strategy], **axes) -> Columns:
    """Cartesian product of strategies and workload axes (lists), evaluated without building a
    Python object per point: trees are resolved once per (tree, acceptance) pair.

    ``axes`` keys: context_len, batch, tp, acceptance, overlap, kv_bytes (missing ones take the
    ``Workload`` defaults). Infeasible points (top_n * block_size > context) are kept and flagged
    by ``feasible_mask``.
    """
    defaults = Workload()
    names = ("context_len", "batch", "tp", "acceptance", "overlap", "kv_bytes")
    bad = set(axes) - set(names)
    if bad:
        raise ValueError(f"unknown workload axes: {', '.join(sorted(bad))}")
    grid = {n: np.asarray(axes.get(n, [getattr(defaults, n)]), dtype=float) for n in names}
    for n, v in grid.items():
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"axis {n} must be a non-empty list")
    n_s = len(strategies)
    sizes = [n_s] + [grid[n].size for n in names]
    idx = np.indices(sizes).reshape(len(sizes), -1)
    s_idx = idx[0]
    cols = {n: grid[n][idx[i + 1]] for i, n in enumerate(names)}
    # Strategy fields, gathered per point.
    per_s = [_strategy_columns(s, model.num_layers) for s in strategies]
    for key in per_s[0]:
        cols[key] = np.array([p[key] for p in per_s], dtype=float)[s_idx]
    # Trees depend on (tree spec, acceptance): resolve each pair once.
    acc = cols["acceptance"]
    trees = [s.tree for s in strategies]
    uniq_acc = np.unique(grid["acceptance"])
    cache = {(t, a): _tree_columns(t, float(a)) for t, a in itertools.product(set(trees), uniq_acc)}
    depth = max(len(v[2]) for v in cache.values())
    k_tab = np.zeros((n_s, uniq_acc.size))
    e_tab = np.zeros((n_s, uniq_acc.size))
    lv_tab = np.zeros((n_s, uniq_acc.size, max(depth, 1)))
    for i, t in enumerate(trees):
        for j, a in enumerate(uniq_acc):
            k, e, lv = cache[(t, a)]
            k_tab[i, j], e_tab[i, j] = k, e
            lv_tab[i, j, : len(lv)] = lv
    a_idx = np.searchsorted(uniq_acc, acc)
    cols["num_draft"] = k_tab[s_idx, a_idx]
    cols["expected_tokens"] = e_tab[s_idx, a_idx]
    return Columns(level_sizes=lv_tab[s_idx, a_idx], **cols)


def take(c: Columns, idx: np.ndarray) -> Columns:
    """The points ``idx`` of ``c`` (a new Columns)."""
    return Columns(**{f.name: getattr(c, f.name)[idx] for f in fields(Columns)})


def unique_points(c: Columns, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the distinct points of ``c`` on columns ``names`` (level_sizes included when
    named) and the inverse map, so an op that depends on those columns only is evaluated once
    per distinct point."""
    cols = [
        col for n in names for col in (c.level_sizes.T if n == "level_sizes" else [getattr(c, n)])
    ]
    # Mixed-radix codes, re-factorised after each column so they never overflow (much faster
    # than np.unique(axis=0), which sorts whole rows).
    code = np.zeros(len(c), dtype=np.int64)
    for col in cols:
        u, inv = np.unique(col, return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
        _, code = np.unique(code, return_inverse=True)
        code = code.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def feasible_mask(c: Columns) -> np.ndarray:
    """Points a sparse strategy can run: the selected tokens fit the context."""
    return (c.sparse == 0) | (c.top_n * c.block_size <= c.context_len)


# ----------------------------------------------------------------------------- op builders


def _gemm(m, n, k, weight_bytes) -> Op:
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


def _elementwise(nbytes, flops, launches, kernel=None, calls=None, depth=0.0) -> Op:
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


class _Acc(dict):
    def add(self, name: str, op: Op) -> None:
        self[name] = self[name] + op if name in self else op


def _local_heads(model: ModelSpec, tp):
    hq = np.ceil(model.num_q_heads / tp)
    hkv = np.ceil(model.num_kv_heads / tp)  # KV heads replicate when tp > Hkv
    return hq, hkv


def _kv_token_bytes(model: ModelSpec, hkv, kv_bytes):
    """KV bytes of one token in one layer on one rank (MLA's latent is not split by TP)."""
    if model.is_mla:
        return model.kv_bytes_per_token(1) * kv_bytes * np.ones_like(hkv)
    return 2 * hkv * model.head_dim * kv_bytes


def _attn_flops_per_row_token(model: ModelSpec, hq):
    """FLOPs of one query row (all its heads) against one cached token: QK^T and PV.
    MLA in its absorbed form scores over the latent + rope dims and mixes the latent."""
    if model.is_mla:
        return 2 * hq * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
    return 4 * hq * model.head_dim


def _linear_ops(acc: _Acc, model: ModelSpec, m, tp, layers, prefix: str) -> None:
    """Norms, QKV/O projections, rotary + KV append, FFN or MoE, TP all-reduces: per layer
    counts times ``layers`` (an array or scalar; MoE layers counted in proportion)."""
    d, wb = model.hidden_size, model.weight_bytes
    hq, hkv = _local_heads(model, tp)
    attn_w = model.attention_weight_params()
    moe_share = model.num_moe_layers / model.num_layers if model.is_moe else 0.0
    dense_layers = layers * (1 - moe_share)
    moe_layers = layers * moe_share

    acc.add(
        prefix + "norms",
        _elementwise(8 * m * d * ACT_BYTES + 2 * d * wb, 10 * m * d, 2, f"rmsnorm/d{d}").scaled(
            layers
        ),
    )
    # The two residual adds of a pre-norm block (separate kernels in the engine).
    acc.add(
        prefix + "residual",
        _elementwise(2 * 3 * m * d * ACT_BYTES, 2 * m * d, 2, "residual_add").scaled(layers),
    )
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
        qkv = _gemm(m, (hq + 2 * hkv) * model.head_dim, d, wb)
    acc.add(prefix + "qkv_proj", qkv.scaled(layers))
    qk_elems = m * (hq + hkv) * model.head_dim
    # Ops whose single row takes another (cheaper) torch path than several rows: one measured
    # class each, masked by m.
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
        op = _elementwise(on * rope_io, on * 6 * qk_elems, on, kernel, on)
        acc.add(prefix + name, op.scaled(layers))
    # The KV tail written into the cache: an indexed store of K and V, whose threads each store
    # up to 4 elements in series (perfmodel.torch_plan).
    kv_io = 2 * m * _kv_token_bytes(model, hkv, ACT_BYTES)  # read k, v and write them
    kv_elems = m * _kv_token_bytes(model, hkv, ACT_BYTES) / (2 * ACT_BYTES)  # per store
    kv_chain = KV_WRITE_STORES * index_put_steps(kv_elems)
    for name, on, kernel in (
        ("kv_write", 1.0 - one_row, "kv_write"),
        ("kv_write_row", one_row, "kv_write/m1"),
    ):
        op = _elementwise(on * kv_io, 0 * m, 2 * on, kernel, on, on * kv_chain)
        acc.add(prefix + name, op.scaled(layers))
    acc.add(prefix + "o_proj", _gemm(m, d, hq * model.head_dim, wb).scaled(layers))
    if not model.is_moe or moe_share < 1:
        f = model.intermediate_size / tp
        acc.add(prefix + "ffn_gate_up", _gemm(m, 2 * f, d, wb).scaled(dense_layers))
        # SiLU(gate) * up over the GEMM's two halves: strided views for several rows, a
        # contiguous one for a single row (a cheaper path): one measured class each.
        for name, on, kernel in (
            ("ffn_act", 1.0 - one_row, "silu_mul"),
            ("ffn_act_row", one_row, "silu_mul/m1"),
        ):
            act = _elementwise(on * 3 * m * f * ACT_BYTES, on * 5 * m * f, on, kernel, on)
            acc.add(prefix + name, act.scaled(dense_layers))
        acc.add(prefix + "ffn_down", _gemm(m, d, f, wb).scaled(dense_layers))
    if model.is_moe:
        e, k, de = model.num_experts, model.experts_per_token, model.expert_intermediate_size
        acc.add(prefix + "moe_router", _gemm(m, e, d, wb).scaled(moe_layers))
        touched = e * (1 - (1 - k / e) ** m)
        w = touched * 3 * d * de / tp
        experts = Op(
            "gemm",
            2 * m * k * 3 * d * de / tp,
            w * wb + m * k * (2 * d + 3 * de / tp) * ACT_BYTES,
            4 * np.ones_like(m),
        )
        acc.add(prefix + "moe_experts", experts.scaled(moe_layers))
        if model.num_shared_experts:
            fs = model.num_shared_experts * de / tp
            shared = _gemm(m, 2 * fs, d, wb) + _gemm(m, d, fs, wb)
            acc.add(prefix + "moe_shared", shared.scaled(moe_layers))
    ar = Op("comm", np.zeros_like(m), np.zeros_like(m), 2.0 * (tp > 1), 2 * m * d * ACT_BYTES)
    acc.add(prefix + "allreduce", ar.scaled(layers))


def _head_ops(acc: _Acc, model: ModelSpec, m, tp, vocab, prefix: str) -> None:
    """Embedding gather, final norm, LM head GEMM and sampling over the vocabulary."""
    d, wb = model.hidden_size, model.weight_bytes
    v = vocab / tp
    acc.add(
        prefix + "embed_norm",
        _elementwise(m * d * (wb + 3 * ACT_BYTES), 5 * m * d, 2, f"rmsnorm/d{d}"),
    )
    # The rows' rotary factors, gathered from the tables once per forward.
    acc.add(
        prefix + "rope_tables",
        _elementwise(3 * m * model.head_dim * F32, 0 * m, 1, "rope_tables"),
    )
    acc.add(prefix + "lm_head", _gemm(m, v, d, wb))
    # Softmax and sampling/acceptance over the vocabulary: one measured call (two launches),
    # whose rows each walk their v logits (the class's latency floor, depth v).
    acc.add(
        prefix + "sampling",
        _elementwise(
            2 * m * v * F32, 6 * m * v, 2, f"sampling/v{_vocab_shard(vocab, tp)}", 1, depth=v
        ),
    )
    # The vocabulary-parallel logits are gathered across TP ranks.
    acc.add(prefix + "allreduce", Op("comm", 0 * m, 0 * m, 1.0 * (tp > 1), m * v * F32))


def _vocab_shard(vocab: int, tp) -> int:
    """The vocabulary one rank samples over, for the class name (one name per op: when the
    points disagree on tp, the unsharded vocabulary)."""
    tps = np.unique(np.asarray(tp))
    return int(round(vocab / tps[0])) if tps.size == 1 else int(vocab)


def _dense_attention(
    acc: _Acc, model: ModelSpec, c: Columns, rows, kv_tokens, layers, prefix: str
) -> None:
    """Dense attention of ``rows`` query rows per sequence over ``kv_tokens`` cached tokens
    (prefix plus draft tail): KV read once per KV head (GQA rows packed), split-KV + merge."""
    hq, hkv = _local_heads(model, c.tp)
    b = c.batch
    qo = 2 * b * rows * hq * model.head_dim * ACT_BYTES + b * rows * hq * F32
    op = Op(
        "attention",
        b * rows * kv_tokens * _attn_flops_per_row_token(model, hq),
        b * kv_tokens * _kv_token_bytes(model, hkv, c.kv_bytes) + qo,
        2.0 * np.ones_like(rows),
        kernel="dense_verify",
        calls=np.ones_like(rows),  # split-KV kernel + merge: one dense_verify call
    )
    acc.add(prefix + "attention", op.scaled(layers))


def _sparse_attention(
    acc: _Acc, model: ModelSpec, c: Columns, layers, prefix: str, num_sms: int
) -> dict:
    """NSA-style sparse verification attention and block selection (target forward).

    Branch tokens per query: ``T / stride`` compressed, ``min(n B, T)`` selected, ``min(w, T)``
    window plus the draft tail. A kernel group (one query for ``per_query``, C queries
    otherwise) reads the compressed keys and the window once; the selected blocks it reads are
    ``blocks_loaded_per_layer``. Selection (refresh layers): scores over block metadata (mean:
    1 vector per block, quest: 2) or, for NSA, over the compressed attention probabilities,
    then a top-n; ``shared`` mode selects for the group's representative only. Each attention
    call also carries the merge steps of its launch plan on ``num_sms`` SMs
    (``perfmodel.nsa_plan``), the serial tail the calibrated NSA classes price.
    """
    hq, hkv = _local_heads(model, c.tp)
    b, t, T = c.batch, c.rows, c.context_len
    sparse = c.sparse
    comp = np.where(c.comp_stride > 0, np.floor(T / np.maximum(c.comp_stride, 1)), 0.0)
    sel = np.minimum(c.top_n * c.block_size, T)
    win = np.minimum(c.window, T)
    groups = np.where(c.mode == 0, t, np.ceil(t / c.group_size))
    nb = np.ceil(T / c.block_size)
    sel_blocks = np.zeros_like(t)
    for name, code in MODE_CODES.items():
        m = c.mode == code
        if m.any():
            sel_blocks[m] = blocks_loaded_per_layer(
                t[m], c.top_n[m], name, c.group_size[m], c.overlap[m], nb[m]
            )
    loaded = {
        "compressed": groups * comp,
        "selected": sel_blocks * c.block_size,
        "window": groups * (win + t),
    }
    kv_tok = _kv_token_bytes(model, hkv, c.kv_bytes)
    attended = comp + sel + win + t
    m_rows = b * t
    branch_out = m_rows * hq * model.head_dim * F32  # one branch's fp32 output
    # Fusion level: unfused = 3 branch kernels + combine, 3 outputs round-trip; refresh layer of
    # refresh_reuse = 2 kernels, 1 output round-trips; reuse layer = 1 fused kernel.
    r = c.refresh_frac
    launches = np.where(c.fused > 0, 2 * r + 1 * (1 - r), 4.0)
    intermediates = np.where(c.fused > 0, r * 2 * branch_out, 3 * 2 * branch_out)
    qo = 2 * m_rows * hq * model.head_dim * ACT_BYTES + m_rows * hq * F32
    flops = m_rows * attended * _attn_flops_per_row_token(model, hq)
    nbytes = b * kv_tok * sum(loaded.values()) + qo + intermediates
    # NSA metadata: the engine's NSA kernels select inside the refresh call and read, per
    # (sequence, KV head), the compressed keys once and the union of its rows' selected blocks
    # and window -- the bytes ``kernels.benchmark`` counts for the nsa_verify rows. Grouping
    # modes do not apply there.
    nsa = (c.meta_vectors == 0) * 1.0
    nsa_sel = blocks_loaded_per_layer(t, c.top_n, "union", t, c.overlap, nb) * c.block_size
    gates = m_rows * hq * 3 * F32
    nsa_bytes = b * kv_tok * (comp + np.minimum(nsa_sel + win, T) + t) + qo + gates
    nbytes = np.where(nsa > 0, nsa_bytes, nbytes)
    # One op per measured class: the three NSA branches launched apart and gated in torch
    # (unfused) or the fused kernels; refresh layers (NSA: selection inside) and reuse layers.
    # One call per layer each.
    fused, unfused = sparse * (c.fused > 0), sparse * (c.fused == 0)
    refresh = nsa * r
    tile_rows = mma_row_cost(t, hq, hkv)
    for name, on, kernel, is_fused, is_refresh in (
        ("sparse_attention", unfused * (1 - refresh), "nsa_verify/reuse/unfused", 0, 0),
        ("sparse_attention_refresh", unfused * refresh, "nsa_verify/refresh/unfused", 0, 1),
        ("sparse_attention_fused", fused * (1 - refresh), "nsa_verify/reuse/fused", 1, 0),
        ("sparse_attention_fused_refresh", fused * refresh, "nsa_verify/refresh/fused", 1, 1),
    ):
        steps = merge_steps(t, hq, hkv, b, num_sms, fused=is_fused, refresh=is_refresh)
        attn = Op(
            "attention",
            on * flops,
            on * nbytes,
            on * launches,
            kernel=kernel,
            calls=on * 1.0,
            serial_steps=on * steps,
            tile_rows=on * tile_rows,
        )
        acc.add(prefix + name, attn.scaled(layers))
    # Selection over block metadata (mean / quest), in refresh layers only.
    on_meta = sparse * (1 - nsa)
    q_sel = np.where(c.mode == 2, groups, t)
    v = c.meta_vectors
    # Bytes as the measured class counts them (kernels/benchmark.py): the fp32 metadata
    # vectors, the scored query rows and the selected ids; the score rows the top-n stage
    # scans are priced by its stage counts (below), not as bytes.
    meta = b * hkv * nb * v * model.head_dim * F32
    scores = b * q_sel * hq * model.head_dim * ACT_BYTES + b * q_sel * hkv * c.top_n * I32
    nsa_probs = np.where(v == 0, 2 * b * q_sel * hq * comp * F32, 0.0)
    update = b * t * hkv * model.head_dim * ACT_BYTES * (1 + 2 * v)
    # The top-n stage after the scoring: topk over the score rows, two sorts of top_n keys
    # (perfmodel.torch_plan), over the blocks of the context plus the draft rows.
    topn = topn_counts(b * q_sel * hkv, np.ceil((T + t) / c.block_size), c.top_n)
    sel_op = Op(
        "selection",
        on_meta * (2 * b * q_sel * hkv * nb * model.head_dim * v + 2 * b * q_sel * hq * comp),
        on_meta * (meta + scores + nsa_probs + update),
        on_meta * 2.0,
        kernel="select_blocks/mean",  # the measured scoring + top-n call (mean-key metadata)
        calls=on_meta * 1.0,
        stage_counts=tuple(on_meta * x for x in topn),
    )
    acc.add(prefix + "selection", sel_op.scaled(layers * r))
    return {k: sparse * b * kv_tok * val * layers for k, val in loaded.items()}


def _target_forward(
    acc: _Acc, model: ModelSpec, c: Columns, rows, prefix: str, num_sms: int
) -> dict:
    """One target forward over ``rows`` query rows per sequence with the strategy's attention
    (``num_sms``: the GPU's, for the attention kernels' launch plan)."""
    m = c.batch * rows
    layers = model.num_layers * np.ones_like(rows)
    _linear_ops(acc, model, m, c.tp, layers, prefix)
    dense = 1.0 - c.sparse
    _dense_attention(acc, model, c, rows, c.context_len + rows, layers * dense, prefix)
    branches = _sparse_attention(acc, model, c, layers, prefix, num_sms)
    _head_ops(acc, model, m, c.tp, model.vocab_size, prefix)
    return branches


def _draft_ops(
    acc: _Acc, model: ModelSpec, draft: ModelSpec | None, c: Columns, draft_vocab: int | None
) -> None:
    """Drafting cost of one round, by drafter kind (masked per point).

    eagle: per tree level with m nodes, one decoder layer at target width over the context plus
    a 3d -> d feature fusion GEMM, the LM head and top-k sampling (EAGLE-3). draft_model: per
    level, a full forward of the draft model over the context. ngram: one scan of the context's
    token ids. self_sparse: K chain steps of the target with attention over s T tokens.
    Ignores the drafter's pass over the previous round's accepted tokens.
    """
    b, T = c.batch, c.context_len
    is_eagle = (c.drafter == 0) * 1.0
    is_model = (c.drafter == 1) * 1.0
    is_ngram = (c.drafter == 2) * 1.0
    is_self = (c.drafter == 3) * 1.0
    spec = c.num_draft > 0
    drafted = np.zeros_like(T)
    for lvl in range(c.level_sizes.shape[1]):
        nodes = c.level_sizes[:, lvl]
        on = (nodes > 0) & spec
        if not on.any():
            continue
        kv = T + drafted + nodes
        sub = _Acc()
        # EAGLE head: one target-width layer, fused features, LM head.
        m = b * nodes
        _linear_ops(sub, model, m, c.tp, is_eagle * on, "draft.")
        _dense_attention(sub, model, c, nodes, kv, is_eagle * on, "draft.")
        sub.add(
            "draft.fc",
            _gemm(m, model.hidden_size, 3 * model.hidden_size, model.weight_bytes).scaled(
                is_eagle * on
            ),
        )
        head = _Acc()
        _head_ops(head, model, m, c.tp, draft_vocab or model.vocab_size, "draft.")
        for k, op in head.items():
            sub.add(k, op.scaled(is_eagle * on))
        if draft is not None:
            dl = draft.num_layers * is_model * on
            _linear_ops(sub, draft, m, c.tp, dl, "draft.model.")
            _dense_attention(sub, draft, c, nodes, kv, dl, "draft.model.")
            head = _Acc()
            _head_ops(head, draft, m, c.tp, draft.vocab_size, "draft.model.")
            for k, op in head.items():
                sub.add(k, op.scaled(is_model * on))
        for k, op in sub.items():
            acc.add(k, op)
        drafted = drafted + nodes
    # n-gram / prompt lookup: one pass over int32 token ids.
    acc.add(
        "draft.ngram",
        _elementwise(b * T * 4.0 * is_ngram * spec, b * T * is_ngram * spec, is_ngram * spec),
    )
    # Self-speculation: K chain steps of the target with attention over s T tokens.
    steps = c.num_draft * is_self
    if (steps > 0).any():
        one = np.ones_like(T)
        sub = _Acc()
        _linear_ops(sub, model, b * one, c.tp, model.num_layers * one, "draft.self.")
        _dense_attention(
            sub,
            model,
            c,
            one,
            c.sparsity_ratio * T + c.num_draft,
            model.num_layers * one,
            "draft.self.",
        )
        _head_ops(sub, model, b * one, c.tp, model.vocab_size, "draft.self.")
        for k, op in sub.items():
            acc.add(k, op.scaled(steps))


def _flags(predictor, n: int) -> np.ndarray:
    """A predictor's per-point extrapolation flags as an [n] array (none: all False)."""
    f = getattr(predictor, "outside", None)
    if f is None:
        return np.zeros(n, dtype=bool)
    try:
        return np.broadcast_to(np.asarray(f, dtype=bool), (n,)).copy()
    except ValueError:
        return np.zeros(n, dtype=bool)


DRAFT_KEYS = (
    "drafter",
    "num_draft",
    "level_sizes",
    "batch",
    "context_len",
    "tp",
    "kv_bytes",
    "sparsity_ratio",
)


def _gather(op: Op, idx: np.ndarray, n: int) -> Op:
    def g(x):
        return np.broadcast_to(x, (n,))[idx]

    return Op(
        op.kind,
        g(op.flops),
        g(op.bytes),
        g(op.launches),
        g(op.comm_bytes),
        op.kernel,
        g(op.calls),
        None if op.dedup_bytes is None else g(op.dedup_bytes),
        g(op.depth),
        g(op.serial_steps),
        g(op.tile_rows),
        tuple(g(x) for x in op.stage_counts),
    )


def _mark_resident(acc: _Acc, owner, gpu) -> None:
    """Name the GEMM and element-wise ops of the models whose weights fit in ``gpu``'s L2 with
    ``RESIDENT_SUFFIX`` (``owner(key)``: the model an op of ``acc`` belongs to)."""
    for k, op in acc.items():
        if op.kernel and op.kind in RESIDENT_KINDS and weights_fit_l2(owner(k), gpu):
            acc[k] = dataclasses.replace(op, kernel=op.kernel + RESIDENT_SUFFIX)


ATTENTION_OPS = (
    "attention",
    "sparse_attention",
    "sparse_attention_refresh",
    "sparse_attention_fused",
    "sparse_attention_fused_refresh",
)


def attention_seconds(op_seconds: dict[str, np.ndarray], stage: str = "verify") -> np.ndarray:
    """Seconds of a stage's attention, dense or sparse (the ops of ``ATTENTION_OPS``)."""
    parts = [op_seconds[f"{stage}.{n}"] for n in ATTENTION_OPS if f"{stage}.{n}" in op_seconds]
    return sum(parts[1:], parts[0]) if parts else 0.0


@dataclass(slots=True)
class StepPrediction:
    """Per-op seconds and counts for the evaluated points, and the round's totals."""

    op_seconds: dict[str, np.ndarray]
    ops: dict[str, Op]
    draft_s: np.ndarray
    verify_s: np.ndarray
    round_s: np.ndarray
    tokens_per_round: np.ndarray
    tokens_per_s: np.ndarray
    branch_bytes: dict[str, np.ndarray]
    provenance: str
    extrapolated: np.ndarray  # per point: some op outside its calibrated range


def predict_columns(
    model: ModelSpec, c: Columns, predictor: RooflinePredictor, drafter: DrafterSpec | None = None
) -> StepPrediction:
    """Evaluate every point of ``c``: verification (or AR step) forward, drafting, acceptance.

    ``round_s = draft_s + verify_s``; ``tokens_per_s = batch * E[tokens per round] / round_s``.
    The predictor's ``tp`` must match ``c.tp`` (build it with ``tp=c.tp``). ``drafter`` supplies
    the draft model's spec and EAGLE's draft vocabulary (the kind per point is in ``c``).
    """
    drafter = drafter or DrafterSpec()
    draft = drafter.draft_spec()
    draft_vocab = drafter.draft_vocab
    if draft is None and (c.drafter == DRAFTER_CODES["draft_model"]).any():
        raise ValueError("a draft_model drafter needs the draft model (DrafterSpec.model)")
    if hasattr(predictor, "outside"):
        predictor.outside = None  # extrapolation flags are per evaluation
    acc = _Acc()
    branches = _target_forward(acc, model, c, c.rows, "verify.", predictor.gpu.num_sms)
    spec = (c.num_draft > 0) * 1.0
    # Acceptance bookkeeping: compare/sample per row, compact accepted KV entries of each layer.
    kv_tok = _kv_token_bytes(model, _local_heads(model, c.tp)[1], c.kv_bytes)
    acc.add(
        "verify.accept",
        _elementwise(
            spec * (c.batch * c.rows * 16.0 + 2 * c.batch * c.rows * kv_tok * model.num_layers),
            spec * c.batch * c.rows * 8.0,
            2 * spec,
        ),
    )
    _mark_resident(acc, lambda _: model, predictor.gpu)
    secs = {k: predictor.op_time_s(op) * np.ones(len(c)) for k, op in acc.items()}
    # Drafting depends on few columns: evaluate it once per distinct point, then gather.
    first, inverse = unique_points(c, DRAFT_KEYS)
    cu = take(c, first)
    draft_acc = _Acc()
    _draft_ops(draft_acc, model, draft, cu, draft_vocab)
    _mark_resident(
        draft_acc, lambda k: draft if k.startswith("draft.model.") else model, predictor.gpu
    )
    draft_pred = predictor.at(first) if hasattr(predictor, "at") else predictor
    for k, op in draft_acc.items():
        secs[k] = (draft_pred.op_time_s(op) * np.ones(len(cu)))[inverse]
        acc[k] = _gather(op, inverse, len(cu))
    outside = _flags(predictor, len(c)) | _flags(draft_pred, len(cu))[inverse]
    draft_s = sum((v for k, v in secs.items() if k.startswith("draft.")), np.zeros(len(c)))
    verify_s = sum((v for k, v in secs.items() if k.startswith("verify.")), np.zeros(len(c)))
    round_s = draft_s + verify_s
    return StepPrediction(
        op_seconds=secs,
        ops=dict(acc),
        draft_s=draft_s,
        verify_s=verify_s,
        round_s=round_s,
        tokens_per_round=c.expected_tokens,
        tokens_per_s=c.batch * c.expected_tokens / round_s,
        branch_bytes=branches,
        provenance=predictor.provenance,
        extrapolated=outside,
    )
