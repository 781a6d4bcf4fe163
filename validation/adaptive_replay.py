"""Replay the online controller, on the CPU, in worlds built from a planner evaluation's fixed
measurements: what adaptive gain its decisions would earn on each prompt set, and how widely
the median of a few runs spreads around it.

    python -m ssvkit.validation.adaptive_replay          # the planner evaluation of record
    python -m ssvkit.validation.adaptive_replay --runs 400 --json /tmp/replay.json

Each prompt set's world (``validation.replay_worlds``) gives every strategy its measured round
time and each drafter a per-depth acceptance fitted to its measured chains; ``replay`` runs
the controller in it from the regime's offline best, as ``validation.adaptive.adaptive_run``
runs it on the engine. Replayed gain = replayed adaptive tokens/s over the measured offline
best's, beside the document's measured gain (``measured_gain``). The figures are a model's,
not a measurement: rounds are drawn independently, while n-gram acceptance on real text comes
in bursts, which widens the real spread.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from ssvkit.engine.controller import ShadowAcceptance
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser, dataclass_from_pairs
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.planner.controller import ControllerConfig, OnlineController, switch_kind
from ssvkit.planner.profile import regime_of
from ssvkit.planner.space import strategy_id
from ssvkit.validation.controller_world import (
    draw_accepted,
    load_setting,
    round_stats,
    simulate_accepted,
)
from ssvkit.validation.records import file_label, record_path
from ssvkit.validation.replay_worlds import World, build_worlds


def _round_time(world: World, s, sid: str, ctl, regime: str) -> float:
    if sid in world.round_s:
        return world.round_s[sid]
    pred = ctl._round_s(regime, [s])[sid]
    return pred * world.ratio.get((s.drafter.kind, s.tree), world.ratio_all)


def _shadow(n, committed, ngram, walked, walk_pos, rng, sib) -> ShadowAcceptance:
    """The n-gram shadow of a round that committed ``n`` tokens (``committed`` in all): what an
    n-gram chain would have matched at each of them (per-depth acceptance ``ngram``), and the
    walks (``walked``: chain lengths and trees, each at ``walk_pos``, advanced in place) over
    the committed tokens -- a round in progress waits for the next round's tokens."""
    matched = [0] * SHADOW_MAX_CHAIN
    for _ in range(n):
        for k in range(SHADOW_MAX_CHAIN):
            if rng.random() >= ngram[k]:
                break
            matched[k] += 1
    chain_r, chain_d, trees = [], [], []
    for j, (key, tree) in enumerate(walked):
        r = d = sq = 0
        while walk_pos[j] < committed:
            a = simulate_accepted(tree, ngram, rng, sib)
            walk_pos[j] += a + 1
            r, d, sq = r + 1, d + a, sq + a * a
        if isinstance(key, int):
            chain_r.append(r)
            chain_d.append(d)
        else:
            trees.append((key, r, d, sq))
    return ShadowAcceptance(n, tuple(matched), tuple(chain_r), tuple(chain_d), tuple(trees))


def _walks(ctl, context_len: int) -> list[tuple]:
    """The walks of the n-gram shadow (``engine.ngram``) as (key, parents): one per chain
    length (keyed by the length) and one per tree it walks (keyed by the tree), each drawing
    rounds of that chain or tree drafted by the n-gram drafter over the tokens committed."""
    walked = [(k, parse_tree(f"chain:{k}")) for k in range(1, SHADOW_MAX_CHAIN + 1)]
    walked += [(spec, parse_tree(spec)) for spec in ctl.shadow_trees(context_len)]
    return walked


def _round_cost(world: World, s, sid: str, ctl, regime: str, host_s: float, switch_cost):
    """A round of ``s``'s seconds and its ``step_s``: its round time and the host time
    ``host_s``, plus ``switch_cost`` when a switch installed ``s`` (None when none did)."""
    t = _round_time(world, s, sid, ctl, regime) + host_s
    step_s = {"verify": t}
    if switch_cost is not None:
        step_s["switch"] = switch_cost
        t += switch_cost
    return t, step_s


