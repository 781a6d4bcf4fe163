"""Dense tree verification: ``t`` draft queries over the full KV prefix plus the draft tail.

Flash-decoding layout: one program per (query-row tile, KV split, sequence x KV head). The
``G = H / Hkv`` query heads of a KV head times the ``t`` draft rows are packed into the MMA rows
(row ``r`` = draft row ``r // G``, head ``r % G``), so every KV tile is read from memory once per
KV head. Each split writes a partial ``(o, lse)`` in fp32 and :func:`kernels.merge.merge_partials`
combines them; with one split the kernel writes the final output directly. Splits are sized per
sequence inside the kernel from ``prefix_lens``, so the wrapper never reads lengths on the host.

Example::

    o, lse = dense_verify(q, k_cache, v_cache, prefix_lens, ancestor_bitmask(parents))

"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from ssvkit.kernels.checks import (
    check_attention_inputs,
    check_tree_mask,
    softmax_scale,
    validate_prefix_lens,
)
from ssvkit.kernels.device import num_sms, smem_per_sm
from ssvkit.kernels.merge import merge_partials
from ssvkit.kernels.tree import MAX_TREE_NODES
from ssvkit.perfmodel.attention_plan import (
    DEFAULT_DENSE_CONFIG,
    DenseVerifyConfig,
    DenseVerifyPlan,
    choose_dense_splits,
    dense_verify_plan,
)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MAX_TREE_BIT = tl.constexpr(MAX_TREE_NODES - 1)
LN2_C = tl.constexpr(LN2)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for ``dtype``: IEEE fp32 for fp32 (Triton's default on the
    GPU is TF32, 10 mantissa bits), the MMA's own for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


DEFAULT_CONFIG = DEFAULT_DENSE_CONFIG


@triton.jit
def online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile of log2-domain scores ``s`` [BLOCK_M, BLOCK_N] (masked = -inf) and values
    ``v`` [BLOCK_N, D] into the running state."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Guard: a row with nothing visible yet keeps m = -inf; use 0 so exp2 sees -inf - 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _dense_verify_kernel(
    q_ptr,  # [B, t, H, D]
    k_ptr,  # [B, Hkv, T_max, D]
    v_ptr,  # [B, Hkv, T_max, D]
    prefix_lens_ptr,  # [B] int32
    tree_mask_ptr,  # [B, t] int64
    o_ptr,  # final [B, t, H, D] or partial [B, t, H, S, D]; strides below in units of D
    lse_ptr,  # final [B, H, t] or partial [B, t, H, S]
    qk_scale,  # sm_scale * log2(e)
    NUM_T,
    NUM_Q_HEADS,
    NUM_KV_HEADS,
    GROUP,
    T_MAX,
    NUM_SPLITS,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lt,
    stride_lh,
    stride_ls,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
):
    """One (query-row tile, KV split, sequence x KV head) program: the packed rows' online
    softmax over the split's share of the sequence, written as a partial or the final output.

    The split's share is sized from ``prefix_lens`` in device memory: the wrapper takes the
    split count from the cache capacity ``T_max`` and the SM count, and a split past a
    sequence's end does no work and writes ``lse = -inf``. KV tiles wholly inside the committed
    prefix run unmasked in a software-pipelined loop; the at most two tiles that straddle the
    prefix end and the draft tail are masked per position by the tree bitmask in a loop that is
    not pipelined, which would push ``BLOCK_M = 64`` into register spills. ``BLOCK_M`` 16 and 32
    use mma.sync (wgmma needs 64 rows a warpgroup); ``BLOCK_M = 64`` with 4 warps uses wgmma.
    """
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 columns")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs a head dim of at least 16")

    m_tile = tl.program_id(0)
    split = tl.program_id(1)
    bh = tl.program_id(2)
    b = (bh // NUM_KV_HEADS).to(tl.int64)
    kvh = bh % NUM_KV_HEADS

    num_rows = GROUP * NUM_T
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    tok = rows // GROUP  # draft row of each packed row
    head = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    q_rows = (b * NUM_T + tok) * NUM_Q_HEADS + head  # int64
    q_off = q_rows[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, D]

    prefix = tl.load(prefix_lens_ptr + b)
    seq_len = prefix + NUM_T
    # Per-sequence split size: every split of a short sequence still gets an equal share.
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    # Tiles wholly inside the committed prefix are visible to every row: no mask needed.
    full_end = tl.minimum(end, (prefix // BLOCK_N) * BLOCK_N)

    kv_base = (b * NUM_KV_HEADS + kvh) * T_MAX * HEAD_DIM  # int64
    k_base = k_ptr + kv_base
    v_base = v_ptr + kv_base

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    for n0 in range(start, full_end, BLOCK_N):
        kv_off = (n0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_base + kv_off)
        v = tl.load(v_base + kv_off)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    # At most two tiles straddle the prefix end and the draft tail: mask them per position.
    row_bits = tl.load(tree_mask_ptr + b * NUM_T + tok, mask=row_ok, other=0)  # [BLOCK_M] int64
    # Two int32 words: [BLOCK_M, BLOCK_N] int64 shifts would double the masked tile's registers.
    bits_lo = (row_bits & 0xFFFFFFFF).to(tl.int32)
    bits_hi = (row_bits >> 32).to(tl.int32)
    for n0 in tl.range(tl.maximum(start, full_end), end, BLOCK_N, num_stages=1):
        pos = n0 + offs_n
        in_seq = pos < end
        kv_off = pos[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_base + kv_off, mask=in_seq[:, None], other=0.0)
        v = tl.load(v_base + kv_off, mask=in_seq[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        shift = tl.minimum(tl.maximum(pos - prefix, 0), MAX_TREE_BIT)
        word = tl.where((shift < 32)[None, :], bits_lo[:, None], bits_hi[:, None])
        bit = (word >> (shift & 31)[None, :]) & 1
        in_tail = (pos >= prefix) & in_seq
        visible = (pos < prefix)[None, :] | (in_tail[None, :] & (bit != 0))
        s = tl.where(visible, s, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2_C, float("-inf"))
    # Row strides are in units of D so the compiler sees D-aligned rows and vectorises stores.
    o_rows = (b * stride_ob + tok * stride_ot + head * stride_oh + split * stride_os) * HEAD_DIM
    tl.store(
        o_ptr + o_rows[:, None] + offs_d[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    l_rows = b * stride_lb + tok * stride_lt + head * stride_lh + split * stride_ls
    tl.store(lse_ptr + l_rows, lse, mask=row_ok)


def choose_num_splits(
    num_programs: int,
    num_tiles: int,
    slots: int,
    config: DenseVerifyConfig = DEFAULT_CONFIG,
    resident_slots: int | None = None,
) -> int:
    """KV split count: ``perfmodel.attention_plan.choose_dense_splits``."""
    return choose_dense_splits(num_programs, num_tiles, slots, config, resident_slots)


def plan_dense_verify(
    bsz: int,
    t: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    t_max: int,
    device: torch.device,
    num_splits: int | None = None,
    config: DenseVerifyConfig = DEFAULT_CONFIG,
) -> DenseVerifyPlan:
    """The launch plan of a call on ``device`` (``perfmodel.attention_plan.dense_verify_plan``
    with the device's SM count and shared memory)."""
    return dense_verify_plan(
        bsz,
        t,
        num_q_heads,
        num_kv_heads,
        head_dim,
        t_max,
        num_sms(device),
        num_splits,
        config,
        smem_per_sm_bytes=smem_per_sm(device),
    )


def dense_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    validate: bool = True,
    config: DenseVerifyConfig = DEFAULT_CONFIG,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-masked attention of the draft queries over the KV prefix and the draft tail.

    Query row ``i`` of sequence ``b`` sees every committed position ``[0, prefix_lens[b])`` and
    the tail entry ``prefix_lens[b] + j`` when bit ``j`` of ``tree_mask[b, i]`` is set.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]``, ``1 <= t <= 64``; bf16/fp16 on CUDA, fp16/fp32 on the CPU interpreter.
        ``D`` a power of two in ``[16, 256]``.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]`` contiguous, ``H % Hkv == 0``; tail entries at
        ``[prefix_lens[b], prefix_lens[b] + t)``.
    prefix_lens : torch.Tensor
        ``[B]`` int32 on the device, ``0 <= prefix_lens[b] <= T_max - t``.
    tree_mask : torch.Tensor
        ``[B, t]`` int64 ancestor bitmask (:func:`kernels.tree.ancestor_bitmask`).
    sm_scale : float, optional
        Softmax scale, default ``D ** -0.5``.
    num_splits : int, optional
        KV splits; default from :func:`choose_num_splits` with ``T_max`` as the length bound.
    validate : bool
        Also check values (``prefix_lens`` range, tree-mask bits): synchronises the host. The
        engine's hot path passes ``False``; shapes, dtypes and layouts are always checked.
    config : DenseVerifyConfig
        Tile sizes, warps and the split heuristic's knobs.

    Returns
    -------
    (o, lse) : tuple of torch.Tensor
        ``o`` ``[B, t, H, D]`` in ``q.dtype``; ``lse`` ``[B, H, t]`` float32 natural log, ``-inf``
        (with ``o = 0``) for a row that sees nothing.
    """
    _check_inputs(q, k_cache, v_cache, prefix_lens, tree_mask, num_splits, validate)
    bsz, t, num_q_heads, head_dim = q.shape
    num_kv_heads, t_max = k_cache.shape[1], k_cache.shape[2]
    scale = softmax_scale(sm_scale, head_dim)
    plan = plan_dense_verify(
        bsz, t, num_q_heads, num_kv_heads, head_dim, t_max, q.device, num_splits, config
    )
    num_splits = plan.num_splits
    o, lse, o_dst, lse_dst, so, sl = _outputs(q, num_splits)

    grid = (plan.num_m_tiles, num_splits, bsz * num_kv_heads)
    _dense_verify_kernel[grid](
        q,
        k_cache,
        v_cache,
        prefix_lens,
        tree_mask,
        o_dst,
        lse_dst,
        scale * LOG2E,
        t,
        num_q_heads,
        num_kv_heads,
        num_q_heads // num_kv_heads,
        t_max,
        num_splits,
        *so,
        *sl,
        HEAD_DIM=head_dim,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )
    if num_splits > 1:
        merge_partials(o_dst, lse_dst, o_out=o, lse_out=lse.permute(0, 2, 1))
    return o, lse


def _check_inputs(q, k_cache, v_cache, prefix_lens, tree_mask, num_splits, validate) -> None:
    """``dense_verify``'s checks of its inputs (their values too where ``validate``)."""
    check_attention_inputs(q, k_cache, v_cache, prefix_lens)
    bsz, t, _, _ = q.shape
    t_max = k_cache.shape[2]
    if not 1 <= t <= MAX_TREE_NODES:
        raise ValueError(f"q has t={t} draft rows; 1..{MAX_TREE_NODES} are supported")
    if t_max < t:
        raise ValueError(f"k_cache holds T_max={t_max} positions, fewer than t={t}")
    check_tree_mask(tree_mask, bsz, t, q.device)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if validate:
        validate_prefix_lens(prefix_lens, t, t_max)
        if t < MAX_TREE_NODES and bool((tree_mask >> t).ne(0).any()):
            raise ValueError(f"tree_mask has bits set at positions >= t={t}")


