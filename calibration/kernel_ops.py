"""The kernel sweep's per-op timing: each step builds one ``KernelConfig``'s inputs
(``calibration.kernel_grid``) -- dense verification (and torch SDPA), sparse verification per
mode and group size, repair, NSA (packed row tiles and the row schedules) and block selection
-- enough input sets to defeat the L2 (``kernels.timing.num_rotations``), and times the
config's pending rows through the runner.

Sparse modes count their own traffic: ``per_query`` every row's blocks, ``union`` the
deduplicated union of each group, ``shared`` each group's representative set;
``params.global_unique_bytes`` is the floor of any algorithm (each (sequence, KV head)'s blocks
once). FLOPs count the useful products (4 D per visible query-key pair), not masked padding.
The sparse rows record the load fraction measured on their indices (``params.f_load``) beside
the SSV formula's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import KernelConfig, Variant, nsa_params, selection_rng
from ssvkit.calibration.runner import Runner
from ssvkit.kernels import timing as tm


def free() -> None:
    """Return the cached device memory of the config just timed."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_config(r: Runner, cfg: KernelConfig, seed: int, mod) -> bool:
    """Time the variants of ``cfg`` not yet in the runner's file, at its geometry; False when
    there were none (or the budget left no room)."""
    todo = [v for v in cfg.variants if r.pending(v.op, v.params)]
    if not todo or r.out_of_time():
        return False
    with ki.geometry(cfg.geometry):
        _RUN[cfg.step](r, seed, mod, cfg, todo)
    free()
    return True


def _run_dense(r: Runner, seed: int, mod, cfg: KernelConfig, todo: list[Variant]) -> None:
    from ssvkit.kernels.dense_verify import dense_verify, plan_dense_verify

    sdpa = any(v.op == "torch_sdpa" for v in todo)
    _dense_config(r, seed, cfg.common, dense_verify, plan_dense_verify, sdpa)


def _dense_config(r: Runner, seed: int, p: dict, dense_verify, plan_dense_verify, sdpa) -> None:
    bsz, ctx, t = p["batch"], p["context_len"], p["num_query_tokens"]
    length = ctx + t
    unique = bsz * ki.NUM_KV_HEADS * ki.kv_bytes(length) + ki.qol_bytes(bsz, t)
    rot = tm.num_rotations(unique)
    gen = ki.generator(seed + ctx + t + bsz)
    sets = [ki.attention_inputs(bsz, t, length, [ctx] * bsz, gen) for _ in range(rot)]
    tail_pairs = int(sum(bin(int(m) & (2**64 - 1)).count("1") for m in sets[0][4][0].cpu()))
    flops = 4 * bsz * ki.NUM_Q_HEADS * ki.HEAD_DIM * (t * ctx + tail_pairs)
    plan = plan_dense_verify(
        bsz, t, ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, ki.HEAD_DIM, length, sets[0][0].device
    )
    pd = dict(p, num_splits=plan.num_splits, rotations=rot)
    r.time_op(
        "dense_verify",
        pd,
        lambda i: dense_verify(*sets[i], validate=False),
        num_inputs=rot,
        unique_bytes=unique,
        flops=flops,
    )
    if not sdpa:
        return
    # torch SDPA on the same inputs: [B, H, t, D] queries over the first ctx + t positions.
    sdpa_sets = []
    for q, k, v, _, mask in sets:
        j = torch.arange(t, device=ki.DEVICE)
        tail = ((mask[:, :, None] >> j) & 1).bool()  # [B, t, t]
        full = torch.ones((bsz, t, ctx), dtype=torch.bool, device=ki.DEVICE)
        attn = None if t == 1 else torch.cat([full, tail], -1)[:, None]  # [B, 1, t, L]
        sdpa_sets.append((q.transpose(1, 2), k[:, :, :length], v[:, :, :length], attn))

    def sdpa(i):
        q, k, v, attn = sdpa_sets[i]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn, enable_gqa=True)

    r.time_op(
        "torch_sdpa",
        dict(p, rotations=rot),
        sdpa,
        num_inputs=rot,
        unique_bytes=unique,
        flops=flops,
    )


def _run_sparse(r: Runner, seed: int, mod, cfg: KernelConfig, todo: list[Variant]) -> None:
    _sparse_config(r, seed, mod, cfg.common, [v.knob for v in todo])