def replay(world: World, setting, config=None, seed: int = 0) -> dict:
    """One adaptive run in ``world``: tokens/s, rounds and the switches (round, reason, to).

    A fresh controller starts from the regime's offline best and decodes
    ``World.max_new_tokens``, as ``validation.adaptive.adaptive_run`` does, knowing the switch
    costs the document's timed adaptive runs knew (``World.known_switch_s``). Each round draws
    what the strategy accepts (``controller_world.draw_accepted``: children tried in rank order,
    the r-th sibling accepted at the depth's acceptance times ``sibling`` ** r) and the n-gram
    shadow's leading matches of every committed position and its walks over the committed tokens
    of every chain length and of each n-gram tree it walks (``OnlineController.shadow_trees``).
    A round costs the strategy's round time (``World.round_s``), a switch the measured cost of
    its destination kind (``World.switch_s``), and, for a controller without ``overlap`` only,
    every round the measured host time of the controller and of the shadow of that set's
    adaptive runs (``World.control_s``, ``World.shadow_s``); with ``overlap`` both hide behind
    the next round's GPU work, and a decision installs a round later. Round 0 is left out, as
    the evaluation leaves it out.

    Besides the bursts of real text, the replay leaves out that a strategy's rounds cost
    different times (each costs its median fixed round) and that a seed's text differs between
    strategies, so its figures are a model's; ``measured_gain`` is what to hold them against.

    Parameters
    ----------
    world : World
        The prompt set's replay world (``validation.replay_worlds``).
    setting : tuple
        (ranking, model, gpu, profile) of the planner evaluation
        (``controller_world.load_setting``).
    config : ControllerConfig, optional
        The controller's settings (``ControllerConfig()`` when None).
    seed : int
        The seed of the run's random draws.
    """

    ranking, model, gpu, profile = setting
    config = config or ControllerConfig()
    ctl = OnlineController(ranking, model, gpu, profile, config, switch_cost_s=world.known_switch_s)
    # Overlapped, the controller and the shadow run behind the next round's GPU work.
    host_s = 0.0 if config.overlap else world.control_s + world.shadow_s
    ctl.warm()
    rng = np.random.default_rng(seed)
    ctx = ctx0 = world.context_len
    regime = regime_of(ctx)
    s = ctl.initial_strategy(ctx)
    tokens, wall, rnd, switch_cost, decided = 0, 0.0, 0, None, None
    ngram = world.alpha.get("ngram", [0.0] * SHADOW_MAX_CHAIN)
    walked = _walks(ctl, world.context_len)
    walk_pos = [0] * len(walked)  # tokens each walk has passed
    committed = 0
    sib = world.sibling.get("ngram", 1.0)
    while tokens < world.max_new_tokens:
        sid = strategy_id(s)
        parents = parse_tree(s.tree)
        sibling = world.sibling.get(s.drafter.kind, 1.0)
        accepted = draw_accepted(parents, s, world.alpha, profile, regime, rng, sibling)
        n = accepted + 1
        committed += n
        shadow = _shadow(n, committed, ngram, walked, walk_pos, rng, sib)
        t, step_s = _round_cost(world, s, sid, ctl, regime, host_s, switch_cost)
        stats = round_stats(rnd, s, ctx, parents, accepted, step_s, shadow)
        if rnd > 0:  # round 0 is left out, as the evaluation does
            tokens, wall = tokens + n, wall + t
        switch_cost = None
        if config.overlap:  # this round's decision is the last round's, installed now
            new, decided = decided, ctl.after_round(stats)
        else:
            new = ctl.after_round(stats)
        if new is not None and strategy_id(new) != sid:
            s = new
            switch_cost = world.switch_s.get(switch_kind(s), 0.0)
        ctx += n
        rnd += 1
    return {
        "tokens_per_s": tokens / wall,
        "rounds": rnd,
        "context": ctx - ctx0,
        "switches": [(x["round"], x["reason"], x["to"]) for x in ctl.switches],
    }


def summarise(world: World, runs: list[dict], repeats: int) -> dict:
    """Mean replayed gain, the gain of the median run, and the spread of the median of
    ``repeats`` runs (5th-95th percentile over consecutive groups)."""
    tps = np.array([r["tokens_per_s"] for r in runs])
    gains = tps / world.offline_best_tps - 1.0
    groups = len(tps) // repeats
    med = np.median(tps[: groups * repeats].reshape(groups, repeats), axis=1) if groups else tps
    med_gain = med / world.offline_best_tps - 1.0
    first = {}
    for r in runs:
        if r["switches"]:
            key = f"{r['switches'][0][1]}:{r['switches'][0][2]}"
            first[key] = first.get(key, 0) + 1
    return {
        "runs": len(runs),
        "mean_gain": float(gains.mean()),
        "median_gain": float(np.median(gains)),
        f"median_of_{repeats}_p05": float(np.percentile(med_gain, 5)),
        f"median_of_{repeats}_p95": float(np.percentile(med_gain, 95)),
        "measured_gain": world.measured_gain,
        "first_switch": dict(sorted(first.items(), key=lambda kv: -kv[1])),
        "switches_per_run": float(np.mean([len(r["switches"]) for r in runs])),
    }


