"""The step model: per-op counts and seconds of one AR decode step or one draft/verify round.

For (model, strategy, workload) points it counts, per op, FLOPs, device-memory bytes, kernel
launches and link bytes of: the QKV/O and FFN (or MoE) GEMMs, norms, rotary embedding and KV
append, block selection, each attention branch, TP all-reduces, LM head and sampling, and the
drafter. A predictor (``perfmodel.predictor``) turns counts into seconds; tokens/s follow from
the expected tokens per round (``perfmodel.acceptance``). Everything is vectorised over a
``Columns`` table of points, so a grid of 10^5 points evaluates in one pass.

The parts: the points (``perfmodel.columns``), the op builders of the dense layers and
attention (``perfmodel.ops``), of sparse attention and selection (``perfmodel.sparse_ops``)
and of the drafting (``perfmodel.draft_ops``); this module assembles them into a round. A
verification forward runs ``t = K + 1`` query rows per sequence (the last accepted token and
the K draft nodes); an AR step runs one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.accept_ops import accept_op, tree_depths
from ssvkit.perfmodel.columns import (
    DRAFTER_CODES,
    META_VECTORS,
    MODE_CODES,
    Columns,
    build_columns,
    feasible_mask,
    product_columns,
    take,
    unique_points,
)
from ssvkit.perfmodel.draft_host import draft_host_s, shipped_coefficients
from ssvkit.perfmodel.draft_ops import draft_ops
from ssvkit.perfmodel.intervals import HOST, POOLED, IntervalSource, Residuals, Spread
from ssvkit.perfmodel.loop_host import exposed_s, loop_host_s, pipelined
from ssvkit.perfmodel.loop_host import shipped as shipped_loop_host
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import (
    OpSum,
    dense_attention,
    head_ops,
    linear_ops,
)
from ssvkit.perfmodel.predictor import (
    RESIDENT_KINDS,
    RESIDENT_SUFFIX,
    Op,
    RooflinePredictor,
    weights_fit_l2,
)
from ssvkit.perfmodel.selection_ops import SELECTION_OPS
from ssvkit.perfmodel.sparse_ops import SPARSE_VERIFY_OPS, sparse_attention
from ssvkit.perfmodel.strategy import DrafterSpec

__all__ = [
    "ATTENTION_OPS",
    "DRAFTER_CODES",
    "META_VECTORS",
    "MODE_CODES",
    "Columns",
    "StepPrediction",
    "attention_seconds",
    "build_columns",
    "feasible_mask",
    "predict_columns",
    "product_columns",
    "take",
    "target_forward",
    "unique_points",
]


def target_forward(
    acc: OpSum, model: ModelSpec, c: Columns, rows, prefix: str, num_sms: int
) -> dict:
    """One target forward over ``rows`` query rows per sequence with the strategy's attention
    (``num_sms``: the GPU's, for the attention kernels' launch plan); the bytes each sparse
    branch loads."""
    m = c.batch * rows
    layers = model.num_layers * np.ones_like(rows)
    linear_ops(acc, model, m, c.tp, layers, prefix, c.fused_elementwise, c.chains_norms)
    dense = 1.0 - c.sparse
    dense_attention(acc, model, c, rows, c.context_len + rows, layers * dense, prefix, num_sms)
    branches = sparse_attention(acc, model, c, layers, prefix, num_sms)
    head_ops(acc, model, m, c.tp, model.vocab_size, prefix, c.fused_elementwise)
    return branches


def _flags(predictor, n: int, name: str = "outside") -> np.ndarray:
    """A predictor's per-point flags ``name`` (extrapolation; ``stood_in``: priced by a
    stand-in class) as an [n] array (none: all False)."""
    f = getattr(predictor, name, None)
    if f is None:
        return np.zeros(n, dtype=bool)
    try:
        return np.broadcast_to(np.asarray(f, dtype=bool), (n,)).copy()
    except ValueError:
        return np.zeros(n, dtype=bool)


DRAFT_KEYS = (
    "drafter",
    "num_draft",
    "level_sizes",
    "full_depth",
    "batch",
    "context_len",
    "tp",
    "kv_bytes",
    "sparsity_ratio",
    "fused_elementwise",
)


def _gather(op: Op, idx: np.ndarray, n: int) -> Op:
    def g(x):
        return np.broadcast_to(x, (n,))[idx]

    return Op(
        op.kind,
        g(op.flops),
        g(op.bytes),
        g(op.launches),
        g(op.comm_bytes),
        op.kernel,
        g(op.calls),
        None if op.dedup_bytes is None else g(op.dedup_bytes),
        g(op.depth),
        g(op.serial_steps),
        g(op.tile_rows),
        tuple(g(x) for x in op.stage_counts),
    )


def _mark_resident(acc: OpSum, owner, gpu) -> None:
    """Name the GEMM and element-wise ops of the models whose weights fit in ``gpu``'s L2 with
    ``RESIDENT_SUFFIX`` (``owner(key)``: the model an op of ``acc`` belongs to)."""
    for k, op in acc.items():
        if op.kernel and op.kind in RESIDENT_KINDS and weights_fit_l2(owner(k), gpu):
            acc[k] = dataclasses.replace(op, kernel=op.kernel + RESIDENT_SUFFIX)


ATTENTION_OPS = (
    "attention",
    "sparse_attention",
    "sparse_attention_refresh",
    "sparse_attention_fused",
    "sparse_attention_fused_refresh",
    "sparse_attention_per_query",
    "sparse_attention_refresh_per_query",
    "sparse_attention_fused_per_query",
    "sparse_attention_fused_refresh_per_query",
    *SPARSE_VERIFY_OPS.values(),
)


def attention_seconds(op_seconds: dict[str, np.ndarray], stage: str = "verify") -> np.ndarray:
    """Seconds of a stage's attention, dense or sparse (the ops of ``ATTENTION_OPS``)."""
    parts = [op_seconds[f"{stage}.{n}"] for n in ATTENTION_OPS if f"{stage}.{n}" in op_seconds]
    return sum(parts[1:], parts[0]) if parts else 0.0


