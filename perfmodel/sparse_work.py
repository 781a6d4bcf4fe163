"""The work one block-sparse verification call does (``kernels.sparse_verify``), counted from
the launch plan its wrapper makes (``perfmodel.attention_plan``: ``choose_sparse_splits``,
``sparse_tile_shape``, the functions ``kernels.sparse_launch`` calls), without torch
(``SparseWork``).

A call runs in series: for ``union`` with C > 1 the group plan kernel (``kernels.group_plan``:
each group's list, deduplicated), the attention kernel over ``B x Hkv x groups x S`` programs
(each walks a slice of its group's block list, the last split also the draft tail), and for
``S > 1`` the merge of the fp32 partials. A group's list is the mean union of its rows' blocks
(``list_blocks``), the busiest program's a slice of the largest group's (``group_lists``); a
group of one query runs the ``per_query`` launch whatever the mode (``kernel_mode``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES, cdiv
from ssvkit.perfmodel.attention_work import (
    WARPGROUP,
    fill_sparse_splits,
    resident_programs,
    row_cost,
    union_plan_compares,
)
from ssvkit.perfmodel.numbers import require_at_least_one
from ssvkit.perfmodel.sparse import union_blocks
from ssvkit.perfmodel.sparse_plan import (
    DEFAULT_SPARSE_CONFIG,
    SparseVerifyConfig,
    choose_sparse_splits,
    list_entries,
    merges_in_launch,
    sparse_merge_steps,
    sparse_tile_shape,
)
from ssvkit.perfmodel.work_points import at_distinct_points

ELEM_BYTES = 2  # bf16 K/V, queries, outputs
F32 = 4
I32 = 4
MODES = ("per_query", "union", "shared")
SPLIT_RULES = ("wave_balance", "fill")
# The head dimension whose MMA rows ``SparseWork.row_cost`` counts: a tile's MMAs over a row
# grow with the row's dimensions.
ROW_COST_DIM = 128


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
        require_at_least_one(
            self, ("batch", "t", "num_q_heads", "num_kv_heads", "head_dim", "group_size")
        )
        require_at_least_one(self, ("top_n", "block_size", "context_len"))
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
    """What one sparse verification call executes; floats.

    - ``requested_bytes``: what the programs read and write: every list's K/V blocks, the
      draft tail once per group, queries, outputs, LSE, block lists (and a union plan's
      masks), and the fp32 partials a split call writes and its merge reads back;
      ``unique_bytes``: the same with each (sequence, KV head)'s blocks once -- the other
      reads of them may hit L2 (the tail still once per group);
    - ``mma_flops``: the MMA FLOPs of the padded row tiles (``M_PAD`` rows a key), a tile a
      warpgroup issues as ``wgmma`` counted at ``WGMMA_ROW_COST`` of its FLOPs: the compute
      term prices FLOPs at one rate, and ``wgmma`` issues at about twice ``mma.sync``'s (the
      weight ``row_cost`` gives a tile's rows);
    - ``chain_tiles``: K/V tiles in series: the busiest program's slice (of the largest group's
      list) plus its tail tile, or the call's tiles over the programs the SMs hold at once
      (``attention_work.resident_programs``: what shared memory allows) when the grid
      overfills them; a tile's load latency over the pipeline depth, and its MMAs over
      ``M_PAD`` rows, price it;
    - ``merge_steps``: the steps in which a merge launch reads a row's ``S`` partials
      (``sparse_plan.sparse_merge_steps``; 0 unsplit, and where the last split program of
      each group merges in the launch, ``sparse_plan.merges_in_launch``: its epilogue's
      one load, priced with its row-tile writes, ``row_waves``); ``merge_launches``: 1 for
      a merge launch of its own, else 0; ``num_splits``: the splits of a group's list;
    - ``row_cost``: the rows of the row tile one warpgroup computes (``M_PAD`` over the
      program's warpgroups: 8 warps split a tile of 64 rows or more between two, which run
      side by side) in ``mma.sync`` rows of ``ROW_COST_DIM`` head dimensions (``wgmma`` rows
      count half; a row of head dimension ``D`` issues ``D / ROW_COST_DIM`` of such a row's
      MMAs a K/V tile);
    - ``waves``: waves of programs over the SMs' resident slots (each pays a prologue: query
      tile, list base; and an epilogue: the output write);
    - ``plan_compares``: the compare steps of the union plan's busiest SM slot
      (``attention_work.union_plan_compares``);
    - ``row_waves``: the row-tile rows one SM slot's programs finish in series, ``waves x``
      the warpgroup's rows (``row_cost`` at D = ``ROW_COST_DIM`` whatever the head dimension),
      twice that when split: a program's epilogue writes its row tile after its last K/V
      tile, unoverlapped (bf16 outputs, or fp32 partials -- twice the bytes -- for the
      merge);
    - ``sm_tiles``: the call's K/V tiles over the SMs: each tile costs its SM issue slots (its
      block id's load and addresses, the MMAs and softmax of the row tile, the pipeline's
      wait), which the SM's resident programs share, so they add up per SM whatever the
      residency.
    """

    requested_bytes: float
    unique_bytes: float
    mma_flops: float
    chain_tiles: float
    merge_steps: float
    merge_launches: float
    num_splits: float
    row_cost: float
    waves: float
    plan_compares: float
    row_waves: float
    sm_tiles: float


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
    m_pad, warps, stages = sparse_tile_shape(
        config, s.c, s.num_q_heads, s.num_kv_heads, s.block_size, s.head_dim
    )
    if split_rule == "wave_balance":
        entries = list_entries(s.mode, s.c, s.width)
        splits = choose_sparse_splits(config, lists, entries, warps, num_sms)
    else:
        splits = fill_sparse_splits(config, lists, s.width, num_sms)
    return SparseLaunchPlan(splits, m_pad, warps, stages, lists * splits)


def list_blocks(s: SparseShape) -> float:
    """Blocks of one group's list, the mean over the call's groups: for ``union`` the shape's
    ``list_blocks`` when given, else the mean of the groups' unions (``group_lists``); for the
    other modes ``top_n`` plus the local blocks, at most the context's blocks."""
    return group_lists(s)[0]


