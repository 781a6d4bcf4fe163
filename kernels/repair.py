"""Incremental attention repair (PRR, seed 004 §4.3): fold missed KV blocks into ``(o, lse)``.

Given the attention state of every query row over a predicted block set, and the blocks that
the true selection added (``missed_idx``), one pass over the missed blocks only yields attention
over the union. The state warm-starts the online softmax: ``m = lse``, ``l = 1``, ``acc = o``,
because ``o`` is already normalised by ``exp(lse)``; a row with ``lse = -inf`` starts empty
(``l = 0``, ``acc = 0``). Work and traffic scale with the missed blocks alone.

One program per (draft row, KV head, sequence); the ``G`` query heads of the KV head share the
row's block list and are packed into the MMA rows, so a missed block is read once per row.

Example::

    o, lse = repair(q, k_cache, v_cache, o, lse, missed_idx, prefix_lens=lens, block_size=64)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import (
    check_attention_inputs,
    check_block_idx,
    softmax_scale,
    validate_block_idx,
    validate_prefix_lens,
)
from ssvkit.kernels.dense_verify import (
    LN2_C,
    LOG2E,
    dot_precision,
    online_softmax_step,
)

LOG2E_C = tl.constexpr(LOG2E)


@triton.jit
def _repair_kernel(
    q_ptr,  # [B, t, H, D]
    k_ptr,  # [B, Hkv, T_max, D]
    v_ptr,  # [B, Hkv, T_max, D]
    prefix_lens_ptr,  # [B] int32
    o_in_ptr,  # [B, t, H, D]
    lse_in_ptr,  # [B, H, t] fp32
    idx_ptr,  # [B, Hkv, t, M] int32, -1 = unused slot
    o_ptr,  # [B, t, H, D]
    lse_ptr,  # [B, H, t] fp32
    qk_scale,  # sm_scale * log2(e)
    NUM_T,
    NUM_Q_HEADS,
    NUM_KV_HEADS,
    GROUP,
    T_MAX,
    NUM_SLOTS,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SLOTS_POW2: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
):
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_SIZE % BLOCK_N == 0, "a KV block must be whole tiles")
    tok = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)

    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    head = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    qo_rows = ((b * NUM_T + tok) * NUM_Q_HEADS + head) * HEAD_DIM  # int64
    qo_off = qo_rows[:, None] + offs_d[None, :]
    q = tl.load(q_ptr + qo_off, mask=row_ok[:, None], other=0.0)
    lse_off = (b * NUM_Q_HEADS + head) * NUM_T + tok
    lse_in = tl.load(lse_in_ptr + lse_off, mask=row_ok, other=float("-inf"))

    # Warm start: o is normalised by exp(lse), so (m, l, acc) = (lse, 1, o) in the log2 domain.
    had = lse_in > float("-inf")
    m_i = tl.where(had, lse_in * LOG2E_C, float("-inf"))
    l_i = tl.where(had, 1.0, 0.0)
    o_in = tl.load(o_in_ptr + qo_off, mask=row_ok[:, None], other=0.0).to(tl.float32)
    acc = tl.where(had[:, None], o_in, 0.0)  # an empty row's o may hold anything

    prefix = tl.load(prefix_lens_ptr + b)
    kv_base = (b * NUM_KV_HEADS + kvh) * T_MAX * HEAD_DIM
    idx_base = idx_ptr + ((b * NUM_KV_HEADS + kvh) * NUM_T + tok) * NUM_SLOTS
    # Loop only up to the last used slot: trailing -1 padding costs nothing.
    slots = tl.arange(0, SLOTS_POW2)
    idx_row = tl.load(idx_base + slots, mask=slots < NUM_SLOTS, other=-1)
    num_used = tl.max(tl.where(idx_row >= 0, slots + 1, 0), 0)

    for slot in range(0, num_used):
        blk = tl.load(idx_base + slot)
        for sub in tl.static_range(BLOCK_SIZE // BLOCK_N):
            pos = blk * BLOCK_SIZE + sub * BLOCK_N + offs_n
            # A -1 slot (interior padding) gives negative positions; the tail of a partial last
            # block lies past the prefix: both are masked.
            ok = (pos >= 0) & (pos < prefix)
            kv_off = tl.where(ok, pos, 0)[:, None] * HEAD_DIM + offs_d[None, :]
            k = tl.load(k_ptr + kv_base + kv_off, mask=ok[:, None], other=0.0)
            v = tl.load(v_ptr + kv_base + kv_off, mask=ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(ok[None, :], s, float("-inf"))
            acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2_C, float("-inf"))
    tl.store(o_ptr + qo_off, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + lse_off, lse, mask=row_ok)


def repair(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    missed_idx: torch.Tensor,
    *,
    prefix_lens: torch.Tensor,
    block_size: int,
    sm_scale: float | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold the missed KV blocks into an attention state in one pass (PRR's repair kernel).

    The result equals attention over (the set ``(o, lse)`` was computed on) ∪ (the missed
    blocks), provided the two are disjoint (the caller's contract; not checked).

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]``; bf16/fp16 on CUDA, fp16/fp32 on the CPU interpreter.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]`` contiguous.
    o : torch.Tensor
        ``[B, t, H, D]`` in ``q.dtype``: the normalised output over the previous set.
    lse : torch.Tensor
        ``[B, H, t]`` float32 natural-log LSE of the previous set; ``-inf`` = empty set.
    missed_idx : torch.Tensor
        ``[B, Hkv, t, M]`` int32 committed-prefix block indices, ``-1`` for an unused slot
        (anywhere; a row's trailing ``-1`` slots cost nothing). ``M = 0`` is allowed.
    prefix_lens : torch.Tensor
        ``[B]`` int32: positions ``>= prefix_lens[b]`` of a partial last block are masked.
    block_size : int
        Positions per KV block, a power of two >= 16.
    sm_scale : float, optional
        Softmax scale, default ``D ** -0.5``.
    validate : bool
        Also check index values (range, duplicates within a row): synchronises the host.

    Returns
    -------
    (o_new, lse_new) : tuple of torch.Tensor
        New tensors ``[B, t, H, D]`` in ``o.dtype`` and ``[B, H, t]`` float32.
    """
    _check_inputs(q, k_cache, v_cache, o, lse, missed_idx, prefix_lens, block_size, validate)
    bsz, t, num_q_heads, head_dim = q.shape
    num_kv_heads, t_max = k_cache.shape[1], k_cache.shape[2]
    scale = softmax_scale(sm_scale, head_dim)
    o_new = torch.empty_like(o)
    lse_new = torch.empty_like(lse)
    num_slots = missed_idx.shape[3]
    group = num_q_heads // num_kv_heads
    block_m = max(16, triton.next_power_of_2(group))
    block_n = min(block_size, 64)
    grid = (t, num_kv_heads, bsz)
    _repair_kernel[grid](
        q,
        k_cache,
        v_cache,
        prefix_lens,
        o,
        lse,
        missed_idx,
        o_new,
        lse_new,
        scale * LOG2E,
        t,
        num_q_heads,
        num_kv_heads,
        group,
        t_max,
        num_slots,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_SIZE=block_size,
        SLOTS_POW2=max(16, triton.next_power_of_2(num_slots)),
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
        num_stages=3,
    )
    return o_new, lse_new