def selection_seconds(op_seconds: dict[str, np.ndarray], stage: str = "verify") -> np.ndarray:
    """Seconds of a stage's block-metadata selection (the ops of ``SELECTION_OPS``)."""
    names = SELECTION_OPS.values()
    parts = [op_seconds[f"{stage}.{n}"] for n in names if f"{stage}.{n}" in op_seconds]
    return sum(parts[1:], parts[0]) if parts else 0.0


@dataclass(slots=True)
class StepPrediction:
    """Per-op seconds and counts for the evaluated points, and the round's totals; per op, the
    kernel family of the class that priced it (None: the roofline) and the points where it was
    extrapolated, from which ``spread`` builds the intervals (``perfmodel.intervals``)."""

    op_seconds: dict[str, np.ndarray]
    ops: dict[str, Op]
    draft_s: np.ndarray
    verify_s: np.ndarray
    round_s: np.ndarray  # draft_s + verify_s + loop_s
    tokens_per_round: np.ndarray
    tokens_per_s: np.ndarray
    branch_bytes: dict[str, np.ndarray]
    provenance: str
    extrapolated: np.ndarray  # per point: some op outside its calibrated range
    stand_in: np.ndarray  # per point: some op priced by a stand-in class
    stand_ins: dict[str, str]  # kernel -> the measured class that priced it
    op_family: dict[str, str | None] = dataclasses.field(default_factory=dict)
    op_outside: dict[str, np.ndarray | None] = dataclasses.field(default_factory=dict)
    interval_source: IntervalSource | None = None
    interval_note: str = ""  # why the figures carry no interval, when they carry none
    # The loop's host time per round (``perfmodel.loop_host``; zeros where no fit ships) and
    # the log residuals of its fit, which widen the round (None: it adds no width).
    loop_s: np.ndarray | None = None
    loop_residuals: Residuals | None = None

    def __post_init__(self) -> None:
        if self.loop_s is None:
            self.loop_s = np.zeros_like(np.asarray(self.round_s, dtype=float))

    def stood_in_for(self, i: int) -> list[str]:
        """``kernel <- class`` of each op of point ``i`` priced by a stand-in class."""
        ops = (op for op in self.ops.values() if op.kernel in self.stand_ins)
        used = {op.kernel for op in ops if np.broadcast_to(op.calls, self.round_s.shape)[i] > 0}
        return [f"{k} <- {self.stand_ins[k]}" for k in sorted(used)]

    def label(self, i: int) -> str:
        """Point ``i``'s provenance with its flags: ``:extrapolated``, ``:stand-in``."""
        flags = (":extrapolated", self.extrapolated[i]), (":stand-in", self.stand_in[i])
        return self.provenance + "".join(f for f, on in flags if on)

    def spread(self, keys=None, prefix: str = "") -> Spread | None:
        """The error model (``perfmodel.intervals.Spread``) of the sum of the ops ``keys``
        (default: every op whose name starts with ``prefix``); None without residuals."""
        src = self.interval_source
        if src is None:
            return None
        keys = [k for k in self.op_seconds if k.startswith(prefix)] if keys is None else keys
        axis = src.axis
        out = Spread.zeros(len(self.round_s), len(axis))
        for k in keys:
            if not self.op_seconds[k].any():
                continue
            fam = self.op_family.get(k)
            if k == "loop.host" and self.loop_residuals is not None:
                out.add_op(self.op_seconds[k], axis[HOST], self.loop_residuals)
                continue
            if self.ops[k].kind == "host":
                out.add_apart(self.op_seconds[k])
                continue
            if fam is None:
                out.add_op(self.op_seconds[k])
                continue
            column = axis.get(fam, axis[POOLED])
            gap = src.gap(self.ops[k].kind)
            inside = src.residuals(fam, extrapolated=False)
            mask = self.op_outside.get(k)
            if mask is None or not np.any(mask):
                out.add_op(self.op_seconds[k], column, inside, gap=gap)
            else:
                outside = src.residuals(fam, extrapolated=True)
                out.add_op(self.op_seconds[k], column, inside, outside, mask, gap)
        return out


