"""Cost tables: every duration the simulator uses, precomputed from perfmodel at build time.

A scenario evaluates perfmodel once, vectorised over a grid of batch sizes, context lengths (one
point per ``context_bucket`` tokens) and, where the cost depends on it, query overlaps; the
processes then look costs up per round with linear interpolation in context and overlap (exact
for costs linear in them, which memory-bound attention is). perfmodel is never called per round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.costs import (
    draft_level_seconds,
    mixed_step_seconds,
    prefill_seconds,
    speculation_seconds,
    verify_layer_split,
)
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.models import ModelSpec, get_model
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.prr_costs import prr_layer_costs
from ssvkit.perfmodel.step import product_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload, check_feasible

OVERLAP_GRID = np.linspace(0.0, 1.0, 11)


class Grid:
    """Named quantities on integer batch x uniform context grid x uniform overlap grid.

    ``at(b, T, g)`` returns the quantities (a list of floats) at batch b, interpolated linearly
    in context T (extrapolated past the last point) and overlap g.
    """

    def __init__(self, names, contexts, overlaps, values):
        v = np.asarray(values, dtype=float)  # [B, T, G, Q]
        if v.shape[1:] != (len(contexts), len(overlaps), len(names)):
            raise ValueError(f"grid values of shape {v.shape} do not match the axes")
        self.names = tuple(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.values = v
        self.t0 = float(contexts[0])
        self.dt = float(contexts[1] - contexts[0]) if len(contexts) > 1 else 1.0
        self.nt = len(contexts)
        self.ng = len(overlaps)
        self.dg = float(overlaps[1] - overlaps[0]) if len(overlaps) > 1 else 1.0
        self.g0 = float(overlaps[0])
        self._rows = v.tolist()

    @property
    def max_batch(self) -> int:
        return len(self._rows)

    def _t(self, T):
        if self.nt == 1:
            return 0, 0.0
        x = (T - self.t0) / self.dt
        i = min(max(int(x), 0), self.nt - 2)
        return i, max(x - i, 0.0)

    def at(self, b: int, T: float, g: float = 0.0) -> list[float]:
        rows = self._rows[b - 1]
        i, fx = self._t(T)
        if self.ng == 1:
            a = rows[i][0]
            if self.nt == 1:
                return a
            c = rows[i + 1][0]
            return [u + fx * (w - u) for u, w in zip(a, c, strict=True)]
        y = min(max((g - self.g0) / self.dg, 0.0), self.ng - 1.0)
        j = min(int(y), self.ng - 2)
        fy = y - j
        r0, r1 = rows[i], rows[min(i + 1, self.nt - 1)]
        out = []
        for q in range(len(self.names)):
            lo = r0[j][q] + fy * (r0[j + 1][q] - r0[j][q])
            hi = r1[j][q] + fy * (r1[j + 1][q] - r1[j][q])
            out.append(lo + fx * (hi - lo))
        return out

    def get(self, name: str, b: int, T: float, g: float = 0.0) -> float:
        return self.at(b, T, g)[self.index[name]]


@dataclass(frozen=True, slots=True)
class CostContext:
    """What every table is evaluated with: model, GPU, predictor and workload constants."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    kv_bytes: int
    acceptance: float
    dtype: str = "bf16"
    elementwise: str = "fused"  # perfmodel.elementwise.ELEMENTWISE
    loop: str = "pipelined"  # perfmodel.loop_host.LOOPS

    @classmethod
    def build(
        cls,
        model: str,
        gpu: str,
        tp: int,
        kv_bytes: int,
        acceptance: float,
        roofline=False,
        any_architecture=False,
        elementwise: str = "fused",
        loop: str = "pipelined",
    ):
        spec = get_gpu(gpu, measured=not roofline, any_architecture=any_architecture)
        return cls(
            get_model(model), spec, tp, kv_bytes, acceptance, elementwise=elementwise, loop=loop
        )

    def predictor(self, tp: int | None = None) -> RooflinePredictor:
        return make_predictor(self.gpu, self.dtype, self.tp if tp is None else tp)

    @property
    def provenance(self) -> str:
        """Where the durations come from: the predictor's label (its profile, own or
        transferred, or the GPU's ceilings for the roofline)."""
        return self.predictor().provenance

    def check(self, strategy: Strategy, context_len: int) -> None:
        w = Workload(
            context_len=context_len,
            tp=self.tp,
            kv_bytes=self.kv_bytes,
            elementwise=self.elementwise,
            loop=self.loop,
        )
        check_feasible(strategy, w, self.model)


