"""Launch geometry of the torch kernels some engine ops call, without torch.

``kv_write`` (``engine.cache.KVCache.write``) stores K and V with two advanced-index assignments,
``kv[rows, :, slots] = k``: each is one ATen ``index_put_`` kernel (``IndexKernel.cu``,
``index_elementwise_kernel<nt=128, vt=4>``), one thread per ``nt`` elements of the value that
walks up to ``vt`` elements **one after another**: each step loads the row and slot indices, the
value, and stores it, and the compiler cannot hoist the next step's loads over the store (they
may alias). A small write's time is that chain, not its bytes: at 2 KV heads x 64 dims the
measured call takes 8.7 / 10.2 / 11.1 us at 256 / 384 / 512 elements per store (2 / 3 / 4 steps)
and then stays at 11.2 us up to 48K elements (more blocks, not longer chains); the single-row
class, 128 -> 1024 elements: 5.1, 6.0, 8.3, 8.2 us (1, 2, 4, 4 steps)
(``calibration/profiles/h100-sxm/op_sweep.jsonl``). The calibrated model prices the chain as a
latency bound beside the roofline (``perfmodel.class_fit``'s ``t_k``).

Block selection (``kernels.select_blocks.select_blocks``) scores every block in one Triton
kernel. The committed H100 rows (``calibration/profiles/h100-sxm``) were timed with its top-n in
torch (``topn_from_scores``, the reference of the one-launch ``kernels.top_blocks``), and
``topn_counts`` prices that path: ``torch.topk`` over each of the
``R = B x Hkv x t`` score rows of ``NB`` blocks (a radix select that scans the row), which
returns its ``top_n`` picks sorted, and a ``torch.sort`` of the picked ids: two sorts of R rows
of ``top_n`` keys, by another ATen path above 32 keys (a bitonic sort up to 32, a warp merge
sort up to 128). At equal bytes the measured call with top_n = 64 takes 4-5 us more than with
16 at R = 32, 6-7 us at R = 128, 9-13 us at R = 512 and 34-45 us at R = 2048, the same at every
context; at R = 2048 the call's time grows by ~4.5 us per 1K context, ~10x what its metadata
bytes explain (``kernel_bench.jsonl``). ``topn_counts`` gives the stage's three counts, each
priced at a fitted rate (``perfmodel.class_fit``'s ``t_x``).
"""

from __future__ import annotations

import numpy as np

# ATen IndexKernel.cu: launch_size_nd threads per block, launch_bound2 elements per thread.
INDEX_THREADS = 128
INDEX_ELEMS_PER_THREAD = 4
KV_WRITE_STORES = 2  # K, then V


def index_put_steps(numel) -> np.ndarray:
    """Elements one thread of an ``index_put_`` kernel over ``numel`` elements stores in series:
    ``min(4, ceil(numel / 128))`` (0 for an empty store)."""
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
    sort length (``top_n``, a serial walk per row whatever the row count)."""
    rows = np.asarray(rows, dtype=float)
    num_blocks, top_n = np.asarray(num_blocks, dtype=float), np.asarray(top_n, dtype=float)
    return rows * num_blocks, rows * top_n, top_n * np.ones_like(rows)
