"""Sparse-attention traffic: NSA branches, block metadata, budgets, grouped-query unions.

Sources: seed 000 (NSA's compressed / selected / sliding-window branches; SSV's grouped
execution, union size and load fraction f_load; exact vs approximate modes), seed 001 §3.1
(block retrieval by mean keys; its piecewise budget, eq. 6, is in ``perfmodel.seed_formulas``),
seed 004 A.1 (Quest min/max keys under GQA). All functions broadcast over numpy arrays.
"""

from __future__ import annotations

import numpy as np

MODES = ("per_query", "union", "shared")


def _arr(x):
    return np.asarray(x, dtype=float)


def load_fraction(group_size, overlap):
    """SSV's f_load(C, gamma) = 1/C + (1 - 1/C)(1 - gamma).

    The fraction of the per-query KV-block loads that a group of C queries still issues when it
    loads the union of its selections once (seed 000, "Computing the Expected Verification
    Gain"): the first query brings n blocks, each further query brings the (1 - gamma) n blocks
    it does not share with its neighbour. f_load(4, 0.75) = 0.4375, f_load(4, 0.9) = 0.325.
    Assumes every query selects n blocks and the pairwise overlap gamma is the same for all
    adjacent pairs and not shared further (the union is an upper bound when overlaps nest).
    """
    c, g = _arr(group_size), _arr(overlap)
    if (c < 1).any():
        raise ValueError(f"group_size must be >= 1, got {group_size!r}")
    if ((g < 0) | (g > 1)).any():
        raise ValueError(f"overlap must lie in [0, 1], got {overlap!r}")
    out = 1.0 / c + (1.0 - 1.0 / c) * (1.0 - g)
    return float(out) if out.ndim == 0 else out


def union_blocks(top_n, group_size, overlap, num_blocks=None):
    """Expected size of a group's block union, n (1 + (C - 1)(1 - gamma)) = C n f_load.

    Capped at the number of blocks in the context when ``num_blocks`` is given (a union can
    not exceed the context). Seed 000, Algorithm 1 note.
    """
    u = _arr(top_n) * _arr(group_size) * load_fraction(group_size, overlap)
    if num_blocks is not None:
        u = np.minimum(u, _arr(num_blocks))
    return float(u) if np.ndim(u) == 0 else u


def blocks_loaded_per_layer(num_queries, top_n, mode, group_size=1, overlap=0.0, num_blocks=None):
    """KV blocks one KV head loads for ``num_queries`` verifier queries in one layer.

    ``per_query``: every query loads its own n blocks (t n). ``union`` (exact, NSA semantics
    kept): ceil(t / C) groups each load their union. ``shared`` (approximate): each group loads
    its representative's n blocks. The last group may be smaller than C; it is counted with
    its true size.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    t, c = _arr(num_queries), _arr(group_size)
    n = _arr(top_n) if num_blocks is None else np.minimum(_arr(top_n), _arr(num_blocks))
    if mode == "per_query":
        out = t * n
    else:
        full = np.floor(t / c)
        last = t - full * c
        if mode == "shared":
            out = (full + (last > 0)) * n
        else:
            last_union = union_blocks(n, np.maximum(last, 1), overlap, num_blocks)
            out = full * union_blocks(n, c, overlap, num_blocks) + np.where(
                last > 0, last_union, 0.0
            )
    return float(out) if np.ndim(out) == 0 else out


def nsa_branch_tokens(context_len, top_n, block_size, window, comp_stride):
    """Tokens each NSA branch attends to for one query (seed 000, NSA section).

    Returns ``(compressed, selected, window)``: ``floor(T / stride)`` compressed tokens (0 when
    ``comp_stride`` is 0, i.e. no compressed branch), ``min(n B, T)`` selected raw tokens and
    ``min(w, T)`` window tokens. Ignores overlap between the selected blocks and the window
    (NSA attends to both; each branch has its own softmax).
    """
    T = _arr(context_len)
    s = _arr(comp_stride)
    comp = np.where(s > 0, np.floor(T / np.maximum(s, 1)), 0.0)
    sel = np.minimum(_arr(top_n) * _arr(block_size), T)
    win = np.minimum(_arr(window), T)
    return comp, sel, win


def metadata_bytes(context_len, block_size, num_kv_heads, head_dim, kind="mean", elem_bytes=2):
    """Bytes of block metadata one layer reads to score every block of one sequence.

    ``mean`` keys (001 eq. 5) keep one d_h vector per block and KV head; ``quest`` keeps the
    channel-wise min and max keys (two vectors); ``nsa`` scores the compressed keys, whose cost
    is the compressed branch itself (zero extra here).
    """
    vectors = {"mean": 1, "quest": 2, "nsa": 0}
    if kind not in vectors:
        raise ValueError(f"metadata kind must be mean, quest or nsa, got {kind!r}")
    nb = np.ceil(_arr(context_len) / _arr(block_size))
    return nb * vectors[kind] * _arr(num_kv_heads) * _arr(head_dim) * elem_bytes


def metadata_update_bytes(num_new_tokens, num_kv_heads, head_dim, kind="mean", elem_bytes=2):
    """Bytes to keep metadata current as tokens append: read the new keys, read-modify-write
    the touched block vectors (one block per new token at most)."""
    vectors = {"mean": 1, "quest": 2, "nsa": 0}[kind]
    n, h, d = _arr(num_new_tokens), _arr(num_kv_heads), _arr(head_dim)
    return n * h * d * elem_bytes * (1 + 2 * vectors)


def fits_shared_memory(
    group_size,
    block_size,
    top_n,
    head_dim,
    gqa_group,
    smem_bytes,
    *,
    elem_bytes=2,
    num_stages=2,
    resident_union=False,
    overlap=0.0,
):
    """Whether a group of C queries fits one thread block's shared memory.

    Streaming kernel (ours): ``stages`` K+V tiles of ``block_size x d_h`` plus the Q tile of the
    group's ``C G`` rows. ``resident_union=True`` models SSV's description, where the whole
    union of the group's blocks sits in shared memory at once: ``|union| block_size d_h 2``
    bytes (seed 000, "Group size C must be tuned"). Accumulators live in registers and are not
    counted.
    """
    c, b, d = _arr(group_size), _arr(block_size), _arr(head_dim)
    q_tile = c * _arr(gqa_group) * d * elem_bytes
    if resident_union:
        kv = union_blocks(top_n, c, overlap) * b * d * 2 * elem_bytes
    else:
        kv = num_stages * b * d * 2 * elem_bytes
    need = q_tile + kv
    return need <= _arr(smem_bytes)
