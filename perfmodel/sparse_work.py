"""The work one block-sparse verification call does (``kernels.sparse_verify``), counted from
the launch plan its wrapper makes (``perfmodel.attention_plan``: ``choose_sparse_splits``,
``sparse_tile_shape``, the functions ``kernels.sparse_launch`` calls), without torch.

A call runs in series: for ``union`` with C > 1 the group plan kernel (``kernels.group_plan``:
each group's list, deduplicated), the attention kernel over ``B x Hkv x groups x S`` programs
(each walks a slice of its group's block list, the last split also the draft tail), and for
``S > 1`` the merge of the fp32 partials. ``SparseWork`` counts:

- ``requested_bytes``: what the programs read and write: every list's K/V blocks, the draft
  tail once per group, queries, outputs, LSE, block lists (and a union plan's masks), and the
  fp32 partials a split call writes and its merge reads back; ``unique_bytes``: the same with
  each (sequence, KV head)'s blocks once -- the other reads of them may hit L2 (the tail still
  once per group);
- ``mma_flops``: the MMA FLOPs of the padded row tiles (``M_PAD`` rows a key);
- ``chain_tiles``: K/V tiles in series: the busiest program's slice plus its tail tile, or the
  call's tiles over the programs the SMs hold at once (``attention_work.resident_programs``:
  what shared memory allows) when the grid overfills them; a tile's load latency over the
  pipeline depth, and its MMAs over ``M_PAD`` rows, price it;
- ``merge_steps``: partials the merge reads a row (``S``; 0 unsplit);
- ``row_cost``: the row tile's ``M_PAD`` in ``mma.sync`` rows (``wgmma`` rows count half);
- ``waves``: waves of programs over the SMs' resident slots (each pays a prologue: query tile,
  list base; and an epilogue: the output write);
- ``plan_compares``: block-id compares of the union plan's busiest SM slot
  (``attention_work.union_plan_compares``).

A group's list is the mean union of its rows' blocks (given, or the selection model's
``perfmodel.sparse.union_blocks``); ``shared`` and ``per_query`` lists hold ``top_n`` blocks. A
row's ``local_blocks`` (the engine's local window, appended to its scored picks) are the same
blocks for every row of a sequence: a union or the distinct blocks count them once. It
ignores the spread of union sizes across groups and a group's last, smaller union.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_plan import (
    DEFAULT_SPARSE_CONFIG,
    SparseVerifyConfig,
    cdiv,
    choose_sparse_splits,
    sparse_tile_shape,
)
from ssvkit.perfmodel.attention_work import (
    fill_sparse_splits,
    resident_programs,
    row_cost,
    union_plan_compares,
)
from ssvkit.perfmodel.sparse import union_blocks

ELEM_BYTES = 2  # bf16 K/V, queries, outputs
F32 = 4
I32 = 4
MODES = ("per_query", "union", "shared")
SPLIT_RULES = ("wave_balance", "fill")
DEFAULT_SMEM_PER_SM_BYTES = 228 * 1024  # Hopper (perfmodel.hardware)


@dataclass(frozen=True, slots=True)
class SparseShape:
    """What a sparse verification call's work depends on. A row's list holds ``top_n``
    scored blocks and ``local_blocks`` window blocks. ``list_blocks`` and ``unique_blocks``
    override the selection model: a group's mean list and a (sequence, KV head)'s distinct
    blocks, as measured on a row's selections."""

    batch: int
    t: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int
    mode: str
    group_size: int = 1
    top_n: int = 16
    local_blocks: int = 0
    block_size: int = 64
    overlap: float = 0.7
    list_blocks: float | None = None
    unique_blocks: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("batch", "t", "num_q_heads", "num_kv_heads", "head_dim", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("top_n", "block_size", "context_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.local_blocks < 0:
            raise ValueError(f"local_blocks must be >= 0, got {self.local_blocks}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")

    @property
    def c(self) -> int:
        """Queries a program packs: 1 for ``per_query``, else ``min(group_size, t)``."""
        return 1 if self.mode == "per_query" else min(self.group_size, self.t)

    @property
    def width(self) -> int:
        """Entries of a row's block list (``block_idx.shape[3]``)."""
        return self.top_n + self.local_blocks

    @property
    def num_groups(self) -> int:
        return cdiv(self.t, self.c)


@dataclass(frozen=True, slots=True)
class SparseLaunchPlan:
    """The launch the wrapper makes for a shape: splits, the row tile, its pipeline."""

    num_splits: int
    m_pad: int
    num_warps: int
    num_stages: int
    programs: int


@dataclass(frozen=True, slots=True)
class SparseWork:
    """What one sparse verification call executes (module docstring); floats."""

    requested_bytes: float
    unique_bytes: float
    mma_flops: float
    chain_tiles: float
    merge_steps: float
    row_cost: float
    waves: float
    plan_compares: float


def launch_plan(
    s: SparseShape,
    num_sms: int,
    split_rule: str = "wave_balance",
    config: SparseVerifyConfig = DEFAULT_SPARSE_CONFIG,
) -> SparseLaunchPlan:
    """The wrapper's launch for ``s`` on ``num_sms`` SMs: ``wave_balance`` is the current
    kernel's split rule, ``fill`` the rule of the kernel that timed the committed H100 rows."""
    if split_rule not in SPLIT_RULES:
        raise ValueError(f"split_rule must be one of {SPLIT_RULES}, got {split_rule!r}")
    lists = s.batch * s.num_kv_heads * s.num_groups
    choose = choose_sparse_splits if split_rule == "wave_balance" else fill_sparse_splits
    splits = choose(config, lists, s.width, num_sms)
    m_pad, warps, stages = sparse_tile_shape(
        config, s.c, s.num_q_heads, s.num_kv_heads, s.block_size, s.head_dim
    )
    return SparseLaunchPlan(splits, m_pad, warps, stages, lists * splits)


def list_blocks(s: SparseShape) -> float:
    """Blocks of one group's list: the mean union of its scored picks (``union``), else
    ``top_n``, plus the local blocks; at most the context's blocks."""
    num_blocks = math.ceil(s.context_len / s.block_size)
    if s.mode != "union":
        return float(min(s.width, num_blocks))
    if s.list_blocks is not None:
        return float(s.list_blocks)
    scored = union_blocks(s.top_n, s.c, s.overlap, num_blocks)
    return float(min(scored + s.local_blocks, num_blocks))


def unique_blocks(s: SparseShape) -> float:
    """Distinct blocks of one (sequence, KV head): the union of all ``t`` rows' selections."""
    if s.unique_blocks is not None:
        return float(s.unique_blocks)
    num_blocks = math.ceil(s.context_len / s.block_size)
    scored = union_blocks(min(s.top_n, num_blocks), s.t, s.overlap, num_blocks)
    return float(min(scored + s.local_blocks, num_blocks))


def sparse_call_work(
    s: SparseShape,
    *,
    num_sms: int,
    smem_per_sm_bytes: int = DEFAULT_SMEM_PER_SM_BYTES,
    split_rule: str = "wave_balance",
    config: SparseVerifyConfig = DEFAULT_SPARSE_CONFIG,
) -> SparseWork:
    """The work of one ``sparse_verify`` call (its plan built inside the call, as the kernel
    sweep times it) on ``num_sms`` SMs."""
    plan = launch_plan(s, num_sms, split_rule, config)
    heads = s.batch * s.num_kv_heads
    lists = heads * s.num_groups
    n_list = list_blocks(s)
    splits = plan.num_splits
    resident = resident_programs(
        plan.num_stages, s.block_size, plan.m_pad, s.head_dim, smem_per_sm_bytes
    )
    slots = num_sms * resident
    tail_tiles = cdiv(s.t, s.block_size)
    busiest = math.ceil(n_list / splits) + tail_tiles
    total_tiles = lists * (n_list + tail_tiles)
    block_row = s.block_size * 2 * s.head_dim * ELEM_BYTES  # one block's K and V
    token_row = 2 * s.head_dim * ELEM_BYTES
    rows_q = s.batch * s.t * s.num_q_heads
    io = 2 * rows_q * s.head_dim * ELEM_BYTES + rows_q * F32
    io += heads * s.t * s.width * I32  # the rows' block ids
    if s.mode == "union" and s.c > 1:
        io += 2 * lists * n_list * I32  # the plan's lists and member masks, written and read
    if splits > 1:
        io += 2 * rows_q * splits * (s.head_dim + 1) * F32
    tail = lists * s.t * token_row
    requested = lists * n_list * block_row + tail + io
    # The tail counts once per group: each group's last split reads it after its list, apart
    # from the other groups' reads of it.
    unique = heads * min(unique_blocks(s), n_list * s.num_groups) * block_row + tail + io
    return SparseWork(
        requested_bytes=float(requested),
        unique_bytes=float(min(unique, requested)),
        mma_flops=float(total_tiles * s.block_size * plan.m_pad * s.head_dim * 4),
        chain_tiles=float(max(busiest, total_tiles / slots)),
        merge_steps=float(splits if splits > 1 else 0),
        row_cost=row_cost(plan.m_pad),
        waves=float(cdiv(plan.programs, slots)),
        plan_compares=union_plan_compares(s.mode, s.c, s.width, lists, num_sms),
    )


BATCH_REGIMES = ("b1", "bN")


def batch_regime(batch) -> np.ndarray:
    """The batch regime of a call, which names its class beside the mode (``b1``: one
    sequence, a grid below one wave whose blocks about fit L2; ``bN``: more), per point."""
    return np.where(np.asarray(batch) == 1, "b1", "bN")


WORK_FIELDS = SparseWork.__slots__
_INT_FIELDS = ("batch", "t", "num_q_heads", "num_kv_heads", "head_dim", "context_len")


def sparse_work_arrays(
    shape: dict,
    mode: str,
    *,
    num_sms: int,
    smem_per_sm_bytes: int = DEFAULT_SMEM_PER_SM_BYTES,
) -> dict[str, np.ndarray]:
    """``sparse_call_work`` of mode ``mode`` at every point of ``shape`` (``SparseShape``
    field names to arrays or scalars that broadcast), one array per ``SparseWork`` field,
    evaluated once per distinct point; a point without rows, heads or blocks counts nothing."""
    names = list(shape)
    args = np.broadcast_arrays(*(np.asarray(shape[n], dtype=float) for n in names))
    flat = np.stack([a.ravel() for a in args], axis=1)
    distinct, inverse = np.unique(flat, axis=0, return_inverse=True)
    out = np.zeros((len(distinct), len(WORK_FIELDS)))
    for i, point in enumerate(distinct):
        kw = {
            n: (float(v) if n in ("overlap", "list_blocks", "unique_blocks") else int(round(v)))
            for n, v in zip(names, point, strict=True)
        }
        if min(kw.get(n, 1) for n in (*_INT_FIELDS, "top_n", "block_size")) < 1:
            continue
        w = sparse_call_work(
            SparseShape(mode=mode, **kw), num_sms=num_sms, smem_per_sm_bytes=smem_per_sm_bytes
        )
        out[i] = [getattr(w, f) for f in WORK_FIELDS]
    return {f: out[inverse.ravel(), j].reshape(args[0].shape) for j, f in enumerate(WORK_FIELDS)}
