"""The seeds' formulas that the step model does not price: ``ssvkit papers`` reproduces the
seeds' figures with them, and nothing on the cost path (``perfmodel.step``, ``sim``, the planner)
calls them.

- seed 001: the FLOPs table (Table 1: attention, FFN, MoE, dense and sparse), the piecewise
  budget (eq. 6) and the anchor layers chosen by the Jaccard similarity of adjacent layers'
  retrieval masks (eqs. 7-9), with seed 000's refresh-schedule cost ``R T_R + (L - R) T_U``;
- seed 002: Saguaro sampling and the closed-form SSD speedups (the simulator runs SSD itself);
- seed 003: the attention reduction and speedup of sparse self-speculation, the KV bytes a step
  appends and whether their offload hides behind a step;
- seed 004: the speculation budget and the serial DSA path.

A formula that enters the cost path moves to the module of its op (``perfmodel.sparse``,
``perfmodel.refresh``, ...) with the step-model option that turns it on.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.acceptance import expected_tokens_per_round
from ssvkit.perfmodel.saguaro import _check, sd_round_time_s, ssd_round_time_s
from ssvkit.perfmodel.sparsespec import offload_time_s


def _f(x):
    return np.asarray(x, dtype=float)


def _arr(x):
    return np.asarray(x, dtype=float)


def _check_fraction(name, x):
    a = np.asarray(x, dtype=float)
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")


# Seed 001, Table 1: FLOPs of one layer. Symbols as in the table: B batch, T sequence length,
# d hidden size, d_f FFN width, d_e expert width, E experts, k active experts per token,
# s_a / s_f / s_e the sparsity of attention, of the FFN down/up channels and of the active
# experts. A multiply-add is two FLOPs. The attention rows count the Q, K and V projections as
# 6 B T d^2 (MHA, d_q = d_kv = d; the table leaves the output projection out) and score plus PV
# over all T^2 pairs as 4 B T^2 d (no causal halving). The FFN rows are a gated MLP (gate, up,
# down). The MoE router is 2 B T d E.
def _check_sparsity(name, s):
    a = _f(s)
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1], got {s!r}")


def full_attention_flops(B, T, d):
    """``6 B T d^2 + 4 B T^2 d``."""
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * d**2 + 4 * B * T**2 * d


def sparse_attention_flops(B, T, d, s_a):
    """``6 B T d^2 + 4 B (1 - s_a) T^2 d``: the projections stay dense."""
    _check_sparsity("s_a", s_a)
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * d**2 + 4 * B * (1 - _f(s_a)) * T**2 * d


def dense_ffn_flops(B, T, d, d_f):
    """``6 B T d d_f`` (gate, up and down projections)."""
    return 6 * _f(B) * _f(T) * _f(d) * _f(d_f)


def sparse_ffn_flops(B, T, d, d_f, s_f):
    """``2 B T d d_f (3 - 2 s_f)``: the gate stays dense, up and down skip the s_f inactive
    channels (seed 001 eqs. 12-14)."""
    _check_sparsity("s_f", s_f)
    return 2 * _f(B) * _f(T) * _f(d) * _f(d_f) * (3 - 2 * _f(s_f))


def moe_ffn_flops(B, T, d, d_e, k, E):
    """``6 B T k d d_e + 2 B T d E``: k experts of width d_e per token plus the router."""
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * _f(k) * d * _f(d_e) + 2 * B * T * d * _f(E)


def sparse_moe_flops(B, T, d, d_e, k, E, s_e):
    """``6 B T (1 - s_e) k d d_e + 2 B T d E``: s_e of the active experts are skipped
    (seed 001 eqs. 15-16); the router still scores every expert."""
    _check_sparsity("s_e", s_e)
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * (1 - _f(s_e)) * _f(k) * d * _f(d_e) + 2 * B * T * d * _f(E)


def reduction(dense, sparse):
    """Fractional FLOPs saved, ``1 - sparse / dense``."""
    return 1.0 - _f(sparse) / _f(dense)


# Seed 001 eq. 6: the piecewise budget.


def piecewise_budget(seq_len, base_len, sparsity, num_kv_heads, block_size):
    """Blocks retained by 001's piecewise budget control (seed 001, eq. 6).

    ``N = ((L - L0) rho + L0) H / B`` for L > L0, and no eviction (all ``ceil(L / B) H`` blocks)
    for L <= L0, with H KV heads and block size B. Counts blocks over all KV heads.
    """
    L, L0, rho = _arr(seq_len), _arr(base_len), _arr(sparsity)
    if ((rho <= 0) | (rho >= 1)).any():
        raise ValueError(f"sparsity coefficient must lie in (0, 1), got {sparsity!r}")
    h, b = _arr(num_kv_heads), _arr(block_size)
    out = np.where(L > L0, ((L - L0) * rho + L0) * h / b, np.ceil(L / b) * h)
    return float(out) if out.ndim == 0 else out


# Seed 001 §3.3 (anchor layers) and seed 000 Mechanism 2 (refresh-schedule cost).


def schedule_from_anchors(num_layers: int, anchors) -> np.ndarray:
    """Refresh vector with the given anchor layers (layer 0 is always added)."""
    r = np.zeros(num_layers, dtype=bool)
    a = np.asarray(list(anchors), dtype=int)
    if a.size and ((a < 0) | (a >= num_layers)).any():
        raise ValueError(f"anchor layers must lie in [0, {num_layers}), got {a.tolist()}")
    r[a] = True
    r[0] = True
    return r


def schedule_cost_s(schedule, refresh_layer_s, reuse_layer_s):
    """Attention time of one step under a refresh schedule: ``R T_R + (L - R) T_U``.

    ``schedule`` is the boolean refresh vector (or an int/array count R with L implied by a
    separate call); ``T_R`` and ``T_U`` are per-layer costs (seconds, broadcastable). The
    saving over refreshing every layer is ``(L - R)(T_R - T_U)`` (seed 000). Assumes every
    refresh layer costs the same and every reuse layer costs the same.
    """
    r = np.asarray(schedule, dtype=bool)
    num_refresh = r.sum(axis=-1)
    num_layers = r.shape[-1]
    out = num_refresh * np.asarray(refresh_layer_s) + (num_layers - num_refresh) * np.asarray(
        reuse_layer_s
    )
    return float(out) if np.ndim(out) == 0 else out


def jaccard(a, b) -> float:
    """|A n B| / |A u B| of two boolean masks; 0 for two empty masks (seed 001 eq. 7)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


