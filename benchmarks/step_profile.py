"""Which GPU kernels a decode round spends its time in, per prompt set (torch.profiler).

    PYTHONPATH=. python benchmarks/step_profile.py --context 15360 --sets code,random \\
        --strategies draft_model:chain:0,draft_model:chain:2 --out /tmp/steps.json

For each prompt set (``planner.evaluate.prompt_tokens``, the adaptive runs' prompt) and each
strategy (``DRAFTER:TREE``, dense attention): one run to capture the CUDA graphs, then one run
under ``torch.profiler`` (CUDA activity; kernels replayed by a graph are recorded too). Reports
the run's steady figures (``planner.evaluate.steady_figures``: CUDA-event step times) and the
kernels by total device time, per round. Written to find why the engine's ``accept`` step of
autoregressive decoding took 68 us per round on random bytes and 200 us on other text at 16K
(docs/notes/planner.md, run 14). The JSON goes to ``--out`` (whole or not at all); a table is
printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict

from perfmodel.files import atomic_write
from perfmodel.strategy import DrafterSpec, Strategy
from planner.evaluate import PROMPT_SETS, make_bench, prompt_tokens, run_once, steady_figures


def parse_strategy(text: str, draft_label: str) -> Strategy:
    kind, _, tree = text.partition(":")
    if not tree:
        raise ValueError(f"strategy {text!r}: expected DRAFTER:TREE, e.g. draft_model:chain:2")
    spec = DrafterSpec(kind=kind, model=draft_label if kind == "draft_model" else None)
    return dataclasses.replace(Strategy(name=text, tree=tree, traversal="bfs"), drafter=spec)


class HostMarks:
    """Wraps ``engine.timing.StepTimer`` so that every mark also notes the host clock: per
    step, the host time between two marks beside the device time between their events. A
    device step longer than the host's is the GPU's own work; one that follows the host's is
    the GPU waiting for the host."""

    def __init__(self):
        self.host: dict[str, list[float]] = defaultdict(list)

    def __enter__(self):
        import time

        from engine import timing

        self._orig = (timing.StepTimer.start, timing.StepTimer.mark)
        start0, mark0 = self._orig
        host, last = self.host, [0.0]

        def start(t):
            last[0] = time.perf_counter()
            start0(t)

        def mark(t, name):
            now = time.perf_counter()
            host[name].append(now - last[0])
            last[0] = now
            mark0(t, name)

        timing.StepTimer.start, timing.StepTimer.mark = start, mark
        return self

    def __exit__(self, *exc):
        from engine import timing

        timing.StepTimer.start, timing.StepTimer.mark = self._orig

    def means_us(self) -> dict[str, float]:
        return {k: 1e6 * sum(v[1:]) / max(len(v) - 1, 1) for k, v in self.host.items()}


def profile_run(bench, strategy: Strategy, prompt: list[int], top: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    run_once(bench, strategy, prompt, seed=0)  # captures the graphs, compiles
    with HostMarks() as marks:
        timed = steady_figures(run_once(bench, strategy, prompt, seed=0))
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        result = run_once(bench, strategy, prompt, seed=0)
        torch.cuda.synchronize()
    fig = steady_figures(result)
    rounds = len(result.rounds)
    kernels: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":  # kernels and memcpys on the device
            kernels[ev.name].append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
    rows = sorted(
        (
            {
                "name": k,
                "count_per_round": len(v) / rounds,
                "us_per_round": sum(v) / rounds,
                "us_each": sum(v) / len(v),
            }
            for k, v in kernels.items()
        ),
        key=lambda r: -r["us_per_round"],
    )
    return {
        "timed": timed,
        "host_us": marks.means_us(),
        "figures": fig,
        "rounds": rounds,
        "kernels_per_round": sum(len(v) for v in kernels.values()) / rounds,
        "kernel_us_per_round": sum(sum(v) for v in kernels.values()) / rounds,
        "top": rows[:top],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--draft-model", default="tiny-draft")
    p.add_argument("--context", type=int, default=15360)
    p.add_argument("--sets", default="code,random")
    p.add_argument("--strategies", default="draft_model:chain:0,draft_model:chain:2")
    p.add_argument(
        "--first",
        default="",
        help="baselines (perfmodel.strategy.BASELINES, e.g. ar_sparse) decoded once "
        "per prompt set before the profiled strategies, as an evaluation that "
        "measured them earlier on the same runners would have",
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        sets = [s for s in args.sets.split(",") if s]
        bad = [s for s in sets if s not in PROMPT_SETS]
        if bad:
            raise ValueError(f"unknown prompt set {bad[0]!r}; expected {', '.join(PROMPT_SETS)}")
        if args.context < 1 or args.new_tokens < 1:
            raise ValueError("--context and --new-tokens must be >= 1")
        names = [x for x in args.strategies.split(",") if x]
        for x in names:  # bad input fails before any model is built
            parse_strategy(x, args.draft_model)
        first = [Strategy.from_name(x) for x in args.first.split(",") if x]
        bench = make_bench(
            args.model,
            args.draft_model,
            args.context,
            args.new_tokens,
            1,
            "cuda",
            temperature=args.temperature,
        )
        strategies = [parse_strategy(x, bench.draft_label) for x in names]
    except ValueError as e:
        print(f"step_profile: {e}", file=sys.stderr)
        return 2
    from kernels.timing import provenance

    out = {
        "provenance": {**provenance(), "command": " ".join(sys.argv)},
        "first": args.first,
        "context": args.context,
        "new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "runs": [],
    }
    for kind in sets:
        prompt = prompt_tokens(kind, args.context, offset=2 * args.context)
        for s in first:
            run_once(bench, s, prompt, seed=0)
        for s in strategies:
            r = profile_run(bench, s, prompt, args.top)
            out["runs"].append({"set": kind, "strategy": s.name, **r})
            steps = {k: round(v * 1e6) for k, v in r["timed"]["steps_s"].items() if v}
            host = {k: round(v) for k, v in r["host_us"].items()}
            print(
                f"{kind:10s} {s.name:22s} {r['timed']['tokens_per_s']:7.1f} tok/s, device "
                f"steps us {steps}, host us {host}; profiled: kernels/round "
                f"{r['kernels_per_round']:.1f} ({r['kernel_us_per_round']:.0f} us)",
                flush=True,
            )
            for k in r["top"]:
                print(
                    f"    {k['us_per_round']:8.1f} us/round {k['count_per_round']:6.2f}x "
                    f"{k['us_each']:7.2f} us  {k['name'][:90]}",
                    flush=True,
                )
    atomic_write(args.out, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
