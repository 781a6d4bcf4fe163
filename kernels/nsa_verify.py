"""NSA tree verification: compressed, selected and sliding-window branches with gates.

For each draft row ``i`` and query head ``h`` (seed 000, "detailed NSA math"; NSA, Yuan et al.
2025)::

    o = g_c * Attn(q, compressed) + g_s * Attn(q, selected blocks) + g_w * Attn(q, window)

each branch with its own softmax. With ``L = prefix_lens[b]``:

- compressed: the ``num_compressed(L)`` compressed tokens of :mod:`kernels.nsa_compress`; all
  their tokens lie in the committed prefix, so every draft row sees all of them.
- selected: the raw prefix tokens of the ``top_n`` blocks of ``block_size`` tokens in
  ``block_idx[b, h // G, i]`` (one set per KV head and row, shared by its ``G`` query heads).
- window: the last ``window`` prefix tokens (the same span for every row: the tail is at most
  64 tokens, so the window is anchored at the prefix end) plus the draft tail under the ancestor
  bitmask ``tree_mask``.

**Reuse path** (``block_idx`` given, a reuse layer): one launch of ``nsa_fwd_kernel``, one
program per (sequence x KV head, row tile). The ``G`` query heads x the tile's draft rows are
packed into the MMA rows (row ``m`` = draft row ``m // G_PAD``, head ``m % G_PAD``, padded to
>= 16 rows), so every key tile is read once per KV head for all of them. The program runs the
three branches one after the other, each with its own online-softmax state (finite sentinel,
guarded exponentials), and folds each into the gated output in registers as soon as it
finishes: no branch output touches HBM. Only one branch state and the gated output are live at
a time; three live ``BLOCK_M x D`` fp32 states would not fit next to the tiles (the 64 x 128
single pass already takes ~250 registers per thread at 8 warps on sm_90). The selected branch
walks the union of the tile's per-row block lists in ascending block order (SSV's exact merged
schedule): a block listed by several rows is loaded once and each row masks to its own list;
the next block is found from registers, so its tile is prefetched while the current one is
computed on.

When (sequences x KV heads x row tiles) would leave SMs idle, the wrapper splits: each extra
program takes a slice of *one* branch (compressed tiles, a block-id range of the union, window
tiles; slices apportioned by each branch's work), writes its partial ``(m, l, acc)``, and
``nsa_merge_kernel`` merges the partials of each branch separately and gates them: the branches
stay separate until gating, as the math requires. That is two launches instead of one, and
``BLOCK_M x D`` fp32 per program written and read back.

**Refresh path** (``block_idx=None``): (1) the compressed branch alone in split mode (its partial
states are kept), (2) ``block_score_kernel`` merges those states into the softmax normaliser and
maps each compressed token's probability, summed over the ``G`` heads, onto every selection block
its window overlaps (NSA's rule), (3) the top ``top_n`` blocks with the first ``num_sink`` and
last ``num_local`` forced (``torch.topk``: acceptable here, a refresh layer is the minority),
(4) the selected and window branches in split mode, (5) the merge with gating, which reuses the
compressed partials from (1). The indices ``[B, Hkv, t, top_n]`` int32 (ascending, ``-1``
padded) are returned for the following reuse layers. Nothing is read on the host.

:func:`nsa_verify_unfused` is the baseline of issue 3: the three branches launched separately
(the same kernel with one branch enabled, each with the whole split budget and its own merge)
and gated in torch.

Example::

    comp_k, comp_v, _ = compress_kv(k_cache, v_cache, prefix_lens, comp_block=32, comp_stride=16)
    kw = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)
    o, idx = nsa_verify(q, k_cache, v_cache, prefix_lens, mask, comp_k, comp_v, gates, **kw)
    o2, _ = nsa_verify(q2, k2, v2, prefix_lens, mask, ck2, cv2, g2, block_idx=idx, **kw)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import triton

from kernels.nsa_compress import (
    compress_kv,
    num_compressed,
    reference_compress_kv,
    update_compressed_kv,
)
from kernels.nsa_kernels import block_score_kernel, nsa_fwd_kernel, nsa_merge_kernel
from kernels.nsa_reference import reference_nsa_verify
from kernels.tree import MAX_TREE_NODES

__all__ = [
    "NsaVerifyConfig",
    "compress_kv",
    "nsa_verify",
    "nsa_verify_unfused",
    "reference_compress_kv",
    "reference_nsa_verify",
    "update_compressed_kv",
]

LOG2E = 1.4426950408889634
GPU_DTYPES = (torch.bfloat16, torch.float16)
# The interpreter's bf16 tl.dot returns garbage, so CPU runs take fp16/fp32 only.
CPU_DTYPES = (torch.float16, torch.float32)
ALL_BRANCHES = (True, True, True)


@dataclass(frozen=True, slots=True)
class NsaVerifyConfig:
    """Launch parameters of :func:`nsa_verify` (tuning knobs, not semantics)."""

    block_m: int = field(default=64, metadata={"help": "most packed MMA rows per program"})
    block_n: int = field(
        default=64, metadata={"help": "keys per tile (compressed, window; selected sub-tile)"}
    )
    block_j: int = field(default=64, metadata={"help": "selection blocks scored per program"})
    num_warps: int = field(default=0, metadata={"help": "warps per program; 0 = by tile size"})
    num_stages: int = field(default=2, metadata={"help": "software-pipeline depth of loads"})
    num_splits: int = field(
        default=0,
        metadata={"help": "programs per (seq, KV head, row tile), shared by the branches (at "
                  "least 3 when > 1); 0 = enough to fill the SMs, 1 = single fused pass"},
    )  # fmt: skip
    ctas_per_sm: int = field(default=1, metadata={"help": "resident programs per SM assumed"})
    max_splits: int = field(default=64, metadata={"help": "upper bound on programs per tile"})
    expected_overlap: float = field(
        default=0.7, metadata={"help": "row-to-row block overlap assumed to apportion splits"}
    )

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_j"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        if self.num_warps not in (0, 1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 0 or a power of two <= 16, got {self.num_warps}")
        for name in ("num_stages", "ctas_per_sm", "max_splits"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_splits < 0:
            raise ValueError(f"num_splits must be >= 0, got {self.num_splits}")
        if not 0.0 <= self.expected_overlap <= 1.0:
            raise ValueError(f"expected_overlap must be in [0, 1], got {self.expected_overlap}")


DEFAULT_CONFIG = NsaVerifyConfig()


@dataclass(frozen=True, slots=True)
class _Plan:
    """Shapes, semantics and launch geometry of one call, all known on the host."""

    batch: int
    num_t: int
    num_kv_heads: int
    group: int
    group_pad: int
    head_dim: int
    nc_max: int
    nb_max: int
    top_n: int
    block_size: int
    window: int
    comp_block: int
    comp_stride: int
    num_sink: int
    num_local: int
    qk_scale: float
    block_m: int
    num_tiles: int
    block_n: int
    block_j: int
    num_warps: int
    num_stages: int
    dot_precision: str

    def rows_meta(self) -> dict:
        """Constexprs of the row packing, shared by the three kernels."""
        return dict(
            NUM_KV_HEADS=self.num_kv_heads,
            GROUP=self.group,
            GROUP_PAD=self.group_pad,
            HEAD_DIM=self.head_dim,
            BLOCK_M=self.block_m,
        )


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check_tensors(q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates,
                   block_idx, top_n) -> None:  # fmt: skip
    if q.dim() != 4:
        raise ValueError(f"q must be [B, t, H, D], got shape {tuple(q.shape)}")
    b, t, h, d = q.shape
    allowed = GPU_DTYPES if q.is_cuda else CPU_DTYPES
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
    if prefix_lens.shape != (b,) or prefix_lens.dtype != torch.int32:
        raise ValueError(f"prefix_lens must be [B={b}] int32, got {tuple(prefix_lens.shape)} "
                         f"{prefix_lens.dtype}")  # fmt: skip
    if tree_mask.shape != (b, t) or tree_mask.dtype != torch.int64:
        raise ValueError(f"tree_mask must be [B={b}, t={t}] int64, got "
                         f"{tuple(tree_mask.shape)} {tree_mask.dtype}")  # fmt: skip
    if gates.shape != (b, t, h, 3) or not gates.is_floating_point():
        raise ValueError(f"gates must be float [B, t, H, 3]=({b}, {t}, {h}, 3), got "
                         f"{tuple(gates.shape)} {gates.dtype}")  # fmt: skip
    if block_idx is not None and (
        block_idx.shape != (b, hkv, t, top_n) or block_idx.dtype != torch.int32
    ):
        raise ValueError(f"block_idx must be [B, Hkv, t, top_n]=({b}, {hkv}, {t}, {top_n}) "
                         f"int32, got {tuple(block_idx.shape)} {block_idx.dtype}")  # fmt: skip
    named = (("prefix_lens", prefix_lens), ("tree_mask", tree_mask), ("gates", gates),
             ("block_idx", block_idx))  # fmt: skip
    for name, x in named:
        if x is not None and (x.device != q.device or not x.is_contiguous()):
            raise ValueError(f"{name} must be contiguous and on {q.device}")


def _make_plan(q, k_cache, comp_k, *, top_n, block_size, window, comp_block, comp_stride,
               num_sink, num_local, sm_scale, config: NsaVerifyConfig) -> _Plan:  # fmt: skip
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if comp_block < 1:
        raise ValueError(f"comp_block must be >= 1, got {comp_block}")
    if not 1 <= comp_stride <= comp_block:
        raise ValueError(f"comp_stride must be in [1, comp_block={comp_block}], got {comp_stride}")
    if num_sink < 0 or num_local < 0 or num_sink + num_local > top_n:
        raise ValueError(f"num_sink ({num_sink}) and num_local ({num_local}) must be >= 0 and "
                         f"sum to at most top_n ({top_n})")  # fmt: skip
    if sm_scale is not None and not sm_scale > 0:
        raise ValueError(f"sm_scale must be > 0, got {sm_scale}")
    b, t, h, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    group_pad = triton.next_power_of_2(h // hkv)
    if group_pad > config.block_m:
        raise ValueError(f"config.block_m ({config.block_m}) must hold a head group ({h // hkv})")
    block_m = max(16, min(config.block_m, triton.next_power_of_2(t * group_pad)))
    return _Plan(
        batch=b, num_t=t, num_kv_heads=hkv, group=h // hkv, group_pad=group_pad, head_dim=d,
        nc_max=comp_k.shape[2], nb_max=triton.cdiv(t_max, block_size), top_n=top_n,
        block_size=block_size, window=window, comp_block=comp_block, comp_stride=comp_stride,
        num_sink=num_sink, num_local=num_local,
        qk_scale=(sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E,
        block_m=block_m, num_tiles=triton.cdiv(t, block_m // group_pad), block_n=config.block_n,
        block_j=config.block_j,
        # sm_90 compiles: with 4 warps, 64 x 128 spills (two BLOCK_M x D fp32 accumulators) and
        # so does 16 x 128 (the selected branch's prefetched K/V tile); 64 x 64 fits.
        num_warps=config.num_warps or (4 if block_m * d <= 64 * 64 and d <= 64 else 8),
        num_stages=config.num_stages,
        dot_precision="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip


def _check_values(plan: _Plan, k_cache, prefix_lens, tree_mask, block_idx) -> None:
    """Checks that read tensor values (host synchronisation): ``validate=True`` only."""
    t_max = k_cache.shape[2]
    lens = prefix_lens.long()
    if bool(((lens < 0) | (lens + plan.num_t > t_max)).any()):
        raise ValueError(f"prefix_lens must be in [0, T_max - t] = [0, {t_max - plan.num_t}]")
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
        nb = torch.div(lens + plan.block_size - 1, plan.block_size, rounding_mode="floor")
        idx = block_idx.long()
        if bool(((idx < -1) | (idx >= nb.view(-1, 1, 1, 1))).any()):
            raise ValueError("block_idx entries must be -1 or a block of the prefix")
        srt = torch.sort(idx, dim=-1).values
        if bool(((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)).any()):
            raise ValueError("block_idx has a duplicate block in a row")


def _num_splits(plan: _Plan, device: torch.device, config: NsaVerifyConfig) -> int:
    """Programs per (sequence, KV head, row tile): enough to fill the SMs, 1 when the grid
    already (nearly) does, since a split pays for a second launch and for writing and reading
    back ``BLOCK_M x D`` fp32 partials."""
    if config.num_splits:
        return config.num_splits
    if device.type != "cuda":
        return 1  # the interpreter gains nothing from more programs
    programs = plan.batch * plan.num_kv_heads * plan.num_tiles
    index = device.index if device.index is not None else torch.cuda.current_device()
    capacity = _num_sms(index) * config.ctas_per_sm
    # Floor: a grid that already fills most of a wave (B = 16, Hkv = 8 on 132 SMs) stays a
    # single fused pass rather than paying the merge for the last few SMs.
    return max(1, min(config.max_splits, capacity // programs))


def _apportion(plan: _Plan, total: int, config: NsaVerifyConfig) -> tuple[int, int, int]:
    """Split ``total`` programs over (compressed, selected, window) by each branch's work in
    key tokens, at least one each. The selected branch's union is estimated with
    ``config.expected_overlap``; the kernel walks the true union, this only balances slices."""
    rows = min(plan.num_t, plan.block_m // plan.group_pad)
    union_blocks = plan.top_n * (1 + (rows - 1) * (1.0 - config.expected_overlap))
    works = (
        plan.nc_max,
        min(union_blocks, plan.nb_max) * plan.block_size,
        min(plan.window, plan.nb_max * plan.block_size) + plan.num_t,
    )
    c, s, w = (max(1, round(max(total, 3) * x / sum(works))) for x in works)
    return c, s, w


def _only(splits: tuple[int, int, int], branches: tuple[bool, bool, bool]) -> tuple[int, ...]:
    return tuple(n if on else 0 for n, on in zip(splits, branches, strict=True))


def _alloc_partials(plan: _Plan, num_slots: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    lead = (plan.batch * plan.num_kv_heads, plan.num_tiles, num_slots)
    return (
        torch.empty((*lead, plan.block_m, plan.head_dim), dtype=torch.float32, device=device),
        torch.empty((*lead, 2, plan.block_m), dtype=torch.float32, device=device),  # m, l
    )


def _launch_fwd(plan: _Plan, args, block_idx, o, part, *, branches, splits, slot_base=0,
                apply_gates=True) -> None:  # fmt: skip
    """One ``nsa_fwd_kernel`` launch: a single pass into ``o`` (``part`` None) or a split."""
    q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates = args
    c_s, s_s, w_s = _only(splits, branches)
    split = part is not None
    part_acc, part_ml = part if split else (q, q)  # unused pointers in a single pass
    o = o if o is not None else q  # unused pointer when split
    idx = block_idx if block_idx is not None else prefix_lens  # unused without the selection
    grid = (plan.batch * plan.num_kv_heads, plan.num_tiles, c_s + s_s + w_s if split else 1)
    nsa_fwd_kernel[grid](
        q, k_cache, v_cache, comp_k, comp_v, gates, idx, tree_mask, prefix_lens, o, part_acc,
        part_ml, *q.stride()[:3], *o.stride()[:3], *k_cache.stride()[:3], *comp_k.stride()[:3],
        plan.num_t, plan.nc_max, plan.window, plan.comp_block, plan.comp_stride, plan.qk_scale,
        c_s, s_s, w_s, slot_base, part_ml.shape[2] if split else 1,
        BLOCK_N=plan.block_n, BLOCK_N_SEL=min(plan.block_size, plan.block_n), TOP_N=plan.top_n,
        TOP_N_PAD=triton.next_power_of_2(plan.top_n), BLOCK_SIZE=plan.block_size,
        HAS_COMP=branches[0], HAS_SEL=branches[1], HAS_WIN=branches[2], SPLIT=split,
        APPLY_GATES=apply_gates, DOT_PRECISION=plan.dot_precision, **plan.rows_meta(),
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )  # fmt: skip


def _launch_merge(plan: _Plan, part, gates, o, splits, *, apply_gates=True) -> None:
    part_acc, part_ml = part
    nsa_merge_kernel[(plan.batch * plan.num_kv_heads, plan.num_tiles)](
        part_acc, part_ml, gates, o, *o.stride()[:3], plan.num_t, *splits, part_ml.shape[2],
        APPLY_GATES=apply_gates, **plan.rows_meta(), num_warps=plan.num_warps,
    )  # fmt: skip


def _select_top_blocks(scores: torch.Tensor, prefix_lens: torch.Tensor, plan: _Plan):
    """``[B, Hkv, t, NB_max]`` block importance -> ``[B, Hkv, t, top_n]`` int32 indices,
    ascending and ``-1`` padded, with the first ``num_sink`` and last ``num_local`` blocks of
    each prefix forced. ``torch.topk`` does the selection: a handful of small launches on a
    refresh layer, no host synchronisation."""
    nb_max = scores.shape[-1]
    j = torch.arange(nb_max, device=scores.device)
    nb = torch.div(prefix_lens.long() + plan.block_size - 1, plan.block_size, rounding_mode="floor")
    nb = nb.view(-1, 1, 1, 1)
    valid = j < nb  # [B, 1, 1, NB]
    forced = valid & ((j < plan.num_sink) | (j >= nb - plan.num_local))
    s = scores.masked_fill(~valid, float("-inf")).masked_fill(forced, float("inf"))
    k = min(plan.top_n, nb_max)
    val, idx = torch.topk(s, k, dim=-1, sorted=False)
    # Slots that could only take a block past the prefix become -1 and sort after real ones.
    key = torch.sort(torch.where(val == float("-inf"), nb_max, idx), dim=-1).values
    out = torch.where(key == nb_max, -1, key).to(torch.int32)
    if k < plan.top_n:
        out = torch.nn.functional.pad(out, (0, plan.top_n - k), value=-1)
    return out.contiguous()


def _refresh_indices(plan: _Plan, args, part, splits) -> torch.Tensor:
    """Steps (1)-(3) of the refresh path; leaves the compressed partials in ``part``."""
    q, _, _, prefix_lens, _, comp_k, _, _ = args
    _launch_fwd(plan, args, None, None, part, branches=(True, False, False), splits=splits)
    shape = (plan.batch, plan.num_kv_heads, plan.num_t, plan.nb_max)
    scores = torch.empty(shape, dtype=torch.float32, device=q.device)
    grid = (plan.batch * plan.num_kv_heads, plan.num_tiles, triton.cdiv(plan.nb_max, plan.block_j))
    block_score_kernel[grid](
        q, comp_k, part[1], prefix_lens, scores, *q.stride()[:3], *comp_k.stride()[:3],
        plan.num_t, plan.nc_max, plan.nb_max, plan.comp_block, plan.comp_stride, plan.qk_scale,
        splits[0], part[1].shape[2], BLOCK_C=plan.block_n, BLOCK_J=plan.block_j,
        BLOCK_SIZE=plan.block_size, DOT_PRECISION=plan.dot_precision, **plan.rows_meta(),
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )  # fmt: skip
    return _select_top_blocks(scores, prefix_lens, plan)


def _prepare(args, block_idx, kw, validate, config) -> _Plan:
    q, k_cache, _, prefix_lens, tree_mask, comp_k, _, _ = args
    _check_tensors(*args, block_idx, kw["top_n"])
    plan = _make_plan(q, k_cache, comp_k, config=config, **kw)
    if validate:
        _check_values(plan, k_cache, prefix_lens, tree_mask, block_idx)
    return plan


def nsa_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    comp_k: torch.Tensor,
    comp_v: torch.Tensor,
    gates: torch.Tensor,
    *,
    block_idx: torch.Tensor | None = None,
    top_n: int,
    block_size: int,
    window: int,
    comp_block: int,
    comp_stride: int,
    num_sink: int = 1,
    num_local: int = 1,
    sm_scale: float | None = None,
    validate: bool = True,
    config: NsaVerifyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated three-branch NSA attention of ``t`` draft rows; fused when ``block_idx`` is given.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]`` draft queries (bf16/fp16 on the GPU, fp16/fp32 on the CPU), ``t <= 64``,
        ``D`` a power of two in [16, 256], unit stride in ``D``.
    k_cache, v_cache : torch.Tensor
        ``[B, Hkv, T_max, D]``: prefix in ``[0, L)``, draft tail in ``[L, L + t)``.
    prefix_lens : torch.Tensor
        ``[B]`` int32 committed lengths ``L`` (device; read on the host only when validating).
    tree_mask : torch.Tensor
        ``[B, t]`` int64 ancestor-or-self bitmask of the draft tail (:mod:`kernels.tree`).
    comp_k, comp_v : torch.Tensor
        ``[B, Hkv, NC_max, D]`` compressed tokens from :func:`compress_kv`; sequence ``b`` uses
        the first ``num_compressed(L)`` of them.
    gates : torch.Tensor
        ``[B, t, H, 3]`` float gates ``(g_c, g_s, g_w)``, contiguous.
    block_idx : torch.Tensor, optional
        ``[B, Hkv, t, top_n]`` int32 selected blocks (``-1`` = unused slot, any order): a reuse
        layer, one fused launch (plus a merge when split). ``None``: a refresh layer, which
        selects them.
    top_n, block_size : int
        Selected blocks per row and tokens per block (a power of two >= 16).
    window : int
        Sliding-window prefix tokens (>= 0); the draft tail is always in the window branch.
    comp_block, comp_stride : int
        Compression window and stride, as given to :func:`compress_kv`.
    num_sink, num_local : int
        Blocks forced into the refresh path's selection at the start and end of the prefix.
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    validate : bool
        Also run the checks that read tensor values (lengths, tree mask, index range and
        duplicates); they synchronise with the host, so the engine passes False.
    config : NsaVerifyConfig, optional
        Launch parameters.

    Returns
    -------
    o : torch.Tensor
        ``[B, t, H, D]`` contiguous, dtype of ``q``.
    block_idx : torch.Tensor
        The indices used: ``block_idx`` itself on a reuse layer, else the refresh path's
        ``[B, Hkv, t, top_n]`` int32 (ascending, ``-1`` padded), on the device.
    """
    config = config or DEFAULT_CONFIG
    kw = dict(top_n=top_n, block_size=block_size, window=window, comp_block=comp_block,
              comp_stride=comp_stride, num_sink=num_sink, num_local=num_local,
              sm_scale=sm_scale)  # fmt: skip
    args = (q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates)
    plan = _prepare(args, block_idx, kw, validate, config)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    total = _num_splits(plan, q.device, config)
    if block_idx is None:
        # Always split: the compressed partials serve both the scores and the output.
        splits = _apportion(plan, total, config)
        part = _alloc_partials(plan, sum(splits), q.device)
        block_idx = _refresh_indices(plan, args, part, splits)
        _launch_fwd(plan, args, block_idx, None, part, branches=(False, True, True),
                    splits=splits, slot_base=splits[0])  # fmt: skip
        _launch_merge(plan, part, gates, o, splits)
        return o, block_idx
    if total == 1:
        _launch_fwd(plan, args, block_idx, o, None, branches=ALL_BRANCHES, splits=(1, 1, 1))
    else:
        splits = _apportion(plan, total, config)
        part = _alloc_partials(plan, sum(splits), q.device)
        _launch_fwd(plan, args, block_idx, None, part, branches=ALL_BRANCHES, splits=splits)
        _launch_merge(plan, part, gates, o, splits)
    return o, block_idx