def adjacent_jaccard(masks) -> np.ndarray:
    """``J(M_l, M_{l-1})`` for each layer of ``masks`` ``[L, N_b]`` (or ``[S, L, N_b]`` for S
    calibration samples, averaged over samples); ``J(M_1, M_0) = 0`` by definition."""
    m = np.asarray(masks, dtype=bool)
    if m.ndim == 2:
        m = m[None]
    if m.ndim != 3:
        raise ValueError(f"masks must be [L, N_b] or [S, L, N_b], got shape {m.shape}")
    inter = np.logical_and(m[:, 1:], m[:, :-1]).sum(-1)
    union = np.logical_or(m[:, 1:], m[:, :-1]).sum(-1)
    j = np.where(union > 0, inter / np.maximum(union, 1), 0.0)
    return np.concatenate([np.zeros(1), j.mean(axis=0)])


def choose_anchor_layers(masks, num_anchors: int) -> np.ndarray:
    """Anchor layers A = TopK_l(1 - J(M_l, M_{l-1})) (seed 001 eq. 8), sorted ascending.

    Layer 0 always wins (its J is 0). Ties go to the lower layer index (stable order).
    """
    j = adjacent_jaccard(masks)
    if not 1 <= num_anchors <= j.size:
        raise ValueError(f"num_anchors must be in 1..{j.size}, got {num_anchors}")
    order = np.argsort(-(1.0 - j), kind="stable")
    return np.sort(order[:num_anchors])


def reuse_source(schedule) -> np.ndarray:
    """For each layer, the refresh layer whose selection it uses: a(l) = max{i in A | i <= l}
    (seed 001 eq. 9; an anchor uses its own retrieval)."""
    r = np.asarray(schedule, dtype=bool)
    idx = np.where(r, np.arange(r.size), -1)
    return np.maximum.accumulate(idx)


# Seed 002: Saguaro sampling and the closed-form SSD speedups.


def saguaro_sampling(p_target, p_draft, num_cached, downweight):
    """Acceptance and bonus-token hit rate under Saguaro sampling sigma_{F,C} (seed 002).

    The draft samples from ``q' ∝ q`` with its top-F probabilities multiplied by C in [0, 1]
    (C = 1 is ordinary sampling). Acceptance is ``sum_x min(p(x), q'(x))``; on rejection the bonus
    token comes from the residual ``∝ max(p - q', 0)``, and the cache hits when it is one of the
    F cached tokens (the draft's top F). Exact for the given distributions; returns
    ``(acceptance, hit_rate_given_rejection)``. Lower C moves residual mass onto the cached
    tokens (higher hit rate) at the price of acceptance.
    """
    p = np.asarray(p_target, dtype=float)
    q = np.asarray(p_draft, dtype=float)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError("p_target and p_draft must be 1-D distributions of the same size")
    for name, d in (("p_target", p), ("p_draft", q)):
        if (d < 0).any() or not np.isclose(d.sum(), 1.0):
            raise ValueError(f"{name} must be a probability vector")
    _check("downweight", downweight, 0, 1)
    if not 1 <= num_cached <= p.size:
        raise ValueError(f"num_cached must be in 1..{p.size}, got {num_cached}")
    top = np.argsort(-q, kind="stable")[:num_cached]
    q2 = q.copy()
    q2[top] *= downweight
    if q2.sum() <= 0:
        raise ValueError("downweight=0 with all draft mass in the cached tokens leaves no draft")
    q2 /= q2.sum()
    acceptance = float(np.minimum(p, q2).sum())
    resid = np.maximum(p - q2, 0.0)
    hit = float(resid[top].sum() / resid.sum()) if resid.sum() > 0 else 1.0
    return acceptance, hit


