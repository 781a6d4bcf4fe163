"""Replay the online controller, on the CPU, in worlds built from a planner evaluation's fixed
measurements: what adaptive gain its decisions would earn on each prompt set, and how widely
the median of a few runs spreads around it.

    PYTHONPATH=. python benchmarks/adaptive_replay.py                    # docs/validation
    PYTHONPATH=. python benchmarks/adaptive_replay.py --runs 400 --json /tmp/replay.json

**The worlds.** Per prompt set of ``adaptive.prompt_sets`` in the planner document (issue #7's
evaluation on the H100), every strategy the evaluation ran fixed (``oracle.strategies``, median
run of ``repeats``) gives its round time, ``(1 + mean_accepted) / tokens_per_s`` -- everything a
fixed round of it costs on that prompt, loop overhead included. Per drafter kind, its chains'
mean accepted drafts on that set (chain:2, chain:4, chain:7 in the evaluation's space) give a
per-depth acceptance (``per_depth_alpha``: piecewise constant between the measured lengths,
each piece solved so that the chain of that length accepts what was measured), which draws
every round of any of its trees (``controller_cost.simulate_accepted``: children tried in rank
order, the r-th sibling accepted at the depth's acceptance times ``sibling`` ** r), the
n-gram shadow's leading matches of every committed position, and its walks over the committed
tokens of every chain length and of each n-gram tree it walks
(``OnlineController.shadow_trees``). ``sibling`` is fitted per drafter
kind to the mean accepted drafts of its branching trees measured fixed on the set
(``fit_sibling``; 1 when none was): with siblings tried at the depth's acceptance, the replay
had the draft model's tree(n=8,d=4) accept 15-18% more than measured on prose and random in
runs 26-28 (2.17 against 1.84, 1.59 against 1.38 in run 28) and 0-1% more on code, which
made a switch to it look better off-distribution than the measured runs found it. A strategy the
evaluation did not run fixed costs its predicted round time (the ranking's model) times the
measured-to-predicted ratio of its drafter and tree dense, or of all measured ones.

**The adaptive run** starts from the regime's offline best and decodes ``max_new_tokens``, as
``planner.evaluate.adaptive_run`` does: a fresh controller (``ControllerConfig()`` unless
told), knowing the switch costs the document's timed adaptive runs knew
(``known_switch_cost_s``), each switch charged the measured cost of its destination kind
(``switch_costs``, else ``known_switch_cost_s``), and -- a controller without ``overlap``
only -- every round the measured host time of the controller (``control_s`` plus
``control_overlap_s``, over rounds) and of the shadow (``steps_s["shadow"]``) of that set's
adaptive runs; with ``overlap`` both hide behind the next round's GPU work, and a decision
installs a round later. Round 0 is
left out, as the evaluation leaves it out. Replayed gain = replayed adaptive tokens/s over the
measured offline best's.

**What it leaves out**, so its figures are a model's, not a measurement: rounds are drawn
independently (n-gram acceptance on real text comes in bursts, which widens the real spread),
every round of a strategy costs its median fixed round, and a seed's text is not the same
across strategies. Checked against the measured adaptive gains of the same document
(``measured_gain`` beside each replayed one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from controller_cost import PLANNER_JSON, load_setting, simulate_accepted  # noqa: E402

from kernels.timing import provenance  # noqa: E402
from perfmodel.files import atomic_write  # noqa: E402


def per_depth_alpha(measured: dict[int, float], depth: int = 8) -> list[float]:
    """Per-depth acceptance (depths 1..``depth``) of a drafter whose chain of length k accepted
    ``measured[k]`` drafts per round on average: constant over each piece between two measured
    lengths, the piece's value solved (bisection) so that the longer chain's expected accepted
    drafts, sum over j <= k of the product of the first j acceptances, match. A piece whose
    measured increase is not positive gets 0; one it cannot reach gets 1; the last piece runs
    on to ``depth``."""
    lens = sorted(k for k in measured if k >= 1)
    if not lens:
        raise ValueError("per_depth_alpha needs at least one measured chain")
    alpha: list[float] = []
    lo_len, prod, done = 0, 1.0, 0.0  # prod: P(first lo_len drafts accepted)
    for k in lens:
        target = measured[k] - done
        n = k - lo_len

        def gain(a: float, n=n, prod=prod) -> float:
            return prod * sum(a**j for j in range(1, n + 1))

        if target <= 0:
            a = 0.0
        elif gain(1.0) <= target:
            a = 1.0
        else:
            lo, hi = 0.0, 1.0
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if gain(mid) < target else (lo, mid)
            a = 0.5 * (lo + hi)
        alpha += [a] * n
        done += gain(a)
        prod *= a**n
        lo_len = k
    alpha += [alpha[-1]] * max(0, depth - len(alpha))
    return alpha[:depth]


def _chain_len(tree: str) -> int:
    from perfmodel.strategy import parse_tree

    return _chain_len_parents(parse_tree(tree))


@dataclasses.dataclass
class World:
    """One prompt set's replay world (see the module)."""

    name: str
    round_s: dict[str, float]  # measured, per strategy id
    alpha: dict[str, list[float]]  # per drafter kind, per depth
    offline_best_tps: float
    measured_gain: float
    control_s: float  # per round
    shadow_s: float  # per round
    switch_s: dict[str, float]  # per destination kind, charged
    known_switch_s: dict[str, float]  # what the controller is told before it switches
    max_new_tokens: int
    context_len: int  # the adaptive runs' prompt length
    ratio: dict[tuple[str, str], float]  # (drafter, tree) -> measured / predicted round time
    ratio_all: float
    sibling: dict[str, float] = dataclasses.field(default_factory=dict)  # per drafter kind


