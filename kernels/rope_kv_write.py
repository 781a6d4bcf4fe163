"""Rotary embedding of q and k with the KV-cache store, one launch: the decoder layer's step
between the fused q/k/v projection and attention.

Row ``(b, i)`` of the projection ``[B, t, (H + 2 Hkv) * D]`` is read once: its cos/sin are
gathered from the tables at ``positions[b, i]`` inside the kernel, q and k heads get the optional
per-head RMSNorm (Qwen3's qk norm; its output rounded to the model dtype, as the torch path's
norm module returns it), then the first ``R = rotary_dim`` dims of each head rotate in fp32 with
``engine.rope.apply_rope``'s pairings (``(x_j, x_{j+R/2})``, or GLM's adjacent ``(x_2j, x_2j+1)``)
and are rounded once. q goes to a new contiguous ``[B, t, H, D]``; k and the raw v go to the
cache ``[B, Hkv, T_max, D]`` at ``slots[b, i]``. A program takes a tile of (row, q or k head)
pairs, ``ROPE_TILE`` elements; the pair of a k head also copies its v head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import check_float_dtype
from ssvkit.kernels.layer_ops import norm_eps, reference_rms_norm

ROPE_TILE = 2048  # elements of a program's ((row, head) pairs x head dims) tile


@triton.jit
def _head_weight(qw_ptr, kw_ptr, cols, mask, is_q):
    """``[heads, cols]`` fp32 norm weights: q's for q heads, k's for k heads."""
    qw = tl.load(qw_ptr + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    kw = tl.load(kw_ptr + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    return tl.where(is_q[:, None], qw, kw)


@triton.jit
def _rope_kv_write_kernel(
    qkv_ptr,  # [B, t, (H + 2 Hkv) * D], last dim contiguous
    cos_ptr,  # [max_pos, HALF] contiguous (fp32; a 16-bit table is read as fp32)
    sin_ptr,
    pos_ptr,  # [B, t] int64
    slot_ptr,  # [B, t] int64
    qw_ptr,  # [D] q-norm weight (QK_NORM)
    kw_ptr,  # [D] k-norm weight (QK_NORM)
    q_ptr,  # [B, t, H, D] contiguous
    k_cache_ptr,  # [B, Hkv, T_max, D], last dim contiguous
    v_cache_ptr,
    NUM_ITEMS,  # B * t * (H + Hkv): (row, q or k head) pairs
    NUM_T,
    stride_xb,
    stride_xt,
    stride_pb,
    stride_pt,
    stride_sb,
    stride_st,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,  # rotary_dim / 2
    HALF_PAD: tl.constexpr,
    PASS_PAD: tl.constexpr,  # padded D - rotary_dim; 1 (masked off) when every dim rotates
    D_PAD: tl.constexpr,
    BLOCK_ITEMS: tl.constexpr,  # (row, head) pairs per program
    INTERLEAVED: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    tl.static_assert(HALF_PAD >= HALF, "HALF_PAD must cover the rotated pairs")
    tl.static_assert(D_PAD >= HEAD_DIM, "D_PAD must cover the head")
    item = tl.program_id(0).to(tl.int64) * BLOCK_ITEMS + tl.arange(0, BLOCK_ITEMS)
    item_ok = item < NUM_ITEMS
    row = item // (NUM_Q_HEADS + NUM_KV_HEADS)  # b * t + i
    heads = (item % (NUM_Q_HEADS + NUM_KV_HEADS)).to(tl.int32)  # q heads, then k heads
    b = row // NUM_T
    i = row % NUM_T
    is_q = heads < NUM_Q_HEADS
    is_k = item_ok & ~is_q
    src = qkv_ptr + (b * stride_xb + i * stride_xt + heads * HEAD_DIM)[:, None]
    j = tl.arange(0, HALF_PAD)
    if INTERLEAVED:  # GLM: adjacent pairs (x_2j, x_2j+1)
        c1 = 2 * j
        c2 = 2 * j + 1
    else:  # rotate half: (x_j, x_j+R/2)
        c1 = j
        c2 = j + HALF
    m = item_ok[:, None] & (j < HALF)[None, :]
    dtype = qkv_ptr.dtype.element_ty
    x1 = tl.load(src + c1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + c2[None, :], mask=m, other=0.0).to(tl.float32)
    cp = 2 * HALF + tl.arange(0, PASS_PAD)  # dims past the rotary ones pass through
    mp = item_ok[:, None] & (cp < HEAD_DIM)[None, :]
    xp = tl.load(src + cp[None, :], mask=mp, other=0.0).to(tl.float32)
    if QK_NORM:
        ss = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1) + tl.sum(xp * xp, 1)
        rstd = tl.math.rsqrt(ss / HEAD_DIM + eps)[:, None]
        w1 = _head_weight(qw_ptr, kw_ptr, c1, j < HALF, is_q)
        w2 = _head_weight(qw_ptr, kw_ptr, c2, j < HALF, is_q)
        wp = _head_weight(qw_ptr, kw_ptr, cp, cp < HEAD_DIM, is_q)
        # The norm's output is rounded to the model dtype before the rotation reads it, as the
        # torch path (an RMSNorm module, then apply_rope) does.
        x1 = (x1 * rstd * w1).to(dtype).to(tl.float32)
        x2 = (x2 * rstd * w2).to(dtype).to(tl.float32)
        xp = (xp * rstd * wp).to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + b * stride_pb + i * stride_pt, mask=item_ok, other=0)
    angle = pos[:, None] * HALF + j[None, :]
    cos = tl.load(cos_ptr + angle, mask=m, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + angle, mask=m, other=0.0).to(tl.float32)
    o1 = (x1 * cos - x2 * sin).to(dtype)
    o2 = (x2 * cos + x1 * sin).to(dtype)
    op = xp.to(dtype)

    q_row = q_ptr + (row * NUM_Q_HEADS + heads)[:, None] * HEAD_DIM
    tl.store(q_row + c1[None, :], o1, mask=m & is_q[:, None])
    tl.store(q_row + c2[None, :], o2, mask=m & is_q[:, None])
    tl.store(q_row + cp[None, :], op, mask=mp & is_q[:, None])

    slot = tl.load(slot_ptr + b * stride_sb + i * stride_st, mask=is_k, other=0)
    kvh = tl.where(is_q, 0, heads - NUM_Q_HEADS)
    k_row = k_cache_ptr + (b * stride_kb + kvh * stride_kh + slot * stride_kt)[:, None]
    k_ty = k_cache_ptr.dtype.element_ty
    tl.store(k_row + c1[None, :], o1.to(k_ty), mask=m & is_k[:, None])
    tl.store(k_row + c2[None, :], o2.to(k_ty), mask=m & is_k[:, None])
    tl.store(k_row + cp[None, :], op.to(k_ty), mask=mp & is_k[:, None])

    # A k head's item also copies its v head (v sits NUM_KV_HEADS heads after it).
    d = tl.arange(0, D_PAD)
    md = is_k[:, None] & (d < HEAD_DIM)[None, :]
    v = tl.load(src + NUM_KV_HEADS * HEAD_DIM + d[None, :], mask=md, other=0.0)
    v_row = v_cache_ptr + (b * stride_vb + kvh * stride_vh + slot * stride_vt)[:, None]
    tl.store(v_row + d[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=md)


def _check_index(name: str, idx: torch.Tensor, bsz: int, t: int, device: torch.device) -> None:
    if idx.shape != (bsz, t) or idx.dtype != torch.int64 or idx.device != device:
        raise ValueError(
            f"{name} must be int64 [{bsz}, {t}] on {device}, got {idx.dtype} "
            f"{tuple(idx.shape)} on {idx.device}"
        )


def _check_rope_tables(cos_table, sin_table, rotary_dim: int, device) -> None:
    for name, tab in (("cos_table", cos_table), ("sin_table", sin_table)):
        check_float_dtype(name, tab)
        if tab.dim() != 2 or tab.shape[1] != rotary_dim // 2:
            raise ValueError(f"{name} must be [max_pos, {rotary_dim // 2}], got {tuple(tab.shape)}")
        if tab.device != device or not tab.is_contiguous():
            raise ValueError(f"{name} must be contiguous on {device}, got {tab.device}")
    if sin_table.shape != cos_table.shape or sin_table.dtype != cos_table.dtype:
        raise ValueError(
            f"sin_table {sin_table.dtype} {tuple(sin_table.shape)} differs from cos_table "
            f"{cos_table.dtype} {tuple(cos_table.shape)}"
        )


def _check_caches(k_cache, v_cache, bsz: int, num_kv_heads: int, head_dim: int, device) -> None:
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_float_dtype(name, c)
        if (
            c.dim() != 4
            or c.shape[0] != bsz
            or c.shape[1] != num_kv_heads
            or c.shape[3] != head_dim
        ):
            raise ValueError(
                f"{name} must be [B={bsz}, Hkv={num_kv_heads}, T_max, D={head_dim}], got "
                f"{tuple(c.shape)}"
            )
        if c.stride(-1) != 1 or c.device != device:
            raise ValueError(f"{name} must have a contiguous last dim on {device}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")


def _check_norm_weights(q_w, k_w, head_dim: int, device) -> bool:
    if (q_w is None) != (k_w is None):
        raise ValueError("q_norm_weight and k_norm_weight must be given together")
    for name, w in (("q_norm_weight", q_w), ("k_norm_weight", k_w)):
        if w is None:
            continue
        check_float_dtype(name, w)
        if w.shape != (head_dim,) or w.device != device or not w.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous [{head_dim}] on {device}, got {tuple(w.shape)} on "
                f"{w.device}"
            )
    return q_w is not None


def rope_kv_write(
    qkv: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    rotary_dim: int,
    interleaved: bool,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Rotate q and k of the fused projection ``qkv``, store k and v in the cache, return q.

    ``qkv`` ``[B, t, (H + 2 Hkv) * D]`` (last dim contiguous) holds q, k, v heads in that order.
    Row ``(b, i)`` is rotated at ``positions[b, i]`` with ``cos_table``/``sin_table``
    ``[max_pos, R / 2]`` (float32 as ``engine.rope.rope_tables`` builds them; 16-bit tables, as
    a model cast wholesale holds, are read as fp32, like the torch path's promotion) on the
    first ``R = rotary_dim`` dims of each head (pairs
    ``(x_j, x_{j+R/2})``, or ``(x_2j, x_2j+1)`` when ``interleaved``), after the per-head RMSNorm
    of q and k when ``q_norm_weight``/``k_norm_weight`` ``[D]`` are given. Its k and v go to
    ``k_cache``/``v_cache`` ``[B, Hkv, T_max, D]`` at position ``slots[b, i]``. ``positions`` and
    ``slots`` are int64 ``[B, t]``. ``validate`` checks their ranges (synchronises the host;
    the engine passes ``False``).

    Returns ``q`` ``[B, t, H, D]`` contiguous in ``qkv.dtype``.
    """
    qk_norm = _check_inputs(
        qkv,
        cos_table,
        sin_table,
        positions,
        k_cache,
        v_cache,
        slots,
        (num_q_heads, num_kv_heads, head_dim, rotary_dim),
        q_norm_weight,
        k_norm_weight,
    )
    bsz, t, dev = qkv.shape[0], qkv.shape[1], qkv.device
    eps = norm_eps(eps)
    if validate:
        max_pos, t_max = cos_table.shape[0], k_cache.shape[2]
        if bool(((positions < 0) | (positions >= max_pos)).any()):
            raise ValueError(f"positions must lie in [0, {max_pos}) (the rope tables' rows)")
        if bool(((slots < 0) | (slots >= t_max)).any()):
            raise ValueError(f"slots must lie in [0, T_max={t_max})")
    q = torch.empty((bsz, t, num_q_heads, head_dim), dtype=qkv.dtype, device=dev)
    if q.numel() == 0:
        return q
    d_pad = triton.next_power_of_2(head_dim)
    half_pad = triton.next_power_of_2(rotary_dim // 2)
    num_items = bsz * t * (num_q_heads + num_kv_heads)
    block = min(triton.next_power_of_2(num_items), max(1, ROPE_TILE // d_pad))
    norm_w = (q_norm_weight, k_norm_weight) if qk_norm else (cos_table, cos_table)  # unread
    _rope_kv_write_kernel[(triton.cdiv(num_items, block),)](
        qkv,
        cos_table,
        sin_table,
        positions,
        slots,
        *norm_w,
        q,
        k_cache,
        v_cache,
        num_items,
        t,
        *qkv.stride()[:2],
        *positions.stride(),
        *slots.stride(),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        eps,
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HALF=rotary_dim // 2,
        HALF_PAD=half_pad,
        PASS_PAD=triton.next_power_of_2(head_dim - rotary_dim) if head_dim > rotary_dim else 1,
        D_PAD=d_pad,
        BLOCK_ITEMS=block,
        INTERLEAVED=interleaved,
        QK_NORM=qk_norm,
        num_warps=4,
    )
    return q


def _check_inputs(
    qkv,
    cos_table,
    sin_table,
    positions,
    k_cache,
    v_cache,
    slots,
    heads,
    q_norm_weight,
    k_norm_weight,
) -> bool:
    """``rope_kv_write``'s checks of its tensors' shapes, dtypes and devices and of ``heads``
    (q heads, KV heads, head dim, rotary dim); True where q and k take their per-head norms."""
    num_q_heads, num_kv_heads, head_dim, rotary_dim = heads
    if num_q_heads < 1 or num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} must be a multiple of num_kv_heads={num_kv_heads}"
        )
    if not (head_dim >= 2 and rotary_dim >= 2 and rotary_dim % 2 == 0 and rotary_dim <= head_dim):
        raise ValueError(f"rotary_dim={rotary_dim} must be even in [2, head_dim={head_dim}]")
    check_float_dtype("qkv", qkv)
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 3 or qkv.shape[2] != width or qkv.stride(2) != 1:
        raise ValueError(
            f"qkv must be [B, t, {width}] with a contiguous last dim, got {tuple(qkv.shape)} "
            f"strides {qkv.stride()}"
        )
    bsz, t, dev = qkv.shape[0], qkv.shape[1], qkv.device
    _check_rope_tables(cos_table, sin_table, rotary_dim, dev)
    _check_index("positions", positions, bsz, t, dev)
    _check_index("slots", slots, bsz, t, dev)
    _check_caches(k_cache, v_cache, bsz, num_kv_heads, head_dim, dev)
    return _check_norm_weights(q_norm_weight, k_norm_weight, head_dim, dev)


def reference_rope_kv_write(
    qkv,
    cos_table,
    sin_table,
    positions,
    *,
    num_q_heads,
    num_kv_heads,
    head_dim,
    rotary_dim,
    interleaved,
    q_norm_weight=None,
    k_norm_weight=None,
    eps=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(q [B, t, H, D], k [B, t, Hkv, D], v [B, t, Hkv, D])`` of :func:`rope_kv_write`
    (k and v are what it stores at the rows' slots), computed without intermediate rounding."""
    b, t, _ = qkv.shape
    h, hkv, d, r = num_q_heads, num_kv_heads, head_dim, rotary_dim
    x = qkv.float().reshape(b, t, h + 2 * hkv, d)
    qk, v = x[:, :, : h + hkv], x[:, :, h + hkv :]
    if q_norm_weight is not None:
        qk = torch.cat(
            (
                reference_rms_norm(qk[:, :, :h], q_norm_weight, eps),
                reference_rms_norm(qk[:, :, h:], k_norm_weight, eps),
            ),
            dim=2,
        )
    cos, sin = cos_table[positions][:, :, None], sin_table[positions][:, :, None]  # [B, t, 1, R/2]
    rot = qk[..., :r]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.split(r // 2, -1)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.stack((o1, o2), -1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)
    qk = torch.cat((out, qk[..., r:]), -1)
    return qk[:, :, :h], qk[:, :, h:], v
