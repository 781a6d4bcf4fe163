"""NSA compressed tokens: one key/value per window of ``comp_block`` prefix tokens.

NSA (Yuan et al., 2025) compresses window ``i`` = tokens ``[i * comp_stride, i * comp_stride +
comp_block)`` of each KV head into one key and value with a learned MLP; this toolkit measures
kernels, not model quality, so it mean-pools the window, a parameter-free stand-in with the same
token count and traffic. Only complete windows of the committed prefix count (``num_compressed``).

Example::

    comp_k, comp_v, comp_lens = compress_kv(k_cache, v_cache, prefix_lens,
                                            comp_block=32, comp_stride=16)
    # ... accept tokens, prefix_lens grows by at most t + 1 ...
    comp_lens = update_compressed_kv(k_cache, v_cache, comp_k, comp_v, comp_lens, prefix_lens,
                                     comp_block=32, comp_stride=16, max_new_tokens=t + 1)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import check_float_dtype, check_lens


@triton.jit
def _compress_kernel(
    k_ptr,  # [L, B, Hkv, T_max, D]
    v_ptr,  # [L, B, Hkv, T_max, D]
    ck_ptr,  # [L, B, Hkv, NC_max, D]
    cv_ptr,  # [L, B, Hkv, NC_max, D]
    start_ptr,  # [B] int32: first window to write
    prefix_ptr,  # [B] int32: prefix lengths, whose complete windows end the range
    new_lens_ptr,  # [B] int32 out: one past the last window written
    stride_kl,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_cl,
    stride_cb,
    stride_ch,
    stride_ct,
    nc_max,
    comp_block,
    comp_stride,
    NUM_KV_HEADS: tl.constexpr,
    BATCH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Grid ``(L * B * Hkv, window tiles)``: mean-pool windows ``[start, end)`` of one layer,
    sequence and KV head, ``end`` the prefix's complete windows (at most ``nc_max``); the
    programs of layer 0, head 0, tile 0 also write ``end`` to ``new_lens``."""
    tl.static_assert(BLOCK_W >= 1, "at least one window per program")
    lbh = tl.program_id(0)
    layer = (lbh // (BATCH * NUM_KV_HEADS)).to(tl.int64)
    b = ((lbh // NUM_KV_HEADS) % BATCH).to(tl.int64)
    h = (lbh % NUM_KV_HEADS).to(tl.int64)
    start = tl.load(start_ptr + b)
    prefix = tl.load(prefix_ptr + b)
    end = tl.where(prefix >= comp_block, (prefix - comp_block) // comp_stride + 1, 0)
    end = tl.minimum(end, nc_max)
    if (lbh < NUM_KV_HEADS * BATCH) & (h == 0) & (tl.program_id(1) == 0):
        tl.store(new_lens_ptr + b, end)
    w = start + tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)  # [BLOCK_W] window ids
    valid = w < end
    offs_d = tl.arange(0, HEAD_DIM)
    tok0 = w.to(tl.int64) * comp_stride
    k_base = k_ptr + layer * stride_kl + b * stride_kb + h * stride_kh
    v_base = v_ptr + layer * stride_kl + b * stride_kb + h * stride_kh
    sum_k = tl.zeros([BLOCK_W, HEAD_DIM], dtype=tl.float32)
    sum_v = tl.zeros([BLOCK_W, HEAD_DIM], dtype=tl.float32)
    for i in range(comp_block):
        off = (tok0 + i)[:, None] * stride_kt + offs_d[None, :]
        sum_k += tl.load(k_base + off, mask=valid[:, None], other=0.0).to(tl.float32)
        sum_v += tl.load(v_base + off, mask=valid[:, None], other=0.0).to(tl.float32)
    c_base = layer * stride_cl + b * stride_cb + h * stride_ch
    c_off = c_base + w.to(tl.int64)[:, None] * stride_ct + offs_d[None, :]
    inv = 1.0 / comp_block
    tl.store(ck_ptr + c_off, (sum_k * inv).to(ck_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(cv_ptr + c_off, (sum_v * inv).to(cv_ptr.dtype.element_ty), mask=valid[:, None])


def num_compressed(prefix_lens: torch.Tensor, comp_block: int, comp_stride: int) -> torch.Tensor:
    """``[B]`` int32 count of complete compression windows in each prefix (on the device): a
    prefix of ``L`` tokens holds ``(L - comp_block) // comp_stride + 1`` of them when
    ``L >= comp_block``, else none. The verification kernels derive the same count from
    ``prefix_lens`` on the device, so they never need it on the host."""
    lens = prefix_lens.to(torch.int64)
    n = torch.div(lens - comp_block, comp_stride, rounding_mode="floor") + 1
    return torch.where(lens >= comp_block, n, torch.zeros_like(n)).to(torch.int32)


def max_compressed(t_max: int, comp_block: int, comp_stride: int) -> int:
    """Capacity ``NC_max`` of the compressed cache for a KV cache of ``t_max`` positions (>= 1,
    so the tensors are never empty)."""
    return max(1, (t_max - comp_block) // comp_stride + 1)


def _check_comp_args(k_cache, v_cache, prefix_lens, comp_block: int, comp_stride: int) -> None:
    if k_cache.dim() not in (4, 5):
        raise ValueError(
            f"k_cache must be [B, Hkv, T_max, D] or [L, B, Hkv, T_max, D], got shape "
            f"{tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("v_cache must have the shape and strides of k_cache")
    check_float_dtype("k_cache", k_cache)
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache dtype {v_cache.dtype} differs from k_cache {k_cache.dtype}")
    if k_cache.stride(-1) != 1:
        raise ValueError("k_cache must have a unit stride in its last (head-dim) dimension")
    d = k_cache.shape[-1]
    if d < 16 or d & (d - 1):
        raise ValueError(f"k_cache head dim must be a power of two >= 16, got {d}")
    check_lens(prefix_lens, k_cache.shape[-4], k_cache.device, "prefix_lens")
    if comp_block < 1:
        raise ValueError(f"comp_block must be >= 1, got {comp_block}")
    if not 1 <= comp_stride <= comp_block:
        raise ValueError(f"comp_stride must be in [1, comp_block], got {comp_stride}")


def _layers(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a leading layer dimension (a view)."""
    return x if x.dim() == 5 else x.unsqueeze(0)


def _launch(
    k_cache, v_cache, comp_k, comp_v, start, prefix_lens, max_windows, comp_block, comp_stride
):
    """One launch over every layer of the (layer-stacked) tensors; returns the new ``[B]``
    window counts the kernel writes."""
    k_cache, v_cache, comp_k, comp_v = map(_layers, (k_cache, v_cache, comp_k, comp_v))
    num_layers, b, hkv, _, d = k_cache.shape
    new_lens = torch.empty_like(prefix_lens)
    block_w = min(16, triton.next_power_of_2(max_windows))
    grid = (num_layers * b * hkv, triton.cdiv(max_windows, block_w))
    _compress_kernel[grid](
        k_cache,
        v_cache,
        comp_k,
        comp_v,
        start,
        prefix_lens,
        new_lens,
        *k_cache.stride()[:4],
        *comp_k.stride()[:4],
        comp_k.shape[-2],
        comp_block,
        comp_stride,
        NUM_KV_HEADS=hkv,
        BATCH=b,
        HEAD_DIM=d,
        BLOCK_W=block_w,
    )
    return new_lens


def compress_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    comp_block: int,
    comp_stride: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean-pool every complete window of the committed prefix into one compressed token.

    Parameters
    ----------
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]`` KV cache (fp16, bf16 or fp32; unit stride in ``D``), or
        ``[L, B, Hkv, T_max, D]``: every layer in one launch.
    prefix_lens : torch.Tensor
        ``[B]`` int32 committed prefix lengths, on the device (never read on the host).
    comp_block : int
        Tokens per compression window (NSA's ``l``).
    comp_stride : int
        Distance between window starts (NSA's ``d``), ``1 <= comp_stride <= comp_block``.

    Returns
    -------
    comp_k, comp_v : torch.Tensor
        ``[(L,) B, Hkv, NC_max, D]`` in the cache dtype, ``NC_max = max_compressed(T_max, ...)``.
        Window ``i`` is the mean of tokens ``[i * comp_stride, i * comp_stride + comp_block)``;
        slots past ``comp_lens[b]`` are zero. NSA learns an MLP here; mean pooling is the
        parameter-free stand-in (same shapes and traffic, no weights).
    comp_lens : torch.Tensor
        ``[B]`` int32 count of complete windows per sequence.
    """
    _check_comp_args(k_cache, v_cache, prefix_lens, comp_block, comp_stride)
    *lead, t_max, d = k_cache.shape
    nc_max = max_compressed(t_max, comp_block, comp_stride)
    comp_k = torch.zeros((*lead, nc_max, d), dtype=k_cache.dtype, device=k_cache.device)
    comp_v = torch.zeros_like(comp_k)
    start = torch.zeros_like(prefix_lens)
    comp_lens = _launch(
        k_cache, v_cache, comp_k, comp_v, start, prefix_lens, nc_max, comp_block, comp_stride
    )
    return comp_k, comp_v, comp_lens


def update_compressed_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    comp_k: torch.Tensor,
    comp_v: torch.Tensor,
    comp_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    comp_block: int,
    comp_stride: int,
    max_new_tokens: int,
) -> torch.Tensor:
    """Compress, in place, the windows completed since ``comp_lens`` by a grown prefix.

    Writes windows ``[comp_lens[b], num_compressed(prefix_lens)[b])`` of ``comp_k``/``comp_v``
    and returns the new ``comp_lens``, in one launch; nothing is read on the host, so it can be
    captured in a CUDA graph. The tensors may carry a leading layer dimension (``[L, B, Hkv,
    ...]``, e.g. views of a cache holding every layer): all layers are updated by the same
    launch. ``max_new_tokens`` bounds how far any prefix grew since ``comp_lens`` was
    computed (``t + 1`` after a verification round); it sizes the grid, ``max_new_tokens //
    comp_stride + 1`` windows per sequence, so a larger growth would leave windows unwritten.

    Parameters
    ----------
    k_cache, v_cache, prefix_lens, comp_block, comp_stride
        As in :func:`compress_kv` (or ``[L, B, Hkv, T_max, D]``); ``prefix_lens`` holds the
        new lengths.
    comp_k, comp_v : torch.Tensor
        ``[B, Hkv, NC_max, D]`` from :func:`compress_kv` (or ``[L, ...]`` matching
        ``k_cache``), updated in place.
    comp_lens : torch.Tensor
        ``[B]`` int32 window counts the compressed cache holds now.
    max_new_tokens : int
        Upper bound on ``prefix_lens - prefix_lens_before`` over the batch.

    Returns
    -------
    torch.Tensor
        ``[B]`` int32 new window counts.
    """
    _check_comp_args(k_cache, v_cache, prefix_lens, comp_block, comp_stride)
    *lead, t_max, d = k_cache.shape
    nc_max = max_compressed(t_max, comp_block, comp_stride)
    expect = (*lead, nc_max, d)
    for name, x in (("comp_k", comp_k), ("comp_v", comp_v)):
        if tuple(x.shape) != expect or x.dtype != k_cache.dtype or x.stride(-1) != 1:
            raise ValueError(f"{name} must be {expect} {k_cache.dtype}, got {tuple(x.shape)}")
    check_lens(comp_lens, prefix_lens.shape[0], k_cache.device, "comp_lens")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    max_windows = min(nc_max, max_new_tokens // comp_stride + 1)
    return _launch(
        k_cache,
        v_cache,
        comp_k,
        comp_v,
        comp_lens,
        prefix_lens,
        max_windows,
        comp_block,
        comp_stride,
    )


def reference_compress_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    comp_block: int,
    comp_stride: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 torch reference of :func:`compress_kv` (``unfold`` + mean, then masked)."""
    t_max = k_cache.shape[2]
    nc_max = max_compressed(t_max, comp_block, comp_stride)
    comp_lens = torch.clamp(num_compressed(prefix_lens, comp_block, comp_stride), max=nc_max)
    out = []
    for x in (k_cache, v_cache):
        full = torch.zeros(*x.shape[:2], nc_max, x.shape[3], device=x.device)
        if t_max >= comp_block:
            pooled = x.float().unfold(2, comp_block, comp_stride).mean(-1)  # [B, Hkv, n, D]
            full[:, :, : pooled.shape[2]] = pooled
        keep = torch.arange(nc_max, device=x.device) < comp_lens[:, None].long()  # [B, NC]
        out.append(full * keep[:, None, :, None])
    return out[0], out[1], comp_lens
