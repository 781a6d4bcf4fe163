"""Triton kernels for sparse speculative verification, each with an fp32 torch reference.

One op per module: ``dense_verify``, ``select_blocks``, ``sparse_verify``, ``nsa_verify``,
``repair``, and the decoder layer's element-wise ops: ``layer_ops`` (RMSNorm alone or fused with
the residual add, SwiGLU's ``silu_mul``) and ``rope_kv_write``. Each module holds the
``@triton.jit`` code, a thin validating wrapper and a ``reference_*`` function in fp32 torch.

Layout conventions shared by every op (names as in DESIGN.md):

- ``q``: ``[B, t, H, D]`` -- the ``t`` verifier query rows (draft tokens) of each sequence.
- ``k_cache``, ``v_cache``: ``[B, Hkv, T_max, D]``, contiguous. Sequence ``b`` holds its
  committed prefix in positions ``[0, prefix_lens[b])`` and its ``t`` draft-tail entries in
  ``[prefix_lens[b], prefix_lens[b] + t)``.
- ``prefix_lens``: ``[B]`` int32 on the device (never read on the host in a hot path).
- Draft-tail tree mask: ``[B, t]`` int64 ancestor bitmask; bit ``j`` of row ``i`` is set when tail
  entry ``j`` is an ancestor of query ``i`` or ``i`` itself (``kernels.tree``).
- Block indices: ``[B, Hkv, t, top_n]`` int32, ``-1`` pads an unused slot.
- Outputs: ``o`` like ``q``; ``lse`` ``[B, H, t]`` float32, natural log, ``-inf`` for a row that
  attended to nothing (its ``o`` row is then 0).

Importing this package does not import torch or triton; the op modules do.
"""
