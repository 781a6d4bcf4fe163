"""What the acceptance step costs on the GPU: the rejection-sampling walk of one round, in
batched torch ops (``kernels.accept.reference_accept_sampled``, what the engine ran until
session 12) against the one-launch Triton kernel (``kernels.accept.accept_sampled``).

    PYTHONPATH=. python benchmarks/accept_cost.py --out /tmp/accept.json

Per tree and draft kind (``ngram``: deterministic drafts, no draft distribution;
``draft_model``: sampled drafts with their distributions), each backend's step -- the uniforms'
draw and the walk -- is captured in a CUDA graph and replayed (``kernels.timing.bench_graph``),
as the engine runs it. The inputs (``B x t x V`` logits of a byte vocabulary) are a few KB and
stay in L2: what is timed is the launches and the work, which is what the step costs. Before the
timing each tree is checked: the kernel and the reference make the same decisions from the same
uniforms on bf16 logits (random, a draft near the target).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", default="chain:1,chain:2,chain:4,chain:7,best:10:4,full:3x2")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON of every figure")
    args = p.parse_args(argv)
    import torch

    from engine.drafter import draw_children
    from engine.tree import DraftTree
    from kernels.accept import accept_sampled, reference_accept_sampled, uniforms_needed
    from kernels.timing import bench_graph, provenance

    try:
        trees = {s: DraftTree.from_spec(s, "position") for s in args.trees.split(",") if s}
        if not trees or args.vocab < 2 or args.batch < 1:
            raise ValueError("--trees, --vocab >= 2 and --batch >= 1 are needed")
    except ValueError as e:
        print(f"accept_cost: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("accept_cost: no CUDA device", file=sys.stderr)
        return 1
    dev, b, v = torch.device("cuda"), args.batch, args.vocab
    rows = []
    for spec, tree in trees.items():
        tt = tree.tensors(b, dev)
        t, depth, w = tree.num_nodes, tree.max_depth, tt.children.shape[1]
        target = torch.randn(b, t, v, device=dev) * 2
        tokens = torch.randint(0, v, (b, t), device=dev)
        probs = torch.zeros(b, t, v, device=dev)
        for node in range(t):
            kids = tree.children[node]
            if kids:
                noisy = target[:, node : node + 1] + torch.randn(b, 1, v, device=dev)
                cand, q = draw_children(noisy, len(kids), 1.0)
                tokens[:, list(kids)] = cand[:, 0, : len(kids)]
                probs[:, node] = q[:, 0]
        logits = target.to(torch.bfloat16)
        for kind, dp in (("ngram", None), ("draft_model", probs)):
            u = torch.rand(b * 64, uniforms_needed(depth, w, deterministic=dp is None), device=dev)
            for i in range(0, b * 64, b):  # the same decisions from the same uniforms
                ui = u[i : i + b]
                got = accept_sampled(tokens, logits, dp, tt.children, depth, 1.0, ui)
                ref = reference_accept_sampled(tokens, logits, dp, tt.children, depth, 1.0, ui)
                if not all(torch.equal(x, y) for x, y in zip(got, ref, strict=True)):
                    print(
                        f"accept_cost: {spec} {kind}: kernel and reference differ", file=sys.stderr
                    )
                    return 1
            row = {"tree": spec, "nodes": t, "depth": depth, "draft": kind}
            for name, fn in (("torch", reference_accept_sampled), ("triton", accept_sampled)):

                def step(_, fn=fn, a=(tokens, logits, dp, tt.children, depth)):
                    n = uniforms_needed(a[-1], a[3].shape[1], deterministic=a[2] is None)
                    uu = torch.rand(b, n, device=dev)
                    return fn(*a, 1.0, uu)

                row[f"{name}_us"] = bench_graph(step).median_s * 1e6
            rows.append(row)
    doc = {"provenance": provenance(), "vocab": v, "batch": b, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(f"{'tree':<10} {'draft':<12} {'nodes':>5} {'torch us':>9} {'triton us':>9}")
    for r in rows:
        print(
            f"{r['tree']:<10} {r['draft']:<12} {r['nodes']:>5} {r['torch_us']:>9.1f} "
            f"{r['triton_us']:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
