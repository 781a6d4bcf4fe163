"""Input checks of :func:`kernels.nsa_verify.nsa_verify`: shapes and layouts (host only), and
the checks that read tensor values (host synchronisation, ``validate=True`` only)."""

from __future__ import annotations

import torch
from ssvkit.kernels.checks import CPU_DTYPES, check_lens, validate_block_idx, validate_prefix_lens
from ssvkit.kernels.nsa_compress import num_compressed
from ssvkit.kernels.nsa_launch import LaunchPlan, make_plan
from ssvkit.kernels.tree import MAX_TREE_NODES

# The NSA kernels take half precision on the GPU; on the CPU, kernels.checks' rule.
NSA_GPU_DTYPES = (torch.bfloat16, torch.float16)


def check_tensors(
    q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates, block_idx, top_n
) -> None:
    """Shape, dtype, device and layout checks of an NSA call (no tensor values read)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, t, H, D], got shape {tuple(q.shape)}")
    b, t, h, d = q.shape
    allowed = NSA_GPU_DTYPES if q.is_cuda else CPU_DTYPES
    if q.dtype not in allowed:
        raise ValueError(f"q dtype must be one of {allowed} on {q.device.type}, got {q.dtype}")
    if not 1 <= t <= MAX_TREE_NODES:
        raise ValueError(f"q has t={t} rows; 1..{MAX_TREE_NODES} are supported")
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"q head dim must be a power of two in [16, 256], got {d}")
    if k_cache.dim() != 4 or k_cache.shape[0] != b or k_cache.shape[3] != d:
        raise ValueError(f"k_cache must be [B={b}, Hkv, T_max, D={d}], got {tuple(k_cache.shape)}")
    hkv = k_cache.shape[1]
    if h % hkv:
        raise ValueError(f"q heads ({h}) must be a multiple of k_cache KV heads ({hkv})")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("v_cache must have the shape and strides of k_cache")
    if comp_k.dim() != 4 or comp_k.shape[:2] != (b, hkv) or comp_k.shape[3] != d:
        raise ValueError(f"comp_k must be [B={b}, Hkv={hkv}, NC, D={d}], got {tuple(comp_k.shape)}")
    if comp_v.shape != comp_k.shape or comp_v.stride() != comp_k.stride():
        raise ValueError("comp_v must have the shape and strides of comp_k")
    for name, x in (("q", q), ("k_cache", k_cache), ("comp_k", comp_k), ("comp_v", comp_v)):
        if x.dtype != q.dtype or x.device != q.device or x.stride(-1) != 1:
            raise ValueError(f"{name} must be {q.dtype} on {q.device} with a unit last stride")
    check_lens(prefix_lens, b, q.device, "prefix_lens")
    if tree_mask.shape != (b, t) or tree_mask.dtype != torch.int64:
        raise ValueError(
            f"tree_mask must be [B={b}, t={t}] int64, got "
            f"{tuple(tree_mask.shape)} {tree_mask.dtype}"
        )
    if gates.shape != (b, t, h, 3) or not gates.is_floating_point():
        raise ValueError(
            f"gates must be float [B, t, H, 3]=({b}, {t}, {h}, 3), got "
            f"{tuple(gates.shape)} {gates.dtype}"
        )
    if block_idx is not None and (
        block_idx.shape != (b, hkv, t, top_n) or block_idx.dtype != torch.int32
    ):
        raise ValueError(
            f"block_idx must be [B, Hkv, t, top_n]=({b}, {hkv}, {t}, {top_n}) "
            f"int32, got {tuple(block_idx.shape)} {block_idx.dtype}"
        )
    named = (
        ("prefix_lens", prefix_lens),
        ("tree_mask", tree_mask),
        ("gates", gates),
        ("block_idx", block_idx),
    )
    for name, x in named:
        if x is not None and (x.device != q.device or not x.is_contiguous()):
            raise ValueError(f"{name} must be contiguous and on {q.device}")


def check_values(plan, k_cache, prefix_lens, tree_mask, block_idx) -> None:
    """Checks that read tensor values (host synchronisation): ``validate=True`` only."""
    t_max = k_cache.shape[2]
    validate_prefix_lens(prefix_lens, plan.num_t, t_max)
    nc_need = int(num_compressed(prefix_lens, plan.comp_block, plan.comp_stride).max())
    if nc_need > plan.nc_max:
        raise ValueError(
            f"comp_k holds {plan.nc_max} compressed tokens, the prefixes need {nc_need}"
        )
    rows = torch.arange(plan.num_t, device=tree_mask.device)
    self_bit = torch.bitwise_right_shift(tree_mask, rows) & 1
    above = torch.bitwise_right_shift(tree_mask, (rows + 1).clamp(max=MAX_TREE_NODES - 1))
    above = torch.where(rows + 1 >= MAX_TREE_NODES, torch.zeros_like(above), above)
    if bool((self_bit != 1).any()) or bool((above != 0).any()):
        raise ValueError("tree_mask row i must have bit i set and no bit above i")
    if block_idx is not None:
        validate_block_idx(block_idx, "block_idx", prefix_lens, plan.block_size)


def checked_plan(args, block_idx, kw, validate, config) -> LaunchPlan:
    """The launch plan of an NSA call on ``args`` (``q, k_cache, v_cache, prefix_lens,
    tree_mask, comp_k, comp_v, gates``) after the checks of shapes and dtypes, and with
    ``validate`` those that read values (they synchronise with the host)."""
    q, k_cache, _, prefix_lens, tree_mask, comp_k, _, _ = args
    check_tensors(*args, block_idx, kw["top_n"])
    plan = make_plan(q, k_cache, comp_k, config=config, **kw)
    if validate:
        check_values(plan, k_cache, prefix_lens, tree_mask, block_idx)
    return plan
