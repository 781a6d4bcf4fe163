"""What a warm drafter's catch-up costs: ``n`` committed tokens appended after a long prefix,
what a switch back to the draft model runs (``engine.draft_model.resume``).

    PYTHONPATH=. python benchmarks/catchup_cost.py --context 15360 --out /tmp/catchup.json

Per tail length and method -- ``append`` (what ``resume`` runs: graph-captured chain forwards,
``ModelRunner.append``), or ``extend`` with an SDPA backend set (``default``: torch's choice;
``no_cudnn``: flash, memory-efficient and math only) -- the wall time of one call (CUDA-
synchronised, host included: the switch is host time), the first call of each length apart from
the median of the repeats (a per-shape setup, such as building an attention plan, shows as a
first call far above the rest -- and every catch-up has a shape of its own, its prefix being
longer each time). Fresh random tokens each call; the cache length is reset after each call.
Before the timing, each length's ``append`` is checked against ``extend`` of the same tokens:
the KV written (bf16), its largest difference over the largest value, under 5%.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-draft", help="checkpoint (the draft model)")
    p.add_argument("--context", type=int, default=15360, help="prefix length before the tail")
    p.add_argument("--tails", default="17,33,64,65,100,131", help="tail lengths")
    p.add_argument("--repeats", type=int, default=5, help="calls per length after the first")
    p.add_argument("--out", default=None, help="JSON of every call's time")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then N more extends of the first tail length under torch.profiler: "
        "the top ops by host and by device time",
    )
    args = p.parse_args(argv)
    try:
        tails = [int(x) for x in args.tails.split(",") if x]
        if not tails or min(tails) < 1 or args.context < 1 or args.repeats < 1:
            raise ValueError("--tails, --context and --repeats must be positive")
    except ValueError as e:
        print(f"catchup_cost: {e}", file=sys.stderr)
        return 2
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.checkpoint import build_model, resolve_source
    from engine.runner import ModelRunner

    if not torch.cuda.is_available():
        print("catchup_cost: no CUDA device", file=sys.stderr)
        return 1
    t_max = args.context + max(tails) * (args.repeats + 2) + 64
    m = build_model(
        resolve_source(args.model), max_positions=t_max, device="cuda", dtype=torch.bfloat16
    )
    runner = ModelRunner(m, batch=1, t_max=t_max, backend="triton", use_graphs=True)
    rng = np.random.default_rng(0)
    runner.prefill([rng.integers(0, 256, args.context).tolist()])
    torch.cuda.synchronize()
    base = runner.cache.lens.clone()
    sets = {
        "append": "append",
        "default": None,
        "no_cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    }
    worst = 0.0
    for n in tails:  # append writes what extend writes
        tail = rng.integers(0, 256, n).tolist()
        got = []
        for fn in (runner.append, runner.extend):
            runner.cache.set_lens(base)
            runner.cache.kv[:, :, 0, :, int(base[0]) : int(base[0]) + n].normal_()  # poison
            fn([tail])
            got.append(runner.cache.kv[:, :, 0, :, : int(base[0]) + n].float().clone())
        runner.cache.set_lens(base)
        if not torch.isfinite(got[0]).all():
            print(f"catchup_cost: append of {n} wrote non-finite KV", file=sys.stderr)
            return 1
        worst = max(worst, float((got[0] - got[1]).abs().max() / got[1].abs().max()))
    print(f"append vs extend: max |KV difference| / max |KV| = {worst:.3g} over tails {tails}")
    if not worst < 5e-2:  # bf16: the two paths' attention reductions round differently
        print("catchup_cost: append and extend disagree", file=sys.stderr)
        return 1
    rows = []
    for name, backends in sets.items():
        for offset, n in enumerate(tails):
            times = []
            for i in range(args.repeats + 1):
                # Each call at a prefix of its own (as each catch-up is), fresh tokens.
                runner.cache.set_lens(base + (offset * (args.repeats + 1) + i) % 7)
                tail = rng.integers(0, 256, n).tolist()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if backends == "append":
                    runner.append([tail])
                elif backends is None:
                    runner.extend([tail])
                else:
                    with sdpa_kernel(backends):
                        runner.extend([tail])
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            runner.cache.set_lens(base)
            row = {
                "backends": name,
                "tail": n,
                "first_ms": times[0] * 1e3,
                "median_ms": float(np.median(times[1:])) * 1e3,
                "all_ms": [t * 1e3 for t in times],
            }
            rows.append(row)
            print(
                f"{name:9s} tail {n:4d}: first {row['first_ms']:8.2f} ms, "
                f"median {row['median_ms']:8.2f} ms",
                flush=True,
            )
    if args.profile > 0:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts) as prof:
            for i in range(args.profile):
                runner.cache.set_lens(base + i % 7)
                runner.extend([rng.integers(0, 256, tails[0]).tolist()])
            torch.cuda.synchronize()
        runner.cache.set_lens(base)
        for key in ("self_cpu_time_total", "self_cuda_time_total"):
            print(f"-- {args.profile} extends of {tails[0]} tokens, by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=15))
    if args.out:
        from kernels.timing import provenance

        with open(args.out, "w") as fh:
            json.dump(
                {
                    "provenance": provenance(),
                    "context": args.context,
                    "append_vs_extend_max_rel": worst,
                    "rows": rows,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
