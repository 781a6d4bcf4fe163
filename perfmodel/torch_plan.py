"""Launch geometry of the torch kernels some engine ops call, without torch: the serial chains
the calibrated model prices as latency bounds beside the roofline (``perfmodel.class_fit``'s
``t_k``) and as stage counts (its ``t_x``).

``kv_write`` (``engine.cache.KVCache.write``) stores K and V with two advanced-index
assignments, ``kv[rows, :, slots] = k``, each an ATen ``index_put_`` kernel whose threads
store their elements in series (``index_put_steps``, ``kv_write_chain``). Block selection
(``kernels.select_blocks.select_blocks``) scores every block in one Triton kernel; the
committed H100 rows (``calibration/profiles/h100-sxm``) were timed with its top-n in torch
(``kernels.select_reference.topn_from_scores``, the reference of ``kernels.top_blocks``), which
``topn_counts`` prices.
"""

from __future__ import annotations

import numpy as np

# ATen IndexKernel.cu: launch_size_nd threads per block, launch_bound2 elements per thread.
INDEX_THREADS = 128
INDEX_ELEMS_PER_THREAD = 4
KV_WRITE_STORES = 2  # K, then V


def index_put_steps(numel) -> np.ndarray:
    """Elements one thread of an ``index_put_`` kernel over ``numel`` elements stores in series:
    ``min(4, ceil(numel / 128))`` (0 for an empty store).

    The kernel (``IndexKernel.cu``, ``index_elementwise_kernel<nt=128, vt=4>``) runs one
    thread per ``nt`` elements of the value, which walks up to ``vt`` elements **one after
    another**: each step loads the row and slot indices and the value, and stores it, and the
    compiler cannot hoist the next step's loads over the store (they may alias). A small
    write's time is that chain, not its bytes."""
    numel = np.asarray(numel, dtype=float)
    return np.minimum(INDEX_ELEMS_PER_THREAD, np.ceil(numel / INDEX_THREADS))


def kv_write_chain(m, num_kv_heads, head_dim) -> np.ndarray:
    """Serial steps of one ``kv_write`` call of ``m`` rows (batch x tokens): its two stores of
    ``m x Hkv x D`` elements each, run in series."""
    numel = np.asarray(m, dtype=float) * num_kv_heads * head_dim
    return KV_WRITE_STORES * index_put_steps(numel)


def topn_counts(rows, num_blocks, top_n) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts of the top-n stage of one block-selection call over ``rows`` score rows (batch x
    KV heads x query rows) of ``num_blocks`` blocks: the scores ``torch.topk`` scans
    (``rows x num_blocks``), the keys the two sorts order (``rows x top_n``), and one row's
    sort length (``top_n``, a serial walk per row whatever the row count), each priced at a
    fitted rate (``perfmodel.class_fit``'s ``t_x``).

    The stage is ``torch.topk`` over each score row (a radix select that scans the row), which
    returns its ``top_n`` picks sorted, and a ``torch.sort`` of the picked ids: two sorts of
    ``rows`` rows of ``top_n`` keys, by another ATen path above 32 keys (a bitonic sort up to
    32, a warp merge sort up to 128)."""
    rows = np.asarray(rows, dtype=float)
    num_blocks, top_n = np.asarray(num_blocks, dtype=float), np.asarray(top_n, dtype=float)
    return rows * num_blocks, rows * top_n, top_n * np.ones_like(rows)
