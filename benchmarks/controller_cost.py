"""What the decode loop's host bookkeeping costs per round, on the CPU: the online controller
(``OnlineController.after_round``, the loop's ``step_s["control"]``) and the warm n-gram
drafter's shadow (``sync`` + ``take_shadow``, ``step_s["shadow"]``).

    PYTHONPATH=. python benchmarks/controller_cost.py --json /tmp/controller_cost.json
    PYTHONPATH=. python benchmarks/controller_cost.py --profile   # cProfile of each, top 15

Both run between a round's one host synchronisation and the next round's launch, so each
microsecond is one the GPU idles (an autoregressive round of the tiny pair at 16K takes ~756 us
on the H100).

**Controller.** The ranking is regenerated on the CPU (``planner.rank.rank``) from the profile,
space, model and regimes of ``docs/validation/planner.json``, and ``OnlineController``
(``ControllerConfig()`` defaults, ``warm()`` first, as ``planner.evaluate.adaptive_run`` does)
is fed synthetic ``RoundStats`` at a 15360-token context (growing by the tokens each round
commits), starting from the regime's offline best. Each round the world draws what the current
strategy accepts (``simulate_accepted``: per-token acceptance ``alpha`` of its drafter kind
times the profile's attention factor; a tree's children tried in rank order) and what an n-gram
chain of 8 would have matched at each committed position (``simulate_shadow``); the strategy the
controller returns is the next round's. Scenarios (``SCENARIOS``: per-token acceptance per
drafter kind): ``code`` -- n-gram near its profiled 0.52, ``prose`` -- n-gram far below it, the
draft model below its profile too, so the controller leaves for autoregressive decoding and
probes; ``random`` -- random bytes, n-gram ~0; ``decay`` -- prose again, but the draft model
accepts its first drafts as profiled and later ones far less (per-depth acceptance), so its
chain:2 beats its chain:4; ``prose>code`` -- prose, then from round 200
text the n-gram drafter suits, which its shadow reveals. Fixed numpy seed: every repeat makes
the same decisions (checked), so per-round times are medians over repeats of the same round.

**Shadow.** ``NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN)`` started on a 15360-token prompt of the
prompt set (``planner.evaluate.prompt_tokens``), then per round 1-5 further tokens of the same
text appended and ``sync`` + ``take_shadow`` timed; then again walking the n-gram trees the
controller declares for that context (``OnlineController.shadow_trees``: its candidates'
branching n-gram trees in the 16K regime, ``<set>+trees``).

Each is timed twice by default (``--flush-mib 0,32``): back to back, its code and data hot in
the CPU caches, and with 32 MiB written between two calls (``cache_flush``), as the rest of a
decode round evicts them (5-7x slower on the development CPU; the H100 runs' 20-50 us of
control per round are nearer this figure). The garbage collector is held
off, as ``planner.evaluate.run_once`` does. Per-round figures: mean, median and p99 in
microseconds; re-scores (``_rescore`` calls) and the switches (round, reason) for the
controller, positions and leading-match counts for the shadow.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

from kernels.timing import provenance
from perfmodel.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
PLANNER_JSON = ROOT / "docs" / "validation" / "planner.json"
CONTEXT = 15360
# Per scenario, the per-token acceptance of each drafter kind (before the profile's attention
# factor), or phases of it: (first round, acceptance per kind), in order.
SCENARIOS = {
    "code": {"ngram": 0.52, "draft_model": 0.70},
    "prose": {"ngram": 0.15, "draft_model": 0.35},
    "random": {"ngram": 0.01, "draft_model": 0.30},
    # prose whose later drafts fare worse: the draft model's chain:2 beats its chain:4, which
    # its chain:4's own rounds reveal (reason ``truncation``, from chain:4; from the offline
    # best, with ``ControllerConfig.transfer`` 0.5, the controller probes chain:2 itself)
    "decay": {"ngram": 0.15, "draft_model": (0.75, 0.65, 0.45, 0.35)},
    # prose, then text the n-gram drafter suits: the shadow brings it back (reason ``shadow``)
    "prose>code": [
        (0, {"ngram": 0.15, "draft_model": 0.35}),
        (200, {"ngram": 0.80, "draft_model": 0.70}),
    ],
}
# Prompt sets the shadow is timed on (``planner.evaluate.prompt_tokens``).
SHADOW_PROMPTS = ("code", "prose", "random")
# Host time a switch to each kind costs (``step_s["switch"]`` of the next round), seconds.
SWITCH_S = {"none": 1e-4, "ngram": 1e-4, "draft_model": 4e-3}


def load_setting(path: Path = PLANNER_JSON):
    """(ranking, model, gpu, profile) of a planner evaluation document, the ranking
    regenerated on the CPU over the document's regimes."""
    from perfmodel.hardware import get_gpu
    from perfmodel.models import get_model
    from planner.profile import profile_from_json
    from planner.rank import rank
    from planner.space import SpaceSpec

    doc = json.loads(Path(path).read_text())
    profile = profile_from_json(doc["profile"], str(path), "planner")
    space = SpaceSpec(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()}
    )
    model_path = Path(doc["model"])
    if not model_path.exists():  # the document names the checkpoint where it was measured
        model_path = ROOT / "engine" / "checkpoints" / model_path.name
    model, gpu = get_model(str(model_path)), get_gpu(doc["gpu_model"])
    regimes = {r: v["context_len"] for r, v in doc["regimes"].items()}
    return rank(model, gpu, space, profile, regimes=regimes), model, gpu, profile


