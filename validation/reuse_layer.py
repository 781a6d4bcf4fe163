"""Where a reuse layer's sparse verification spends its time: the engine's call at its own
selection, with its lists cut short and at other split counts.

    python -m ssvkit.validation.reuse_layer --out validation/data/reuse-layer-h200.json

The engine's verify step (random-weight Llama-3.1-8B, batch 1, ``--context`` committed tokens,
a chain of ``--t`` draft rows, ``ssv`` with block means: union groups of four rows) records one
forward's queries; each refresh layer's selection and group plan, with that layer's queries and
KV cache, is one input set (so successive samples read other layers' K/V). Every variant is a
``sparse_verify`` call on those sets, timed in interleaved CUDA-graph replays with the L2
flushed (``kernels.timing.bench_graphs``: the cold case; in the engine the queries and the
draft tail are warm):

- ``lists N``: each group list cut to its first N blocks (``0``: the draft tail and the merge
  alone), ``lists all``: the call the engine makes. The time at full lists less the time at
  none is what the walk adds; their difference per listed block a split program walks in
  series (``per_split``) is the walk's rate;
- ``splits S``: the full lists at S splits (``lists all`` has the engine's rule's);
- ``merge launch``: the split partials merged by a launch of their own.

Outputs equal the default call's (every variant of full lists is checked first); cut lists are
checked finite. ``floor_s``: the K/V of the distinct listed blocks (picks, sink and window) of
every (sequence, KV head) and of the draft tail, q and o, over the copy bandwidth measured in the
same run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from ssvkit.engine.attention import AttentionConfig, TreeAttention
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels import timing as tm
from ssvkit.kernels.sparse_launch import SparseVerifyConfig, plan_launch
from ssvkit.kernels.sparse_verify import sparse_verify
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.validation.bench_documents import write_benchmark

SPLITS = (4, 6, 8, 10, 12, 16)
CUTS = (0, 1, 8, 16, 32, 48)
TIMING = dict(warmup=3, graph_launches=8, graph_reps=15, max_total_s=0.6)


def _parser() -> OneLineParser:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--context", type=int, default=131072, help="committed tokens")
    p.add_argument("--t", type=int, default=16, help="draft rows (a chain)")
    p.add_argument("--model", default="random:llama-3.1-8b")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if not 2 <= args.t <= 64:
        p.exit(2, f"reuse_layer: --t {args.t} must lie in [2, 64] (union groups of rows)\n")
    if args.context < 4096:
        p.exit(2, f"reuse_layer: --context {args.context} is under 4096 tokens\n")
    if not torch.cuda.is_available():
        p.exit(2, "reuse_layer: needs a CUDA GPU\n")
    cases, attn = _engine_cases(args)
    rows, meta = _time_variants(cases, attn)
    fields = dict(model=args.model, context=args.context, t=args.t, **meta)
    write_benchmark(args.out, "reuse_layer", rows, **fields)
    print_table(rows, meta)
    return 0


def _engine_cases(args):
    """Per refresh layer: (q, k, v, lens, tree mask, block_idx, plan) of the engine's step."""
    ctx, t = args.context, args.t
    torch.manual_seed(0)
    model = build_model(
        resolve_source(args.model), max_positions=ctx + t + 1, device="cuda", dtype=torch.bfloat16
    )
    runner = ModelRunner(model, batch=1, t_max=ctx + t + 1, backend="triton", use_graphs=False)
    runner.cache.kv.normal_()
    runner.cache.set_lens(torch.tensor([ctx], dtype=torch.int32))
    strategy = dataclasses.replace(Strategy.from_name("ssv"), metadata="mean")
    attn = AttentionConfig.from_strategy(strategy)
    runner.prepare(attn)
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    tokens = torch.randint(0, model.config.vocab_size, (1, t), device="cuda")
    cases = []
    with torch.no_grad():
        queries = runner.tree_forward(tokens, tree, attn, record=True)[2]
        tt = runner.tree_tensors(tree)
        positions = runner.cache.lens.long()[:, None] + tt.depth
        for layer in range(model.config.num_layers):
            if not attn.is_refresh(layer):
                continue
            a = TreeAttention(attn, runner.cache, tt, positions, backend="triton")
            a(layer, queries[layer])
            k, v = runner.cache.k(layer), runner.cache.v(layer)
            q = queries[layer].contiguous()
            cases.append((q, k, v, runner.cache.lens, tt.mask, a.block_idx, a.plan))
    return cases, attn


