"""Refresh/reuse schedules over layers and anchor-layer choice.

Sources: seed 000 "Core Mechanism 2" (refresh layers recompute the selected blocks, reuse layers
inherit them and run one fused kernel; T_total = R T_R + (L - R) T_U) and seed 001 §3.3
(anchor layers by Jaccard similarity of adjacent layers' retrieval masks, eqs. 7-9).
"""

from __future__ import annotations

import numpy as np


def schedule_every(num_layers: int, refresh_every: int, first_refresh: int = 0) -> np.ndarray:
    """Boolean refresh vector r of length L: layer j refreshes when
    ``(j - first_refresh) % refresh_every == 0`` and j >= first_refresh; layer 0 always
    refreshes (nothing precedes it to reuse)."""
    if num_layers < 1 or refresh_every < 1:
        raise ValueError(
            f"num_layers and refresh_every must be >= 1, got {num_layers}, {refresh_every}"
        )
    j = np.arange(num_layers)
    r = (j >= first_refresh) & ((j - first_refresh) % refresh_every == 0)
    r[0] = True
    return r


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
