"""Strategies, drafters and workloads: what is run, and on what.

A ``Strategy`` is everything the decode loop chooses (drafter, tree, traversal, sparse
attention and its grouping, refresh/reuse schedule); a ``Workload`` is what it is run on
(context, batch, tensor parallelism, acceptance). Baselines use the names of DESIGN.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from ssvkit.perfmodel.acceptance import (
    TreeAcceptance,
    best_tree,
    chain_parents,
    expected_tokens_tree,
    full_tree_parents,
    node_depths_ranks,
)
from ssvkit.perfmodel.elementwise import fused_elementwise
from ssvkit.perfmodel.hardware import suggest
from ssvkit.perfmodel.loop_host import pipelining
from ssvkit.perfmodel.models import ModelSpec, get_model
from ssvkit.perfmodel.nsa_plan import (
    CONTEXT_TILES,
    DEFAULT_CONTEXT_TILES,
    DEFAULT_TILE_PLAN,
    TILE_PLANS,
)

DRAFTER_KINDS = ("eagle", "draft_model", "ngram", "self_sparse")
TRAVERSALS = ("bfs", "dfs", "position")
SPARSE_MODES = ("per_query", "union", "shared")
FUSIONS = ("none", "refresh_reuse")
METADATA = ("mean", "quest", "nsa")
# NSA draft rows per row tile of the packed schedule: as many as the kernel's tile holds.
PACKED_ROWS = 0
# The verify kernels' int64 ancestor bitmask (kernels.tree) holds one bit per node.
MAX_TREE_NODES = 64


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    """How draft tokens are produced (costs in ``perfmodel.draft_ops``).

    ``eagle``: one decoder layer at the target's width plus an LM head, fed the target's hidden
    states (EAGLE-3). ``draft_model``: a separate small model (``model`` names its ModelSpec).
    ``ngram``: prompt lookup, a scan of the context's token ids. ``self_sparse``: the target itself
    with attention over a fraction ``sparsity_ratio`` of its KV cache (seed 003, chain drafts).
    """

    kind: str = field(
        default="eagle", metadata={"help": "eagle | draft_model | ngram | self_sparse"}
    )
    model: str | None = field(default=None, metadata={"help": "draft ModelSpec for draft_model"})
    draft_vocab: int | None = field(
        default=32000,
        metadata={"help": "EAGLE-3 draft vocabulary (32K in the Llama-3.1 EAGLE-3 heads)"},
    )
    sparsity_ratio: float = field(default=0.05, metadata={"help": "self_sparse: KV share read"})

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_KINDS:
            raise ValueError(f"drafter kind {self.kind!r} is not one of {', '.join(DRAFTER_KINDS)}")
        if self.kind == "draft_model" and not self.model:
            raise ValueError("drafter draft_model needs a model name or config path")
        if not 0 < self.sparsity_ratio <= 1:
            raise ValueError(f"sparsity_ratio must lie in (0, 1], got {self.sparsity_ratio}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"draft_vocab must be >= 1, got {self.draft_vocab}")

    def draft_spec(self) -> ModelSpec | None:
        return get_model(self.model) if self.kind == "draft_model" else None


@functools.lru_cache(maxsize=4096)  # best:N runs a DP; grids ask for the same trees often
def parse_tree(spec: str, acceptance: float = 0.7, num_ranks: int = 4) -> tuple[int, ...]:
    """Tree parents from ``chain:K``, ``full:BxD`` (branching x depth), ``best:N[:D]`` (the
    best tree of N nodes, optional max depth D, for ``acceptance`` with geometric sibling decay)
    or ``parents:P0,P1,...`` (explicit: node i hangs below node Pi, -1 = the root).
    ``none`` or ``chain:0`` is autoregressive decoding (no drafts). The node count is checked
    against ``MAX_TREE_NODES`` before anything is built."""
    s = spec.strip().lower()
    if s in ("none", "ar"):
        return ()
    kind, _, arg = s.partition(":")
    try:
        size, args = _tree_size(kind, arg)
    except ValueError:
        raise ValueError(
            f"tree {spec!r} is not chain:K, full:BxD, best:N[:D] or parents:P0,P1,... "
            "with positive integers (parents in -1..i-1)"
        ) from None
    if size is None or size > MAX_TREE_NODES:
        shown = f"{size}" if size is not None else f"more than {MAX_TREE_NODES}"
        raise ValueError(
            f"tree {spec!r} has {shown} nodes; the verify kernels take at most {MAX_TREE_NODES}"
        )
    if kind == "chain":
        return tuple(chain_parents(args[0]))
    if kind == "full":
        return tuple(full_tree_parents(args[0], args[1]))
    if kind == "parents":
        return args
    n, d = args
    return best_tree(n, TreeAcceptance.from_alpha(acceptance, num_ranks), d).parents


def _tree_size(kind: str, arg: str) -> tuple[int | None, tuple]:
    """The drafted nodes a tree spec asks for (None: more than ``MAX_TREE_NODES``, not counted
    further) and its parsed arguments (``ValueError`` when malformed), without building it."""
    if kind == "chain":
        k = int(arg)
        if k < 0:
            raise ValueError
        return k, (k,)
    if kind == "full":
        b, d = (int(x) for x in arg.split("x"))
        if b < 1 or d < 1:
            raise ValueError
        size, level = 0, 1
        for _ in range(d):
            level *= b
            size += level
            if size > MAX_TREE_NODES:
                return None, (b, d)
        return size, (b, d)
    if kind == "parents":  # an explicit tree: parents:-1,0,0,1 (node -> parent)
        parents = tuple(int(x) for x in arg.split(",")) if arg else ()
        if any(not -1 <= p < i for i, p in enumerate(parents)):
            raise ValueError
        return len(parents), parents
    if kind == "best":
        n, _, d = arg.partition(":")
        if int(n) < 1 or (d and int(d) < 1):
            raise ValueError
        return int(n), (int(n), int(d) if d else None)
    raise ValueError


@dataclass(frozen=True, slots=True)
class Strategy:
    """One strategy tuple (seed 000's s = tree, traversal, coarsening mode, schedule), plus the
    drafter and the sparse budget. ``attention='dense'`` ignores the sparse fields."""

    name: str = field(default="custom", metadata={"help": "label shown in tables"})
    tree: str = field(default="chain:0", metadata={"help": "chain:K | full:BxD | best:N[:D]"})
    drafter: DrafterSpec = field(default_factory=DrafterSpec, metadata={"help": "drafter"})
    traversal: str = field(default="position", metadata={"help": "bfs | dfs | position"})
    attention: str = field(default="dense", metadata={"help": "dense | sparse"})
    mode: str = field(default="per_query", metadata={"help": "per_query | union | shared"})
    group_size: int = field(default=1, metadata={"help": "queries per group C"})
    top_n: int = field(default=16, metadata={"help": "selected blocks per query"})
    block_size: int = field(default=64, metadata={"help": "tokens per selection block"})
    window: int = field(default=512, metadata={"help": "sliding-window tokens"})
    comp_block: int = field(default=32, metadata={"help": "NSA compression block l"})
    comp_stride: int = field(default=16, metadata={"help": "NSA compression stride (0 = none)"})
    metadata: str = field(default="nsa", metadata={"help": "block scores: mean | quest | nsa"})
    refresh_every: int = field(default=1, metadata={"help": "a refresh layer every N layers"})
    fusion: str = field(default="none", metadata={"help": "none | refresh_reuse kernels"})
    nsa_context_tiles: str = field(
        default=DEFAULT_CONTEXT_TILES,
        metadata={
            "help": "NSA compressed branch: shared (one row tile of all draft rows) | per_tile "
            "(the row schedule's tiles, each streaming it)"
        },
    )
    nsa_tile_plan: str = field(
        default=DEFAULT_TILE_PLAN,
        metadata={
            "help": "NSA row tiles and slots (NsaVerifyConfig.tile_plan): fixed | fit | fit_slots"
        },
    )

    def __post_init__(self) -> None:
        checks = {
            "traversal": (self.traversal, TRAVERSALS),
            "attention": (self.attention, ("dense", "sparse")),
            "mode": (self.mode, SPARSE_MODES),
            "fusion": (self.fusion, FUSIONS),
            "nsa_context_tiles": (self.nsa_context_tiles, CONTEXT_TILES),
            "nsa_tile_plan": (self.nsa_tile_plan, TILE_PLANS),
            "metadata": (self.metadata, METADATA),
        }
        for fname, (v, allowed) in checks.items():
            if v not in allowed:
                raise ValueError(f"{fname} must be one of {', '.join(allowed)}, got {v!r}")
        for fname in ("group_size", "top_n", "block_size", "refresh_every"):
            v = getattr(self, fname)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{fname} must be an integer >= 1, got {v!r}")
        if self.group_size > MAX_TREE_NODES:
            raise ValueError(
                f"group_size {self.group_size} exceeds the {MAX_TREE_NODES} queries a verify "
                "step can hold"
            )
        for fname in ("window", "comp_block", "comp_stride"):
            v = getattr(self, fname)
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"{fname} must be an integer >= 0, got {v!r}")
        parse_tree(self.tree)  # validates the spec
        if self.drafter.kind == "self_sparse" and not self.tree.startswith("chain"):
            raise ValueError("the self_sparse drafter drafts chains only (tree chain:K)")

    @property
    def is_sparse(self) -> bool:
        return self.attention == "sparse"

    @property
    def nsa_rows_per_tile(self) -> int:
        """Draft rows the NSA kernels pack into one row tile (``nsa_rows_per_tile``)."""
        return nsa_rows_per_tile(self.mode, self.group_size)

    def parents(self, acceptance: float) -> tuple[int, ...]:
        return parse_tree(self.tree, acceptance)

    def num_draft_tokens(self, acceptance: float) -> int:
        return len(self.parents(acceptance))

    @classmethod
    def from_name(cls, name: str, **overrides) -> Strategy:
        """A DESIGN.md baseline (``ar_dense``, ``ar_sparse``, ``sd_dense``, ``sd_sparse_naive``,
        ``ssv``) with optional field overrides."""
        if name not in BASELINES:
            raise ValueError(f"unknown strategy {name!r}{suggest(name, list(BASELINES))}")
        return dataclasses.replace(BASELINES[name], **overrides)


def nsa_rows_per_tile(mode: str, group_size: int) -> int:
    """Draft rows that share one NSA row tile, and so one load of the union of their selected
    blocks, under a grouping ``mode``: ``per_query`` 1 (every row streams its own blocks, seed
    000's decoding-oriented naive baseline), ``union`` C, ``shared`` ``PACKED_ROWS`` (as many
    rows as the kernel's tile holds). NSA selects per row under every mode: it has no
    shared-index approximation, so every schedule is exact."""
    if mode not in SPARSE_MODES:
        raise ValueError(f"mode must be one of {', '.join(SPARSE_MODES)}, got {mode!r}")
    if mode == "per_query":
        return 1
    return group_size if mode == "union" else PACKED_ROWS


def with_nsa_rows_per_tile(s: Strategy, rows_per_tile: int) -> Strategy:
    """``s`` with the grouping whose NSA schedule is ``rows_per_tile`` draft rows a tile
    (``PACKED_ROWS``: ``shared``; 1: ``per_query``; C: ``union`` C); ``s`` itself when it has it
    already or is not an NSA strategy."""
    if not (s.is_sparse and s.metadata == "nsa") or s.nsa_rows_per_tile == rows_per_tile:
        return s
    if not (isinstance(rows_per_tile, int) and rows_per_tile >= 0):
        raise ValueError(f"nsa_rows_per_tile must be an integer >= 0, got {rows_per_tile!r}")
    mode = {PACKED_ROWS: "shared", 1: "per_query"}.get(rows_per_tile, "union")
    return dataclasses.replace(s, mode=mode, group_size=max(rows_per_tile, 1))


DEFAULT_TREE = "best:16:6"
BASELINES: dict[str, Strategy] = {
    "ar_dense": Strategy(name="ar_dense"),
    "ar_sparse": Strategy(name="ar_sparse", attention="sparse"),
    "sd_dense": Strategy(name="sd_dense", tree=DEFAULT_TREE),
    "sd_sparse_naive": Strategy(name="sd_sparse_naive", tree=DEFAULT_TREE, attention="sparse"),
    "ssv": Strategy(
        name="ssv",
        tree=DEFAULT_TREE,
        attention="sparse",
        mode="union",
        group_size=4,
        refresh_every=4,
        fusion="refresh_reuse",
    ),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """What a strategy runs on. ``overlap`` is gamma, the share of a query's selected blocks
    that its neighbour in traversal order also selected (SSV measured 50-90%); ``elementwise``
    how the engine runs the element-wise ops (``perfmodel.elementwise.ELEMENTWISE``)."""

    context_len: int = field(default=32768, metadata={"help": "tokens in the KV cache T"})
    batch: int = field(default=1, metadata={"help": "sequences decoded together"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree"})
    acceptance: float = field(default=0.7, metadata={"help": "per-draft acceptance alpha"})
    overlap: float = field(default=0.75, metadata={"help": "adjacent-query block overlap gamma"})
    dtype: str = field(default="bf16", metadata={"help": "activation/compute dtype"})
    kv_bytes: int = field(default=2, metadata={"help": "bytes per KV-cache element"})
    elementwise: str = field(
        default="fused",
        metadata={"help": "the engine's element-wise ops: fused (triton backend) | torch"},
    )
    loop: str = field(
        default="pipelined",
        metadata={
            "help": "the engine's decode loop: pipelined (a round issued before the host reads "
            "the last, where the strategy allows) | serial"
        },
    )

    def __post_init__(self) -> None:
        fused_elementwise(self.elementwise)  # validates it
        pipelining(self.loop)  # validates it
        for fname in ("context_len", "batch", "tp", "kv_bytes"):
            v = getattr(self, fname)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{fname} must be a positive integer, got {v!r}")
        for fname in ("acceptance", "overlap"):
            v = getattr(self, fname)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{fname} must lie in [0, 1], got {v!r}")
        if self.dtype not in ("bf16", "fp16", "fp8"):
            raise ValueError(f"dtype must be bf16, fp16 or fp8, got {self.dtype!r}")


def check_feasible(strategy: Strategy, workload: Workload, model: ModelSpec) -> None:
    """Reject a strategy the workload cannot run, naming the offending values."""
    if strategy.is_sparse:
        sel = strategy.top_n * strategy.block_size
        if sel > workload.context_len:
            raise ValueError(
                f"top_n*block_size = {strategy.top_n}*{strategy.block_size} = {sel} exceeds "
                f"context_len={workload.context_len}"
            )
    if model.num_q_heads % workload.tp and workload.tp > 1:
        raise ValueError(f"tp={workload.tp} does not divide num_q_heads={model.num_q_heads}")


def tree_expected_tokens(parents, acceptance: float, num_ranks: int = 4) -> float:
    """Expected tokens per round of a tree under geometric sibling decay from alpha."""
    if not parents:
        return 1.0
    return expected_tokens_tree(list(parents), TreeAcceptance.from_alpha(acceptance, num_ranks))


def fit_acceptance(parents, mean_accepted: float) -> float:
    """The per-draft alpha whose expected accepted drafts per round (``tree_expected_tokens``)
    equal ``mean_accepted`` (bisection; clamped to [0, 1])."""
    if not parents:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if tree_expected_tokens(parents, mid) - 1 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def tree_depth(parents) -> int:
    return max(node_depths_ranks(list(parents))[0], default=0)


@functools.lru_cache(maxsize=256)
def chain_length(tree: str) -> int:
    """K for a chain of K drafts (node i's parent is node i - 1), else 0 (autoregressive
    decoding and branching trees)."""
    parents = parse_tree(tree)
    if not parents or any(p != i - 1 for i, p in enumerate(parents)):
        return 0
    return len(parents)
