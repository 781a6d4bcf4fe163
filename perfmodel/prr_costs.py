"""PRR's costs (seed 004): the incremental repair of missed blocks (``repair_seconds``) and the
per-layer split of a sparse verification into the parts PRR runs side by side
(``prr_layer_costs``). Counted with the step model's op builders and predictor, as
``perfmodel.costs`` is. Pure numpy; vectorised over the ``Columns`` points or arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.costs import verify_layer_split, with_columns
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import (
    ACT_BYTES,
    F32,
    attn_flops_per_row_token,
    kv_token_bytes,
    local_heads,
)
from ssvkit.perfmodel.predictor import Op
from ssvkit.perfmodel.repair_work import distinct_share, repair_call_work
from ssvkit.perfmodel.step import Columns, attention_seconds, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec


def repair_seconds(
    model: ModelSpec,
    predictor,
    rows,
    missed_blocks,
    block_size,
    batch=1,
    kv_bytes=2,
    context_len=None,
) -> np.ndarray:
    """PRR's incremental repair of one layer (seed 004 §4.3, eqs. 6-8), seconds.

    The kernel reads the speculative output O, its running max m and denominator l for every
    query row and head, streams the ``missed_blocks`` blocks of ``block_size`` tokens once, and
    writes the corrected O: bytes ``b rows (missed B kv_token + Hq (2 d_h act + 2 fp32))``
    (each row's own missed blocks, as the kernel gathers them), FLOPs ``b rows missed B (4 Hq
    d_h)``, one launch. Work scales with the misses only; at zero misses it still launches
    (PRR's fixed repair cost). The op is the measured ``repair/repair`` class, and it carries
    the kernel's launch-plan counts (``perfmodel.repair_work``: each program walks its row's
    missed blocks one after another) as its ``slot_plan``, so a calibrated predictor prices a
    missed block at its measured latency, not at its bytes alone. With ``context_len`` the
    rows of one (sequence, KV head) draw their blocks uniformly from its blocks, as the
    calibration rows do, and re-read the ones they share from L2
    (``repair_work.distinct_share``); without it every row's blocks are its own. Vectorised
    over every argument.
    """
    tp = predictor.tp
    hq, hkv = local_heads(model, tp)
    b = np.asarray(batch, dtype=float)
    r = np.asarray(rows, dtype=float)
    blocks = np.asarray(missed_blocks, dtype=float)
    tokens = blocks * np.asarray(block_size, dtype=float)
    state = b * r * hq * (2 * model.head_dim * ACT_BYTES + 2 * F32)
    ones = np.ones_like(tokens + b + r)
    plan = _repair_plan(model, predictor, hq, hkv, b, r, blocks, block_size, context_len, ones)
    op = Op(
        "attention",
        b * r * tokens * attn_flops_per_row_token(model, hq),
        b * r * tokens * kv_token_bytes(model, hkv, kv_bytes) + state,
        ones,
        kernel="repair/repair",
        calls=ones,
        slot_plan=plan,
        head_dim=model.head_dim,
    )
    return predictor.op_time_s(op)


def _repair_plan(
    model: ModelSpec, predictor, hq, hkv, b, r, blocks, block_size, context_len, ones
) -> Op | None:
    """The repair kernel's launch-plan work (``repair_work.repair_call_work``) as the
    ``slot_plan`` of ``repair_seconds``' op: its FLOPs, requested bytes, the distinct ones
    (``repair_work.distinct_share`` with ``context_len``, all of them without), its chain of
    tiles and its waves. None for an MLA model: the kernel runs no MLA, so its repair op keeps
    the algorithmic counts."""
    if model.is_mla:
        return None
    gpu = predictor.gpu
    w = repair_call_work(
        r, hq, hkv, model.head_dim, b, blocks, block_size, gpu.num_sms, gpu.smem_per_sm_bytes
    )
    share = 1.0
    if context_len is not None:
        num_blocks = np.asarray(context_len, dtype=float) // np.asarray(block_size, dtype=float)
        share = distinct_share(num_blocks, blocks, r)
    return Op(
        "attention",
        w.flops * ones,
        w.requested_bytes * ones,
        ones,
        kernel="repair/repair",
        calls=ones,
        dedup_bytes=w.requested_bytes * share * ones,
        depth=w.chain_tiles * ones,
        stage_counts=(w.waves * ones,),
    )


@dataclass(frozen=True, slots=True)
class PrrLayerCosts:
    """Per-layer costs of dynamic sparse attention with and without PRR (seed 004).

    Serial DSA layer: ``linear + selection + attention``. PRR layer: ``linear +
    max(selection + compressed, speculative) + repair(missed)``: the compressed branch scores
    the blocks (it belongs to selection), the speculative kernel attends to the predicted
    ``ceil(rho n)`` blocks and the sliding window while selection runs, and the repair kernel
    folds in the missed blocks.
    """

    linear_s: np.ndarray
    selection_s: np.ndarray  # block selection of one layer
    attention_s: np.ndarray  # the step model's sparse attention of one layer (all branches)
    compressed_s: np.ndarray  # its compressed-branch share
    speculative_s: np.ndarray  # selected branch over ceil(rho n) blocks plus the window
    repair_fixed_s: np.ndarray  # repair kernel with no missed block
    repair_block_s: np.ndarray  # each further missed block
    head_s: np.ndarray
    accept_s: np.ndarray
    draft_s: np.ndarray
    serial_verify_s: np.ndarray  # the step model's verify seconds (selection every layer)


def prr_layer_costs(
    model: ModelSpec, c: Columns, predictor, budget_ratio=1.0, drafter: DrafterSpec | None = None
) -> PrrLayerCosts:
    """Per-layer PRR costs for sparse points of ``c`` (selection in every layer).

    Each attention part is the step model's sparse attention op with branches switched off
    (``top_n = 0`` and/or ``comp_stride = 0``), so the parts keep its launch and intermediate
    accounting: compressed = attention - attention without the compressed branch; speculative =
    attention without the compressed branch at ``top_n = ceil(rho n)``. The repair costs come
    from ``repair_seconds`` with the verification's query rows.
    """
    if (c.sparse == 0).any():
        raise ValueError("PRR needs sparse attention at every point")
    if np.any(np.asarray(budget_ratio) <= 0):
        raise ValueError(f"budget_ratio must be > 0, got {budget_ratio!r}")
    L = model.num_layers
    full = with_columns(c, refresh_frac=1.0, fused=0.0)
    split = verify_layer_split(model, full, predictor, drafter)
    no_comp = predict_columns(model, with_columns(full, comp_stride=0.0), predictor, drafter)
    spec_n = np.ceil(np.asarray(budget_ratio) * c.top_n)
    spec = predict_columns(
        model, with_columns(full, comp_stride=0.0, top_n=spec_n), predictor, drafter
    )
    attn = split.attention_refresh_s
    rows, b = c.rows, c.batch
    args = (c.block_size, b, c.kv_bytes, c.context_len)
    fixed = repair_seconds(model, predictor, rows, 0.0, *args)
    one = repair_seconds(model, predictor, rows, 1.0, *args)
    return PrrLayerCosts(
        linear_s=split.linear_s,
        selection_s=split.selection_s,
        attention_s=attn,
        # Differences of two calibrated predictions, which size-dependent efficiencies do not
        # keep monotone in the work (fewer bytes can price a lower efficiency): a branch or a
        # missed block costs at least nothing, and the call without the compressed branch at
        # most the whole layer's.
        compressed_s=np.maximum(attn - attention_seconds(no_comp.op_seconds) / L, 0.0),
        speculative_s=np.minimum(attention_seconds(spec.op_seconds) / L, attn),
        repair_fixed_s=fixed * np.ones(len(c)),
        repair_block_s=np.maximum(one - fixed, 0.0) * np.ones(len(c)),
        head_s=split.head_s,
        accept_s=split.accept_s,
        draft_s=split.draft_s,
        serial_verify_s=split.verify_s,
    )
