"""The campaign at scale's GPU time, estimated per cell and group, and its split over shards.

A group's estimate is perfmodel's: its prefill once (``prefill_estimate``), then per cell the
decode's rounds priced by the step model, one oracle probe per round, and the oracle's
reference pass where no earlier cell of the group left one (``cell_estimate``). It leaves out
kernel compilation, CUDA-graph capture, host time, probes beyond one per round and the
selection statistics, so it is a lower bound, meant to balance the shards, not to predict the
campaign.

``assign`` gives each group to a shard, the same split in every process. Cells already in the
run cache cost nothing, so shards that all resume from one cache (every shard's finished cells)
split the work left between them.
"""

from __future__ import annotations

import dataclasses

from ssvkit.validation.scale_cells import (
    GIB,
    Cell,
    Setup,
    campaign_cells,
    cell_strategy,
    groups_of,
    max_batch_for,
    memory_plan,
    run_order,
)

# Verify forwards the oracle runs before each round's timed one (``engine.oracle``: one when
# its reference holds).
PROBES_PER_ROUND = 1


def parse_shard(text: str | None) -> tuple[int, int]:
    """``K/N`` (0-based K) as (K, N); None: the whole campaign, (0, 1)."""
    if text is None:
        return 0, 1
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N (0-based K), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"--shard {text!r}: need N >= 1 and 0 <= K < N")
    return k, n


def cell_estimate(st: Setup, cell: Cell, references: dict) -> dict:
    """One cell's estimated seconds: ``decode_s`` (rounds and probes), ``reference_s`` (the
    oracle's reference pass unless ``references``, the group's so far, holds one as long),
    or ``skipped`` with the reason the campaign will give.

    The rounds are the step model's (``validation.decode_figures.predict``): ``new_tokens - 1``
    autoregressive rounds, or as many speculative rounds as the oracle's acceptance a gives,
    ``1 + a + a^2 + ... + a^D`` tokens per round along a tree of depth D, each with
    ``PROBES_PER_ROUND`` oracle probes (a verify forward: the fewest the oracle runs, when its
    reference holds). The reference pass is ``new_tokens + D`` autoregressive rounds
    (``engine.oracle.reference``)."""
    from ssvkit.engine.attention import AttentionConfig
    from ssvkit.engine.tree import DraftTree

    try:
        strategy = cell_strategy(st, cell)
    except ValueError as e:
        return {"skipped": str(e).splitlines()[0]}
    _, reason = memory_plan(st, cell, strategy)
    if reason is not None:
        return {"skipped": reason}
    new = st.args.new_tokens
    depth = DraftTree.from_spec(strategy.tree, strategy.traversal).max_depth
    if cell.acceptance is None or depth == 0:
        return {"decode_s": (new - 1) * _round_s(st, cell, strategy, 0.0), "reference_s": 0.0}
    a = cell.acceptance
    tokens_per_round = sum(a**k for k in range(depth + 1))
    rounds = (new - 1) / tokens_per_round
    pred = _predict(st, cell, strategy, a)
    decode_s = rounds * (pred.get("round_s", 0.0) + PROBES_PER_ROUND * pred.get("verify_s", 0.0))
    ar = dataclasses.replace(strategy, tree="chain:0")
    key = AttentionConfig.from_strategy(ar)
    reference_s = 0.0
    if references.get(key, 0) < new + depth:
        references[key] = new + depth
        reference_s = (new + depth) * _round_s(st, cell, ar, 0.0)
    return {"decode_s": decode_s, "reference_s": reference_s}


def _predict(st: Setup, cell: Cell, strategy, alpha: float) -> dict:
    from ssvkit.perfmodel.elementwise import elementwise_of_backend
    from ssvkit.perfmodel.strategy import BASELINES
    from ssvkit.validation.decode_figures import predict
    from ssvkit.validation.scale_cells import backend_of

    ctx = cell.context + st.args.new_tokens // 2
    name = cell.model.removeprefix("random:")
    kw = {"elementwise": elementwise_of_backend(backend_of(st.device)), "loop": "pipelined"}
    pred = predict(strategy, name, None, ctx, cell.batch, alpha, None, st.args.gpu, **kw)
    if "error" in pred:  # priced as dense autoregressive decoding instead
        ar = BASELINES["ar_dense"]
        pred = predict(ar, name, None, ctx, cell.batch, 0.0, None, st.args.gpu, **kw)
    return pred


def _round_s(st: Setup, cell: Cell, strategy, alpha: float) -> float:
    return _predict(st, cell, strategy, alpha).get("round_s", 0.0)


def prefill_estimate(st: Setup, cell: Cell) -> tuple[float, float]:
    """Seconds and FLOPs of a group's prefill (perfmodel's prefill ops at the cell's batch,
    ``perfmodel.costs.prefill_seconds``: the linear layers on every prompt token and causal
    attention, at the GPU's calibrated rates)."""
    from ssvkit.perfmodel.calibrated import make_predictor
    from ssvkit.perfmodel.costs import prefill_ops, prefill_seconds
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model

    model = get_model(cell.model.removeprefix("random:"))
    pred = make_predictor(get_gpu(st.args.gpu))
    args = (model, pred, cell.context, cell.batch, st.elem_bytes)
    flops = sum(float(op.flops) for op in prefill_ops(*args).values())
    return float(prefill_seconds(*args)), flops


