"""What the decode loop's host bookkeeping costs per round, on the CPU: the online controller
(``OnlineController.after_round``, the loop's ``step_s["control"]``) and the warm n-gram
drafter's shadow (``sync`` + ``take_shadow``, ``step_s["shadow"]``), in the synthetic world of
``validation.controller_world``.

    python -m ssvkit.validation.controller_cost --json /tmp/controller_cost.json
    python -m ssvkit.validation.controller_cost --profile   # cProfile of each, top 15
    python -m ssvkit.validation.controller_cost --batch 32 --context 30720 --flush-mib 32

Both run between a round's one host synchronisation and the next round's launch, so each
microsecond is one the GPU idles. Each is timed back to back, its code and data hot in the
CPU caches, and with 32 MiB written between two calls, as the rest of a decode round evicts
them (``--flush-mib 0,32``, ``cache_flush``); ``measure`` gives the per-round figures and
says what is timed.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import numpy as np
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.planner.controller import ControllerConfig, OnlineController
from ssvkit.validation.bench import collection_held
from ssvkit.validation.controller_world import (
    CONTEXT,
    SCENARIOS,
    SHADOW_PROMPTS,
    load_setting,
    run_controller,
    run_shadow,
)
from ssvkit.validation.records import file_label, record_path


def summary_us(times_s) -> dict:
    t = np.asarray(times_s) * 1e6
    return {
        "mean_us": float(t.mean()),
        "median_us": float(np.median(t)),
        "p99_us": float(np.percentile(t, 99)),
        "max_us": float(t.max()),
    }


def _profiled(fn, *args, top: int = 15, **kwargs) -> str:
    prof = cProfile.Profile()
    fn(*args, prof=prof, **kwargs)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def cache_flush(mib: int):
    """A callable that writes ``mib`` MiB between two timed calls (None for 0): what the rest of
    a decode round does to the CPU caches, roughly -- a tight loop of ``after_round`` calls
    alone finds its dictionaries and code hot, which the real loop does not."""
    if mib <= 0:
        return None
    buf = np.zeros(mib << 20, dtype=np.uint8)

    def flush() -> None:
        np.add(buf, 1, out=buf)

    return flush


def _timed(fn, *args, **kwargs):
    """``fn`` with the garbage collector held off, as ``validation.bench.run_once`` runs a
    decode (``collection_held``)."""
    with collection_held():
        return fn(*args, **kwargs)


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400, help="rounds per scenario")
    p.add_argument("--repeats", type=int, default=5, help="fresh runs per scenario (median)")
    p.add_argument("--seed", type=int, default=0, help="numpy seed of the synthetic rounds")
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation JSON (default: the one of record)",
    )
    p.add_argument(
        "--flush-mib",
        default="0,32",
        help="MiB written between two timed calls, one setting per value (0: none)",
    )
    p.add_argument("--batch", type=int, default=1, help="sequences the shadow is timed on")
    p.add_argument(
        "--shadow-sequences",
        type=int,
        default=ControllerConfig().shadow_sequences,
        help="the shadow's sample at batch > 1 (timed beside every sequence; 0: all only)",
    )
    p.add_argument(
        "--context", type=int, default=CONTEXT, help="prompt tokens (and the trees' regime)"
    )
    p.add_argument(
        "--per-round",
        default="1-5",
        help="tokens each sequence commits per round, N or N-M (1: autoregressive decoding)",
    )
    p.add_argument("--profile", action="store_true", help="print a cProfile of each part")
    p.add_argument("--json", default=None, help="write the figures to this file")
    return p.parse_args(argv)


def check_args(args) -> list[int]:
    """The ``--flush-mib`` settings, with every flag checked (``ValueError`` in one line
    naming the first bad one) and ``--per-round`` turned into (N, M) in place."""
    bad = ValueError(f"--flush-mib needs integers >= 0, got {args.flush_mib!r}")
    try:
        flushes = [int(x) for x in args.flush_mib.split(",") if x.strip()]
    except ValueError:
        raise bad from None
    if not flushes or min(flushes) < 0:
        raise bad
    for name in ("rounds", "repeats", "batch", "context"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.shadow_sequences < 0:
        raise ValueError(f"--shadow-sequences must be >= 0, got {args.shadow_sequences}")
    raw = args.per_round
    lo, _, hi = raw.partition("-")
    try:
        args.per_round = (int(lo), int(hi or lo))
    except ValueError:
        args.per_round = (0, 0)
    if not 1 <= args.per_round[0] <= args.per_round[1]:
        raise ValueError(f"--per-round must be N or N-M with 1 <= N <= M, got {raw!r}")
    if not Path(args.planner).is_file():
        raise ValueError(f"--planner {args.planner!r} does not exist")
    return flushes


def print_row(mib: int, row: dict) -> None:
    """One flush setting's figures (``measure``), a line per scenario and per shadow."""
    print(f"-- {mib} MiB written between calls")
    for scenario, r in row["controller"].items():
        print(
            f"after_round {scenario:7s} mean {r['mean_us']:6.1f} median "
            f"{r['median_us']:6.1f} p99 {r['p99_us']:6.1f} us/round, {r['rescores']} "
            f"re-scores, switches {[(i, why) for i, why, _ in r['switches']]}"
        )
    for kind, r in row["shadow"].items():
        print(
            f"shadow {kind:15s} mean {r['mean_us']:7.1f} median {r['median_us']:7.1f} "
            f"p99 {r['p99_us']:7.1f} us/round, {r['tokens_per_round']:5.1f} tokens read "
            f"per round ({r['positions']} positions, matched {r['matched']})"
        )


