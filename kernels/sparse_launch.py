"""Launch plan of :mod:`kernels.sparse_verify`, on the host: its tuning knobs
(``SparseVerifyConfig``), the split count of each group's block list (``choose_num_splits``),
and what one call launches (``plan_launch``: the group plan, the outputs or the fp32 partials
the kernel writes, the tile and pipeline choices).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.group_plan import GroupPlan, build_group_plan

LOG2E = 1.4426950408889634


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


@dataclasses.dataclass(frozen=True, slots=True)
class SparseLaunch:
    """What one call launches: its group plan, the packed group size C and the split count,
    the outputs, and the destinations the kernel writes (the outputs themselves, or the fp32
    partials ``merge_partials`` combines) with their strides."""

    plan: GroupPlan
    c: int
    num_splits: int
    o: torch.Tensor
    lse: torch.Tensor
    o_dst: torch.Tensor
    lse_dst: torch.Tensor
    o_strides: tuple[int, ...]  # (split, b, t, h)
    lse_strides: tuple[int, ...]  # (split, b, h, t)
    m_pad: int  # packed query-head rows of a program, padded for the MMA
    num_warps: int
    num_stages: int
    scale: float  # softmax scale times log2(e): the kernel works in base 2


def plan_launch(
    q, k_cache, block_idx, order, mode, group_size, c, block_size, sm_scale, plan, cfg
) -> SparseLaunch:
    """The group plan (built, or the caller's checked against the inputs), the split count,
    the outputs the launch writes, and the kernel's tile and pipeline choices."""
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
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
    num_splits = choose_num_splits(cfg, b * hkv * plan.num_groups, block_idx.shape[3], q.device)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, t), dtype=torch.float32, device=q.device)
    if num_splits == 1:
        o_dst, lse_dst = o, lse
        o_strides = (0, *o.stride()[:3])
        lse_strides = (0, *lse.stride())
    else:
        # merge_partials' layout: [B, t, H, S, D] and [B, t, H, S].
        o_dst = torch.empty((b, t, h, num_splits, d), dtype=torch.float32, device=q.device)
        lse_dst = torch.empty((b, t, h, num_splits), dtype=torch.float32, device=q.device)
        o_strides = (o_dst.stride(3), *o_dst.stride()[:3])
        ls = lse_dst.stride()
        lse_strides = (ls[3], ls[0], ls[2], ls[1])
    m_pad = max(16, triton.next_power_of_2(c * (h // hkv)))
    # 4 warps hold up to 32 packed rows (acc [32, D] is 32 fp32 registers a thread at D = 128)
    # and stream faster than 8 on the H200; 64 rows and more take 8.
    num_warps = cfg.num_warps or (4 if m_pad <= 32 else 8)
    # Each stage buffers one K and one V tile: 2 x 16 KB at block 64, D = 128 (72 KB smem at
    # 3 stages, 3 programs per SM); bigger tiles keep 2 stages to stay under ~140 KB.
    num_stages = cfg.num_stages or (3 if block_size * d <= 64 * 128 else 2)
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E
    return SparseLaunch(
        plan,
        c,
        num_splits,
        o,
        lse,
        o_dst,
        lse_dst,
        o_strides,
        lse_strides,
        m_pad,
        num_warps,
        num_stages,
        scale,
    )
