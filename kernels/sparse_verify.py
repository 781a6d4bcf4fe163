"""Sparse tree verification with overlap-aware query grouping (seed 000, Algorithm 1).

Each verifier query row attends to its selected prefix blocks plus the draft tail under the tree
mask. Queries are grouped into consecutive runs of ``group_size`` (C) in a traversal ``order``
and one program serves a group of one KV head:

- ``per_query``: C = 1, every query streams its own blocks (the decoding-oriented baseline).
- ``union`` (exact): the group streams the deduplicated union of its members' blocks once; a
  per-block membership bitmask masks each query's rows to its own blocks, so the result equals
  ``per_query``.
- ``shared`` (approx): every member uses the blocks of the group's first query in ``order``.

Kernel layout (H100): the group's C x G query-head rows are packed into the MMA rows
(``M_PAD = max(16, next_pow2(C * G))``), so one K/V tile of ``BLOCK_N = block_size`` tokens
feeds all of them; the score tile gets a per-row mask from the membership bits. The union list
of a (b, kv head, group) is split across ``num_splits`` programs when ``B * Hkv * num_groups``
alone cannot fill the SMs; the last split also attends to the tail, and
``kernels.merge.merge_partials`` combines the fp32 partial ``(o, lse)``. The group plans
(``kernels.group_plan``) say which blocks each program streams.

Traffic model: a (b, kv head, group) program reads ``|union| * block_size * D * 2`` bytes of
K/V (``top_n`` blocks for ``shared``, ``C * top_n`` for ``per_query`` over its C programs),
plus the ``t``-entry tail once per group.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from kernels.checks import (
    check_attention_inputs,
    check_block_idx,
    check_order,
    check_tree_mask,
    validate_block_idx,
    validate_prefix_lens,
)
from kernels.dense_verify import dot_precision
from kernels.device import num_sms
from kernels.group_plan import MODES, GroupPlan, build_group_plan
from kernels.merge import merge_partials
from kernels.tree import MAX_TREE_NODES

MAX_ROWS = 128  # C * G packed rows per program: acc [128, D] fp32 still fits in registers
_LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True, slots=True)
class SparseVerifyConfig:
    """Launch tunables of ``sparse_verify`` (defaults tuned on the H200)."""

    num_warps: int | None = dataclasses.field(
        default=None,
        metadata={"help": "warps per program (None: 4 up to 32 packed rows, else 8)"},
    )
    num_stages: int | None = dataclasses.field(
        default=None,
        metadata={"help": "pipeline depth of the K/V loop (None: 3, or 2 for tiles > 16 KB)"},
    )
    programs_per_sm: int = dataclasses.field(
        default=2, metadata={"help": "programs one SM runs at once: the wave the splits fill"}
    )
    split_overhead: float = dataclasses.field(
        default=0.1,
        metadata={"help": "relative cost of splitting (partials written, a merge launched)"},
    )
    min_blocks_per_split: int = dataclasses.field(
        default=4, metadata={"help": "never split a list of top_n blocks finer than this"}
    )
    max_splits: int = dataclasses.field(default=16, metadata={"help": "upper bound on splits"})
    num_splits: int | None = dataclasses.field(
        default=None, metadata={"help": "force this many splits (None: heuristic)"}
    )

    def __post_init__(self) -> None:
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two <= 16, got {self.num_warps}")
        if self.num_stages is not None and self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1 or None, got {self.num_stages}")
        for name in ("programs_per_sm", "min_blocks_per_split"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_splits < 1:
            raise ValueError(f"max_splits must be >= 1, got {self.max_splits}")
        if not self.split_overhead >= 0.0:
            raise ValueError(f"split_overhead must be >= 0, got {self.split_overhead}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 or None, got {self.num_splits}")


@triton.jit
def _sparse_verify_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    prefix_ptr,
    tree_ptr,
    order_ptr,
    list_ptr,
    mask_ptr,
    count_ptr,
    o_ptr,
    lse_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_xb,
    stride_xh,
    stride_xr,
    stride_os,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_ls,
    stride_lb,
    stride_lh,
    stride_lt,
    qk_scale,
    num_rows,
    list_len,
    num_groups,
    num_splits,
    G: tl.constexpr,
    C: tl.constexpr,
    M_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    T_PAD: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    GROUP_LISTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
):
    tl.static_assert(M_PAD >= 16)  # MMA rows
    tl.static_assert(M_PAD >= C * G)
    tl.static_assert(BLOCK_N >= 16)
    tl.static_assert(T_PAD >= 16)
    NEG_BIG: tl.constexpr = -1.0e30  # finite running-max floor: never exp(-inf - -inf)
    LN2: tl.constexpr = 0.6931471805599453

    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    g = pid // num_splits
    split = pid % num_splits
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)

    # Packed rows: r = c * G + hh  ->  query row order[g * C + c], query head h * G + hh.
    offs_r = tl.arange(0, M_PAD)
    member = offs_r // G
    head = h * G + offs_r % G
    slot = g * C + member
    row_ok = (member < C) & (slot < num_rows)
    if HAS_ORDER:
        qrow = tl.load(order_ptr + b64 * num_rows + slot, mask=row_ok, other=0)
    else:
        qrow = slot
    qrow = tl.where(row_ok, qrow, 0)
    offs_d = tl.arange(0, D)
    q_offs = b64 * stride_qb + qrow.to(tl.int64)[:, None] * stride_qt
    q_offs += head.to(tl.int64)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)  # [M_PAD, D]

    # The list this group streams: its own (union) or its first member's row of block_idx.
    if GROUP_LISTS:
        list_row = g
    else:
        list_row = g * C
        if HAS_ORDER:
            list_row = tl.load(order_ptr + b64 * num_rows + list_row)
    list_base = b64 * stride_xb + h64 * stride_xh + list_row.to(tl.int64) * stride_xr
    if GROUP_LISTS:
        n_list = tl.load(count_ptr + (b64 * tl.num_programs(1) + h64) * num_groups + g)
    else:
        n_list = list_len
    per_split = (n_list + num_splits - 1) // num_splits
    start = split * per_split
    end = tl.minimum(start + per_split, n_list)

    prefix_len = tl.load(prefix_ptr + b).to(tl.int64)
    kv_base = b64 * stride_kb + h64 * stride_kh
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([M_PAD], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([M_PAD], dtype=tl.float32)
    acc = tl.zeros([M_PAD, D], dtype=tl.float32)
    for u in range(start, end):
        blk = tl.load(list_ptr + list_base + u).to(tl.int64)
        pos = blk * BLOCK_N + offs_n  # [BLOCK_N]
        col_ok = (pos >= 0) & (pos < prefix_len)  # a -1 pad is all negative positions
        kv_offs = kv_base + pos[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=col_ok[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_ptr + kv_offs, mask=col_ok[:, None], other=0.0)
        # [M_PAD, BLOCK_N], log2 domain
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if GROUP_LISTS:
            bits = tl.load(mask_ptr + list_base + u)
            # [M_PAD]: did this row's query pick the block (shift clamped: >= 32 is undefined)
            sel = ((bits >> tl.minimum(member, C - 1)) & 1) != 0
            keep = sel[:, None] & col_ok[None, :]
        else:
            keep = row_ok[:, None] & col_ok[None, :]
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if split == num_splits - 1:
        # Draft tail: entries prefix_len + j, visible to a row when bit j of its tree mask is set.
        offs_j = tl.arange(0, T_PAD)
        tail_ok = offs_j < num_rows
        pos = prefix_len + offs_j
        kv_offs = kv_base + pos[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=tail_ok[:, None], other=0.0)  # [T_PAD, D]
        v = tl.load(v_ptr + kv_offs, mask=tail_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M_PAD, T_PAD]
        tree = tl.load(tree_ptr + b64 * num_rows + qrow, mask=row_ok, other=0)  # [M_PAD] int64
        seen = ((tree[:, None] >> offs_j.to(tl.int64)[None, :]) & 1) != 0
        s = tl.where(seen & tail_ok[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * LN2, -float("inf"))
    split64 = split.to(tl.int64)
    o_offs = split64 * stride_os + b64 * stride_ob + qrow.to(tl.int64)[:, None] * stride_ot
    o_offs += head.to(tl.int64)[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr + o_offs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse_offs = split64 * stride_ls + b64 * stride_lb + head.to(tl.int64) * stride_lh
    lse_offs += qrow.to(tl.int64) * stride_lt
    tl.store(lse_ptr + lse_offs, lse, mask=row_ok)


def choose_num_splits(
    cfg: SparseVerifyConfig, programs: int, top_n: int, device: torch.device
) -> int:
    """Splits per group's block list: the count that minimises the waves each list's share
    of the work occupies, ``ceil(programs * s / wave) / s`` with ``wave = programs_per_sm x
    SMs``, charged ``1 + split_overhead`` once split. One full wave is never split further
    (the merge would cost more than it balances), a partial last wave is (``programs`` =
    1.5 waves runs as 3 waves of half lists), and a batch-1 grid is split until it fills
    one wave. At most ``max_splits`` and ``top_n / min_blocks_per_split``."""
    if cfg.num_splits is not None:
        return cfg.num_splits
    wave = cfg.programs_per_sm * num_sms(device)
    most = max(1, min(cfg.max_splits, top_n // cfg.min_blocks_per_split))
    best, best_cost = 1, float(triton.cdiv(programs, wave))
    for s in range(2, most + 1):
        cost = triton.cdiv(programs * s, wave) / s * (1.0 + cfg.split_overhead)
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def _validate_values(
    prefix_lens: torch.Tensor,
    block_idx: torch.Tensor,
    order: torch.Tensor | None,
    t_max: int,
    t: int,
    block_size: int,
) -> None:
    # Host-synchronising checks: only with validate=True, never in the engine's hot path.
    validate_prefix_lens(prefix_lens, t, t_max)
    validate_block_idx(block_idx, "block_idx", prefix_lens, block_size)
    if order is not None:
        ident = torch.arange(t, device=order.device, dtype=order.dtype).expand(order.shape[0], t)
        if not torch.equal(torch.sort(order, dim=-1).values, ident):
            raise ValueError("order must be a permutation of 0..t-1 in every row")


def sparse_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    mode: str = "per_query",
    group_size: int = 1,
    order: torch.Tensor | None = None,
    block_size: int = 64,
    sm_scale: float | None = None,
    validate: bool = True,
    plan: GroupPlan | None = None,
    config: SparseVerifyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each draft row over its selected prefix blocks plus its tree ancestors.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]`` fp16/bf16/fp32, contiguous; ``t <= 64``, ``D`` a power of two.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]``, contiguous, dtype of ``q``; the prefix is ``[0, prefix_lens[b])``
        and the tail ``[prefix_lens[b], prefix_lens[b] + t)``.
    prefix_lens : torch.Tensor
        ``[B]`` int32.
    tree_mask : torch.Tensor
        ``[B, t]`` int64 ancestor-or-self bitmask (``kernels.tree.ancestor_bitmask``).
    block_idx : torch.Tensor
        ``[B, Hkv, t, top_n]`` int32 prefix block ids per query row, ``-1`` pads.
    mode : str
        ``"per_query"``, ``"union"`` (exact) or ``"shared"`` (approx).
    group_size : int
        C, queries per group (consecutive in ``order``).
    order : torch.Tensor or None
        ``[B, t]`` int32 traversal order of the query rows; None is the identity.
    block_size : int
        Tokens per block; a power of two >= 16 (the K/V tile height).
    sm_scale : float or None
        Softmax scale; ``1 / sqrt(D)`` by default.
    validate : bool
        Also check values (index ranges, duplicates, permutation); synchronises with the host.
    plan : GroupPlan or None
        A plan from ``build_group_plan`` for these ``block_idx``/``order`` (e.g. shared by the
        reuse layers of a round); built here when None.
    config : SparseVerifyConfig or None
        Launch tunables.

    Returns
    -------
    o : torch.Tensor
        ``[B, t, H, D]`` in ``q.dtype``; 0 for a row that attended to nothing.
    lse : torch.Tensor
        ``[B, H, t]`` float32 natural-log sum of exp of the scaled scores; ``-inf`` when empty.
    """
    cfg = config or SparseVerifyConfig()
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    check_attention_inputs(q, k_cache, v_cache, prefix_lens)
    b, t, h, d = q.shape
    _, hkv, t_max, _ = k_cache.shape
    if not 1 <= t <= MAX_TREE_NODES:
        raise ValueError(f"q has t={t} rows; 1..{MAX_TREE_NODES} are supported")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    check_tree_mask(tree_mask, b, t, q.device)
    check_block_idx(block_idx, "block_idx", (b, hkv, t), q.device)
    if block_idx.shape[3] < 1:
        raise ValueError("block_idx must have top_n >= 1")
    check_order(order, b, t, q.device)
    g_heads = h // hkv
    c = 1 if mode == "per_query" else min(group_size, t)
    if c * g_heads > MAX_ROWS:
        raise ValueError(f"group_size * (H / Hkv) = {c} * {g_heads} exceeds {MAX_ROWS} packed rows")
    if validate:
        _validate_values(prefix_lens, block_idx, order, t_max, t, block_size)

    if plan is None:
        plan = build_group_plan(block_idx, order, group_size, mode)
    elif (
        plan.mode != mode
        or plan.group_size != c
        or tuple(plan.block_lists.shape[:2]) != (b, hkv)
        or (plan.counts is None and plan.block_lists is not block_idx)
        or (c > 1 and plan.order is not order)
    ):
        raise ValueError(f"plan was built for other inputs (mode={plan.mode}, C={plan.group_size})")
    top_n = block_idx.shape[3]
    group_lists = plan.counts is not None
    num_splits = choose_num_splits(cfg, b * hkv * plan.num_groups, top_n, q.device)

    o = torch.empty_like(q)
    lse = torch.empty((b, h, t), dtype=torch.float32, device=q.device)
    if num_splits == 1:
        o_dst, lse_dst = o, lse
        o_strides = (0, *o.stride()[:3])  # (split, b, t, h)
        lse_strides = (0, *lse.stride())  # (split, b, h, t)
    else:
        # merge_partials' layout: [B, t, H, S, D] and [B, t, H, S].
        o_dst = torch.empty((b, t, h, num_splits, d), dtype=torch.float32, device=q.device)
        lse_dst = torch.empty((b, t, h, num_splits), dtype=torch.float32, device=q.device)
        o_strides = (o_dst.stride(3), *o_dst.stride()[:3])
        ls = lse_dst.stride()
        lse_strides = (ls[3], ls[0], ls[2], ls[1])
    lists = plan.block_lists
    m_pad = max(16, triton.next_power_of_2(c * g_heads))
    # 4 warps hold up to 32 packed rows (acc [32, D] is 32 fp32 registers a thread at D = 128)
    # and stream faster than 8 on the H200; 64 rows and more take 8.
    num_warps = cfg.num_warps or (4 if m_pad <= 32 else 8)
    # Each stage buffers one K and one V tile: 2 x 16 KB at block 64, D = 128 (72 KB smem at
    # 3 stages, 3 programs per SM); bigger tiles keep 2 stages to stay under ~140 KB.
    num_stages = cfg.num_stages or (3 if block_size * d <= 64 * 128 else 2)
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * _LOG2E
    _sparse_verify_kernel[(plan.num_groups * num_splits, hkv, b)](
        q,
        k_cache,
        v_cache,
        prefix_lens,
        tree_mask,
        order if order is not None else prefix_lens,
        lists,
        plan.member_mask if group_lists else lists,
        plan.counts if group_lists else prefix_lens,
        o_dst,
        lse_dst,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        lists.stride(0),
        lists.stride(1),
        lists.stride(2),
        *o_strides,
        *lse_strides,
        scale,
        t,
        lists.shape[3],
        plan.num_groups,
        num_splits,
        G=g_heads,
        C=c,
        M_PAD=m_pad,
        D=d,
        BLOCK_N=block_size,
        T_PAD=max(16, triton.next_power_of_2(t)),
        HAS_ORDER=order is not None and c > 1,
        GROUP_LISTS=group_lists,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1:
        merge_partials(o_dst, lse_dst, o_out=o, lse_out=lse.transpose(1, 2))
    return o, lse


def reference_sparse_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    mode: str = "per_query",
    group_size: int = 1,
    order: torch.Tensor | None = None,
    block_size: int = 64,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch ``sparse_verify``: a per-query masked softmax over ``[0, T_max)``.

    ``per_query`` and ``union`` give every row its own blocks; ``shared`` gives every row the
    blocks of the first member of its group in ``order``.
    """
    b, t, h, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    dev = q.device
    if order is None:
        order = torch.arange(t, device=dev, dtype=torch.int32).expand(b, t)
    order = order.long()
    if mode == "shared":
        c = min(group_size, t)
        inv = torch.argsort(order, dim=1)  # position of each query row in the order
        rep = torch.gather(order, 1, (inv // c) * c)  # [B, t]: its group's first member
        block_idx = torch.gather(
            block_idx, 2, rep.view(b, 1, t, 1).expand(-1, hkv, -1, block_idx.shape[3])
        )
    nb = -(-t_max // block_size)
    sel = torch.zeros((b, hkv, t, nb + 1), dtype=torch.bool, device=dev)
    sel.scatter_(3, torch.where(block_idx < 0, nb, block_idx).long(), True)
    pos = torch.arange(t_max, device=dev)
    allowed = sel[..., :nb].repeat_interleave(block_size, dim=3)[..., :t_max]
    allowed &= (pos < prefix_lens.long().view(b, 1, 1, 1)).view(b, 1, 1, t_max)
    j = pos.view(1, t_max) - prefix_lens.long().view(b, 1)  # [B, T_max] tail index
    in_tail = (j >= 0) & (j < t)
    bit = (tree_mask.view(b, t, 1) >> j.clamp(0, 63).view(b, 1, t_max)) & 1  # [B, t, T_max]
    allowed |= ((bit != 0) & in_tail.view(b, 1, t_max)).view(b, 1, t, t_max)

    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    qf = q.float().view(b, t, hkv, h // hkv, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, t, D]
    s = torch.einsum("bkgtd,bksd->bkgts", qf, k_cache.float()) * scale
    s = s.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, Hkv, G, t]
    p = torch.where(allowed.unsqueeze(2), torch.exp(s - lse.clamp(min=-1e30).unsqueeze(-1)), 0.0)
    o = torch.einsum("bkgts,bksd->bkgtd", p, v_cache.float())
    o = o.permute(0, 3, 1, 2, 4).reshape(b, t, h, d)
    return o, lse.reshape(b, h, t)
