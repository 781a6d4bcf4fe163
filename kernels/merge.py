"""Merge split-KV partial attention states (flash-decoding's second pass).

A split ``s`` of a row holds a normalised partial output ``o_s`` and its natural-log
log-sum-exp ``lse_s`` over the keys it saw. The merged row is

    lse = log(sum_s exp(lse_s)),   o = sum_s exp(lse_s - lse) * o_s,

computed with the running maximum subtracted first. A split that saw nothing has
``lse_s = -inf`` and contributes weight 0 whatever its ``o_s`` holds; a row whose splits all saw
nothing gets ``lse = -inf`` and ``o = 0``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.device import num_sms

_MAX_LEAD_DIMS = 3


@triton.jit
def _merge_kernel(
    o_part_ptr,  # [N, S, D] fp32, contiguous
    lse_part_ptr,  # [N, S] fp32, contiguous
    o_ptr,  # [A0, A1, A2, D]; row strides below in units of D (keeps stores vectorised)
    lse_ptr,  # [A0, A1, A2], any strides
    num_rows,
    A1,
    A2,
    NUM_SPLITS,
    stride_o0,
    stride_o1,
    stride_o2,
    stride_l0,
    stride_l1,
    stride_l2,
    HEAD_DIM: tl.constexpr,
    S_PAD: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """``BLOCK_R`` consecutive rows a program: their split LSEs as one ``[BLOCK_R, S_PAD]``
    tile, then their partials ``BLOCK_S`` splits at a time as ``[BLOCK_R, BLOCK_S, D]`` tiles,
    each weighted and summed over its splits."""
    tl.static_assert(S_PAD % BLOCK_S == 0, "S_PAD must be a multiple of BLOCK_S")
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < num_rows
    offs_all = tl.arange(0, S_PAD)
    lse_all = tl.load(
        lse_part_ptr + rows[:, None] * NUM_SPLITS + offs_all[None, :],
        mask=live[:, None] & (offs_all[None, :] < NUM_SPLITS),
        other=float("-inf"),
    )
    m = tl.max(lse_all, 1)
    # Guard: a row no split saw keeps m = -inf; subtracting a finite stand-in avoids -inf - -inf.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l_sum = tl.sum(tl.where(lse_all > float("-inf"), tl.exp(lse_all - m_safe[:, None]), 0.0), 1)

    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        on = live[:, None] & (offs_s[None, :] < NUM_SPLITS)
        part = rows[:, None] * NUM_SPLITS + offs_s[None, :]  # [BLOCK_R, BLOCK_S]
        lse_s = tl.load(lse_part_ptr + part, mask=on, other=float("-inf"))
        w = tl.where(lse_s > float("-inf"), tl.exp(lse_s - m_safe[:, None]), 0.0)
        o_s = tl.load(
            o_part_ptr + part[:, :, None] * HEAD_DIM + offs_d[None, None, :],
            mask=on[:, :, None],
            other=0.0,
        )
        # A zero weight must not let a garbage partial (NaN) through: 0 * NaN = NaN.
        acc += tl.sum(tl.where(w[:, :, None] > 0, w[:, :, None] * o_s, 0.0), 1)

    seen = l_sum > 0
    o = acc / tl.where(seen, l_sum, 1.0)[:, None]
    lse = tl.where(seen, m_safe + tl.log(tl.where(seen, l_sum, 1.0)), float("-inf"))
    a0 = rows // (A1 * A2)
    a1 = (rows // A2) % A1
    a2 = rows % A2
    o_row = (a0 * stride_o0 + a1 * stride_o1 + a2 * stride_o2) * HEAD_DIM
    tl.store(
        o_ptr + o_row[:, None] + offs_d[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=live[:, None],
    )
    tl.store(lse_ptr + a0 * stride_l0 + a1 * stride_l1 + a2 * stride_l2, lse, mask=live)


@triton.jit
def _merge_row_kernel(
    o_part_ptr,  # [N, S, D] fp32, contiguous
    lse_part_ptr,  # [N, S] fp32, contiguous
    o_ptr,  # [A0, A1, A2, D]; row strides below in units of D (keeps stores vectorised)
    lse_ptr,  # [A0, A1, A2], any strides
    A1,
    A2,
    NUM_SPLITS,
    stride_o0,
    stride_o1,
    stride_o2,
    stride_l0,
    stride_l1,
    stride_l2,
    HEAD_DIM: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One row a program: its split LSEs, then its partials ``BLOCK_S`` splits at a time as
    ``[BLOCK_S, D]`` tiles (the merge of few rows, which a program each spreads over the SMs)."""
    tl.static_assert(MAX_SPLITS % BLOCK_S == 0, "MAX_SPLITS must be a multiple of BLOCK_S")
    row = tl.program_id(0).to(tl.int64)
    a0 = row // (A1 * A2)
    a1 = (row // A2) % A1
    a2 = row % A2

    offs_all = tl.arange(0, MAX_SPLITS)
    lse_all = tl.load(
        lse_part_ptr + row * NUM_SPLITS + offs_all,
        mask=offs_all < NUM_SPLITS,
        other=float("-inf"),
    )
    m = tl.max(lse_all, 0)
    # Guard: a row no split saw keeps m = -inf; subtracting a finite stand-in avoids -inf - -inf.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l_sum = tl.sum(tl.exp(lse_all - m_safe), 0)

    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        in_range = offs_s < NUM_SPLITS
        lse_s = tl.load(lse_part_ptr + row * NUM_SPLITS + offs_s, mask=in_range, other=0.0)
        w = tl.where(in_range & (lse_s > float("-inf")), tl.exp(lse_s - m_safe), 0.0)
        o_s = tl.load(
            o_part_ptr + (row * NUM_SPLITS + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=in_range[:, None],
            other=0.0,
        )
        # A zero weight must not let a garbage partial (NaN) through: 0 * NaN = NaN.
        acc += tl.sum(tl.where(w[:, None] > 0, w[:, None] * o_s, 0.0), 0)

    seen = l_sum > 0
    o = acc / tl.where(seen, l_sum, 1.0)
    lse = tl.where(seen, m_safe + tl.log(tl.where(seen, l_sum, 1.0)), float("-inf"))
    tl.store(
        o_ptr + (a0 * stride_o0 + a1 * stride_o1 + a2 * stride_o2) * HEAD_DIM + offs_d,
        o.to(o_ptr.dtype.element_ty),
    )
    tl.store(lse_ptr + a0 * stride_l0 + a1 * stride_l1 + a2 * stride_l2, lse)


# Partial rows (a row's split) one merge program loads at once: ``BLOCK_R`` rows of
# ``BLOCK_S`` splits: one row a program (``_merge_row_kernel``, where rows are fewer than SMs
# can share) would leave most of its threads idle at few splits and launch as many programs as
# rows.
MERGE_TILE_ROWS = 32
MAX_BLOCK_S = 16


def merge_blocks(num_splits: int, num_rows: int, sms: int) -> tuple[int, int, int]:
    """(``S_PAD``, ``BLOCK_S``, ``BLOCK_R``) of a merge of ``num_rows`` rows over
    ``num_splits`` splits on ``sms`` SMs: the splits padded to a power of two, loaded up to
    ``MAX_BLOCK_S`` at a time, and as many rows a program as fill ``MERGE_TILE_ROWS`` partial
    rows, fewer where that would leave SMs without a program (a power of two)."""
    s_pad = max(2, triton.next_power_of_2(num_splits))
    block_s = min(s_pad, MAX_BLOCK_S)
    per_sm = max(1, num_rows // sms)
    spread = 1 << (per_sm.bit_length() - 1)  # the largest power of two <= per_sm
    return s_pad, block_s, max(1, min(MERGE_TILE_ROWS // block_s, spread))


def _as_3d(lead: tuple[int, ...]) -> tuple[int, int, int]:
    return (1,) * (_MAX_LEAD_DIMS - len(lead)) + tuple(lead)


def _strides_3d(x: torch.Tensor, num_lead: int) -> tuple[int, int, int]:
    return (0,) * (_MAX_LEAD_DIMS - num_lead) + tuple(x.stride()[:num_lead])


def merge_partials(
    o_part: torch.Tensor,
    lse_part: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    o_out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``S`` partial attention states per row into one (log-sum-exp weighted).

    Parameters
    ----------
    o_part : torch.Tensor
        ``[*lead, S, D]`` float32, contiguous: normalised partial outputs. ``lead`` has 1 to 3
        dims; ``D`` a power of two.
    lse_part : torch.Tensor
        ``[*lead, S]`` float32, contiguous: natural-log LSE per split, ``-inf`` for a split that
        saw no key (its ``o_part`` entry is then ignored, even if NaN).
    out_dtype : torch.dtype, optional
        dtype of the merged output when ``o_out`` is not given (default float32).
    o_out, lse_out : torch.Tensor, optional
        Destinations ``[*lead, D]`` (unit stride on ``D``, other strides multiples of ``D``)
        and ``[*lead]`` float32 with any strides, e.g. a transposed view, so a caller's layout
        needs no extra copy.

    Returns
    -------
    (o, lse) : tuple of torch.Tensor
        ``[*lead, D]`` and ``[*lead]`` float32; ``lse = -inf`` and ``o = 0`` where every split
        was empty. No host synchronisation.
    """
    o_out, lse_out = _checked_outputs(o_part, lse_part, out_dtype, o_out, lse_out)
    *lead, num_splits, head_dim = o_part.shape
    lead = tuple(lead)

    a0, a1, a2 = _as_3d(lead)
    num_rows = a0 * a1 * a2
    if num_rows == 0:
        return o_out, lse_out
    so = tuple(st // head_dim for st in _strides_3d(o_out, len(lead)))
    sl = _strides_3d(lse_out, len(lead))
    s_pad, block_s, block_r = merge_blocks(num_splits, num_rows, num_sms(o_part.device))
    args = (o_part, lse_part, o_out, lse_out)
    strides = (so[0], so[1], so[2], sl[0], sl[1], sl[2])
    warps = 4 if head_dim <= 128 else 8
    if block_r == 1:
        _merge_row_kernel[(num_rows,)](
            *args,
            a1,
            a2,
            num_splits,
            *strides,
            HEAD_DIM=head_dim,
            MAX_SPLITS=max(MAX_BLOCK_S, s_pad),
            BLOCK_S=block_s,
            num_warps=warps,
        )
    else:
        _merge_kernel[(triton.cdiv(num_rows, block_r),)](
            *args,
            num_rows,
            a1,
            a2,
            num_splits,
            *strides,
            HEAD_DIM=head_dim,
            S_PAD=s_pad,
            BLOCK_S=block_s,
            BLOCK_R=block_r,
            num_warps=warps,
        )
    return o_out, lse_out


def _checked_outputs(o_part, lse_part, out_dtype, o_out, lse_out) -> tuple:
    """``merge_partials``' checks of its partials and destinations; the destinations, new
    ones where not given."""
    if o_part.dim() < 3 or o_part.dim() > _MAX_LEAD_DIMS + 2:
        raise ValueError(f"o_part must be [*lead, S, D] with 1-3 lead dims, got {o_part.shape}")
    *lead, num_splits, head_dim = o_part.shape
    lead = tuple(lead)
    if o_part.dtype != torch.float32 or not o_part.is_contiguous():
        raise ValueError("o_part must be contiguous float32")
    if tuple(lse_part.shape) != (*lead, num_splits):
        raise ValueError(f"lse_part must be {(*lead, num_splits)}, got {tuple(lse_part.shape)}")
    if lse_part.dtype != torch.float32 or not lse_part.is_contiguous():
        raise ValueError("lse_part must be contiguous float32")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"o_part head dim must be a power of two >= 16, got {head_dim}")
    if o_out is None:
        dtype = out_dtype or torch.float32
        o_out = torch.empty((*lead, head_dim), dtype=dtype, device=o_part.device)
    if tuple(o_out.shape) != (*lead, head_dim) or o_out.stride(-1) != 1:
        raise ValueError(f"o_out must be {(*lead, head_dim)} with unit stride on the last dim")
    if any(st % head_dim for st in o_out.stride()[:-1]):
        raise ValueError(f"o_out strides {o_out.stride()[:-1]} must be multiples of D={head_dim}")
    if lse_out is None:
        lse_out = torch.empty(lead, dtype=torch.float32, device=o_part.device)
    if tuple(lse_out.shape) != lead or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out must be float32 {lead}, got {lse_out.dtype} {lse_out.shape}")
    for name, x in (("lse_part", lse_part), ("o_out", o_out), ("lse_out", lse_out)):
        if x.device != o_part.device:
            raise ValueError(f"{name} is on {x.device}, o_part on {o_part.device}")
    return o_out, lse_out


def reference_merge_partials(
    o_part: torch.Tensor, lse_part: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference of :func:`merge_partials` (returns fp32 ``o`` and ``lse``)."""
    lse_part = lse_part.float()
    lse = torch.logsumexp(lse_part, dim=-1)
    seen = torch.isfinite(lse)
    w = torch.exp(lse_part - torch.where(seen, lse, 0.0)[..., None])
    w = torch.where(torch.isfinite(lse_part), w, 0.0)
    o = torch.where(w[..., None] > 0, w[..., None] * o_part.float(), 0.0).sum(-2)
    lse = torch.where(seen, lse, float("-inf"))
    return o, lse
