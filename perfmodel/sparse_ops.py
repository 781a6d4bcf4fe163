"""Op builders of NSA-style sparse verification attention and block selection (seed 000).

Each query attends to ``T / stride`` compressed tokens, ``min(n B, T)`` selected and
``min(w, T)`` window tokens plus its draft-tree ancestors; grouping changes only the bytes
loaded, never the FLOPs (``branches``, ``_attention_counts``). NSA calls are priced by the
measured NSA classes, their bytes those of their row tiles (``nsa_selected_tokens``,
``_attention_ops``); block-metadata selection (``mean``/``quest``) verifies with
``kernels.sparse_verify`` in the strategy's grouping mode, priced by the
``sparse_verify/<mode>/<grid regime>`` class on the work of its launch plan
(``_sparse_verify_ops``, ``perfmodel.sparse_work``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.columns import MODE_CODES, Columns
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.nsa_plan import (
    DEFAULT_BRANCH_STREAMS,
    PER_QUERY,
    is_packed,
    merge_steps,
    mma_row_cost,
    tile_rows_of,
)
from ssvkit.perfmodel.nsa_work import nsa_work_arrays
from ssvkit.perfmodel.ops import (
    ACT_BYTES,
    F32,
    OpSum,
    attn_flops_per_row_token,
    kv_token_bytes,
    local_heads,
)
from ssvkit.perfmodel.predictor import Op
from ssvkit.perfmodel.selection_ops import selection_op
from ssvkit.perfmodel.sparse import blocks_loaded_per_layer, union_blocks
from ssvkit.perfmodel.sparse_work import (
    GRID_REGIMES,
    grid_regime,
    kernel_mode,
    num_lists,
    sparse_work_arrays,
)


@dataclass(frozen=True, slots=True)
class Branches:
    """Per point: tokens per query of the compressed (``comp``), selected (``sel``) and window
    (``win``) branches, kernel groups per sequence (``groups``: one query for ``per_query``, C
    queries otherwise), blocks of the context (``nb``), and the tokens each branch loads per
    layer and sequence (``loaded``)."""

    comp: np.ndarray
    sel: np.ndarray
    win: np.ndarray
    groups: np.ndarray
    nb: np.ndarray
    loaded: dict[str, np.ndarray]


def branches(c: Columns) -> Branches:
    """A kernel group reads the compressed keys and the window once; the selected blocks it
    reads are ``blocks_loaded_per_layer`` of its mode."""
    t, T = c.rows, c.context_len
    comp = np.where(c.comp_stride > 0, np.floor(T / np.maximum(c.comp_stride, 1)), 0.0)
    sel = np.minimum(c.top_n * c.block_size, T)
    win = np.minimum(c.window, T)
    groups = np.where(c.mode == 0, t, np.ceil(t / c.group_size))
    nb = np.ceil(T / c.block_size)
    sel_blocks = np.zeros_like(t)
    for name, code in MODE_CODES.items():
        m = c.mode == code
        if m.any():
            sel_blocks[m] = blocks_loaded_per_layer(
                t[m], c.top_n[m], name, c.group_size[m], c.overlap[m], nb[m]
            )
    loaded = {
        "compressed": groups * comp,
        "selected": sel_blocks * c.block_size,
        "window": groups * (win + t),
    }
    return Branches(comp, sel, win, groups, nb, loaded)


def sparse_attention(
    acc: OpSum, model: ModelSpec, c: Columns, layers, prefix: str, num_sms: int
) -> dict:
    """NSA-style sparse verification attention and block selection (target forward); the
    bytes each branch loads, per point.

    Selection (refresh layers): scores over block metadata (mean: 1 vector per block, quest:
    2) or, for NSA, over the compressed attention probabilities, then a top-n; ``shared`` mode
    selects for the group's representative only. Each attention call also carries the merge
    steps of its launch plan on ``num_sms`` SMs (``perfmodel.nsa_plan``), the serial tail the
    calibrated NSA classes price.
    """
    hq, hkv = local_heads(model, c.tp)
    br = branches(c)
    kv_tok = kv_token_bytes(model, hkv, c.kv_bytes)
    nsa = (c.meta_vectors == 0) * 1.0  # NSA selects inside its attention kernels
    # NSA metadata: the engine's NSA kernels select inside the refresh call and read, per
    # (sequence, KV head), the compressed keys and the window once and each row tile's union of
    # selected blocks -- the bytes ``calibration.kernel_ops`` counts for the nsa_verify rows.
    nsa_loaded = {
        "compressed": br.comp,
        "selected": nsa_selected_tokens(model, c, br, hq, hkv),
        "window": br.win + c.rows,
    }
    loaded = {k: np.where(nsa > 0, nsa_loaded[k], v) for k, v in br.loaded.items()}
    flops, nbytes, launches = _attention_counts(model, c, br, nsa, hq, kv_tok)
    nsa_bytes = _nsa_io_bytes(model, c, hq) + c.batch * kv_tok * sum(nsa_loaded.values())
    nbytes = np.where(nsa > 0, nsa_bytes, nbytes)
    shape = nsa_shape(model, c, hq, hkv)
    counts = (flops, nbytes, launches)
    _attention_ops(acc, c, counts, nsa, hq, hkv, layers, prefix, num_sms, shape)
    _sparse_verify_ops(acc, model, c, nsa, hq, hkv, layers, prefix, num_sms)
    selection_op(acc, model, c, br.groups, br.nb, br.comp, nsa, hq, hkv, layers, prefix, num_sms)
    return {k: c.sparse * c.batch * kv_tok * val * layers for k, val in loaded.items()}


def _qo_bytes(model: ModelSpec, c: Columns, hq):
    """Queries read and outputs written (activations) plus the fp32 LSE, of one call."""
    m_rows = c.batch * c.rows
    return 2 * m_rows * hq * model.head_dim * ACT_BYTES + m_rows * hq * F32


def _nsa_io_bytes(model: ModelSpec, c: Columns, hq):
    """An NSA call's bytes besides K/V: queries, outputs and LSE, and the fp32 gates."""
    return _qo_bytes(model, c, hq) + c.batch * c.rows * hq * 3 * F32