def simulate_accepted(parents: tuple[int, ...], alpha, rng, sibling: float = 1.0) -> int:
    """Drafts a round accepts: from the root, the children of the last accepted node are
    tried in order, each accepted with probability ``alpha`` (a number, or one per depth from
    1: text whose later drafts fare worse) times ``sibling`` to the power of its rank among
    its siblings (0 for the first: a drafter's second choice, tried after its first failed,
    is right less often); the first accepted is followed."""
    children: dict[int, list[int]] = {}
    for node, p in enumerate(parents):
        children.setdefault(p, []).append(node)
    per_depth = alpha if isinstance(alpha, (tuple, list)) else None
    node, depth = -1, 0
    while True:
        a = alpha if per_depth is None else per_depth[min(depth, len(per_depth) - 1)]
        for rank, c in enumerate(children.get(node, ())):
            if rng.random() < a * sibling**rank:
                node, depth = c, depth + 1
                break
        else:
            return depth


def simulate_shadow(positions: int, alpha: float, chain: int, rng):
    """``ShadowAcceptance`` of ``positions`` committed positions whose leading matches with an
    n-gram chain of ``chain`` each run on with probability ``alpha``."""
    from engine.controller import ShadowAcceptance

    m = (
        np.minimum(rng.geometric(1.0 - alpha, positions) - 1, chain)
        if alpha < 1
        else (np.full(positions, chain))
    )
    return ShadowAcceptance(positions, tuple(int((m > k).sum()) for k in range(chain)))


def run_controller(
    setting,
    scenario,
    rounds: int,
    seed: int = 0,
    controller_cls=None,
    prof: cProfile.Profile | None = None,
    flush=None,
    start=None,
    config=None,
) -> dict:
    """Drive a fresh, warmed controller (``controller_cls``, ``OnlineController`` by default,
    with ``config``, ``ControllerConfig()`` by default) through ``rounds`` synthetic rounds of
    ``scenario`` (a name of ``SCENARIOS``, or such an entry itself) from ``start`` (the
    regime's offline best by default); per-round ``after_round`` seconds, the number of
    re-scores and the switches (``prof`` profiles the ``after_round`` calls only, ``flush``
    runs before each)."""
    from engine.controller import RoundStats
    from engine.ngram import SHADOW_MAX_CHAIN
    from perfmodel.strategy import parse_tree
    from planner.controller import ControllerConfig, OnlineController, switch_kind
    from planner.profile import regime_of

    ranking, model, gpu, profile = setting
    phases = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    phases = [(0, phases)] if isinstance(phases, dict) else phases
    ctl = (controller_cls or OnlineController)(
        ranking, model, gpu, profile, config or ControllerConfig()
    )
    ctl.warm()
    rescores = 0
    rescore = ctl._rescore

    def counted(*args, **kwargs):
        nonlocal rescores
        rescores += 1
        return rescore(*args, **kwargs)

    ctl._rescore = counted
    rng = np.random.default_rng(seed)
    s, ctx, switched, times = start or ctl.initial_strategy(CONTEXT), CONTEXT, False, []
    for i in range(rounds):
        world = next(w for first, w in reversed(phases) if i >= first)
        parents = parse_tree(s.tree)
        if parents:
            factor = profile.attention_factor(regime_of(ctx), s)
            a = world[s.drafter.kind]
            a = (
                [min(1.0, x * factor) for x in a]
                if isinstance(a, (tuple, list))
                else min(1.0, a * factor)
            )
            accepted = simulate_accepted(parents, a, rng)
        else:
            accepted = 0
        shadow = simulate_shadow(accepted + 1, world["ngram"], SHADOW_MAX_CHAIN, rng)
        step_s = {"draft": 1e-4, "verify": 6e-4, "accept": 1e-4}
        if switched:
            step_s["switch"] = SWITCH_S[switch_kind(s)]
        stats = RoundStats(
            round=i,
            strategy=s,
            context_lens=(ctx,),
            drafted=len(parents),
            accepted=(accepted,),
            step_s=step_s,
            tokens_generated=accepted + 1,
            shadow={"ngram": shadow},
        )
        if flush is not None:
            flush()
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        new = ctl.after_round(stats)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.disable()
        ctx += accepted + 1
        switched = new is not None and new != s
        if switched:
            s = new
    switches = [(x["round"], x["reason"], x["to"]) for x in ctl.switches]
    return {"times_s": times, "rescores": rescores, "switches": switches, "log": ctl.switches}