def expected_accepted(parents: tuple[int, ...], alpha: list[float], sibling: float) -> float:
    """Mean drafts a round of the tree ``parents`` accepts under ``simulate_accepted``'s
    model (per-depth ``alpha``, the r-th sibling at ``sibling`` ** r of it), exactly."""
    children: dict[int, list[int]] = {}
    for node, p in enumerate(parents):
        children.setdefault(p, []).append(node)

    def below(node: int, depth: int) -> float:
        a = alpha[min(depth, len(alpha) - 1)]
        reach, total = 1.0, 0.0
        for rank, c in enumerate(children.get(node, ())):
            p = a * sibling**rank
            total += reach * p * (1.0 + below(c, depth + 1))
            reach *= 1.0 - p
        return total

    return below(-1, 0)


def fit_sibling(trees: list[tuple[tuple[int, ...], float]], alpha: list[float]) -> float:
    """The ``sibling`` factor in [0, 1] (a grid of 0.01) whose ``expected_accepted`` best fits
    the measured mean accepted drafts of ``trees`` (parents, measured), least squares; 1 when
    none branches."""
    trees = [(p, m) for p, m in trees if _chain_len_parents(p) == 0]
    if not trees:
        return 1.0
    grid = np.linspace(0.0, 1.0, 101)
    err = [sum((expected_accepted(p, alpha, s) - m) ** 2 for p, m in trees) for s in grid]
    return float(grid[int(np.argmin(err))])


def _chain_len_parents(parents: tuple[int, ...]) -> int:
    if parents and all(p == i - 1 for i, p in enumerate(parents)):
        return len(parents)
    return 0


def build_worlds(doc: dict, ranking: dict) -> dict[str, World]:
    """A ``World`` per prompt set of the document's adaptive evaluation."""
    from perfmodel.strategy import parse_tree
    from planner.rank import strategy_from_json
    from planner.space import strategy_id

    ad = doc["adaptive"]
    regime = ad["regime"]
    predicted = {}
    for r in ranking["regimes"][regime]["ranking"]:
        s = strategy_from_json(r["strategy"])
        predicted[strategy_id(s)] = (s, r["round_s"])
    worlds = {}
    for name, ps in ad["prompt_sets"].items():
        measured = {x["id"]: x for x in ps["oracle"]["strategies"]}
        round_s = {
            sid: (1.0 + x["mean_accepted"]) / x["tokens_per_s"] for sid, x in measured.items()
        }
        chains: dict[str, dict[int, float]] = {}
        branching: dict[str, list[tuple[tuple[int, ...], float]]] = {}
        ratio, ratios = {}, []
        for sid, x in measured.items():
            if sid not in predicted:
                continue
            s, pred = predicted[sid]
            k = _chain_len(s.tree)
            if k:
                chains.setdefault(s.drafter.kind, {})[k] = x["mean_accepted"]
            elif parse_tree(s.tree) and not s.is_sparse:
                branching.setdefault(s.drafter.kind, []).append(
                    (parse_tree(s.tree), x["mean_accepted"])
                )
            if pred:
                ratio[(s.drafter.kind, s.tree)] = round_s[sid] / pred
                ratios.append(round_s[sid] / pred)
        adaptive = ps["adaptive"]
        runs = adaptive["runs"]
        rounds = adaptive["rounds"]
        alpha = {kind: per_depth_alpha(m) for kind, m in chains.items()}
        worlds[name] = World(
            name=name,
            round_s=round_s,
            alpha=alpha,
            sibling={k: fit_sibling(t, alpha[k]) for k, t in branching.items() if k in alpha},
            offline_best_tps=ps["offline_best"]["tokens_per_s"],
            measured_gain=ps["adaptive_gain"],
            # Serial and overlapped calls alike: what the controller's host work costs a round.
            control_s=float(
                np.median([r["control_s"] + r.get("control_overlap_s", 0.0) for r in runs])
            )
            / rounds,
            shadow_s=adaptive["steps_s"].get("shadow", 0.0),
            # What the runs measured per destination kind, the earlier runs' where they did not.
            switch_s={
                k: v
                for k, v in {**adaptive["known_switch_cost_s"], **adaptive["switch_costs"]}.items()
                if k != "default"
            },
            known_switch_s=dict(adaptive["known_switch_cost_s"]),
            max_new_tokens=doc["max_new_tokens"],
            context_len=int(ad["context_len"]),
            ratio=ratio,
            ratio_all=float(np.median(ratios)) if ratios else 1.0,
        )
    return worlds


