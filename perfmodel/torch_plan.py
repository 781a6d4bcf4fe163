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
latency bound beside the roofline (``perfmodel.calibrated``'s ``t_k``).
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