def context_grid(lo: int, hi: int, step: int) -> np.ndarray:
    """Context points from ``lo`` to past ``hi`` every ``step`` tokens (at least two)."""
    n = max(int(np.ceil((hi - lo) / step)) + 1, 1) + 1
    return lo + step * np.arange(n, dtype=float)


def _columns(ctx: CostContext, strategy, contexts, batches, overlaps, tp=None):
    return product_columns(
        ctx.model,
        [strategy],
        context_len=list(contexts),
        batch=list(batches),
        overlap=list(overlaps),
        acceptance=[ctx.acceptance],
        tp=[ctx.tp if tp is None else tp],
        kv_bytes=[ctx.kv_bytes],
        elementwise=ctx.elementwise,
        loop=ctx.loop,
    )


def _to_grid(names, arrays, contexts, batches, overlaps) -> Grid:
    shape = (len(contexts), len(batches), len(overlaps))
    stacked = np.stack([np.asarray(a, dtype=float).reshape(shape) for a in arrays], axis=-1)
    return Grid(names, contexts, overlaps, stacked.transpose(1, 0, 2, 3))


def needs_overlap_axis(strategy: Strategy, varies: bool) -> bool:
    return strategy.is_sparse and strategy.mode == "union" and varies


LOOP_NAMES = (
    "draft_s",
    "select_s",
    "verify_s",
    "accept_s",
    "host_s",
    "linear_s",
    "attention_refresh_s",
    "attention_reuse_s",
    "selection_s",
    "head_s",
)


def loop_table(
    ctx: CostContext, strategy: Strategy, contexts, max_batch: int, overlaps
) -> tuple[Grid, Grid]:
    """Round costs of the AR/SD/SSV decode loop and the per-level drafting costs.

    Returns ``(round grid, draft-level grid)``. Round quantities: ``draft_s``; ``select_s``
    (selection summed over the refresh layers); ``verify_s`` (the rest of the verification
    forward); ``accept_s``; and the per-layer split (``perfmodel.costs.verify_layer_split``).
    ``draft_s + select_s + verify_s + accept_s`` is the step model's ``round_s``.
    """
    batches = range(1, max_batch + 1)
    c = _columns(ctx, strategy, contexts, batches, overlaps)
    drafter = strategy.drafter
    split = verify_layer_split(ctx.model, c, ctx.predictor(), drafter)
    select = split.num_refresh * split.selection_s
    arrays = [
        split.draft_s,
        select,
        split.verify_s - select - split.accept_s,
        split.accept_s,
        split.host_s,
        split.linear_s,
        split.attention_refresh_s,
        split.attention_reuse_s,
        split.selection_s,
        split.head_s,
    ]
    grid = _to_grid(LOOP_NAMES, arrays, contexts, batches, overlaps)
    levels = draft_level_seconds(ctx.model, c, ctx.predictor(), drafter)
    names = [f"level{i}" for i in range(levels.shape[1])]
    lgrid = _to_grid(names, list(levels.T), contexts, batches, overlaps)
    return grid, lgrid


PRR_NAMES = (
    "linear_s",
    "selection_s",
    "attention_s",
    "compressed_s",
    "speculative_s",
    "repair_fixed_s",
    "repair_block_s",
    "head_s",
    "accept_s",
    "draft_s",
)


def prr_table(
    ctx: CostContext, strategy: Strategy, contexts, max_batch: int, budget_ratio: float
) -> Grid:
    """Per-layer PRR costs (``perfmodel.prr_costs.prr_layer_costs``) on the grid."""
    batches = range(1, max_batch + 1)
    overlaps = [0.75]
    c = _columns(ctx, strategy, contexts, batches, overlaps)
    p = prr_layer_costs(ctx.model, c, ctx.predictor(), budget_ratio, strategy.drafter)
    return _to_grid(PRR_NAMES, [getattr(p, n) for n in PRR_NAMES], contexts, batches, overlaps)


