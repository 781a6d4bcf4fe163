"""How much one decode's wall time moves from run to run, and whether pinning the host helps:
the same deterministic decode (same prompt, seed and strategy: the same tokens and rounds every
time) repeated, under each host setting in turn (interleaved, so a drift of the machine's speed
falls on every setting alike).

    PYTHONPATH=. python benchmarks/run_noise.py --context 7680 --runs 12 --out /tmp/noise.json

Settings (``--modes``):

- ``plain``: as ``planner.evaluate`` runs (garbage collector held off, nothing else);
- ``pinned``: the process pinned to one CPU (``os.sched_setaffinity``), so the scheduler cannot
  move the decode loop between cores mid-run;
- ``threads1``: torch's intra-op CPU thread pool at one thread (``torch.set_num_threads``).

Per run: the mean round time (what tokens/s divides by), the median round and the 90th
percentile round (a run slowed throughout moves its median; one slowed by a few stalls moves its
mean, not its median). Per setting: the spread of the runs' mean round times (robust standard
deviation of their logarithm, 1.4826 x MAD). The planner's evaluation (issue #7) times each
strategy by such runs; its regret and adaptive gains are differences of a few per cent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODES = ("plain", "pinned", "threads1")


def _robust_sd_log(x: list[float]) -> float:
    lx = np.log(np.asarray(x, dtype=float))
    return float(1.4826 * np.median(np.abs(lx - np.median(lx))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--draft-model", default="tiny-draft")
    p.add_argument("--context", type=int, default=7680)
    p.add_argument("--new-tokens", type=int, default=384)
    p.add_argument(
        "--trees",
        default="ngram:chain:4,draft_model:chain:0",
        help="drafter:tree pairs, comma-separated (dense attention)",
    )
    p.add_argument("--runs", type=int, default=12, help="runs per setting and strategy")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", default=None, help="JSON of every run")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(
            f"run_noise: unknown mode {bad[0] if bad else '(none)'}; expected one of "
            f"{', '.join(MODES)}",
            file=sys.stderr,
        )
        return 2
    if args.runs < 2 or args.context < 1:
        print("run_noise: --runs must be >= 2 and --context >= 1", file=sys.stderr)
        return 2
    from perfmodel.strategy import parse_tree

    pairs = []
    for pair in (x for x in args.trees.split(",") if x):
        kind, sep, tree = pair.partition(":")
        try:
            if not sep or kind not in ("draft_model", "ngram"):
                raise ValueError("expected drafter:tree with drafter draft_model or ngram")
            parse_tree(tree)
        except ValueError as e:
            print(f"run_noise: --trees {pair!r}: {e}", file=sys.stderr)
            return 2
        pairs.append((kind, tree))
    if not pairs:
        print("run_noise: --trees names no strategy", file=sys.stderr)
        return 2
    import torch

    from kernels.timing import provenance
    from perfmodel.strategy import Strategy
    from planner.evaluate import _drafter, make_bench, prompt_tokens, run_once
    from planner.space import describe

    bench = make_bench(
        args.model, args.draft_model, args.context, args.new_tokens, 1, temperature=1.0
    )
    strategies = []
    for kind, tree in pairs:
        strategies.append(Strategy(tree=tree, drafter=_drafter(bench, kind), traversal="bfs"))
    prompt = prompt_tokens("code", args.context, offset=args.context)
    all_cpus = sorted(os.sched_getaffinity(0))
    threads0 = torch.get_num_threads()
    host = {"cpus": all_cpus, "torch_threads": threads0, "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            host["cpu_mhz"] = [float(x.split(":")[1]) for x in f if x.startswith("cpu MHz")]
    except OSError:
        pass

    def setting(mode: str) -> None:
        os.sched_setaffinity(0, {all_cpus[len(all_cpus) // 2]} if mode == "pinned" else all_cpus)
        torch.set_num_threads(1 if mode == "threads1" else threads0)

    for s in strategies:  # warm-up: graphs captured, kernels compiled
        run_once(bench, s, prompt, seed=0)
    runs = []
    for i in range(args.runs):
        for s in strategies:
            for mode in modes:
                setting(mode)
                res = run_once(bench, s, prompt, seed=0)
                walls = np.array([r.wall_s for r in res.rounds[1:]])
                tokens = int(sum(r.tokens for r in res.rounds[1:]))
                runs.append(
                    {
                        "strategy": describe(s),
                        "mode": mode,
                        "repeat": i,
                        "rounds": len(walls),
                        "tokens": tokens,
                        "mean_round_s": float(walls.mean()),
                        "median_round_s": float(np.median(walls)),
                        "p90_round_s": float(np.percentile(walls, 90)),
                    }
                )
    setting("plain")
    rows = []
    for s in strategies:
        for mode in modes:
            rs = [r for r in runs if r["strategy"] == describe(s) and r["mode"] == mode]
            means = [r["mean_round_s"] for r in rs]
            meds = [r["median_round_s"] for r in rs]
            rows.append(
                {
                    "strategy": describe(s),
                    "mode": mode,
                    "runs": len(rs),
                    "rounds_distinct": len({r["rounds"] for r in rs}),
                    "median_mean_round_us": float(np.median(means)) * 1e6,
                    "min_mean_round_us": float(min(means)) * 1e6,
                    "max_mean_round_us": float(max(means)) * 1e6,
                    "robust_sd_log_mean": _robust_sd_log(means),
                    "sd_log_mean": float(np.std(np.log(means))),
                    "robust_sd_log_median": _robust_sd_log(meds),
                }
            )
    doc = {
        "provenance": provenance(),
        "host": host,
        "context": args.context,
        "new_tokens": args.new_tokens,
        "runs": runs,
        "summary": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(
        f"{'strategy':34s} {'mode':9s} {'median us':>9s} {'min':>6s} {'max':>6s} "
        f"{'sd(log mean)':>12s} {'robust':>7s} {'robust(median)':>14s}"
    )
    for r in rows:
        print(
            f"{r['strategy'][:34]:34s} {r['mode']:9s} {r['median_mean_round_us']:9.0f} "
            f"{r['min_mean_round_us']:6.0f} {r['max_mean_round_us']:6.0f} "
            f"{r['sd_log_mean']:12.3f} {r['robust_sd_log_mean']:7.3f} "
            f"{r['robust_sd_log_median']:14.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