def parse_config(text: str):
    """``ControllerConfig`` from ``name=value`` pairs separated by commas (its defaults for the
    rest); ``ValueError`` names a field it lacks or a value that is not of its type."""
    return dataclass_from_pairs(ControllerConfig, text, "--config")


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation JSON (default: the one of record)",
    )
    p.add_argument("--runs", type=int, default=200, help="replayed runs per prompt set")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="runs per median, for the spread of a median of that many",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sets", default="", help="prompt sets to replay (default: all)")
    p.add_argument(
        "--config",
        default="",
        help="controller settings, e.g. transfer=0,patience=8 (ControllerConfig)",
    )
    p.add_argument("--json", default=None, help="write the figures to this file")
    return p.parse_args(argv)


def check_args(args) -> tuple[ControllerConfig, dict, list[str]]:
    """The controller's settings, the planner evaluation document and the prompt sets to
    replay, with every flag checked (``ValueError`` in one line naming the first bad one,
    ``json.JSONDecodeError`` for a document that is no JSON)."""
    config = parse_config(args.config)
    if args.runs < 1 or args.repeats < 1:
        raise ValueError(f"--runs and --repeats must be >= 1, got {args.runs}, {args.repeats}")
    if not Path(args.planner).is_file():
        raise ValueError(f"--planner {args.planner!r} does not exist")
    doc = json.loads(Path(args.planner).read_text())
    if "adaptive" not in doc or "prompt_sets" not in doc["adaptive"]:
        raise ValueError(f"--planner {args.planner!r} holds no adaptive evaluation")
    sets = [x for x in args.sets.split(",") if x] or list(doc["adaptive"]["prompt_sets"])
    bad = [x for x in sets if x not in doc["adaptive"]["prompt_sets"]]
    if bad:
        raise ValueError(
            f"unknown prompt set {bad[0]!r}; the document has "
            f"{', '.join(doc['adaptive']['prompt_sets'])}"
        )
    return config, doc, sets


def replay_set(world: World, setting, config, args) -> dict:
    """A prompt set's figures: ``args.runs`` replays in ``world`` (seeds from ``args.seed``)
    summarised (``summarise``), with the world's per-depth acceptance and sibling factors."""
    runs = [replay(world, setting, config, seed=args.seed + i) for i in range(args.runs)]
    row = summarise(world, runs, args.repeats)
    row["alpha"] = {k: [round(a, 3) for a in v] for k, v in world.alpha.items()}
    row["sibling"] = world.sibling
    return row


def print_row(name: str, row: dict, repeats: int) -> None:
    """A prompt set's line: the replayed gains, the spread of a median of ``repeats`` runs, the
    measured gain, the switches per run and the three commonest first switches."""
    top = ", ".join(f"{k} x{v}" for k, v in list(row["first_switch"].items())[:3])
    print(
        f"{name:10s} replayed gain mean {row['mean_gain']:+6.1%} median "
        f"{row['median_gain']:+6.1%}  median of {repeats}: "
        f"{row[f'median_of_{repeats}_p05']:+6.1%} .. "
        f"{row[f'median_of_{repeats}_p95']:+6.1%}  measured "
        f"{row['measured_gain']:+6.1%}  {row['switches_per_run']:.1f} switches/run; "
        f"first: {top}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config, doc, sets = check_args(args)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"adaptive_replay: {e}", file=sys.stderr)
        return 2
    setting = load_setting(Path(args.planner))
    worlds = build_worlds(doc, setting[0])
    out = {
        "planner": file_label(args.planner),
        "runs": args.runs,
        "seed": args.seed,
        "controller": dataclasses.asdict(config),
        "provenance": provenance(),
        "sets": {},
    }
    for name in sets:
        out["sets"][name] = row = replay_set(worlds[name], setting, config, args)
        print_row(name, row, args.repeats)
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
