"""Triton kernels for sparse speculative verification, each with an fp32 torch reference.

One op per module (``dense_verify``, ``select_blocks``, ``sparse_verify``, ``nsa_verify``,
``repair``, the layer's element-wise ``layer_ops`` and ``rope_kv_write``, ...): the
``@triton.jit`` code, a thin validating wrapper and a ``reference_*`` function in fp32 torch.
Importing this package does not import torch or triton; the op modules do. Shared layouts:

- ``q`` ``[B, t, H, D]``: the ``t`` draft rows of each sequence; ``o`` like ``q``, ``lse``
  ``[B, H, t]`` float32, natural log, ``-inf`` for a row that attended to nothing (``o`` row 0).
- ``k_cache``, ``v_cache`` ``[B, Hkv, T_max, D]``, contiguous: sequence ``b``'s prefix at
  ``[0, prefix_lens[b])``, its ``t`` draft-tail entries right after; ``prefix_lens`` ``[B]``
  int32 on the device, never read on the host in a hot path.
- Tree mask ``[B, t]`` int64: bit ``j`` of row ``i`` is set when tail entry ``j`` is ``i`` or an
  ancestor of it (``kernels.tree``); block indices ``[B, Hkv, t, top_n]`` int32, ``-1`` pads.
"""