def _add_draft_host(acc: OpSum, secs, family, flags, c: Columns, gpu: str) -> None:
    """The draft step's host time (``perfmodel.draft_host``) as the op ``draft.host``, where
    coefficients ship for ``gpu`` and some point drafts."""
    shipped = shipped_coefficients(gpu)
    if shipped is None:
        return
    host_s = draft_host_s(shipped[0], c.drafter, c.batch, c.num_draft, tree_depths(c))
    if not host_s.any():
        return
    zero = np.zeros(len(c))
    acc["draft.host"] = Op("host", zero, zero, zero)
    secs["draft.host"], family["draft.host"], flags["draft.host"] = host_s, None, None


def _add_loop_host(acc: OpSum, secs, family, flags, c: Columns, gpu: str) -> np.ndarray:
    """The loop's host time per round (``perfmodel.loop_host``) as the op ``loop.host``, where
    coefficients ship for ``gpu``; returns the points outside the batch range they were fitted
    on (extrapolated)."""
    fit = shipped_loop_host(gpu)
    if fit is None:
        return np.zeros(len(c), dtype=bool)
    low, high = fit.batches
    host_s = loop_host_s(fit.coefficients, c.drafter, c.batch, c.num_draft, c.expected_tokens)
    zero = np.zeros(len(c))
    acc["loop.host"] = Op("host", zero, zero, zero)
    secs["loop.host"], family["loop.host"], flags["loop.host"] = host_s + zero, None, None
    batch = np.asarray(c.batch) + zero
    return (batch < low) | (batch > high)


def _draft_model(c: Columns, drafter: DrafterSpec) -> ModelSpec | None:
    """The draft model's spec where some point of ``c`` drafts with it, else None: an
    autoregressive point keeps its strategy's drafter, which is never priced."""
    drafts_with_model = ((c.drafter == DRAFTER_CODES["draft_model"]) & (c.num_draft > 0)).any()
    draft = drafter.draft_spec() if drafts_with_model else None
    if draft is None and drafts_with_model:
        raise ValueError("a draft_model drafter needs the draft model (DrafterSpec.model)")
    return draft


def _price_ops(acc: OpSum, predictor, n: int) -> tuple[dict, dict, dict]:
    """Each op's seconds at the ``n`` points, the kernel family that priced it and the points
    where it was extrapolated (None: nowhere)."""
    secs, family, flags = {}, {}, {}
    for k, op in acc.items():
        t, family[k], f = predictor.price(op)
        secs[k] = t * np.ones(n)
        flags[k] = None if f is None else np.broadcast_to(f, (n,))
    return secs, family, flags