def nsa_verify_unfused(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    comp_k: torch.Tensor,
    comp_v: torch.Tensor,
    gates: torch.Tensor,
    *,
    block_idx: torch.Tensor | None = None,
    top_n: int,
    block_size: int,
    window: int,
    comp_block: int,
    comp_stride: int,
    num_sink: int = 1,
    num_local: int = 1,
    sm_scale: float | None = None,
    validate: bool = True,
    config: NsaVerifyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline of :func:`nsa_verify`: each branch launched on its own, gated in torch.

    Same parameters and result as :func:`nsa_verify`. Branch ``x`` is ``nsa_fwd_kernel`` with
    only ``x`` enabled, writing its normalised output ``o_x`` to HBM; when the grid is split,
    each branch gets the whole split budget to fill the SMs on its own, plus its own merge. The
    gating ``g_c * o_c + g_s * o_s + g_w * o_w`` runs as torch element-wise ops. The refresh
    path's selection is the one :func:`nsa_verify` uses.
    """
    config = config or DEFAULT_CONFIG
    kw = dict(top_n=top_n, block_size=block_size, window=window, comp_block=comp_block,
              comp_stride=comp_stride, num_sink=num_sink, num_local=num_local,
              sm_scale=sm_scale)  # fmt: skip
    args = (q, k_cache, v_cache, prefix_lens, tree_mask, comp_k, comp_v, gates)
    plan = _prepare(args, block_idx, kw, validate, config)
    total = _num_splits(plan, q.device, config)
    if block_idx is None:
        splits = _apportion(plan, total, config)
        part = _alloc_partials(plan, splits[0], q.device)
        block_idx = _refresh_indices(plan, args, part, splits)
    outs = []
    for branches in ((True, False, False), (False, True, False), (False, False, True)):
        o_x = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if total == 1:
            _launch_fwd(plan, args, block_idx, o_x, None, branches=branches, splits=(1, 1, 1),
                        apply_gates=False)  # fmt: skip
        else:
            # Each branch alone gets the whole split budget: three individually sized launches.
            splits = _only((total, total, total), branches)
            part = _alloc_partials(plan, total, q.device)
            _launch_fwd(plan, args, block_idx, None, part, branches=branches, splits=splits,
                        apply_gates=False)  # fmt: skip
            _launch_merge(plan, part, gates, o_x, splits, apply_gates=False)
        outs.append(o_x)
    g = gates.float()
    o = g[..., 0:1] * outs[0].float() + g[..., 1:2] * outs[1].float() + g[..., 2:3] * outs[2]
    return o.to(q.dtype), block_idx