def _outputs(q: torch.Tensor, num_splits: int) -> tuple:
    """``o`` and ``lse`` of a ``dense_verify`` call, the buffers its kernel writes (the
    outputs themselves, or fp32 partials per split for the merge) and their strides in the
    kernel's units."""
    bsz, t, num_q_heads, head_dim = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((bsz, num_q_heads, t), dtype=torch.float32, device=q.device)
    if num_splits == 1:
        o_dst, lse_dst = o, lse
        so = (o.stride(0) // head_dim, o.stride(1) // head_dim, o.stride(2) // head_dim, 0)
        sl = (lse.stride(0), lse.stride(2), lse.stride(1), 0)
    else:
        o_dst = torch.empty(
            (bsz, t, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        lse_dst = torch.empty(
            (bsz, t, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
        so = tuple(st // head_dim for st in o_dst.stride()[:4])
        sl = lse_dst.stride()
    return o, lse, o_dst, lse_dst, so, sl


def reference_dense_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    sm_scale: float | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference of :func:`dense_verify` (``num_splits`` is ignored).

    Returns fp32 ``o`` ``[B, t, H, D]`` and ``lse`` ``[B, H, t]``; reads ``prefix_lens`` on the
    host, one sequence at a time.
    """
    del num_splits
    bsz, t, num_q_heads, head_dim = q.shape
    group = num_q_heads // k_cache.shape[1]
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    o = torch.zeros((bsz, t, num_q_heads, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((bsz, num_q_heads, t), float("-inf"), dtype=torch.float32, device=q.device)
    j = torch.arange(t, device=q.device, dtype=torch.int64)
    for b in range(bsz):
        prefix = int(prefix_lens[b])
        k = k_cache[b, :, : prefix + t].float().repeat_interleave(group, 0)  # [H, L, D]
        v = v_cache[b, :, : prefix + t].float().repeat_interleave(group, 0)
        s = torch.einsum("ihd,hnd->hin", q[b].float(), k) * scale  # [H, t, L]
        tail_visible = ((tree_mask[b][:, None] >> j[None, :]) & 1).bool()  # [t, t]
        visible = torch.cat(
            [torch.ones((t, prefix), dtype=torch.bool, device=q.device), tail_visible], dim=1
        )
        s = s.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [H, t]
        seen = torch.isfinite(row_lse)
        p = torch.exp(s - torch.where(seen, row_lse, 0.0)[..., None])
        o[b] = torch.einsum("hin,hnd->ihd", p, v)
        lse[b] = torch.where(seen, row_lse, float("-inf"))
    return o, lse