SSD_NAMES = ("verify_s", "primary_s", "backup_s", "speculate_s")


def ssd_table(ctx: CostContext, strategy: Strategy, contexts, max_batch: int, budget: int) -> Grid:
    """Saguaro costs per batch and context: the target's verification (at the workload's tp),
    and on the draft device (tp 1): the primary's drafting, the backup's (prompt lookup) and
    the pre-speculation of ``budget`` outcomes per sequence."""
    batches = range(1, max_batch + 1)
    overlaps = [0.75]
    target = _columns(ctx, strategy, contexts, batches, overlaps)
    verify = verify_layer_split(ctx.model, target, ctx.predictor(), strategy.drafter).verify_s
    draft_cols = _columns(ctx, strategy, contexts, batches, overlaps, tp=1)
    split = verify_layer_split(ctx.model, draft_cols, ctx.predictor(1), strategy.drafter)
    backup = dataclasses.replace(strategy, drafter=DrafterSpec(kind="ngram"))
    bcols = _columns(ctx, backup, contexts, batches, overlaps, tp=1)
    backup_s = verify_layer_split(ctx.model, bcols, ctx.predictor(1), backup.drafter).draft_s
    spec = speculation_seconds(ctx.model, draft_cols, ctx.predictor(1), strategy.drafter, budget)
    arrays = [verify, split.draft_s, backup_s, spec]
    return _to_grid(SSD_NAMES, arrays, contexts, batches, overlaps)


@dataclass(frozen=True, slots=True)
class MixedTables:
    """SparseSpec step costs: the linear ops and head over rows m, each attention kind over
    sequences n and context (``perfmodel.costs.mixed_step_seconds`` split by part)."""

    linear_head: list[float]  # [m] seconds, m = 0..max rows
    draft_attention: Grid  # batch axis = n sequences drafting
    verify_attention: Grid  # batch axis = n sequences verifying

    def step_s(self, nd: int, nv: int, k: int, td: float, tv: float) -> float:
        m = nd + nv * (k + 1)
        t = self.linear_head[m]
        if nd:
            t += self.draft_attention.at(nd, td)[0]
        if nv:
            t += self.verify_attention.at(nv, tv)[0]
        return t


def mixed_tables(
    ctx: CostContext, k: int, sparsity_ratio: float, contexts, max_seqs: int
) -> MixedTables:
    """Tables of ``mixed_step_seconds`` for up to ``max_seqs`` sequences of k-step chains."""
    pred = ctx.predictor()
    m = np.arange(max_seqs * (k + 1) + 1, dtype=float)
    ew = {"elementwise": ctx.elementwise}
    lin = mixed_step_seconds(
        ctx.model, pred, m, 0, k, contexts[0], sparsity_ratio, ctx.kv_bytes, **ew
    )
    # With n_v = 0 the rows are n_d: the linear ops and the head depend on m only.
    linear_head = (lin["linear_s"] + lin["head_s"]).tolist()
    n = np.arange(1, max_seqs + 1, dtype=float)[:, None]
    T = np.asarray(contexts, dtype=float)[None, :]
    d = mixed_step_seconds(ctx.model, pred, n, 0, k, T, sparsity_ratio, ctx.kv_bytes, **ew)
    v = mixed_step_seconds(ctx.model, pred, 0, n, k, T, sparsity_ratio, ctx.kv_bytes, **ew)
    grid = lambda a: Grid(["s"], contexts, [0.0], a[:, :, None, None])
    return MixedTables(linear_head, grid(d["draft_attention_s"]), grid(v["verify_attention_s"]))


def prefill_table(ctx: CostContext, contexts) -> Grid:
    """Prefill seconds of one prompt per context point (``perfmodel.costs.prefill_seconds``)."""
    s = prefill_seconds(
        ctx.model, ctx.predictor(), np.asarray(contexts), 1, ctx.kv_bytes, ctx.elementwise
    )
    return Grid(["prefill_s"], contexts, [0.0], np.asarray(s)[None, :, None, None])