def _attention_counts(model: ModelSpec, c: Columns, br: Branches, nsa, hq, kv_tok):
    """FLOPs, bytes and launches of one layer's block-metadata sparse attention call (NSA's
    bytes are ``sparse_attention``'s), per point.

    Refresh layers (a fraction 1 / refresh_every of layers) run block selection; reuse layers
    do not. Without fusion every layer launches the three branches and a combine kernel and
    round-trips the branch outputs through memory; with ``refresh_reuse`` fusion a refresh
    layer runs a partially fused pair of kernels and a reuse layer one fused kernel (seed 000,
    Mechanism 2). Caches are ignored: repeated block loads of ``per_query`` kernels count as
    device-memory traffic (the calibrated predictor corrects for L2 hits)."""
    b, t = c.batch, c.rows
    attended = br.comp + br.sel + br.win + t
    m_rows = b * t
    branch_out = m_rows * hq * model.head_dim * F32  # one branch's fp32 output
    # Fusion level: unfused = 3 branch kernels + combine, 3 outputs round-trip; refresh layer of
    # refresh_reuse = 2 kernels, 1 output round-trips; reuse layer = 1 fused kernel.
    r = c.refresh_frac
    launches = np.where(c.fused > 0, 2 * r + 1 * (1 - r), 4.0)
    intermediates = np.where(c.fused > 0, r * 2 * branch_out, 3 * 2 * branch_out)
    flops = m_rows * attended * attn_flops_per_row_token(model, hq)
    nbytes = b * kv_tok * sum(br.loaded.values()) + _qo_bytes(model, c, hq) + intermediates
    return flops, nbytes, launches


def nsa_selected_tokens(model, c: Columns, br: Branches, hq, hkv) -> np.ndarray:
    """Selected-branch tokens one NSA call streams per (sequence, KV head) outside the window:
    the union of each row tile's blocks (``c.nsa_rows_per_tile`` rows a tile at ``model``'s
    head dim, the last tile the rest), each tile's at most the prefix before the window. The
    packed schedule is one union of all ``t`` rows, as the measured rows count it.

    One draft row a tile (``per_query``, seed 000's naive baseline) so loads every row's blocks
    on its own, tiles of C rows (``union``) each group's union, the packed schedule
    (``shared``) the union of all rows. The compressed tokens and the window are counted once
    per (sequence, KV head) (``sparse_attention``): the other tiles' reads of them hit L2."""
    t, T = c.rows, c.context_len
    r, d = c.nsa_rows_per_tile, model.head_dim
    _, rows, _ = tile_rows_of(t, hq, hkv, r, head_dim=d)
    rows = np.where(is_packed(t, hq, hkv, r, d), t, np.minimum(rows, t))
    full = np.floor(t / rows)
    last = t - full * rows
    room = T - br.win

    def tile(r):
        return np.minimum(
            union_blocks(c.top_n, np.maximum(r, 1), c.overlap, br.nb), room / c.block_size
        )

    return c.block_size * (full * tile(rows) + np.where(last > 0, tile(last), 0.0))