def run_shadow(
    kind: str,
    rounds: int,
    seed: int = 0,
    prof: cProfile.Profile | None = None,
    flush=None,
    trees: tuple[str, ...] = (),
) -> dict:
    """Per-round seconds of ``sync`` + ``take_shadow`` of a warm n-gram drafter on a
    ``CONTEXT``-token prompt of ``kind``, 1-5 tokens of the same text committed per round,
    walking ``trees`` too; the counts it returned."""
    from engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter
    from planner.evaluate import prompt_tokens

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, rounds).tolist()
    text = prompt_tokens(kind, CONTEXT + sum(sizes))
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, trees)
    d.start([text[:CONTEXT]])
    hist, times, counts = text[:CONTEXT], [], []
    for n in sizes:
        hist += text[len(hist) : len(hist) + n]  # in place, as the loop commits
        if flush is not None:
            flush()
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        d.sync([hist])
        sh = d.take_shadow()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.disable()
        counts.append((sh.positions, sh.matched))
    return {"times_s": times, "counts": counts}


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
    """``fn`` with the garbage collector held off, as ``planner.evaluate.run_once`` runs a
    decode (a collection pause is not the code under test)."""
    gc.collect()
    gc.disable()
    try:
        return fn(*args, **kwargs)
    finally:
        gc.enable()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400, help="rounds per scenario")
    p.add_argument("--repeats", type=int, default=5, help="fresh runs per scenario (median)")
    p.add_argument("--seed", type=int, default=0, help="numpy seed of the synthetic rounds")
    p.add_argument("--planner", default=str(PLANNER_JSON), help="planner evaluation JSON")
    p.add_argument(
        "--flush-mib",
        default="0,32",
        help="MiB written between two timed calls, one setting per value (0: none)",
    )
    p.add_argument("--profile", action="store_true", help="print a cProfile of each part")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    try:
        bad = ValueError(f"--flush-mib needs integers >= 0, got {args.flush_mib!r}")
        try:
            flushes = [int(x) for x in args.flush_mib.split(",") if x.strip()]
        except ValueError:
            raise bad from None
        if not flushes or min(flushes) < 0:
            raise bad
        for name in ("rounds", "repeats"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
        if not Path(args.planner).is_file():
            raise ValueError(f"--planner {args.planner!r} does not exist")
    except ValueError as e:
        print(f"controller_cost: {e}", file=sys.stderr)
        return 2
    setting = load_setting(Path(args.planner))
    out = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "seed": args.seed,
        "planner": str(args.planner),
        "provenance": provenance(),
        "runs": {},
    }
    for mib in flushes:
        out["runs"][f"flush_{mib}mib"] = row = measure(setting, args, cache_flush(mib))
        print(f"-- {mib} MiB written between calls")
        for scenario, r in row["controller"].items():
            print(
                f"after_round {scenario:7s} mean {r['mean_us']:6.1f} median "
                f"{r['median_us']:6.1f} p99 {r['p99_us']:6.1f} us/round, {r['rescores']} "
                f"re-scores, switches {[(i, why) for i, why, _ in r['switches']]}"
            )
        for kind, r in row["shadow"].items():
            print(
                f"shadow {kind:12s} mean {r['mean_us']:6.1f} median {r['median_us']:6.1f} "
                f"p99 {r['p99_us']:6.1f} us/round ({r['positions']} positions, matched "
                f"{r['matched']})"
            )
    if args.profile:
        for scenario in SCENARIOS:
            print(f"-- cProfile: after_round, {scenario}")
            print(_profiled(run_controller, setting, scenario, args.rounds, args.seed))
        for kind in SHADOW_PROMPTS:
            print(f"-- cProfile: shadow, {kind}")
            print(_profiled(run_shadow, kind, args.rounds, args.seed))
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1) + "\n")
    return 0


def measure(setting, args, flush) -> dict:
    """Per-round figures of every scenario (controller) and prompt set (shadow: chains alone,
    and with the n-gram trees the controller has walked, ``+trees``), medians over
    ``args.repeats`` runs of each round."""
    from planner.controller import OnlineController

    trees = OnlineController(*setting[:4]).shadow_trees(CONTEXT)
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
        for name, walked in ((kind, ()), (f"{kind}+trees", trees)):
            runs = [
                _timed(run_shadow, kind, args.rounds, args.seed, flush=flush, trees=walked)
                for _ in range(args.repeats)
            ]
            per_round = np.median([r["times_s"] for r in runs], axis=0)
            counts = runs[0]["counts"]
            matched = [sum(m[k] for _, m in counts) for k in range(len(counts[0][1]))]
            out["shadow"][name] = {
                **summary_us(per_round),
                "positions": sum(n for n, _ in counts),
                "matched": matched,
            }
    return out


if __name__ == "__main__":
    sys.exit(main())