def _round_time(world: World, s, sid: str, ctl, regime: str) -> float:
    if sid in world.round_s:
        return world.round_s[sid]
    pred = ctl._round_s(regime, [s])[sid]
    return pred * world.ratio.get((s.drafter.kind, s.tree), world.ratio_all)


def replay(world: World, setting, config=None, seed: int = 0) -> dict:
    """One adaptive run in ``world``: tokens/s, rounds and the switches (round, reason, to)."""
    from engine.controller import RoundStats, ShadowAcceptance
    from engine.ngram import SHADOW_MAX_CHAIN
    from perfmodel.strategy import parse_tree
    from planner.controller import ControllerConfig, OnlineController, switch_kind
    from planner.profile import regime_of
    from planner.space import strategy_id

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
    # The walks of the n-gram shadow (``engine.ngram``), per chain length and per tree it
    # walks: rounds of that chain or tree drafted by the n-gram drafter, drawn over the
    # tokens committed (a round in progress waits for the next round's tokens).
    walked = [(k, parse_tree(f"chain:{k}")) for k in range(1, SHADOW_MAX_CHAIN + 1)]
    walked += [(spec, parse_tree(spec)) for spec in ctl.shadow_trees(world.context_len)]
    walk_pos = [0] * len(walked)  # tokens each walk has passed
    committed = 0
    sib = world.sibling.get("ngram", 1.0)
    while tokens < world.max_new_tokens:
        sid = strategy_id(s)
        parents = parse_tree(s.tree)
        if parents:
            f = profile.attention_factor(regime, s)
            a = [min(1.0, x * f) for x in world.alpha[s.drafter.kind]]
            accepted = simulate_accepted(parents, a, rng, world.sibling.get(s.drafter.kind, 1.0))
        else:
            accepted = 0
        n = accepted + 1
        # What an n-gram chain would have matched at each of the n committed positions.
        matched = [0] * SHADOW_MAX_CHAIN
        for _ in range(n):
            for k in range(SHADOW_MAX_CHAIN):
                if rng.random() >= ngram[k]:
                    break
                matched[k] += 1
        committed += n
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
        t = _round_time(world, s, sid, ctl, regime) + host_s
        step_s = {"verify": t}
        if switch_cost is not None:
            step_s["switch"] = switch_cost
            t += switch_cost
        stats = RoundStats(
            round=rnd,
            strategy=s,
            context_lens=(ctx,),
            drafted=len(parents),
            accepted=(accepted,),
            step_s=step_s,
            tokens_generated=n,
            shadow={
                "ngram": ShadowAcceptance(
                    n, tuple(matched), tuple(chain_r), tuple(chain_d), tuple(trees)
                )
            },
        )
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
    rest); ``ValueError`` names a field it lacks or a value that is no number."""
    from planner.controller import ControllerConfig

    fields = {f.name: f for f in dataclasses.fields(ControllerConfig)}
    kw = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(
                f"--config {item!r}: expected name=value with a name of {', '.join(fields)}"
            )
        default = fields[name].default
        try:
            kw[name] = (
                type(default)(value)
                if not isinstance(default, bool)
                else (value.lower() in ("1", "true", "yes"))
            )
        except ValueError:
            raise ValueError(
                f"--config {item!r}: {value!r} is no {type(default).__name__}"
            ) from None
    return ControllerConfig(**kw)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--planner", default=str(PLANNER_JSON), help="planner evaluation JSON")
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
    args = p.parse_args(argv)
    try:
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
    except (ValueError, json.JSONDecodeError) as e:
        print(f"adaptive_replay: {e}", file=sys.stderr)
        return 2
    setting = load_setting(Path(args.planner))
    worlds = build_worlds(doc, setting[0])
    out = {
        "planner": str(args.planner),
        "runs": args.runs,
        "seed": args.seed,
        "controller": dataclasses.asdict(config),
        "provenance": provenance(),
        "sets": {},
    }
    for name in sets:
        w = worlds[name]
        runs = [replay(w, setting, config, seed=args.seed + i) for i in range(args.runs)]
        out["sets"][name] = row = summarise(w, runs, args.repeats)
        row["alpha"] = {k: [round(a, 3) for a in v] for k, v in w.alpha.items()}
        row["sibling"] = w.sibling
        top = ", ".join(f"{k} x{v}" for k, v in list(row["first_switch"].items())[:3])
        print(
            f"{name:10s} replayed gain mean {row['mean_gain']:+6.1%} median "
            f"{row['median_gain']:+6.1%}  median of {args.repeats}: "
            f"{row[f'median_of_{args.repeats}_p05']:+6.1%} .. "
            f"{row[f'median_of_{args.repeats}_p95']:+6.1%}  measured "
            f"{row['measured_gain']:+6.1%}  {row['switches_per_run']:.1f} switches/run; "
            f"first: {top}"
        )
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