def nsa_shape(model: ModelSpec, c: Columns, hq, hkv) -> dict:
    """The ``perfmodel.nsa_shape.NsaShape`` fields of every point (the compression window twice
    its stride, as the strategies' defaults have it; no compressed branch where ``comp_stride``
    is 0; an unfused call's branches as the kernels' default ``NsaVerifyConfig.branch_streams``
    runs them)."""
    return dict(
        batch=c.batch,
        t=np.ceil(c.rows),
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=model.head_dim,
        context_len=c.context_len,
        overlap=np.clip(c.overlap, 0.0, 1.0),
        rows_per_tile=c.nsa_rows_per_tile,
        top_n=np.maximum(c.top_n, 1),
        block_size=c.block_size,
        window=c.window,
        comp_block=2 * np.maximum(c.comp_stride, 1),
        comp_stride=np.maximum(c.comp_stride, 0),
        shared_context=c.nsa_shared_context,
        branch_streams=int(DEFAULT_BRANCH_STREAMS),
        tile_plan=c.nsa_tile_plan,
        # The engine hands a fused reuse layer the union plan of the refresh before it.
        union_given=1,
    )


def _slot_plan_op(launches, kernel: str, on, shape, num_sms, fused, refresh) -> Op:
    """One NSA call per point where ``on`` counted by the slot plan (``perfmodel.nsa_work``):
    the counts the slot-planned classes are fitted on (``calibration.features``)."""
    live = {k: np.where(on > 0, v, 0) for k, v in shape.items() if k in ("batch", "t")}
    w = nsa_work_arrays({**shape, **live}, fused=fused, refresh=refresh, num_sms=num_sms)
    stages = (w["waves"], w["pick_rows"]) if refresh else (w["waves"],)
    return _plan_op(on, w, w["mma_flops"], launches, kernel, stages)


def _plan_op(on, w: dict, flops, launches, kernel: str, stages: tuple, head_dim: int = 0) -> Op:
    """One call per point where ``on`` of a kernel priced from its launch plan's work ``w``
    (requested and distinct bytes, chain tiles, merge steps, row cost) and stage counts, at
    head dimension ``head_dim``."""
    return Op(
        "attention",
        on * flops,
        on * w["requested_bytes"],
        on * launches,
        kernel=kernel,
        calls=on * 1.0,
        dedup_bytes=on * w["unique_bytes"],
        depth=on * w["chain_tiles"],
        serial_steps=on * w["merge_steps"],
        tile_rows=on * w["row_cost"],
        stage_counts=tuple(on * x for x in stages),
        head_dim=head_dim,
    )


