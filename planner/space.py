"""The strategy space: SSV's strategy tuple (seed 000, "Core Mechanism 3") made enumerable.

A strategy = (drafter, tree shape, traversal order, grouping mode + group size C, refresh/reuse
schedule, sparse budget top_n / block / window), as a ``perfmodel.strategy.Strategy``. The space
is the product of the axes of a ``SpaceSpec`` (``enumerate_space``, which drops the tuples that
differ only in axes a strategy ignores) filtered by validity rules that name why a tuple is out
(``invalid_reason``: ``rows``, ``budget``, ``smem``, ``kernel``, ``window``).

Grouping applies to block-metadata selection (``metadata`` ``mean``/``quest``); the NSA kernels
(``metadata`` ``nsa``, the default) select per row under every mode, so the space holds one NSA
strategy per (drafter, tree, budget, schedule), with the packed row tiles.

Every strategy has a stable id (a hash of its fields, independent of enumeration order) and a
human-readable form.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field

from ssvkit.perfmodel.acceptance import node_depths_ranks
from ssvkit.perfmodel.hardware import GpuSpec, suggest
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.nsa_plan import DEFAULT_CONTEXT_TILES, DEFAULT_TILE_PLAN
from ssvkit.perfmodel.sparse import fits_shared_memory
from ssvkit.perfmodel.strategy import (
    METADATA,
    PACKED_ROWS,
    DrafterSpec,
    Strategy,
    parse_tree,
)

MAX_KERNEL_ROWS = 64
MAX_PACKED_ROWS = 128
MAX_UNION_GROUP = 31


@dataclass(frozen=True, slots=True)
class SpaceSpec:
    """Axes of the enumerated space (each a tuple of choices)."""

    drafters: tuple[str, ...] = field(
        default=("eagle",),
        metadata={"help": "drafter kinds: eagle, draft_model, ngram, self_sparse"},
    )
    draft_model: str | None = field(default=None, metadata={"help": "model of draft_model"})
    trees: tuple[str, ...] = field(
        default=("chain:4", "chain:7", "best:8:4", "best:16:6", "best:32:8"),
        metadata={"help": "tree specs: chain:K, full:BxD, best:N[:D]"},
    )
    traversals: tuple[str, ...] = field(
        default=("bfs", "dfs", "position"), metadata={"help": "flattening orders"}
    )
    modes: tuple[str, ...] = field(
        default=("dense", "per_query", "union", "shared"),
        metadata={"help": "dense attention or a sparse grouping mode"},
    )
    group_sizes: tuple[int, ...] = field(default=(1, 2, 4, 8), metadata={"help": "C choices"})
    refresh_every: tuple[int, ...] = field(
        default=(1, 2, 4, 8), metadata={"help": "a refresh layer every N layers"}
    )
    top_ns: tuple[int, ...] = field(default=(16, 32), metadata={"help": "selected blocks"})
    block_sizes: tuple[int, ...] = field(default=(64,), metadata={"help": "selection block"})
    windows: tuple[int, ...] = field(default=(512,), metadata={"help": "sliding window"})
    metadata: tuple[str, ...] = field(
        default=("nsa",), metadata={"help": "sparse selection: nsa | mean | quest (grouped)"}
    )

    def __post_init__(self) -> None:
        for name in (
            "drafters",
            "trees",
            "traversals",
            "modes",
            "group_sizes",
            "refresh_every",
            "top_ns",
            "block_sizes",
            "windows",
            "metadata",
        ):
            if not getattr(self, name):
                raise ValueError(f"space axis {name} is empty")
        for t in self.trees:
            parse_tree(t)  # validates the spec
        bad = set(self.modes) - {"dense", "per_query", "union", "shared"}
        if bad:
            raise ValueError(f"unknown modes {sorted(bad)}")
        bad = set(self.metadata) - set(METADATA)
        if bad:
            raise ValueError(f"unknown metadata {sorted(bad)}; expected {', '.join(METADATA)}")


def space_from_json(d, where: str) -> SpaceSpec:
    """A ``SpaceSpec`` from its JSON form (lists for the axes, as ``dataclasses.asdict`` writes
    it); ``ValueError`` naming ``where`` and the bad key or value."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: the space must be an object of axes, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(SpaceSpec)}
    kw = {}
    for key, value in d.items():
        if key not in fields:
            raise ValueError(f"{where}: unknown space key {key!r}{suggest(str(key), list(fields))}")
        if key == "draft_model":
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}: draft_model must be a name or null, got {value!r}")
            kw[key] = value
            continue
        kind = type(fields[key].default[0])
        if not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, kind) for v in value
        ):
            raise ValueError(f"{where}: {key} must be a list of {kind.__name__}, got {value!r}")
        kw[key] = tuple(value)
    return SpaceSpec(**kw)


