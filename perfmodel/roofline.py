"""Roofline: op time from FLOPs and bytes, and the arithmetic intensity of decode-time ops.

Source: seed 000 "Prerequisites" (arithmetic intensity of dense AR attention, 1/dtype_bytes
counting the QK^T product of one MHA head; of verification with K+1 queries, (K+1)/dtype_bytes)
and the roofline model (Williams, Waterman, Patterson, CACM 2009).
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.sparse import blocks_loaded_per_layer


def op_time_s(flops, bytes_moved, flops_per_s, bytes_per_s, launch_s=0.0, launches=1):
    """``max(FLOPs / rate, bytes / bandwidth) + launches * launch_s``.

    Assumes compute and memory traffic overlap perfectly inside a kernel and that nothing
    overlaps across launches. Ignores caches (``bytes`` are device-memory bytes) and the
    efficiency loss of small launches (calibration fits that).
    """
    f, b = np.asarray(flops, dtype=float), np.asarray(bytes_moved, dtype=float)
    if (f < 0).any() or (b < 0).any():
        raise ValueError("flops and bytes must be >= 0")
    out = np.maximum(f / flops_per_s, b / bytes_per_s) + np.asarray(launches) * launch_s
    return float(out) if out.ndim == 0 else out


def ridge_point(flops_per_s, bytes_per_s):
    """FLOP/byte above which an op is compute-bound."""
    return flops_per_s / bytes_per_s


def attention_intensity(num_query_tokens=1, gqa_group=1, kv_bytes=2, *, count_pv=True):
    """FLOP per KV byte of dense attention when t query tokens share one KV read.

    Per cached token and KV head: K and V (``2 d_h kv_bytes`` bytes) serve ``t G`` query rows,
    each doing ``2 d_h`` FLOPs for QK^T and ``2 d_h`` for PV: ``2 t G / kv_bytes``. With
    ``count_pv=False`` and G = 1 this is seed 000's convention: 1/dtype_bytes for AR decode
    (0.5 FLOP/byte in fp16) and (K + 1)/dtype_bytes for verification of K drafts.
    """
    t, g = np.asarray(num_query_tokens, dtype=float), np.asarray(gqa_group, dtype=float)
    per_row = 4.0 if count_pv else 2.0
    out = per_row * t * g / (2.0 * kv_bytes)
    return float(out) if out.ndim == 0 else out


def sparse_attention_intensity(
    num_query_tokens, top_n, mode, group_size=1, overlap=0.0, gqa_group=1, kv_bytes=2
):
    """FLOP per KV byte of the selected branch: every query attends to n blocks, and the KV
    bytes are the blocks each mode loads (``sparse.blocks_loaded_per_layer``). Per-query
    kernels stay at the AR value 2 G / kv_bytes whatever t is; grouping raises it by 1/f_load.
    """
    t = np.asarray(num_query_tokens, dtype=float)
    loaded = blocks_loaded_per_layer(t, top_n, mode, group_size, overlap)
    return attention_intensity(1, gqa_group, kv_bytes) * t * np.asarray(top_n) / loaded


def gemm_intensity(m, n, k, elem_bytes=2):
    """FLOP per byte of an ``[m, k] x [k, n]`` GEMM reading both operands and writing the
    output once: ``2 m n k / (elem_bytes (m k + k n + m n))``."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    out = 2 * m * n * k / (elem_bytes * (m * k + k * n + m * n))
    return float(out) if out.ndim == 0 else out