def _check_inputs(
    q, k_cache, v_cache, o, lse, missed_idx, prefix_lens, block_size, validate
) -> None:
    """``repair``'s checks of its inputs (the index values too where ``validate``)."""
    check_attention_inputs(q, k_cache, v_cache, prefix_lens)
    bsz, t, num_q_heads, _ = q.shape
    num_kv_heads, t_max = k_cache.shape[1], k_cache.shape[2]
    if o.shape != q.shape or o.dtype != q.dtype or o.device != q.device or not o.is_contiguous():
        raise ValueError(f"o must be contiguous {q.dtype} {tuple(q.shape)} like q, got {o.dtype}")
    want_lse = (bsz, num_q_heads, t)
    if lse.shape != want_lse or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(f"lse must be float32 {want_lse}, got {lse.dtype} {tuple(lse.shape)}")
    if not lse.is_contiguous():
        raise ValueError("lse must be contiguous")
    check_block_idx(missed_idx, "missed_idx", (bsz, num_kv_heads, t), q.device)
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if validate:
        validate_prefix_lens(prefix_lens, 0, t_max)
        validate_block_idx(missed_idx, "missed_idx", prefix_lens, block_size)


def block_positions_mask(
    idx: torch.Tensor, prefix_lens: torch.Tensor, block_size: int, t_max: int
) -> torch.Tensor:
    """``[B, Hkv, t, M]`` block indices -> ``[B, Hkv, t, T_max]`` bool mask of their positions
    inside each sequence's prefix (reference helper)."""
    bsz, num_kv_heads, t, _ = idx.shape
    mask = torch.zeros((bsz, num_kv_heads, t, t_max), dtype=torch.bool, device=idx.device)
    pos = torch.arange(t_max, device=idx.device)
    blk_of_pos = pos // block_size  # [T_max]
    for b in range(bsz):
        in_prefix = pos < int(prefix_lens[b])
        hit = (idx[b][..., :, None] == blk_of_pos).any(dim=-2)  # [Hkv, t, T_max]
        mask[b] = hit & in_prefix
    return mask


def reference_repair(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    missed_idx: torch.Tensor,
    *,
    prefix_lens: torch.Tensor,
    block_size: int,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference of :func:`repair`: attention over the missed blocks, merged with
    ``(o, lse)`` by log-sum-exp weights. Returns fp32 ``o`` ``[B, t, H, D]``, ``lse``
    ``[B, H, t]``."""
    bsz, t, num_q_heads, head_dim = q.shape
    num_kv_heads, t_max = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    visible = block_positions_mask(missed_idx, prefix_lens, block_size, t_max)  # [B, Hkv, t, T]
    visible = visible.repeat_interleave(group, 1)  # [B, H, t, T]
    k = k_cache.float().repeat_interleave(group, 1)  # [B, H, T, D]
    v = v_cache.float().repeat_interleave(group, 1)
    s = torch.einsum("bihd,bhnd->bhin", q.float(), k) * scale
    s = s.masked_fill(~visible, float("-inf"))
    lse_m = torch.logsumexp(s, dim=-1)  # [B, H, t]
    seen_m = torch.isfinite(lse_m)
    p = torch.exp(s - torch.where(seen_m, lse_m, 0.0)[..., None])
    o_m = torch.einsum("bhin,bhnd->bihd", p, v)  # [B, t, H, D]

    lse_prev = lse.float()
    lse_new = torch.logaddexp(lse_prev, lse_m)
    seen = torch.isfinite(lse_new)
    safe = torch.where(seen, lse_new, 0.0)
    w_prev = torch.where(torch.isfinite(lse_prev), torch.exp(lse_prev - safe), 0.0)
    w_m = torch.where(seen_m, torch.exp(lse_m - safe), 0.0)
    o_prev = torch.where(torch.isfinite(lse_prev).transpose(1, 2)[..., None], o.float(), 0.0)
    o_new = w_prev.transpose(1, 2)[..., None] * o_prev + w_m.transpose(1, 2)[..., None] * o_m
    return o_new, torch.where(seen, lse_new, float("-inf"))
