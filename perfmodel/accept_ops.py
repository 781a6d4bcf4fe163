"""The engine's accept step after the verify forward, as one op (``verify.accept``): greedy
acceptance of the draft tree, the cut to each sequence's remaining budget, the KV commit of
the kept path, the refresh of the cache's summaries and the packing of the host read -- the
graph ``engine.accept_graph.AcceptGraph.accept`` captures, run every round (an autoregressive
round accepts and commits its one token too).

The triton backend runs it as ``kernels.accept_commit``; the torch backend (and the triton
backend before ``FUSED_ACCEPT_SINCE``, ``perfmodel.strategy``) as some fifty batched torch ops.
Either is a chain of small launches, so it is priced per launch (``accept_launches``, the
engine's counts) and by the bytes it moves (``accept_op``).
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.columns import META_VECTORS, Columns
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import F32, I64, elementwise, kv_token_bytes, local_heads

# The calibrated class of one element-wise launch (its t0: launch and ramp).
ONE_LAUNCH_CLASS = "residual_add"
# Launches of a one-node round's acceptance graph besides the vocabulary pass: the greedy walk,
# the cut to the remaining budget, the commit (indices, gather, scatter, lengths) and the
# packed host read; plus the copies of the graph's two inputs.
BASE_LAUNCHES = 49 + 2
# Launches per tree level of the greedy walk (an ancestor lookup and a logical and).
LEVEL_LAUNCHES = 2
# Launches of the fused step besides the vocabulary pass: ``accept_commit``, plus the copies
# of the graph's two inputs; the move of the kept entries adds one where the tree branches.
FUSED_BASE_LAUNCHES = 1 + 2
FUSED_MOVE_LAUNCHES = 1
# Launches of the compressed tokens' refresh (NSA): the update of every layer and its lengths.
NSA_REFRESH_LAUNCHES = 2


def tree_depths(c: Columns) -> np.ndarray:
    """Per point, the draft tree's depth (0 for an autoregressive round)."""
    return (np.asarray(c.level_sizes) > 0).sum(axis=1).astype(float)


def accept_launches(depth, layers, block_meta, nsa, fused=0.0, branches=0.0) -> np.ndarray:
    """Launches of the accept step: in torch ops (``fused`` 0) ``BASE_LAUNCHES`` and
    ``LEVEL_LAUNCHES`` per tree level; fused (``fused`` 1) ``FUSED_BASE_LAUNCHES`` and
    ``FUSED_MOVE_LAUNCHES`` where the tree ``branches`` (1: a node has two children); either
    way one block-metadata update per layer where the cache keeps block metadata
    (``block_meta``: 1 for mean / quest summaries) and ``NSA_REFRESH_LAUNCHES`` where it keeps
    compressed tokens.

    ``kernels.accept_commit`` runs one program per sequence for the walk, the cut, the lengths
    and the packed read, one launch over the cache's rows for the move of the kept entries
    (none for a chain, whose kept entries already sit in place), and the summaries' refresh.
    The counts are the engine's at temperature 0: ``tests/engine`` counts the ops (and the
    Triton launches) the acceptance graph dispatches on both backends and checks them against
    this function."""
    fused = np.asarray(fused, dtype=float)
    ops = BASE_LAUNCHES + LEVEL_LAUNCHES * np.asarray(depth, dtype=float)
    kernels = FUSED_BASE_LAUNCHES + FUSED_MOVE_LAUNCHES * np.asarray(branches, dtype=float)
    return (
        fused * kernels
        + (1.0 - fused) * ops
        + layers * np.asarray(block_meta, dtype=float)
        + NSA_REFRESH_LAUNCHES * np.asarray(nsa, dtype=float)
    )


def accept_op(model: ModelSpec, c: Columns):
    """The ``verify.accept`` op of every point of ``c``: ``accept_launches`` launches, each a
    call of the calibrated one-launch element-wise class (``ONE_LAUNCH_CLASS``), and the bytes
    the step moves. The commit reads and writes the kept path's ``depth + 1`` KV entries of
    every layer (one gather and one scatter over the cache seen as rows of ``head_dim``: their
    launches do not grow with the cache), with the per-entry indices in torch ops; fused, only
    the move, and only where the tree branches. The walk reads and writes a few int64 per tree
    row; a block-metadata refresh reads the touched block of each layer and writes its fp32
    summaries, the compressed tokens' refresh reads a window of two strides of keys and values.
    The vocabulary pass over the logits is the head's ``verify.sampling``, not counted here."""
    _, hkv = local_heads(model, c.tp)
    layers = model.num_layers
    depth = tree_depths(c)
    kept = c.batch * (depth + 1)  # KV entries per layer each sequence may keep, all sequences
    sparse = np.asarray(c.sparse, dtype=float)
    nsa = sparse * (c.meta_vectors == META_VECTORS["nsa"])
    block_meta = sparse - nsa
    branches = (np.asarray(c.level_sizes) > 1).any(axis=1).astype(float)
    fused = np.asarray(c.fused_accept, dtype=float)
    # The commit's gather and scatter and the per-entry indices they read (torch ops); fused,
    # the move alone, and only where the tree branches.
    move = 2 * kept * layers * kv_token_bytes(model, hkv, c.kv_bytes)
    indices = 2 * kept * layers * (2 * hkv * I64)
    commit = fused * branches * move + (1.0 - fused) * (move + indices)
    # The walk over the tree's rows: tokens, argmax, masks and path, a few int64 per row.
    walk = 16 * c.batch * c.rows * I64
    # A block-metadata refresh reads the touched block's keys and writes its summaries (fp32);
    # the compressed tokens' refresh reads a window of two strides of keys and values.
    head_bytes = hkv * model.head_dim
    meta = block_meta * layers * c.batch * head_bytes * (c.block_size * c.kv_bytes + 2 * F32)
    comp = nsa * layers * c.batch * head_bytes * 2 * (2 * c.comp_stride) * c.kv_bytes
    launches = accept_launches(depth, layers, block_meta, nsa, fused, branches)
    return elementwise(commit + walk + meta + comp, 0 * c.batch, launches, ONE_LAUNCH_CLASS)