def group_estimates(st: Setup, cells: list[Cell], done=frozenset()) -> list[dict]:
    """Every group of ``cells`` (canonical order) with the estimates of its cells whose keys
    are not in ``done`` (a run cache's) and of its prefill when one of them decodes."""
    out = []
    for group, members in groups_of(cells).items():
        references: dict = {}
        est: dict[str, dict] = {}
        for c in run_order(st, members):  # a cell of another label but the same decode: once
            if c.key not in done:
                est.setdefault(c.key, cell_estimate(st, c, references))
        decoded = [e for e in est.values() if "skipped" not in e]
        prefill_s, flops = prefill_estimate(st, members[0]) if decoded else (0.0, 0.0)
        cells_s = sum(e["decode_s"] + e["reference_s"] for e in decoded)
        out.append(
            {
                "model": group[0],
                "context_asked": group[1],
                "batch": group[2],
                "labels": list(dict.fromkeys(c.label for c in members)),
                "context": members[0].context,
                "cells": [c.slot for c in members],
                "done": len({c.key for c in members} & set(done)),
                "decodes": len(decoded),
                "skipped": len(est) - len(decoded),
                "prefill_s": prefill_s,
                "prefill_flops": flops,
                "decode_s": cells_s,
                "estimate_s": float(f"{prefill_s + cells_s:.6g}"),
            }
        )
    return out


def assign(estimates: list[dict], num_shards: int) -> list[int]:
    """The shard of each group: longest estimate first onto the least loaded shard (ties to
    the one with fewer groups, then the lower index). The estimates are rounded to six
    significant digits (``group_estimates``), so every process computes the same split."""
    loads = [0.0] * num_shards
    counts = [0] * num_shards
    shard = [0] * len(estimates)
    for i in sorted(range(len(estimates)), key=lambda i: (-estimates[i]["estimate_s"], i)):
        k = min(range(num_shards), key=lambda j: (loads[j], counts[j], j))
        shard[i] = k
        loads[k] += estimates[i]["estimate_s"]
        counts[k] += 1
    return shard


def run_sequence(estimates: list[dict]) -> list[int]:
    """The order a shard runs its groups: the longest estimate first (ties in canonical
    order), so that a call cut short by ``--stop-after`` leaves short groups to the next."""
    return sorted(range(len(estimates)), key=lambda i: (-estimates[i]["estimate_s"], i))


def shard_cells(
    st: Setup, index: int, count: int, done=frozenset()
) -> tuple[list[Cell], list[Cell]]:
    """The campaign's cells (canonical order) and those of shard ``index`` of ``count`` in the
    order it runs them (``run_sequence``; each group's cells together), the split balancing
    the work not ``done`` (the keys of the run cache every shard reads)."""
    cells = campaign_cells(st)
    est = group_estimates(st, cells, done)
    shard = assign(est, count)
    by_group = groups_of(cells)
    mine = [
        (g["model"], g["context_asked"], g["batch"])
        for g, i in ((est[i], i) for i in run_sequence(est))
        if shard[i] == index
    ]
    return cells, [c for g in mine for c in by_group[g]]


def plan(st: Setup, num_shards: int, done=frozenset()) -> dict:
    """The split of the campaign over ``num_shards`` shards with every group's estimate of the
    work not ``done``, and the largest batch per (model, context)."""
    cells = campaign_cells(st)
    est = group_estimates(st, cells, done)
    for g, k in zip(est, assign(est, num_shards), strict=True):
        g["shard"] = k
    max_batch = {
        f"{m}|{ctx}": max_batch_for(st, m, ctx)
        for m, ctx in dict.fromkeys((c.model, c.context) for c in cells)
    }
    shards = [
        {
            "index": k,
            "groups": sum(g["shard"] == k for g in est),
            "cells": sum(len(g["cells"]) for g in est if g["shard"] == k),
            "estimate_s": sum(g["estimate_s"] for g in est if g["shard"] == k),
            "prefill_s": sum(g["prefill_s"] for g in est if g["shard"] == k),
        }
        for k in range(num_shards)
    ]
    return {
        "gpu": st.args.gpu,
        "available_bytes": st.available_bytes,
        "new_tokens": st.args.new_tokens,
        "max_batch": max_batch,
        "groups": est,
        "shards": shards,
        "done": len(done),
        "probes_per_round": PROBES_PER_ROUND,
    }


def plan_text(p: dict) -> str:
    """The plan as lines: the largest batches, each shard's groups, the totals."""
    lines = [
        f"plan over {len(p['shards'])} shard(s): gpu {p['gpu']}, "
        f"{p['available_bytes'] / GIB:.1f} GiB available, {p['new_tokens']} new tokens, "
        f"{p['done']} decodes done; "
        "perfmodel lower bounds (prefill once per group, rounds, one probe per round, "
        "references; no compilation, capture or host time)",
        "largest batch every baseline fits (engine.memory.max_batch):",
    ]
    for key, b in p["max_batch"].items():
        model, ctx = key.split("|")
        lines.append(f"  {model:24s} context {int(ctx):7d}: {b}")
    for s in p["shards"]:
        lines.append(
            f"shard {s['index']}: {s['groups']} groups, {s['cells']} cells, "
            f"{s['estimate_s']:.0f} s (prefill {s['prefill_s']:.0f} s), in the order it runs them:"
        )
        groups = [p["groups"][i] for i in run_sequence(p["groups"])]
        for g in (g for g in groups if g["shard"] == s["index"]):
            lines.append(
                f"  {g['model']:24s} ctx {g['context']:7d} b {g['batch']:4d} "
                f"({','.join(g['labels'])}): "
                f"prefill {g['prefill_s']:7.1f} s ({g['prefill_flops'] / 1e15:6.1f} PFLOP), "
                f"{g['decodes']:2d} decodes {g['decode_s']:7.1f} s"
                + (f", {g['skipped']} skipped" if g["skipped"] else "")
            )
    total = sum(s["estimate_s"] for s in p["shards"])
    longest = max(s["estimate_s"] for s in p["shards"])
    lines.append(f"total {total:.0f} s; the longest shard {longest:.0f} s")
    return "\n".join(lines)