def strategy_id(s: Strategy) -> str:
    """Stable id: a hash of every field except the display name."""
    d = dataclasses.asdict(s)
    d.pop("name")
    if d["nsa_context_tiles"] == DEFAULT_CONTEXT_TILES:  # the kernels' default: no part of the id
        d.pop("nsa_context_tiles")
    if d["nsa_tile_plan"] == DEFAULT_TILE_PLAN:  # likewise
        d.pop("nsa_tile_plan")
    return "s-" + hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def describe(s: Strategy) -> str:
    """Human-readable one-liner, e.g. ``eagle best:16:6 bfs | nsa | refresh/4 fused |
    top16 x 64 w512`` or ``eagle best:16:6 dfs | union C4 mean | refresh/1 | top16 x 64 w512``."""
    tree = s.tree
    if tree.startswith("parents:"):
        parents = parse_tree(tree)
        depth = max(node_depths_ranks(list(parents))[0], default=0)
        tree = f"tree(n={len(parents)},d={depth})"
    head = f"{s.drafter.kind} {tree} {s.traversal}"
    if not s.is_sparse:
        return f"{head} | dense"
    sched = f"refresh/{s.refresh_every}" + (" fused" if s.fusion == "refresh_reuse" else "")
    if s.metadata == "nsa":  # the mode sets the row schedule only: packed tiles say nothing
        group = "nsa"
        if s.nsa_rows_per_tile != PACKED_ROWS:
            group += " per_query" if s.mode == "per_query" else f" union C{s.group_size}"
    else:
        group = s.mode if s.mode == "per_query" else f"{s.mode} C{s.group_size}"
        group += f" {s.metadata}"
    return f"{head} | {group} | {sched} | top{s.top_n} x {s.block_size} w{s.window}"


def invalid_reason(s: Strategy, model: ModelSpec, gpu: GpuSpec, context_len: int) -> str | None:
    """Why ``s`` cannot run on (model, gpu) at ``context_len``; None when it can.

    The reason starts with the rule it breaks:

    - ``rows``: the flattened tree plus the root row must fit the verification kernels
      (``MAX_KERNEL_ROWS``, 64 rows);
    - ``budget``: the selected tokens ``top_n * block_size`` must fit the context;
    - ``window``: block-metadata selection (``mean``/``quest``) needs a local window of at
      least the verification rows (the engine's position-relative, lossless selection);
    - ``kernel``: C no larger than the rows, C x G <= 128 packed rows, C <= 31 in union mode;
    - ``smem``: a group of C queries (C x G packed rows, two K/V stages) must fit one thread
      block's shared memory (``perfmodel.sparse.fits_shared_memory``).
    """
    rows = len(parse_tree(s.tree)) + 1
    if rows > MAX_KERNEL_ROWS:
        return f"rows: {rows} verification rows > {MAX_KERNEL_ROWS}"
    if not s.is_sparse:
        return None
    if s.top_n * s.block_size > context_len:
        return f"budget: top_n*block_size={s.top_n * s.block_size} > context {context_len}"
    if s.metadata != "nsa" and s.window < rows:
        return f"window: window {s.window} < {rows} verification rows"
    g = model.gqa_group
    if s.mode != "per_query":
        if s.group_size > rows:
            return f"kernel: group size {s.group_size} > {rows} rows"
        if s.group_size * g > MAX_PACKED_ROWS:
            return f"kernel: C*G={s.group_size * g} packed rows > {MAX_PACKED_ROWS}"
        if s.mode == "union" and s.group_size > MAX_UNION_GROUP:
            return f"kernel: union groups of {s.group_size} > {MAX_UNION_GROUP}"
    if not bool(
        fits_shared_memory(
            s.group_size, s.block_size, s.top_n, model.head_dim, g, gpu.smem_per_block_bytes
        )
    ):
        return f"smem: C={s.group_size} with {s.block_size}-token tiles does not fit"
    return None