def ssd_speedups(
    verify_s,
    draft_step_s,
    num_draft_tokens,
    acceptance,
    hit_rate,
    ar_step_s,
    batch_size=1,
    fallback_s=None,
    speculate_s=0.0,
):
    """SSD speedup over SD and over AR for the same target, draft and batch.

    SD: E(a_p) tokens per ``K T_draft + T_v``. SSD: E(a_p) tokens per ``ssd_round_time_s`` with
    the primary as fallback (``fallback_s`` defaults to ``K T_draft``). AR: one token per
    ``ar_step_s``. Returns ``(over_sd, over_ar)``; strictly above 1 over SD whenever the cache
    hits with positive probability and drafting takes time (seed 002, theory section).
    """
    k = num_draft_tokens
    t_draft = k * np.asarray(draft_step_s)
    fb = t_draft if fallback_s is None else fallback_s
    e = expected_tokens_per_round(acceptance, k)
    t_sd = sd_round_time_s(verify_s, t_draft)
    t_ssd = ssd_round_time_s(verify_s, fb, hit_rate, batch_size, speculate_s)
    over_sd = t_sd / t_ssd
    over_ar = (e / t_ssd) * np.asarray(ar_step_s)
    return over_sd, over_ar


# Seed 003: sparse self-speculation and KV offload traffic.


def attention_reduction(num_draft_steps, sparsity_ratio):
    """KV bytes that AR decoding loads for k + 1 tokens over what one SparseSpec round loads:
    ``(k + 1) / (k s + 1)`` -- k sparse draft steps read s T each, one verification reads T
    once for all k + 1 queries. An upper bound: it assumes every draft is accepted."""
    _check_fraction("sparsity_ratio", sparsity_ratio)
    k = np.asarray(num_draft_steps, dtype=float)
    return (k + 1) / (k * np.asarray(sparsity_ratio) + 1)


def self_spec_speedup(num_draft_steps, sparsity_ratio, acceptance, attention_fraction):
    """Speedup of sparse self-speculation over AR decoding of the same model.

    With an AR step normalised to 1 and a fraction f of it spent loading the KV cache: a draft
    step costs ``f s + (1 - f)``, the verification of k + 1 tokens costs about one AR step
    (memory-bound: weights and KV read once). Speedup = ``E(alpha, k) / (k (f s + 1 - f) + 1)``.
    Ignores the verification's extra FLOPs and the scheduler's CPU time (see
    ``delayed_verification``). f = 1 and alpha = 1 recover ``attention_reduction``.
    """
    _check_fraction("attention_fraction", attention_fraction)
    _check_fraction("sparsity_ratio", sparsity_ratio)
    k = np.asarray(num_draft_steps, dtype=float)
    f, s = np.asarray(attention_fraction), np.asarray(sparsity_ratio)
    e = expected_tokens_per_round(acceptance, num_draft_steps)
    return e / (k * (f * s + 1 - f) + 1)


def new_kv_bytes_per_step(batch_size, kv_bytes_per_token_per_layer, num_layers):
    """KV bytes a decode step appends: ``B L kv_bytes_per_token`` (seed 003: 18 MB for
    Qwen3-8B at batch 128)."""
    return (
        np.asarray(batch_size, dtype=float) * kv_bytes_per_token_per_layer * np.asarray(num_layers)
    )


def offload_hidden(num_bytes, pcie_bytes_per_s, step_s):
    """True when the asynchronous offload of ``num_bytes`` finishes within one step, so it
    stays off the critical path (seed 003's dynamic KV manager offloads chunk-wise)."""
    return offload_time_s(num_bytes, pcie_bytes_per_s) <= np.asarray(step_s)


# Seed 004: the speculation budget and the serial DSA path.


def speculation_budget(budget_ratios, speculative_attention_s, selection_s):
    """Largest budget ratio whose speculative attention fits inside the selection window
    (seed 004 §4.4): ``max{rho : T_spec(rho) <= T_sel}``, or None when none fits.
    ``speculative_attention_s`` holds T_spec at each ratio of ``budget_ratios``."""
    r = np.asarray(budget_ratios, dtype=float)
    ok = np.asarray(speculative_attention_s, dtype=float) <= selection_s
    return float(r[ok].max()) if ok.any() else None


def dsa_path_s(selection_s, attention_s):
    """Serial dynamic sparse attention: ``T_sel + T_attn`` (seed 004 §2.1)."""
    return np.asarray(selection_s) + np.asarray(attention_s)
