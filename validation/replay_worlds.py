"""The replay worlds of ``validation.adaptive_replay``: one per prompt set of a planner
evaluation's adaptive phase, built from its fixed measurements.

Every strategy the evaluation ran fixed (``oracle.strategies``, median run of ``repeats``)
gives its round time, ``(1 + mean_accepted) / tokens_per_s`` -- everything a fixed round of it
costs on that prompt, the loop's host time included. Per drafter kind, its chains' mean accepted
drafts on that set give a per-depth acceptance (``per_depth_alpha``: piecewise constant between
the measured lengths, each piece solved so that the chain of that length accepts what was
measured). ``sibling`` is fitted per drafter kind to the mean accepted drafts of its branching
trees measured fixed on the set (``fit_sibling``; 1 when none was): with siblings tried at the
depth's acceptance, the replay has a draft model's branching tree accept 15-18% more than
measured off distribution. A strategy the evaluation did not run fixed costs its predicted round
time (the ranking's model) times the measured-to-predicted ratio of its drafter and tree dense,
or of all measured ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.planner.rank import strategy_from_json
from ssvkit.planner.space import strategy_id


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
    return _chain_len_parents(parse_tree(tree))


@dataclasses.dataclass(frozen=True)
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
        for order, c in enumerate(children.get(node, ())):
            p = a * sibling**order
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
    ad = doc["adaptive"]
    regime = ad["regime"]
    predicted = {}
    for r in ranking["regimes"][regime]["ranking"]:
        s = strategy_from_json(r["strategy"])
        predicted[strategy_id(s)] = (s, r["round_s"])
    return {name: _world(doc, name, ps, predicted) for name, ps in ad["prompt_sets"].items()}


def _world(doc: dict, name: str, ps: dict, predicted: dict) -> World:
    """The ``World`` of prompt set ``name`` (``ps``, its entry of the adaptive evaluation);
    ``predicted``: the ranking's strategy and predicted round time by strategy id."""
    measured = {x["id"]: x for x in ps["oracle"]["strategies"]}
    round_s = {sid: (1.0 + x["mean_accepted"]) / x["tokens_per_s"] for sid, x in measured.items()}
    chains, branching, ratio, ratios = _fixed_runs(measured, round_s, predicted)
    adaptive = ps["adaptive"]
    runs = adaptive["runs"]
    rounds = adaptive["rounds"]
    alpha = {kind: per_depth_alpha(m) for kind, m in chains.items()}
    return World(
        name=name,
        round_s=round_s,
        alpha=alpha,
        sibling={k: fit_sibling(t, alpha[k]) for k, t in branching.items() if k in alpha},
        offline_best_tps=ps["offline_best"]["tokens_per_s"],
        measured_gain=ps["adaptive_gain"],
        # Serial and overlapped calls alike: what the controller's host work costs a round.
        control_s=float(np.median([r["control_s"] + r.get("control_overlap_s", 0.0) for r in runs]))
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
        context_len=int(doc["adaptive"]["context_len"]),
        ratio=ratio,
        ratio_all=float(np.median(ratios)) if ratios else 1.0,
    )


def _fixed_runs(measured: dict, round_s: dict, predicted: dict) -> tuple[dict, dict, dict, list]:
    """What a prompt set's strategies run fixed (``measured``, by strategy id) measured, of
    those the ranking holds: per drafter kind its chains' mean accepted drafts by length and
    its dense branching trees' (parents, mean accepted drafts); the measured-to-predicted round
    time ratio per (drafter, tree), and every such ratio."""
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
    return chains, branching, ratio, ratios