def enumerate_space(spec: SpaceSpec) -> list[Strategy]:
    """Every tuple of the product (before validity filtering), deduplicated: dense strategies
    ignore the sparse axes, per_query ignores C, NSA takes the packed schedule and ignores C
    and traversal, a tree that drafts nothing (``chain:0``) ignores the drafter, and
    refresh_every > 1 implies the fused refresh/reuse kernels.

    Grouping applies to block-metadata selection (``metadata`` ``mean``/``quest``: the
    ``sparse_verify`` kernel streams per query, per group union, or the group's shared blocks).
    The NSA kernels (``metadata`` ``nsa``) select per row under every mode; the mode only sets
    how many draft rows share a row tile and its union of blocks
    (``perfmodel.strategy.nsa_rows_per_tile``). So the space holds one NSA strategy per
    (drafter, tree, budget, schedule): mode ``shared``, the packed tiles (as many rows as a
    tile holds, the fewest blocks streamed), with the first traversal; ``per_query`` NSA is
    seed 000's naive baseline, not a candidate. (The step model prices ``mean``/``quest``
    verification as the ``sparse_verify`` calls the engine launches, by the
    ``sparse_verify/<mode>/<grid regime>`` classes on their launch plan's work,
    ``perfmodel.sparse_work``.)"""
    out: dict[str, Strategy] = {}
    drafters = [
        DrafterSpec(kind=k, model=spec.draft_model if k == "draft_model" else None)
        for k in spec.drafters
    ]
    first = spec.traversals[0]
    for drafter, tree, trav in itertools.product(drafters, spec.trees, spec.traversals):
        if drafter.kind == "self_sparse" and not tree.startswith("chain"):
            continue  # self-speculation drafts chains
        if not parse_tree(tree):
            # Nothing drafted: the engine starts no drafter, so one drafter stands for all.
            drafter = drafters[0]
        base = Strategy(name="planned", tree=tree, drafter=drafter, traversal=trav)
        for mode, meta in itertools.product(spec.modes, spec.metadata):
            # Traversal order only matters to grouped modes (it sets which queries share a
            # group); dense, per-query and NSA strategies keep one canonical order.
            nsa = meta == "nsa" and mode != "dense"
            if (mode in ("dense", "per_query") or nsa) and trav != first:
                continue
            if mode == "dense":
                cands = [base]
            else:
                one = nsa or mode == "per_query"
                cands = [
                    dataclasses.replace(
                        base,
                        attention="sparse",
                        mode="shared" if nsa else mode,
                        group_size=1 if one else c,
                        refresh_every=r,
                        fusion="refresh_reuse" if r > 1 else "none",
                        top_n=n,
                        block_size=b,
                        window=w,
                        metadata=meta,
                    )
                    for c, r, n, b, w in itertools.product(
                        spec.group_sizes,
                        spec.refresh_every,
                        spec.top_ns,
                        spec.block_sizes,
                        spec.windows,
                    )
                ]
            for s in cands:
                out.setdefault(strategy_id(s), s)
    return [dataclasses.replace(s, name=sid) for sid, s in out.items()]


def valid_strategies(
    spec: SpaceSpec, model: ModelSpec, gpu: GpuSpec, context_len: int
) -> tuple[list[Strategy], dict[str, int]]:
    """The valid strategies at ``context_len`` and a count of rejections by rule."""
    keep, rejected = [], {}
    for s in enumerate_space(spec):
        why = invalid_reason(s, model, gpu, context_len)
        if why is None:
            keep.append(s)
        else:
            rule = why.split(":", 1)[0]
            rejected[rule] = rejected.get(rule, 0) + 1
    return keep, rejected
