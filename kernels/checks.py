"""Input checks shared by the kernel wrappers, each a one-line ``ValueError`` naming the tensor.

``check_*`` read shapes, dtypes, devices and layouts only: no host synchronisation, so they run
on every call, CUDA graphs included. ``validate_*`` read tensor values (they synchronise with
the host) and run only when a wrapper is called with ``validate=True``.
"""

from __future__ import annotations

import torch

# What the element-wise kernels (norms, RoPE, SwiGLU, block scores) take.
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The attention kernels' tl.dot operands; fp32 runs its dots in IEEE fp32 (not TF32), the
# precision that exactness checks use.
GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The interpreter's bf16 tl.dot is broken, so CPU runs take fp16/fp32 only.
CPU_DTYPES = (torch.float16, torch.float32)


def check_float_dtype(name: str, x: torch.Tensor, dtypes=FLOAT_DTYPES) -> None:
    """``x.dtype`` is one of ``dtypes``."""
    if x.dtype not in dtypes:
        raise ValueError(f"{name} dtype {x.dtype} is not supported; use one of {dtypes}")


def check_lens(lens: torch.Tensor, batch: int, device: torch.device, name: str) -> None:
    """``lens`` is an int32 ``[B]`` vector on ``device``."""
    if lens.shape != (batch,) or lens.dtype != torch.int32:
        raise ValueError(f"{name} must be [B={batch}] int32, got {tuple(lens.shape)} {lens.dtype}")
    if lens.device != device:
        raise ValueError(f"{name} must be on {device}, got {lens.device}")


def check_attention_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor
) -> None:
    """``q`` ``[B, t, H, D]`` and contiguous ``[B, Hkv, T_max, D]`` caches of its dtype and
    device (``D`` a power of two in [16, 256], ``H`` a multiple of ``Hkv``), and ``prefix_lens``
    ``[B]`` int32: what the tree-verification ops (dense, sparse, repair) read."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, t, H, D], got shape {tuple(q.shape)}")
    allowed = GPU_DTYPES if q.is_cuda else CPU_DTYPES
    if q.dtype not in allowed:
        raise ValueError(f"q dtype {q.dtype} not supported on {q.device.type}; use {allowed}")
    bsz, _, num_q_heads, head_dim = q.shape
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"q head dim must be a power of two in [16, 256], got {head_dim}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dim() != 4 or x.shape[0] != bsz or x.shape[3] != head_dim:
            raise ValueError(f"{name} must be [B={bsz}, Hkv, T_max, D={head_dim}], got {x.shape}")
        if x.dtype != q.dtype:
            raise ValueError(f"{name} dtype {x.dtype} differs from q dtype {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    if not q.is_contiguous():
        raise ValueError("q must be contiguous")
    num_kv_heads = k_cache.shape[1]
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"q heads {num_q_heads} not a multiple of k_cache heads {num_kv_heads}")
    check_lens(prefix_lens, bsz, q.device, "prefix_lens")


def check_tree_mask(tree_mask: torch.Tensor, bsz: int, t: int, device: torch.device) -> None:
    """A contiguous ``[B, t]`` int64 ancestor bitmask on ``device``."""
    if tree_mask.shape != (bsz, t) or tree_mask.dtype != torch.int64:
        raise ValueError(
            f"tree_mask must be int64 [{bsz}, {t}], got {tree_mask.dtype} {tuple(tree_mask.shape)}"
        )
    if tree_mask.device != device:
        raise ValueError(f"tree_mask is on {tree_mask.device}, q on {device}")
    if not tree_mask.is_contiguous():
        raise ValueError("tree_mask must be contiguous")


def check_block_idx(
    idx: torch.Tensor, name: str, shape: tuple[int, int, int], device: torch.device
) -> None:
    """A contiguous int32 ``[B, Hkv, t, M]`` block-index tensor on ``device``, ``shape`` its
    first three dimensions."""
    if idx.dim() != 4 or tuple(idx.shape[:3]) != shape or idx.dtype != torch.int32:
        want = ", ".join(map(str, shape))
        raise ValueError(f"{name} must be int32 [{want}, M], got {idx.dtype} {tuple(idx.shape)}")
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device}, q on {device}")
    if not idx.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_order(order: torch.Tensor | None, b: int, t: int, device: torch.device) -> None:
    """A contiguous int32 ``[B, t]`` traversal order on ``device``, or None."""
    if order is None:
        return
    if order.shape != (b, t) or order.dtype != torch.int32:
        raise ValueError(
            f"order must be [B={b}, t={t}] int32, got {tuple(order.shape)} {order.dtype}"
        )
    if not order.is_contiguous() or order.device != device:
        raise ValueError(f"order must be contiguous on {device}")


def softmax_scale(sm_scale: float | None, head_dim: int) -> float:
    """An attention call's softmax scale: ``sm_scale``, ``D ** -0.5`` where None; it must be
    positive."""
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    if not scale > 0:
        raise ValueError(f"sm_scale must be > 0, got {sm_scale}")
    return scale


def validate_prefix_lens(prefix_lens: torch.Tensor, t: int, t_max: int) -> None:
    """Every ``prefix_lens[b] + t`` fits a cache of ``t_max`` positions (synchronises)."""
    if bool(((prefix_lens < 0) | (prefix_lens > t_max - t)).any()):
        raise ValueError(f"prefix_lens must lie in [0, T_max - t] = [0, {t_max - t}]")


def validate_block_idx(
    idx: torch.Tensor, name: str, prefix_lens: torch.Tensor, block_size: int
) -> None:
    """Every entry is -1 or a block starting inside its sequence's prefix, and no block repeats
    within a row (synchronises)."""
    if idx.numel() == 0:
        return
    limit = ((prefix_lens.to(torch.int64) + block_size - 1) // block_size).view(-1, 1, 1, 1)
    if bool(((idx < -1) | (idx.to(torch.int64) >= limit)).any()):
        raise ValueError(f"{name} has entries outside [-1, ceil(prefix_lens[b] / block_size))")
    srt = torch.sort(idx, dim=-1).values
    if bool(((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)).any()):
        raise ValueError(f"{name} has a duplicate block index within a row")