def group_lists(s: SparseShape) -> tuple[float, float]:
    """(mean, largest) blocks of a call's group lists. Under ``union`` with ``t`` not a multiple
    of C the last group holds fewer rows and a smaller union: its ``t mod C`` rows' against the
    others' C rows' (the selection model's ``perfmodel.sparse.union_blocks``, plus the local
    blocks: a row's ``local_blocks``, the engine's window appended to its scored picks, are the
    same blocks for every row of a sequence, so a union counts them once; at most the
    context's blocks). A measured mean (``list_blocks``) is split between the groups in the
    ratio of those unions. Every other list holds a row's ``width`` entries."""
    num_blocks = math.ceil(s.context_len / s.block_size)
    if s.mode != "union":
        n = float(min(s.width, num_blocks))
        return n, n

    def union(rows: int) -> float:
        scored = union_blocks(s.top_n, rows, s.overlap, num_blocks)
        return float(min(scored + s.local_blocks, num_blocks))

    full, rest = divmod(s.t, s.c)
    groups = full + (rest > 0)
    whole = union(s.c)
    total = full * whole + (union(rest) if rest else 0.0)
    if s.list_blocks is None:
        return total / groups, whole
    return float(s.list_blocks), float(s.list_blocks) * groups * whole / total


def unique_blocks(s: SparseShape) -> float:
    """Distinct blocks one (sequence, KV head) reads: the union of all ``t`` rows' selections
    (``per_query``, ``union``); for ``shared`` the union of the groups' representatives' lists
    only, rows ``C`` apart, which share ``overlap^C`` of their blocks (each row keeps
    ``overlap`` of its neighbour's), at most the rows' measured union; the local blocks
    once."""
    num_blocks = math.ceil(s.context_len / s.block_size)
    n = min(s.top_n, num_blocks)
    if s.mode == "shared":
        scored = union_blocks(n, s.num_groups, s.overlap**s.c, num_blocks)
        reps = float(min(scored + s.local_blocks, num_blocks))
        return reps if s.unique_blocks is None else min(reps, float(s.unique_blocks))
    if s.unique_blocks is not None:
        return float(s.unique_blocks)
    scored = union_blocks(n, s.t, s.overlap, num_blocks)
    return float(min(scored + s.local_blocks, num_blocks))