def _distinct_blocks(cases) -> float:
    """Distinct selected blocks per (sequence, KV head), averaged over the input sets."""
    out = []
    for case in cases:
        idx = case[5].long().flatten(2).sort(-1).values
        new = (idx[..., 1:] != idx[..., :-1]) & (idx[..., 1:] >= 0)
        out.append((new.sum(-1) + (idx[..., 0] >= 0)).float().mean().item())
    return sum(out) / len(out)


def _time_variants(cases, attn):
    """Every variant checked, then timed together; the rows and the document's fields."""
    kw = dict(
        mode=attn.mode, group_size=attn.group_size, block_size=attn.block_size, validate=False
    )
    variants = {"lists all": (SparseVerifyConfig(), None)}
    for n in CUTS:
        variants[f"lists {n}"] = (SparseVerifyConfig(), n)
    for s in SPLITS:
        variants[f"splits {s}"] = (SparseVerifyConfig(num_splits=s), None)
    variants["merge launch"] = (SparseVerifyConfig(fused_merge=False), None)

    def plan_of(case, cut):
        plan = case[6]
        if cut is None:
            return plan
        return dataclasses.replace(plan, counts=torch.clamp(plan.counts, max=cut).contiguous())

    plans = {name: [plan_of(c, cut) for c in cases] for name, (_, cut) in variants.items()}

    def call(name):
        cfg = variants[name][0]

        def fn(i):
            q, k, v, lens, mask, idx, _ = cases[i]
            return sparse_verify(q, k, v, lens, mask, idx, plan=plans[name][i], config=cfg, **kw)[0]

        return fn

    want = call("lists all")(0)
    for name, (_, cut) in variants.items():
        got = call(name)(0)
        ok = bool(torch.isfinite(got).all())
        if cut is None:
            ok = ok and torch.allclose(got.float(), want.float(), 2e-2, 2e-2)
        if not ok:
            raise AssertionError(f"reuse_layer: {name} differs from the engine's call")
    names = list(variants)
    timings = tm.bench_graphs(
        [call(n) for n in names], num_inputs=len(cases), config=tm.TimingConfig(**TIMING)
    )
    rows = [
        _row(name, variants[name][0], plans[name], timing.median_s, cases[0], attn)
        for name, timing in zip(names, timings, strict=True)
    ]
    return rows, _floor(cases, attn)


def _row(name: str, cfg, plans: list, median_s: float, case, attn) -> dict:
    """One variant's row: its split count (the launch plan's), its listed blocks a call, the
    most blocks a split program walks and its time."""
    q, k, idx, plan = case[0], case[1], case[5], case[6]
    c = min(attn.group_size, q.shape[1])
    shape = (attn.mode, attn.group_size, c, attn.block_size)
    la = plan_launch(q, k, idx, None, *shape, None, plan, cfg)
    blocks = [int(p.counts.sum()) for p in plans]
    return dict(
        variant=name,
        splits=la.num_splits,
        listed_blocks=sum(blocks) / len(blocks),
        per_split=max(math.ceil(int(p.counts.max()) / la.num_splits) for p in plans),
        median_s=median_s,
    )


def _floor(cases, attn) -> dict:
    """The copy bandwidth and the call's floor: the distinct listed blocks (picks, sink and
    window) of every KV head, the draft tail's K/V, q and o."""
    copy_bps = tm.copy_bytes_per_s()
    q, k, plan = cases[0][0], cases[0][1], cases[0][6]
    d, hkv, t, elem = q.shape[3], k.shape[1], q.shape[1], q.element_size()
    distinct = _distinct_blocks(cases)
    kv_bytes = 2 * hkv * (distinct * attn.block_size + t) * d * elem
    return dict(
        copy_bytes_per_s=copy_bps,
        lists=plan.counts.numel(),
        distinct_blocks=distinct,
        floor_s=(kv_bytes + 2 * q.numel() * elem) / copy_bps,
    )


def print_table(rows: list[dict], meta: dict) -> None:
    print(f"{'variant':<14} {'splits':>6} {'listed':>8} {'per split':>9} {'us':>8}")
    for r in rows:
        print(
            f"{r['variant']:<14} {r['splits']:>6} {r['listed_blocks']:>8.0f}"
            f" {r['per_split']:>9} {r['median_s'] * 1e6:>8.2f}"
        )
    print(
        f"(CUDA graph, L2 flushed; floor {meta['floor_s'] * 1e6:.1f} us: "
        f"{meta['distinct_blocks']:.0f} distinct blocks a KV head, the window and the tail)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
