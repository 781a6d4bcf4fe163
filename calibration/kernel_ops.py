"""The kernel sweep's per-op sweeps: dense verification (and torch SDPA on the same inputs),
sparse verification per mode and group size, repair, NSA and block selection. Each walks its
part of the ``Sweep`` grid, skips a config whose rows are all in the file, builds enough input
sets to defeat the L2 (``kernels.timing.num_rotations``) and times the op through the runner.

Sparse modes count their own traffic: ``per_query`` every row's blocks, ``union`` the
deduplicated union of each group, ``shared`` each group's representative set;
``params.global_unique_bytes`` is the floor of any algorithm (each (sequence, KV head)'s blocks
once). FLOPs count the useful products (4 D per visible query-key pair), not masked padding.
The sparse rows record the load fraction measured on their indices (``params.f_load``) beside
the SSV formula's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.runner import Runner
from ssvkit.kernels import timing as tm

if TYPE_CHECKING:
    from ssvkit.calibration.kernel_sweep import Sweep

WORKING_SET_BYTES = 200 * 2**20  # 4x the H100's 50 MB L2
NSA_REUSE_OVERLAP = 0.7
# select_blocks' ``impl``: scores and pick in one launch (the default), or the two launches.
SELECT_IMPLS = ("one_launch", "two_launch")


def free() -> None:
    """Return the cached device memory of the config just timed."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def dense_sweep(r: Runner, sw: Sweep, seed: int, mod=None) -> None:
    """dense_verify and torch SDPA on the same inputs, per batch, context and tree size."""
    from ssvkit.kernels.dense_verify import dense_verify, plan_dense_verify

    for bsz in sw.dense_batches:
        for ctx in sw.dense_contexts:
            for t in sw.dense_tokens:
                p = ki.base_params(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
                if not (r.pending("dense_verify", p) or r.pending("torch_sdpa", p)):
                    continue
                if r.out_of_time():
                    return
                _dense_config(r, seed, p, dense_verify, plan_dense_verify)
                free()


def _dense_config(r: Runner, seed: int, p: dict, dense_verify, plan_dense_verify) -> None:
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


def sparse_batch(sw: Sweep, ctx: int, top_n: int, overlap: float, rng) -> int:
    """Smallest batch >= ``sw.sparse_min_large_batch`` whose deduplicated working set reaches
    200 MB (at most 64)."""
    idx = ki.overlap_block_idx([ctx // sw.block_size], sw.sparse_tokens, top_n, overlap, rng)
    per_seq = ki.group_blocks(idx, sw.sparse_tokens) * ki.kv_bytes(sw.block_size)
    return int(min(64, max(sw.sparse_min_large_batch, math.ceil(WORKING_SET_BYTES / per_seq))))


def sparse_sweep(r: Runner, sw: Sweep, seed: int, mod) -> None:
    """sparse_verify per mode and group size, per context, top_n and overlap, at batch 1 and
    at the large batch ``sparse_batch``."""
    t, bs, groups = sw.sparse_tokens, sw.block_size, sw.group_sizes
    contexts, top_ns, overlaps = sw.sparse_contexts, sw.top_ns, sw.overlaps
    for ctx in contexts:
        for top_n in top_ns:
            for gamma in overlaps:
                big = sparse_batch(sw, ctx, top_n, gamma, _rng(seed, ctx, top_n, gamma))
                for bsz in (1, big):
                    variants = [("per_query", 1)] + [("union", c) for c in groups]
                    variants += [("shared", c) for c in groups if c > 1]
                    common = dict(
                        context_len=ctx,
                        num_query_tokens=t,
                        batch=bsz,
                        overlap=gamma,
                        top_n=top_n,
                        block_size=bs,
                        tree="binary",
                    )
                    todo = [
                        (m, c)
                        for m, c in variants
                        if r.pending(
                            "sparse_verify", ki.base_params(mode=m, group_size=c, **common)
                        )
                    ]
                    if not todo:
                        continue
                    if r.out_of_time():
                        return
                    _sparse_config(r, seed, mod, common, todo)
                    free()


def _rng(seed: int, *key: float) -> np.random.Generator:
    """A generator per config, so a resumed run rebuilds the same selections."""
    return np.random.default_rng([seed, *(int(round(k * 1000)) for k in key)])


def _sparse_config(r: Runner, seed: int, mod, common: dict, todo) -> None:
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    top_n, gamma, bs = common["top_n"], common["overlap"], common["block_size"]
    length = ctx + t
    rng = _rng(seed, ctx, top_n, gamma, bsz)
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


def repair_sweep(r: Runner, sw: Sweep, seed: int, mod=None) -> None:
    """repair per missed fraction, and the recompute of every block, per batch and context."""
    t, bs, top_n = sw.tokens, sw.block_size, sw.repair_top_n
    fractions = sw.missed_fractions
    for bsz, ctx in itertools.product(sw.repair_batches, sw.repair_contexts):
        common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n, block_size=bs)
        variants = [("repair", f) for f in fractions] + [("recompute", 1.0)]
        todo = [
            (m, f)
            for m, f in variants
            if r.pending("repair", ki.base_params(mode=m, missed_fraction=f, **common))
        ]
        if not todo:
            continue
        if r.out_of_time():
            return
        _repair_config(r, seed, common, todo)
        free()


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
        rng = _rng(seed, ctx, top_n, bsz, frac)
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


def nsa_sweep(r: Runner, sw: Sweep, seed: int, mod) -> None:
    """nsa_verify fused and unfused, refresh and reuse, per batch, tree size and context."""
    for bsz, t in itertools.product(sw.other_batches, sw.nsa_tokens):
        for ctx, overlap in itertools.product(sw.nsa_contexts, (None, NSA_REUSE_OVERLAP)):
            # overlap None: the reuse layer takes the refresh path's indices (random q, so the
            # rows barely overlap); NSA_REUSE_OVERLAP: indices with that exact adjacent-row
            # overlap, the regime SSV measured (50-90%), for the reuse path only.
            modes = ("reuse", "refresh") if overlap is None else ("reuse",)
            variants = [(m, i) for m in modes for i in ("fused", "unfused")]
            common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
            common.update(top_n=ki.NSA_KW["top_n"], block_size=ki.NSA_KW["block_size"])
            if overlap is not None:
                common["overlap"] = overlap
            extra = dict(window=ki.NSA_KW["window"], comp_block=32, comp_stride=16)
            todo = [
                (m, i)
                for m, i in variants
                if r.pending("nsa_verify", ki.base_params(mode=m, impl=i, **common, **extra))
            ]
            if not todo:
                continue
            if r.out_of_time():
                return
            _nsa_config(r, seed, mod, common, extra, todo)
            free()


def _nsa_bytes(idx: torch.Tensor, ctx: int, t: int) -> int:
    """Minimum bytes of one NSA call: per (sequence, KV head) the union of its rows' selected
    blocks and the window, the tail, the compressed tokens; q, o and the gates."""
    bs, window = ki.NSA_KW["block_size"], ki.NSA_KW["window"]
    bsz = idx.shape[0]
    idx_np = idx.cpu().numpy()
    win_blocks = set(range((ctx - window) // bs, ctx // bs))
    tokens = 0
    for b in range(bsz):
        for h in range(ki.NUM_KV_HEADS):
            sel = set(idx_np[b, h].ravel().tolist()) - {-1}
            tokens += len(sel | win_blocks) * bs + t
    comp_tokens = (ctx - 32) // 16 + 1  # complete windows of 32 tokens at stride 16
    gates_bytes = bsz * t * ki.NUM_Q_HEADS * 3 * 4
    comp = bsz * ki.NUM_KV_HEADS * ki.kv_bytes(comp_tokens)
    return ki.kv_bytes(tokens) + comp + ki.qol_bytes(bsz, t) + gates_bytes


def _nsa_config(r: Runner, seed: int, mod, common, extra, todo) -> None:
    bsz, ctx, t = common["batch"], common["context_len"], common["num_query_tokens"]
    gen = ki.generator(seed + ctx + bsz)
    first = ki.nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen)
    overlap = common.get("overlap")
    rng = np.random.default_rng(seed + ctx + bsz)

    def indices(args):
        if overlap is None:  # the refresh layer's own selection
            return mod.nsa_verify(*args, **ki.NSA_KW, validate=False)[1]
        nb = [ctx // ki.NSA_KW["block_size"]] * bsz
        idx = ki.overlap_block_idx(nb, t, ki.NSA_KW["top_n"], overlap, rng)
        return torch.from_numpy(idx).to(ki.DEVICE)

    idx = indices(first)
    unique = _nsa_bytes(idx, ctx, t)
    rot = tm.num_rotations(unique)
    sets = [first] + [ki.nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen) for _ in range(rot - 1)]
    # Reuse layers take the indices of the refresh layer before them: each set's own.
    idxs = [idx] + [indices(a) for a in sets[1:]]
    comp_tokens = (ctx - 32) // 16 + 1
    pairs = comp_tokens + ki.NSA_KW["top_n"] * ki.NSA_KW["block_size"] + ki.NSA_KW["window"] + t / 2
    flops = int(4 * bsz * ki.NUM_Q_HEADS * ki.HEAD_DIM * t * pairs)
    for mode, impl in todo:
        fn_op = mod.nsa_verify if impl == "fused" else mod.nsa_verify_unfused
        p = ki.base_params(mode=mode, impl=impl, **common, **extra)
        p.update(rotations=rot)

        def fn(i, fn_op=fn_op, mode=mode):
            kw = dict(ki.NSA_KW, validate=False)
            if mode == "reuse":
                kw["block_idx"] = idxs[i]
            return fn_op(*sets[i], **kw)

        r.time_op("nsa_verify", p, fn, num_inputs=rot, unique_bytes=unique, flops=flops)


def select_sweep(r: Runner, sw: Sweep, seed: int, mod) -> None:
    """select_blocks per metadata kind, batch, context and top_n, in one launch and in two
    (``impl``) on the same inputs."""
    t, bs = sw.tokens, sw.block_size
    for bsz in sw.select_batches:
        for ctx in sw.select_contexts:
            for top_n in sw.select_top_ns:
                for method in ("mean", "quest"):
                    common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n)
                    p = ki.base_params(block_size=bs, method=method, **common)
                    todo = [i for i in SELECT_IMPLS if r.pending("select_blocks", {**p, "impl": i})]
                    if not todo:
                        continue
                    if r.out_of_time():
                        return
                    _select_config(r, seed, mod, p, todo)
                    free()


def _select_config(r: Runner, seed: int, mod, p: dict, impls) -> None:
    bsz, ctx, t = p["batch"], p["context_len"], p["num_query_tokens"]
    top_n, bs, method = p["top_n"], p["block_size"], p["method"]
    gen = ki.generator(seed + ctx + bsz)
    q, k, _, lens, _ = ki.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
    meta = mod.BlockMetadata.build(k, lens, bs, kinds=(method,))
    nb = math.ceil((ctx + t) / bs)
    kinds = 1 if method == "mean" else 2
    unique = (
        bsz * ki.NUM_KV_HEADS * nb * ki.HEAD_DIM * 4 * kinds
        + bsz * t * ki.NUM_Q_HEADS * ki.HEAD_DIM * ki.ELEM_BYTES
        + bsz * ki.NUM_KV_HEADS * t * top_n * 4
    )
    rot = tm.num_rotations(unique)
    # Rotation sets: fresh queries and copies of the metadata (distinct memory, same values).
    sets = [(q, meta)]
    for _ in range(rot - 1):
        copies = {
            f.name: getattr(meta, f.name).clone()
            for f in dataclasses.fields(meta)
            if isinstance(getattr(meta, f.name), torch.Tensor)
        }
        sets.append((torch.randn_like(q), dataclasses.replace(meta, **copies)))
    flops = 2 * bsz * ki.NUM_KV_HEADS * t * nb * ki.HEAD_DIM * kinds
    for impl in impls:

        def fn(i, fused=impl == "one_launch"):
            qi, mi = sets[i]
            return mod.select_blocks(qi, mi, lens, top_n=top_n, method=method, fused=fused)

        pi = dict(p, impl=impl, rotations=rot)
        r.time_op("select_blocks", pi, fn, num_inputs=rot, unique_bytes=unique, flops=flops)