def print_profiles(setting, args) -> None:
    """A cProfile of ``after_round`` in every scenario and of the shadow on every prompt set."""
    for scenario in SCENARIOS:
        print(f"-- cProfile: after_round, {scenario}")
        print(_profiled(run_controller, setting, scenario, args.rounds, args.seed))
    for kind in SHADOW_PROMPTS:
        print(f"-- cProfile: shadow, {kind}")
        print(_profiled(run_shadow, kind, args.rounds, args.seed, **_world(args)))


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        flushes = check_args(args)
    except ValueError as e:
        print(f"controller_cost: {e}", file=sys.stderr)
        return 2
    setting = load_setting(Path(args.planner))
    out = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "seed": args.seed,
        "batch": args.batch,
        "context": args.context,
        "per_round": list(args.per_round),
        "planner": file_label(args.planner),
        "provenance": provenance(),
        "runs": {},
    }
    for mib in flushes:
        out["runs"][f"flush_{mib}mib"] = row = measure(setting, args, cache_flush(mib))
        print_row(mib, row)
    if args.profile:
        print_profiles(setting, args)
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1) + "\n")
    return 0


def _world(args, sample: int | None = None) -> dict:
    """The shadow's world of ``args``: its batch, sample (``sample``, else the controller's)
    and context."""
    s = args.shadow_sequences if sample is None else sample
    return {"batch": args.batch, "sample": s, "context": args.context, "per_round": args.per_round}


def _samples(args) -> list[tuple[str, int]]:
    """The shadows timed: (suffix, sample) -- at batch 1 one; at batch B every sequence and,
    when it is smaller, the controller's sample."""
    if args.batch == 1:
        return [("", 0)]
    out = [("@all", 0)]
    if 0 < args.shadow_sequences < args.batch:
        out.append((f"@{args.shadow_sequences}", args.shadow_sequences))
    return out


def measure(setting, args, flush) -> dict:
    """Per-round figures of every scenario (controller) and prompt set (shadow: chains alone,
    and with the n-gram trees the controller has walked, ``+trees``; at batch > 1 per sample,
    ``_samples``), medians over ``args.repeats`` runs of each round.

    Each call is timed with the garbage collector held off (``_timed``) and ``flush`` run
    before it (``cache_flush``). The shadow is timed on a ``--context``-token prompt of each
    prompt set, ``--per-round`` further tokens of the same text committed per round (1-5 by
    default); with ``--batch B`` it scores B such sequences, windows of their own: all of them
    (``@all``) and the controller's fixed sample (``@S``, ``--shadow-sequences``). Per part:
    mean, median, p99 and max microseconds a round; for the controller the re-scores
    (``_rescore`` calls) and the switches (round, reason, to), for the shadow the positions,
    the leading-match counts and the tokens it read per round (its work, which the sample
    bounds)."""
    trees = OnlineController(*setting[:4]).shadow_trees(args.context)
    out = {"controller": {}, "shadow": {}, "shadow_trees": list(trees)}
    for scenario in SCENARIOS:
        runs = [
            _timed(run_controller, setting, scenario, args.rounds, args.seed, flush=flush)
            for _ in range(args.repeats)
        ]
        if any(r["switches"] != runs[0]["switches"] for r in runs):
            raise RuntimeError(f"{scenario}: the repeats made different decisions")
        per_round = np.median([r["times_s"] for r in runs], axis=0)
        out["controller"][scenario] = {
            **summary_us(per_round),
            "rescores": runs[0]["rescores"],
            "switches": runs[0]["switches"],
        }
    for kind in SHADOW_PROMPTS:
        for suffix, sample in _samples(args):
            for name, walked in ((kind, ()), (f"{kind}+trees", trees)):
                world = _world(args, sample)
                runs = [
                    _timed(
                        run_shadow, kind, args.rounds, args.seed, flush=flush, trees=walked, **world
                    )
                    for _ in range(args.repeats)
                ]
                per_round = np.median([r["times_s"] for r in runs], axis=0)
                counts = runs[0]["counts"]
                matched = [sum(m[k] for _, m in counts) for k in range(len(counts[0][1]))]
                out["shadow"][name + suffix] = {
                    **summary_us(per_round),
                    "positions": sum(n for n, _ in counts),
                    "matched": matched,
                    "tokens_per_round": float(np.mean(runs[0]["work"])),
                    "max_tokens_per_round": int(max(runs[0]["work"])),
                }
    return out


if __name__ == "__main__":
    sys.exit(main())