def sparse_call_work(
    s: SparseShape,
    *,
    num_sms: int,
    smem_per_sm_bytes: int = DEFAULT_SMEM_PER_SM_BYTES,
    split_rule: str = "wave_balance",
    union_plan: str = "sort",
    config: SparseVerifyConfig = DEFAULT_SPARSE_CONFIG,
) -> SparseWork:
    """The work of one ``sparse_verify`` call (its plan built inside the call, as the kernel
    sweep times it) on ``num_sms`` SMs; ``union_plan`` names the union plan kernel
    (``attention_work.union_plan_compares``)."""
    plan = launch_plan(s, num_sms, split_rule, config)
    heads = s.batch * s.num_kv_heads
    lists = heads * s.num_groups
    n_list, n_largest = group_lists(s)
    splits = plan.num_splits
    in_launch = merges_in_launch(
        config, splits, plan.programs, plan.m_pad, s.head_dim, plan.num_warps, num_sms
    )
    resident = resident_programs(
        plan.num_stages, s.block_size, plan.m_pad, s.head_dim, smem_per_sm_bytes
    )
    slots = num_sms * resident
    tail_tiles = cdiv(s.t, s.block_size)
    busiest = math.ceil(n_largest / splits) + tail_tiles
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
    waves = cdiv(plan.programs, slots)
    rc = row_cost(plan.m_pad, plan.num_warps)
    mma_rows = rc * s.head_dim / ROW_COST_DIM
    # 1 for mma.sync tiles, WGMMA_ROW_COST for wgmma ones: a warpgroup's rows at their rate.
    mma_rate = rc * max(1, plan.num_warps // WARPGROUP) / plan.m_pad
    # The tail counts once per group: each group's last split reads it after its list, apart
    # from the other groups' reads of it.
    unique = heads * min(unique_blocks(s), n_list * s.num_groups) * block_row + tail + io
    return SparseWork(
        requested_bytes=float(requested),
        unique_bytes=float(min(unique, requested)),
        mma_flops=float(total_tiles * s.block_size * plan.m_pad * s.head_dim * 4 * mma_rate),
        chain_tiles=float(max(busiest, total_tiles / slots)),
        merge_steps=float(sparse_merge_steps(splits, in_launch)),
        merge_launches=float(splits > 1 and not in_launch),
        num_splits=float(splits),
        row_cost=mma_rows,
        waves=float(waves),
        plan_compares=union_plan_compares(s.mode, s.c, s.width, lists, num_sms, union_plan),
        row_waves=float(waves * rc * (2 if splits > 1 else 1)),
        sm_tiles=float(total_tiles / num_sms),
    )


# A grid of fewer group lists than SMs leaves SMs without a whole list: the plan splits the lists
# and each SM walks part of one, a latency-bound chain and a merge, over blocks that about fit
# L2; with a list or more an SM the call streams whole lists from HBM in waves, where repeated
# reads of a block by different groups land far apart in time.
GRID_REGIMES = ("few_lists", "many_lists")


def kernel_mode(mode, group_size, t):
    """The kernel path a call runs, per point: ``per_query`` where its groups hold one query
    (``min(group_size, t) == 1``: a ``union`` or ``shared`` group of one launches no plan and
    no member masks and streams each row's own list, the ``per_query`` launch), else ``mode``.
    ``mode`` is a name, or an array of ``columns.MODE_CODES`` (0 is ``per_query``)."""
    one = np.minimum(group_size, t) <= 1
    if isinstance(mode, str):
        return "per_query" if bool(one) else mode
    return np.where(one, 0, mode)


def num_lists(batch, num_kv_heads, t, c):
    """Group lists of a call, per point: ``batch x Hkv x ceil(t / C)`` (``C``: the queries a
    program packs, 1 for the ``per_query`` launch)."""
    return np.asarray(batch) * np.asarray(num_kv_heads) * np.ceil(np.asarray(t) / np.asarray(c))


def grid_regime(lists, num_sms) -> np.ndarray:
    """The grid regime of a call, which names its class beside its kernel path
    (``GRID_REGIMES``: ``few_lists`` below one list an SM, else ``many_lists``), per point."""
    return np.where(np.asarray(lists) < num_sms, *GRID_REGIMES)


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

    def work(kw: dict) -> SparseWork | None:
        if min(kw.get(n, 1) for n in (*_INT_FIELDS, "top_n", "block_size")) < 1:
            return None
        return sparse_call_work(
            SparseShape(mode=mode, **kw), num_sms=num_sms, smem_per_sm_bytes=smem_per_sm_bytes
        )

    floats = ("overlap", "list_blocks", "unique_blocks")
    key = ("sparse_call_work", mode, num_sms, smem_per_sm_bytes)
    return at_distinct_points(shape, work, WORK_FIELDS, floats=floats, memo_key=key)
