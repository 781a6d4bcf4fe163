"""The block-selection op of sparse verification over block metadata (``mean`` / ``quest``):
one scoring and top-n call (two launches) per refresh layer, priced by the torch-pick plan's
counts or, for classes fitted on the current kernels, by their launch plan
(``perfmodel.select_work``)."""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES
from ssvkit.perfmodel.columns import META_VECTORS, Columns
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import ACT_BYTES, F32, I32, OpSum
from ssvkit.perfmodel.predictor import Op
from ssvkit.perfmodel.select_work import TWO_LAUNCH, select_work_arrays
from ssvkit.perfmodel.torch_plan import topn_counts

# The selection op of each metadata method's points (every op present, zero where no point
# selects so): each method's own class prices it.
SELECTION_OPS = {"mean": "selection", "quest": "selection_quest"}


def selection_op(
    acc: OpSum,
    model: ModelSpec,
    c: Columns,
    groups,
    nb,
    comp,
    nsa,
    hq,
    hkv,
    layers,
    prefix: str,
    num_sms: int,
) -> None:
    """Selection over block metadata (mean / quest), in refresh layers only, added to ``acc``
    for ``groups`` query groups, ``nb`` blocks and ``comp`` compressed tokens a point
    (``perfmodel.sparse_ops.Branches``): the engine's call (``kernels.select_blocks.
    select_blocks`` in two launches, the scoring and the pick), one op per method
    (``SELECTION_OPS``) priced by its class ``select_blocks/<method>/two_launch``. An op
    carries the current kernels' launch-plan counts (``perfmodel.select_work``) for classes
    fitted on them, the torch-pick plan's otherwise (a profile whose rows picked in torch:
    ``perfmodel.calibrated.stand_in``)."""
    b, t, T = c.batch, c.rows, c.context_len
    q_sel = np.where(c.mode == 2, groups, t)
    v = c.meta_vectors
    # Bytes as the measured class counts them (calibration/kernel_ops.py): the fp32 metadata
    # vectors, the scored query rows and the selected ids; the score rows the top-n stage
    # scans are priced by its stage counts (below), not as bytes.
    meta = b * hkv * nb * v * model.head_dim * F32
    scores = b * q_sel * hq * model.head_dim * ACT_BYTES + b * q_sel * hkv * c.top_n * I32
    nsa_probs = np.where(v == 0, 2 * b * q_sel * hq * comp * F32, 0.0)
    update = b * t * hkv * model.head_dim * ACT_BYTES * (1 + 2 * v)
    # The top-n stage after the scoring: topk over the score rows, two sorts of top_n keys
    # (perfmodel.torch_plan), over the blocks of the context plus the draft rows.
    topn = topn_counts(b * q_sel * hkv, np.ceil((T + t) / c.block_size), c.top_n)
    for method, name in SELECTION_OPS.items():
        on = c.sparse * (1 - nsa) * (v == META_VECTORS[method])
        kernel = f"select_blocks/{method}/{TWO_LAUNCH}"
        sel_op = Op(
            "selection",
            on * (2 * b * q_sel * hkv * nb * model.head_dim * v + 2 * b * q_sel * hq * comp),
            on * (meta + scores + nsa_probs + update),
            on * 2.0,
            kernel=kernel,
            calls=on * 1.0,
            stage_counts=tuple(on * x for x in topn),
            slot_plan=select_plan_op(model, c, q_sel, hq, hkv, on, num_sms, kernel)
            if np.any(on)
            else None,
            head_dim=model.head_dim,
        )
        acc.add(prefix + name, sel_op.scaled(layers * c.refresh_frac))


def select_plan_op(model: ModelSpec, c: Columns, q_sel, hq, hkv, on, num_sms: int, kernel) -> Op:
    """One block-selection call in two launches per point where ``on``, counted by the current
    kernels' plan (``perfmodel.select_work``): the counts the plan-fitted classes price
    (``calibration.features``)."""
    live = lambda x: np.where(on > 0, x, 0)  # noqa: E731
    shape = {
        "batch": live(c.batch),
        "t": live(q_sel),
        "num_q_heads": hq,
        "num_kv_heads": hkv,
        "head_dim": model.head_dim,
        "context_len": c.context_len,
        "top_n": c.top_n,
        "block_size": c.block_size,
        "kinds": np.maximum(c.meta_vectors, 1),
        "num_local": 0,  # the engine's position-relative rule (engine.attention)
    }
    w = select_work_arrays(
        shape, fused=False, num_sms=num_sms, smem_per_sm_bytes=DEFAULT_SMEM_PER_SM_BYTES
    )
    return Op(
        "selection",
        on * w["flops"],
        on * w["requested_bytes"],
        on * w["launches"],
        kernel=kernel,
        calls=on * 1.0,
        dedup_bytes=on * w["unique_bytes"],
        depth=on * w["chain_tiles"],
        tile_rows=on * w["tile_work"],
        stage_counts=(
            on * w["pick_chain"],
            on * w["pick_rows"],
            on * w["query_chain"],
            on * w["sort_chain"],
            on * w["pick_tail_chain"],
        ),
    )