def _add_draft(
    acc: OpSum, secs, family, flags, model: ModelSpec, draft, draft_vocab, c: Columns, predictor
) -> np.ndarray:
    """The drafting ops into ``acc``, their seconds, kernel families and extrapolated points
    into ``secs``, ``family`` and ``flags``; returns the points where the drafting's pricing
    extrapolated. Drafting depends on few columns (``DRAFT_KEYS``): it is evaluated once per
    distinct point, then gathered back to every point of ``c``."""
    first, inverse = unique_points(c, DRAFT_KEYS)
    cu = take(c, first)
    draft_acc = OpSum()
    draft_ops(draft_acc, model, draft, cu, draft_vocab, predictor.gpu.num_sms)
    _mark_resident(
        draft_acc, lambda k: draft if k.startswith("draft.model.") else model, predictor.gpu
    )
    draft_pred = predictor.at(first) if hasattr(predictor, "at") else predictor
    for k, op in draft_acc.items():
        t, family[k], f = draft_pred.price(op)
        secs[k] = (t * np.ones(len(cu)))[inverse]
        flags[k] = None if f is None else np.broadcast_to(f, (len(cu),))[inverse]
        acc[k] = _gather(op, inverse, len(cu))
    return _flags(draft_pred, len(cu))[inverse]


def predict_columns(
    model: ModelSpec, c: Columns, predictor: RooflinePredictor, drafter: DrafterSpec | None = None
) -> StepPrediction:
    """Evaluate every point of ``c``: verification (or AR step) forward, drafting, acceptance.

    ``round_s = draft_s + verify_s + loop_s`` (the loop's host time, ``perfmodel.loop_host``,
    where a fit ships for the GPU: the part the GPU does not hide where the engine pipelines
    the rounds); ``tokens_per_s = batch * E[tokens per round] / round_s``.
    The predictor's ``tp`` must match ``c.tp`` (build it with ``tp=c.tp``). ``drafter`` supplies
    the draft model's spec and EAGLE's draft vocabulary (the kind per point is in ``c``).
    """
    drafter = drafter or DrafterSpec()
    draft = _draft_model(c, drafter)
    if hasattr(predictor, "outside"):
        predictor.outside = None  # extrapolation and stand-in flags are per evaluation
        predictor.stood_in = None
    acc = OpSum()
    branches = target_forward(acc, model, c, c.rows, "verify.", predictor.gpu.num_sms)
    acc.add("verify.accept", accept_op(model, c))
    _mark_resident(acc, lambda _: model, predictor.gpu)
    secs, family, flags = _price_ops(acc, predictor, len(c))
    draft_outside = _add_draft(
        acc, secs, family, flags, model, draft, drafter.draft_vocab, c, predictor
    )
    _add_draft_host(acc, secs, family, flags, c, predictor.gpu.name)
    loop_outside = _add_loop_host(acc, secs, family, flags, c, predictor.gpu.name)
    outside = _flags(predictor, len(c)) | draft_outside | loop_outside
    draft_s = sum((v for k, v in secs.items() if k.startswith("draft.")), np.zeros(len(c)))
    verify_s = sum((v for k, v in secs.items() if k.startswith("verify.")), np.zeros(len(c)))
    if "loop.host" in secs:
        overlap = pipelined(c.pipelined_loop, c.drafter, c.num_draft)
        secs["loop.host"] = exposed_s(secs["loop.host"], draft_s + verify_s, overlap)
    loop_s = secs.get("loop.host", np.zeros(len(c)))
    round_s = draft_s + verify_s + loop_s
    return StepPrediction(
        op_seconds=secs,
        ops=dict(acc),
        draft_s=draft_s,
        verify_s=verify_s,
        round_s=round_s,
        tokens_per_round=c.expected_tokens,
        tokens_per_s=c.batch * c.expected_tokens / round_s,
        branch_bytes=branches,
        provenance=predictor.provenance,
        extrapolated=outside,
        stand_in=_flags(predictor, len(c), "stood_in"),
        stand_ins=dict(getattr(predictor, "stand_ins", {})),
        op_family=family,
        op_outside=flags,
        interval_source=predictor.interval_source,
        interval_note=predictor.interval_note,
        loop_s=loop_s,
        loop_residuals=_loop_residuals(predictor.gpu.name, secs),
    )


def _loop_residuals(gpu: str, secs: dict) -> Residuals | None:
    """The residuals of the loop host fit that priced ``secs["loop.host"]``, if any."""
    fit = shipped_loop_host(gpu) if "loop.host" in secs else None
    return None if fit is None else fit.residuals
