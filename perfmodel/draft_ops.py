"""Op builders of the drafting in one round, by drafter kind (masked per point).

eagle: per tree level with m nodes, one decoder layer at target width over the context plus a
3d -> d feature fusion GEMM, the LM head and top-k sampling (EAGLE-3). draft_model: as the
engine expands a tree (``engine.draft_model``), level l is a full forward of the draft model
over the context of every node up to depth l (the root and the nodes drafted so far); a kept
leaf of the deepest level was never run through the draft model, so the next round first runs
a one-node forward of every sequence (the catch-up), which a batch of B sequences needs when
any of them kept such a leaf: ``1 - (1 - p)^B`` times a round, p the probability that one
sequence's kept path reaches the deepest level (``Columns.full_depth``). ngram: one scan of the
context's token ids (its host lookups are ``perfmodel.draft_host``'s). self_sparse: K chain
steps of the target with attention over s T tokens.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.columns import Columns
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import OpSum, dense_attention, elementwise, gemm, head_ops, linear_ops


def draft_ops(
    acc: OpSum,
    model: ModelSpec,
    draft: ModelSpec | None,
    c: Columns,
    draft_vocab: int | None,
    num_sms: int,
) -> None:
    """Drafting cost of one round of every point of ``c`` (``draft``: the draft model's spec,
    ``draft_vocab``: EAGLE's draft vocabulary; ``num_sms``: the GPU's, for the attention
    kernel's launch plan), ops named ``draft.*``."""
    b, T = c.batch, c.context_len
    is_ngram = (c.drafter == 2) * 1.0
    is_self = (c.drafter == 3) * 1.0
    spec = c.num_draft > 0
    drafted = np.zeros_like(T)
    for lvl in range(c.level_sizes.shape[1]):
        nodes = c.level_sizes[:, lvl]
        on = (nodes > 0) & spec
        if not on.any():
            continue
        kv = T + drafted + nodes
        for k, op in _eagle_level_ops(model, c, draft_vocab, nodes, kv, on, num_sms).items():
            acc.add(k, op)
        if draft is not None:
            run = 1.0 + drafted  # the draft model's level forward: the root and every node so far
            level = _model_forward(draft, c, run, T + run, on * (c.drafter == 1), num_sms)
            for k, op in level.items():
                acc.add(k, op)
        drafted = drafted + nodes
    if draft is not None:
        catch_up = (1.0 - (1.0 - c.full_depth) ** b) * (c.drafter == 1) * spec
        one = np.ones_like(T)
        for k, op in _model_forward(draft, c, one, T + one, catch_up, num_sms, ".catch_up").items():
            acc.add(k, op)
    # n-gram / prompt lookup: one pass over int32 token ids.
    acc.add(
        "draft.ngram",
        elementwise(b * T * 4.0 * is_ngram * spec, b * T * is_ngram * spec, is_ngram * spec),
    )
    # Self-speculation: K chain steps of the target with attention over s T tokens.
    steps = c.num_draft * is_self
    if (steps > 0).any():
        for k, op in _self_step_ops(model, c, num_sms).items():
            acc.add(k, op.scaled(steps))


def _eagle_level_ops(
    model: ModelSpec, c: Columns, draft_vocab: int | None, nodes, kv, on, num_sms: int
) -> OpSum:
    """One tree level's EAGLE head forward of ``nodes`` nodes per sequence over ``kv`` cached
    tokens (``on``: the points that draft this level)."""
    is_eagle = (c.drafter == 0) * 1.0
    sub = OpSum()
    # EAGLE head: one target-width layer, fused features, LM head.
    m = c.batch * nodes
    linear_ops(sub, model, m, c.tp, is_eagle * on, "draft.", c.fused_elementwise, c.chains_norms)
    dense_attention(sub, model, c, nodes, kv, is_eagle * on, "draft.", num_sms)
    sub.add(
        "draft.fc",
        gemm(m, model.hidden_size, 3 * model.hidden_size, model.weight_bytes).scaled(is_eagle * on),
    )
    head = OpSum()
    head_ops(head, model, m, c.tp, draft_vocab or model.vocab_size, "draft.", c.fused_elementwise)
    for k, op in head.items():
        sub.add(k, op.scaled(is_eagle * on))
    return sub


def _model_forward(
    draft: ModelSpec, c: Columns, rows, kv, times, num_sms: int, suffix: str = ""
) -> OpSum:
    """A tree forward of the draft model over ``rows`` query rows per sequence and ``kv``
    cached tokens, ``times`` per round (0 where a point does not run it): ops named
    ``draft.model.*``, or ``draft.model<suffix>.*``."""
    prefix = f"draft.model{suffix}."
    sub, head = OpSum(), OpSum()
    layers = draft.num_layers * times
    m = c.batch * rows
    linear_ops(sub, draft, m, c.tp, layers, prefix, c.fused_elementwise, c.chains_norms)
    dense_attention(sub, draft, c, rows, kv, layers, prefix, num_sms)
    head_ops(head, draft, m, c.tp, draft.vocab_size, prefix, c.fused_elementwise)
    for k, op in head.items():
        sub.add(k, op.scaled(times))
    return sub


def _self_step_ops(model: ModelSpec, c: Columns, num_sms: int) -> OpSum:
    """One self-speculation step: a forward of the target over one row with attention over
    ``sparsity_ratio * T`` tokens plus the drafts so far."""
    T = c.context_len
    one = np.ones_like(T)
    sub = OpSum()
    layers = model.num_layers * one
    fused = c.fused_elementwise
    linear_ops(sub, model, c.batch * one, c.tp, layers, "draft.self.", fused, c.chains_norms)
    dense_attention(
        sub,
        model,
        c,
        one,
        c.sparsity_ratio * T + c.num_draft,
        model.num_layers * one,
        "draft.self.",
        num_sms,
    )
    head_ops(sub, model, c.batch * one, c.tp, model.vocab_size, "draft.self.", c.fused_elementwise)
    return sub