def _attention_ops(
    acc: OpSum, c: Columns, counts, nsa, hq, hkv, layers, prefix: str, num_sms: int, shape
) -> None:
    """One op per measured NSA class, at the NSA points (``nsa``): the three branches launched
    apart and gated in torch (unfused) or the fused kernels; refresh layers (selection inside)
    and reuse layers.
    One call per layer each (``counts``: FLOPs, bytes and launches of the call).

    A schedule of one draft row per tile, where that is not what packing gives
    (``is_packed``), runs the one-row path of the kernels (no union plan, no member bits) and
    is priced as its own class, ``nsa_verify/<mode>/<impl>/per_query``; a profile without rows
    of it prices it with the packed class, the label says ``stand-in``
    (``perfmodel.calibrated.STAND_INS``)."""
    b, t, sparse = c.batch, c.rows, c.sparse * nsa
    flops, nbytes, launches = counts
    fused, unfused = sparse * (c.fused > 0), sparse * (c.fused == 0)
    refresh = nsa * c.refresh_frac
    r = np.where(nsa > 0, c.nsa_rows_per_tile, 0.0)
    tile_rows = mma_row_cost(t, hq, hkv, r)
    # One draft row a tile, where that is not what packing gives: the kernels' one-row path.
    per_query = nsa * (r == 1) * (1 - is_packed(t, hq, hkv, r))
    for name, on, kernel, is_fused, is_refresh in (
        ("sparse_attention", unfused * (1 - refresh), "nsa_verify/reuse/unfused", 0, 0),
        ("sparse_attention_refresh", unfused * refresh, "nsa_verify/refresh/unfused", 0, 1),
        ("sparse_attention_fused", fused * (1 - refresh), "nsa_verify/reuse/fused", 1, 0),
        ("sparse_attention_fused_refresh", fused * refresh, "nsa_verify/refresh/fused", 1, 1),
    ):
        steps = merge_steps(
            t, hq, hkv, b, num_sms, fused=is_fused, refresh=is_refresh, rows_per_tile=r
        )
        for suffix, share in (("", 1 - per_query), (PER_QUERY, per_query)):
            if suffix and not np.any(on * share):
                continue
            cls = kernel + "/" + suffix if suffix else kernel
            live = on * share * nsa
            attn = Op(
                "attention",
                on * share * flops,
                on * share * nbytes,
                on * share * launches,
                kernel=cls,
                calls=on * share * 1.0,
                serial_steps=on * share * steps,
                tile_rows=on * share * tile_rows,
                slot_plan=_slot_plan_op(
                    launches,
                    cls,
                    on * share,
                    shape,
                    num_sms,
                    bool(is_fused),
                    bool(is_refresh),
                )
                if np.any(live)
                else None,
                head_dim=shape["head_dim"],
            )
            acc.add(prefix + name + ("_" + suffix if suffix else ""), attn.scaled(layers))


SPARSE_VERIFY_OPS = {
    (mode, regime): f"sparse_verify_{mode}_{regime}"
    for mode in MODE_CODES
    for regime in GRID_REGIMES
}


def _sparse_verify_ops(
    acc: OpSum, model: ModelSpec, c: Columns, nsa, hq, hkv, layers, prefix: str, num_sms: int
) -> None:
    """Block-metadata selection's attention (``mean``/``quest``): one ``kernels.sparse_verify``
    call a layer in the strategy's grouping mode over each row's ``top_n`` scored blocks and its
    local window's ``window // block_size + 1`` (``kernels.top_blocks.relative_slots``; no
    compressed branch), one op per kernel path (``sparse_work.kernel_mode``: groups of one
    query run the ``per_query`` launch) and grid regime (``SPARSE_VERIFY_OPS``,
    ``sparse_work.grid_regime``: the call's group lists against the SMs), priced by its class
    ``sparse_verify/<mode>/<grid regime>`` on the work of its launch plan on
    ``num_sms`` SMs (``perfmodel.sparse_work``, the counts the class is fitted on). The group
    plan of a union is built once per refresh and shared by the reuse layers: its compare
    steps count in refresh layers only (its launch stays in the class's fixed cost)."""
    on_meta = c.sparse * (1 - nsa)
    t = np.ceil(c.rows)
    path = kernel_mode(c.mode, c.group_size, t)
    packed = np.where(path == MODE_CODES["per_query"], 1, np.minimum(c.group_size, t))
    regime = grid_regime(num_lists(c.batch, hkv, t, np.maximum(packed, 1)), num_sms)
    for (mode, reg), name in SPARSE_VERIFY_OPS.items():
        on = on_meta * (path == MODE_CODES[mode]) * (regime == reg)
        if not np.any(on):
            continue
        live = on > 0
        w = sparse_work_arrays(
            dict(
                batch=np.where(live, c.batch, 0),
                t=t,
                num_q_heads=hq,
                num_kv_heads=hkv,
                head_dim=model.head_dim,
                context_len=np.maximum(c.context_len, 1),
                group_size=np.maximum(c.group_size, 1),
                top_n=np.maximum(c.top_n, 1),
                local_blocks=np.floor(c.window / np.maximum(c.block_size, 1)) + 1,
                block_size=np.maximum(c.block_size, 1),
                overlap=np.clip(c.overlap, 0.0, 1.0),
            ),
            mode,
            num_sms=num_sms,
        )
        stages = (w["waves"], w["row_waves"], w["sm_tiles"])
        if mode == "union":
            stages += (w["plan_compares"] * c.refresh_frac,)
        launches = 1.0 + w["merge_launches"] + (w["plan_compares"] > 0) * c.refresh_frac
        kernel = f"sparse_verify/{mode}/{reg}"
        op = _plan_op(on, w, w["mma_flops"], launches, kernel, stages, model.head_dim)
        acc.add(prefix + name, op.scaled(layers))
