"""The points the step model evaluates: one row per (strategy, workload) point, as columns.

``build_columns`` takes explicit (strategy, workload) pairs, ``product_columns`` the cartesian
product of strategies and workload axes without a Python object per point; both resolve each
tree once per acceptance into its draft count, expected tokens per round
(``perfmodel.acceptance``) and nodes per level. ``perfmodel.step.predict_columns`` evaluates
a whole table in one vectorised pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np
from ssvkit.perfmodel.acceptance import TreeAcceptance, full_depth_probability, tree_level_sizes
from ssvkit.perfmodel.elementwise import chains_norms, fused_accept, fused_elementwise
from ssvkit.perfmodel.loop_host import pipelining
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.nsa_plan import CONTEXT_TILES, TILE_PLANS
from ssvkit.perfmodel.strategy import (
    Strategy,
    Workload,
    check_feasible,
    parse_tree,
    tree_expected_tokens,
)

MODE_CODES = {"per_query": 0, "union": 1, "shared": 2}
DRAFTER_CODES = {"eagle": 0, "draft_model": 1, "ngram": 2, "self_sparse": 3}
META_VECTORS = {"nsa": 0, "mean": 1, "quest": 2}


@dataclass(slots=True)
class Columns:
    """One row per evaluated point (all arrays of one length N)."""

    context_len: np.ndarray
    batch: np.ndarray
    tp: np.ndarray
    acceptance: np.ndarray
    overlap: np.ndarray
    kv_bytes: np.ndarray
    num_draft: np.ndarray  # K draft nodes
    expected_tokens: np.ndarray  # tokens per round (1 for AR)
    level_sizes: np.ndarray  # [N, D] draft nodes per tree level (drafting forwards)
    full_depth: np.ndarray  # per sequence, P(the kept path reaches the deepest level)
    drafter: np.ndarray  # DRAFTER_CODES
    sparsity_ratio: np.ndarray  # self_sparse drafter's KV share
    sparse: np.ndarray  # 0 dense, 1 NSA-style sparse
    mode: np.ndarray  # MODE_CODES
    group_size: np.ndarray
    top_n: np.ndarray
    block_size: np.ndarray
    window: np.ndarray
    comp_stride: np.ndarray
    meta_vectors: np.ndarray  # META_VECTORS
    refresh_frac: np.ndarray  # share of layers that refresh (run selection)
    fused: np.ndarray  # 1 = refresh_reuse kernels
    nsa_rows_per_tile: np.ndarray  # NSA draft rows per row tile (Strategy.nsa_rows_per_tile)
    # Strategy.nsa_context_tiles as its index in nsa_plan.CONTEXT_TILES (0 per_tile, 1 shared,
    # 2 paired).
    nsa_shared_context: np.ndarray
    # Strategy.nsa_tile_plan as its index in nsa_plan.TILE_PLANS.
    nsa_tile_plan: np.ndarray
    fused_elementwise: np.ndarray  # 1: the engine's fused element-wise kernels, 0: torch ops
    fused_accept: np.ndarray  # 1: the acceptance step as kernels.accept_commit, 0: torch ops
    chains_norms: np.ndarray  # 1: norms chained into projections that stream (linear_rule)
    pipelined_loop: np.ndarray  # 1: the engine pipelines the rounds it can (Workload.loop)

    def __len__(self) -> int:
        return len(self.context_len)

    @property
    def rows(self) -> np.ndarray:
        """Query rows per sequence in the verification forward."""
        return self.num_draft + 1.0


def _tree_columns(tree: str, acceptance: float):
    parents = parse_tree(tree, acceptance)
    full = full_depth_probability(list(parents), TreeAcceptance.from_alpha(acceptance))
    return (
        len(parents),
        tree_expected_tokens(parents, acceptance),
        tree_level_sizes(parents),
        full,
    )


def _strategy_columns(s: Strategy, num_layers: int) -> dict:
    return {
        "drafter": DRAFTER_CODES[s.drafter.kind],
        "sparsity_ratio": s.drafter.sparsity_ratio,
        "sparse": float(s.is_sparse),
        "mode": MODE_CODES[s.mode],
        "group_size": s.group_size,
        "top_n": s.top_n,
        "block_size": s.block_size,
        "window": s.window,
        "comp_stride": s.comp_stride,
        "meta_vectors": META_VECTORS[s.metadata],
        "refresh_frac": np.ceil(num_layers / s.refresh_every) / num_layers,
        "fused": float(s.fusion == "refresh_reuse"),
        "nsa_rows_per_tile": s.nsa_rows_per_tile,
        "nsa_shared_context": float(CONTEXT_TILES.index(s.nsa_context_tiles)),
        "nsa_tile_plan": float(TILE_PLANS.index(s.nsa_tile_plan)),
    }


def build_columns(model: ModelSpec, points: list[tuple[Strategy, Workload]]) -> Columns:
    """Columns for explicit (strategy, workload) pairs; each pair is checked for feasibility."""
    if not points:
        raise ValueError("no (strategy, workload) points to evaluate")
    rows, levels = [], []
    for s, w in points:
        check_feasible(s, w, model)
        k, e, lv, full = _tree_columns(s.tree, w.acceptance)
        rows.append(
            {
                "full_depth": full,
                "context_len": w.context_len,
                "batch": w.batch,
                "tp": w.tp,
                "acceptance": w.acceptance,
                "overlap": w.overlap,
                "kv_bytes": w.kv_bytes,
                "num_draft": k,
                "expected_tokens": e,
                "fused_elementwise": fused_elementwise(w.elementwise),
                "fused_accept": fused_accept(w.elementwise),
                "chains_norms": chains_norms(w.elementwise),
                "pipelined_loop": pipelining(w.loop),
                **_strategy_columns(s, model.num_layers),
            }
        )
        levels.append(lv)
    return _assemble(rows, levels)


def _assemble(rows: list[dict], levels: list[list[int]]) -> Columns:
    depth = max((len(lv) for lv in levels), default=0)
    lv = np.zeros((len(rows), max(depth, 1)))
    for i, sizes in enumerate(levels):
        lv[i, : len(sizes)] = sizes
    cols = {
        f.name: np.array([r[f.name] for r in rows], dtype=float)
        for f in fields(Columns)
        if f.name != "level_sizes"
    }
    return Columns(level_sizes=lv, **cols)


def product_columns(
    model: ModelSpec,
    strategies: list[Strategy],
    *,
    elementwise: str | None = None,
    loop: str | None = None,
    **axes,
) -> Columns:
    """Cartesian product of strategies and workload axes (lists), evaluated without building a
    Python object per point: trees are resolved once per (tree, acceptance) pair.

    ``axes`` keys: context_len, batch, tp, acceptance, overlap, kv_bytes (missing ones take the
    ``Workload`` defaults); ``elementwise`` and ``loop`` hold for every point (default: the
    ``Workload``'s).
    Infeasible points (top_n * block_size > context) are kept and flagged by ``feasible_mask``.
    """
    defaults = Workload()
    elementwise = defaults.elementwise if elementwise is None else elementwise
    fused = fused_elementwise(elementwise)
    names = ("context_len", "batch", "tp", "acceptance", "overlap", "kv_bytes")
    bad = set(axes) - set(names)
    if bad:
        raise ValueError(f"unknown workload axes: {', '.join(sorted(bad))}")
    grid = {n: np.asarray(axes.get(n, [getattr(defaults, n)]), dtype=float) for n in names}
    for n, v in grid.items():
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"axis {n} must be a non-empty list")
    n_s = len(strategies)
    sizes = [n_s] + [grid[n].size for n in names]
    idx = np.indices(sizes).reshape(len(sizes), -1)
    s_idx = idx[0]
    cols = {n: grid[n][idx[i + 1]] for i, n in enumerate(names)}
    cols["fused_elementwise"] = np.full(idx.shape[1], fused)
    cols["fused_accept"] = np.full(idx.shape[1], fused_accept(elementwise))
    cols["chains_norms"] = np.full(idx.shape[1], chains_norms(elementwise))
    cols["pipelined_loop"] = np.full(
        idx.shape[1], pipelining(defaults.loop if loop is None else loop)
    )
    # Strategy fields, gathered per point.
    per_s = [_strategy_columns(s, model.num_layers) for s in strategies]
    for key in per_s[0]:
        cols[key] = np.array([p[key] for p in per_s], dtype=float)[s_idx]
    # Trees depend on (tree spec, acceptance): resolve each pair once.
    acc = cols["acceptance"]
    trees = [s.tree for s in strategies]
    uniq_acc = np.unique(grid["acceptance"])
    cache = {(t, a): _tree_columns(t, float(a)) for t, a in itertools.product(set(trees), uniq_acc)}
    depth = max(len(v[2]) for v in cache.values())
    k_tab = np.zeros((n_s, uniq_acc.size))
    e_tab = np.zeros((n_s, uniq_acc.size))
    f_tab = np.zeros((n_s, uniq_acc.size))
    lv_tab = np.zeros((n_s, uniq_acc.size, max(depth, 1)))
    for i, t in enumerate(trees):
        for j, a in enumerate(uniq_acc):
            k, e, lv, full = cache[(t, a)]
            k_tab[i, j], e_tab[i, j], f_tab[i, j] = k, e, full
            lv_tab[i, j, : len(lv)] = lv
    a_idx = np.searchsorted(uniq_acc, acc)
    cols["num_draft"] = k_tab[s_idx, a_idx]
    cols["expected_tokens"] = e_tab[s_idx, a_idx]
    cols["full_depth"] = f_tab[s_idx, a_idx]
    return Columns(level_sizes=lv_tab[s_idx, a_idx], **cols)


def take(c: Columns, idx: np.ndarray) -> Columns:
    """The points ``idx`` of ``c`` (a new Columns)."""
    return Columns(**{f.name: getattr(c, f.name)[idx] for f in fields(Columns)})


def unique_points(c: Columns, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the distinct points of ``c`` on columns ``names`` (level_sizes included when
    named) and the inverse map, so an op that depends on those columns only is evaluated once
    per distinct point."""
    cols = [
        col for n in names for col in (c.level_sizes.T if n == "level_sizes" else [getattr(c, n)])
    ]
    # Mixed-radix codes, re-factorised after each column so they never overflow (much faster
    # than np.unique(axis=0), which sorts whole rows).
    code = np.zeros(len(c), dtype=np.int64)
    for col in cols:
        u, inv = np.unique(col, return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
        _, code = np.unique(code, return_inverse=True)
        code = code.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def feasible_mask(c: Columns) -> np.ndarray:
    """Points a sparse strategy can run: the selected tokens fit the context."""
    return (c.sparse == 0) | (c.top_n * c.block_size <= c.context_len)