def _sparse_config(r: Runner, seed: int, mod, common: dict, todo) -> None:
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    top_n, gamma, bs = common["top_n"], common["overlap"], common["block_size"]
    length = ctx + t
    rng = selection_rng(seed, ctx, top_n, gamma, bsz)
    idx_np = ki.overlap_block_idx([ctx // bs] * bsz, t, top_n, gamma, rng)
    per_query_blocks = bsz * ki.NUM_KV_HEADS * t * top_n
    global_blocks = ki.group_blocks(idx_np, t)
    fixed = bsz * ki.NUM_KV_HEADS * ki.kv_bytes(t) + ki.qol_bytes(bsz, t) + idx_np.nbytes
    rot = tm.num_rotations(global_blocks * ki.kv_bytes(bs) + fixed)
    gen = ki.generator(seed + ctx + top_n + bsz)
    sets = []
    for _ in range(rot):
        args = ki.attention_inputs(bsz, t, length, [ctx] * bsz, gen)
        sets.append((*args, torch.from_numpy(idx_np).to(ki.DEVICE)))
    flops = 4 * bsz * ki.NUM_Q_HEADS * ki.HEAD_DIM * t * (top_n * bs + (t + 1) / 2)
    for mode, group in todo:
        if mode == "per_query":
            blocks = per_query_blocks
        elif mode == "union":
            blocks = ki.group_blocks(idx_np, group)
        else:
            blocks = bsz * ki.NUM_KV_HEADS * math.ceil(t / group) * top_n
        p = ki.base_params(mode=mode, group_size=group, **common)
        p.update(
            f_load=ki.group_blocks(idx_np, group) / per_query_blocks,
            f_load_formula=ki.f_load_formula(group, round(gamma * top_n) / top_n),
            global_unique_bytes=global_blocks * ki.kv_bytes(bs) + fixed,
            rotations=rot,
        )
        kw = dict(mode=mode, group_size=group, block_size=bs, validate=False)

        def fn(i, kw=kw):
            return mod.sparse_verify(*sets[i], **kw)

        r.time_op(
            "sparse_verify",
            p,
            fn,
            num_inputs=rot,
            unique_bytes=blocks * ki.kv_bytes(bs) + fixed,
            flops=int(flops),
        )


def _run_repair(r: Runner, seed: int, mod, cfg: KernelConfig, todo: list[Variant]) -> None:
    _repair_config(r, seed, cfg.common, [v.knob for v in todo])


def _repair_config(r: Runner, seed: int, common: dict, todo) -> None:
    """One KV cache; the rotation sets differ in their selections (so in the blocks read)."""
    from ssvkit.kernels.repair import repair

    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    top_n, bs = common["top_n"], common["block_size"]
    gen = ki.generator(seed + bsz)
    q, k, v, lens, _ = ki.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    o = torch.randn_like(q)
    lse = torch.randn((bsz, ki.NUM_Q_HEADS, t), generator=gen, device=ki.DEVICE) + 10.0
    empty = (torch.zeros_like(q), torch.full_like(lse, float("-inf")))
    qo = (
        3 * bsz * t * ki.NUM_Q_HEADS * ki.HEAD_DIM * ki.ELEM_BYTES
        + 2 * bsz * ki.NUM_Q_HEADS * t * 4
    )
    for mode, frac in todo:
        width = round(frac * top_n)
        blocks = bsz * ki.NUM_KV_HEADS * t * width
        unique = blocks * ki.kv_bytes(bs) + qo + blocks * 4
        rot = tm.num_rotations(unique)
        rng = selection_rng(seed, ctx, top_n, bsz, frac)
        missed = [
            torch.from_numpy(ki.random_block_idx([ctx // bs] * bsz, t, width, rng))
            .contiguous()
            .to(ki.DEVICE)
            for _ in range(rot)
        ]
        state = (o, lse) if mode == "repair" else empty
        p = ki.base_params(mode=mode, missed_fraction=frac, **common)
        p.update(rotations=rot, missed_blocks=width)

        def fn(i, missed=missed, state=state):
            kw = dict(prefix_lens=lens, block_size=bs, validate=False)
            return repair(q, k, v, *state, missed[i], **kw)

        flops = 4 * bsz * ki.NUM_Q_HEADS * ki.HEAD_DIM * t * width * bs
        r.time_op("repair", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


def _run_nsa(r: Runner, seed: int, mod, cfg: KernelConfig, todo: list[Variant]) -> None:
    _nsa_config(r, seed, mod, cfg.common, cfg.extra, [v.knob for v in todo])


def _nsa_bytes(idx: torch.Tensor, ctx: int, t: int, draft_rows: int = 0) -> int:
    """Bytes of one NSA call: per (sequence, KV head) the window and the compressed tokens
    once, the union of each row tile's selected blocks outside the window (``draft_rows`` a
    tile; 0: one union of all rows, the minimum), the tail; q, o and the gates."""
    bs, window = ki.NSA_KW["block_size"], ki.NSA_KW["window"]
    bsz = idx.shape[0]
    idx_np = idx.cpu().numpy()
    win_blocks = set(range((ctx - window) // bs, ctx // bs))
    step = draft_rows or t
    tokens = 0
    for b in range(bsz):
        for h in range(ki.NUM_KV_HEADS):
            for i in range(0, t, step):
                sel = set(idx_np[b, h, i : i + step].ravel().tolist()) - {-1}
                tokens += len(sel - win_blocks) * bs
            tokens += len(win_blocks) * bs + t
    comp_tokens = (ctx - 32) // 16 + 1  # complete windows of 32 tokens at stride 16
    gates_bytes = bsz * t * ki.NUM_Q_HEADS * 3 * 4
    comp = bsz * ki.NUM_KV_HEADS * ki.kv_bytes(comp_tokens)
    return ki.kv_bytes(tokens) + comp + ki.qol_bytes(bsz, t) + gates_bytes


def _nsa_config(r: Runner, seed: int, mod, common, extra, todo) -> None:
    """Time the ``todo`` (mode, impl) variants of one NSA config; ``common["rows_per_tile"]``
    runs it with that row schedule (``kernel_grid.nsa_tiles_configs``)."""
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    gen = ki.generator(seed + ctx + bsz)
    first = ki.nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen)
    overlap = common.get("overlap")
    rng = np.random.default_rng(seed + ctx + bsz)
    config = mod.NsaVerifyConfig(
        rows_per_tile=common.get("rows_per_tile", 0),
        context_tiles=common.get("context_tiles", "per_tile"),
    )
    nsa_kw = dict(ki.NSA_KW, top_n=common.get("top_n", ki.NSA_KW["top_n"]))

    def indices(args):
        if overlap is None:  # the refresh layer's own selection
            return mod.nsa_verify(*args, **nsa_kw, validate=False)[1]
        nb = [ctx // nsa_kw["block_size"]] * bsz
        idx = ki.overlap_block_idx(nb, t, nsa_kw["top_n"], overlap, rng)
        return torch.from_numpy(idx).to(ki.DEVICE)

    idx = indices(first)
    draft_rows = 0  # of a row tile, as the launch plan packs them
    if "rows_per_tile" in common:
        bs = ki.NSA_KW["block_size"]
        plan = mod.nsa_union_plan(first[0], first[1], idx, block_size=bs, config=config)
        draft_rows = plan.group_size
    unique = _nsa_bytes(idx, ctx, t, draft_rows)
    rot = tm.num_rotations(unique)
    sets = [first] + [ki.nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen) for _ in range(rot - 1)]
    # Reuse layers take the indices of the refresh layer before them: each set's own.
    idxs = [idx] + [indices(a) for a in sets[1:]]
    comp_tokens = (ctx - 32) // 16 + 1
    pairs = comp_tokens + nsa_kw["top_n"] * nsa_kw["block_size"] + nsa_kw["window"] + t / 2
    flops = int(4 * bsz * ki.NUM_Q_HEADS * ki.HEAD_DIM * t * pairs)
    for mode, impl in todo:
        fn_op = mod.nsa_verify if impl == "fused" else mod.nsa_verify_unfused
        p = nsa_params(mode, impl, common, extra)
        p.update(rotations=rot)
        # The row's branch_streams, not the kernels' default: a row without it ran one stream.
        run = dataclasses.replace(config, branch_streams=bool(p.get("branch_streams", False)))

        def fn(i, fn_op=fn_op, mode=mode, run=run):
            kw = dict(nsa_kw, validate=False, config=run)
            if mode == "reuse":
                kw["block_idx"] = idxs[i]
            return fn_op(*sets[i], **kw)

        r.time_op("nsa_verify", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


def _run_select(r: Runner, seed: int, mod, cfg: KernelConfig, todo: list[Variant]) -> None:
    _select_config(r, seed, mod, cfg.common, [v.knob[0] for v in todo])


def select_unique_bytes(
    bsz: int,
    t: int,
    ctx: int,
    top_n: int,
    method: str,
    block_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int = 128,
) -> int:
    """Bytes a block selection must move at least: its metadata (an fp32 summary a block and
    kind), its bf16 queries and its picked int32 block ids."""
    nb = math.ceil((ctx + t) / block_size)
    kinds = 1 if method == "mean" else 2
    return (
        bsz * num_kv_heads * nb * head_dim * 4 * kinds
        + bsz * t * num_q_heads * head_dim * ki.ELEM_BYTES
        + bsz * num_kv_heads * t * top_n * 4
    )


def _select_config(r: Runner, seed: int, mod, p: dict, impls) -> None:
    bsz, ctx, t = p["batch"], p["context_len"], p["num_query_tokens"]
    top_n, bs, method = p["top_n"], p["block_size"], p["method"]
    gen = ki.generator(seed + ctx + bsz)
    q, k, _, lens, _ = ki.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    meta = mod.BlockMetadata.build(k, lens, bs, kinds=(method,))
    nb = math.ceil((ctx + t) / bs)
    kinds = 1 if method == "mean" else 2
    heads = (ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, ki.HEAD_DIM)
    unique = select_unique_bytes(bsz, t, ctx, top_n, method, bs, *heads)
    rot = tm.num_rotations(unique)
    sets = ki.metadata_rotations(q, meta, rot, gen)
    flops = 2 * bsz * ki.NUM_KV_HEADS * t * nb * ki.HEAD_DIM * kinds
    for impl in impls:

        def fn(i, fused=impl == "one_launch"):
            qi, mi = sets[i]
            return mod.select_blocks(qi, mi, lens, top_n=top_n, method=method, fused=fused)

        pi = dict(p, impl=impl, rotations=rot)
        r.time_op("select_blocks", pi, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


_RUN = {
    "dense": _run_dense,
    "sparse": _run_sparse,
    "repair": _run_repair,
    "nsa": _run_nsa,
    "select": _run_select,
    "nsa_tiles": _run_nsa,
}
