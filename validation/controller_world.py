"""A synthetic world the online controller and the n-gram shadow run in, on the CPU.

``run_controller`` feeds a fresh, warmed ``OnlineController`` synthetic ``RoundStats`` at a
15360-token context (growing by the tokens each round commits), starting from the regime's
offline best of a planner evaluation's ranking (``load_setting``). Each round the world draws
what the current strategy accepts (``simulate_accepted``) and what an n-gram chain of 8 would
have matched at each committed position (``simulate_shadow``); the strategy the controller
returns is the next round's. The scenarios (``SCENARIOS``, described at ``run_controller``)
set each drafter kind's per-token acceptance; a fixed numpy seed makes every repeat decide the
same. ``run_shadow`` drives a warm ``NgramDrafter`` over a prompt set's text.
``validation.controller_cost`` times both; the tests check the controller's decisions in it.
"""

from __future__ import annotations

import copy
import cProfile
import json
import time
from pathlib import Path

import numpy as np
from ssvkit.engine.controller import RoundStats, ShadowAcceptance
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter
from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.planner.controller import ControllerConfig, OnlineController, switch_kind
from ssvkit.planner.profile import profile_from_json, regime_of
from ssvkit.planner.rank import rank
from ssvkit.planner.space import SpaceSpec
from ssvkit.validation.prompts import prompt_tokens
from ssvkit.validation.records import local_model, record_path

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
# Prompt sets the shadow is timed on (``validation.prompts.prompt_tokens``).
SHADOW_PROMPTS = ("code", "prose", "random")
# Host time a switch to each kind costs (``step_s["switch"]`` of the next round), seconds.
SWITCH_S = {"none": 1e-4, "ngram": 1e-4, "draft_model": 4e-3}


def load_setting(path: str | Path | None = None, elementwise: str | None = None):
    """(ranking, model, gpu, profile) of a planner evaluation document (the one of record by
    default), the ranking regenerated on the CPU over the document's regimes, its element-wise
    ops priced as ``elementwise`` says (default: as the document's engine ran them) and its
    rounds as the document's runs ran them (``loop``)."""
    path = path or record_path("planner.json")
    doc = json.loads(Path(path).read_text())
    profile = profile_from_json(doc["profile"], str(path), "planner")
    space = SpaceSpec(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()}
    )
    model, gpu = get_model(local_model(doc["model"])), get_gpu(doc["gpu_model"])
    regimes = {r: v["context_len"] for r, v in doc["regimes"].items()}
    elementwise = elementwise or elementwise_of_run(doc["provenance"])
    # Its measured runs' loop: serial in an evaluation recorded before the pipeline.
    loop = doc.get("loop", "serial")
    ranking = rank(model, gpu, space, profile, regimes=regimes, elementwise=elementwise, loop=loop)
    return ranking, model, gpu, profile


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
        for order, c in enumerate(children.get(node, ())):
            if rng.random() < a * sibling**order:
                node, depth = c, depth + 1
                break
        else:
            return depth


def simulate_shadow(positions: int, alpha: float, chain: int, rng):
    """``ShadowAcceptance`` of ``positions`` committed positions whose leading matches with an
    n-gram chain of ``chain`` each run on with probability ``alpha``."""
    m = (
        np.minimum(rng.geometric(1.0 - alpha, positions) - 1, chain)
        if alpha < 1
        else (np.full(positions, chain))
    )
    return ShadowAcceptance(positions, tuple(int((m > k).sum()) for k in range(chain)))


def draw_accepted(parents, s, alpha, profile, regime: str, rng, sibling: float = 1.0) -> int:
    """Drafts a round of ``s`` (its tree's ``parents``) accepts: none without drafts, else
    ``simulate_accepted`` at the acceptance of its drafter kind in ``alpha`` (a number, or one
    per depth) times the profile's attention factor of ``s`` in ``regime``, each at most 1."""
    if not parents:
        return 0
    factor = profile.attention_factor(regime, s)
    a = alpha[s.drafter.kind]
    a = [min(1.0, x * factor) for x in a] if isinstance(a, (tuple, list)) else min(1.0, a * factor)
    return simulate_accepted(parents, a, rng, sibling)


def round_stats(i: int, s, ctx: int, parents, accepted: int, step_s, shadow) -> RoundStats:
    """Synthetic round ``i`` of ``s``: one sequence at context ``ctx``, the drafts of its tree
    (``parents``), ``accepted`` of them and the bonus token committed, the steps' seconds
    ``step_s`` and the n-gram ``shadow``."""
    return RoundStats(
        round=i,
        strategy=s,
        context_lens=(ctx,),
        drafted=len(parents),
        accepted=(accepted,),
        step_s=step_s,
        tokens_generated=accepted + 1,
        shadow={"ngram": shadow},
    )


class _Counted:
    """``fn``, counting its calls."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _timed_after_round(ctl, stats: RoundStats, flush, prof: cProfile.Profile | None):
    """``ctl.after_round(stats)`` and its seconds, ``flush`` run before it and ``prof``
    profiling the call alone."""
    if flush is not None:
        flush()
    if prof is not None:
        prof.enable()
    t0 = time.perf_counter()
    new = ctl.after_round(stats)
    seconds = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
    return new, seconds


# The last controller warmed per (class, config), with the setting it was warmed on: warming
# scores every candidate of every regime (most of a run of a few hundred rounds) and depends
# on nothing but the class, the config and the setting, so a run starts from a copy of it.
_WARMED: dict[tuple, tuple] = {}


def _warmed(cls, setting, config: ControllerConfig):
    """A fresh controller of ``cls`` on ``setting`` with ``config``, warmed: a deep copy of the
    one warmed for them (the setting's ranking, model, GPU and profile shared, as they are by
    every controller made on it)."""
    hit = _WARMED.get((cls, config))
    if hit is None or hit[0] is not setting:
        ctl = cls(*setting, config)
        ctl.warm()
        hit = _WARMED[(cls, config)] = (setting, ctl)
    return copy.deepcopy(hit[1], {id(x): x for x in setting})


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
    runs before each).

    The scenarios of ``SCENARIOS`` (per-token acceptance per drafter kind): ``code`` -- n-gram
    near its profiled 0.52; ``prose`` -- n-gram far below it and the draft model below its
    profile too, so the controller leaves for autoregressive decoding and probes; ``random`` --
    random bytes, n-gram ~0; ``decay`` -- prose whose later drafts fare worse, so the draft
    model's chain:2 beats its chain:4; ``prose>code`` -- prose, then from round 200 text the
    n-gram drafter suits, which its shadow reveals."""
    _, _, _, profile = setting
    phases = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    phases = [(0, phases)] if isinstance(phases, dict) else phases
    ctl = _warmed(controller_cls or OnlineController, setting, config or ControllerConfig())
    ctl._rescore = rescore = _Counted(ctl._rescore)
    rng = np.random.default_rng(seed)
    s, ctx, switched, times = start or ctl.initial_strategy(CONTEXT), CONTEXT, False, []
    for i in range(rounds):
        world = next(w for first, w in reversed(phases) if i >= first)
        parents = parse_tree(s.tree)
        accepted = draw_accepted(parents, s, world, profile, regime_of(ctx), rng)
        shadow = simulate_shadow(accepted + 1, world["ngram"], SHADOW_MAX_CHAIN, rng)
        step_s = {"draft": 1e-4, "verify": 6e-4, "accept": 1e-4}
        if switched:
            step_s["switch"] = SWITCH_S[switch_kind(s)]
        stats = round_stats(i, s, ctx, parents, accepted, step_s, shadow)
        new, seconds = _timed_after_round(ctl, stats, flush, prof)
        times.append(seconds)
        ctx += accepted + 1
        switched = new is not None and new != s
        if switched:
            s = new
    switches = [(x["round"], x["reason"], x["to"]) for x in ctl.switches]
    return {"times_s": times, "rescores": rescore.calls, "switches": switches, "log": ctl.switches}


def shadow_texts(kind: str, batch: int, context: int, sizes) -> list[list[int]]:
    """Sequence j's text: ``context`` tokens of prompt set ``kind`` from its window j, and the
    tokens ``sizes[:, j]`` commits after them (``sizes``: [rounds, batch] tokens per round)."""
    return [
        prompt_tokens(kind, context + int(sizes[:, j].sum()), offset=j * context)
        for j in range(batch)
    ]


def run_shadow(
    kind: str,
    rounds: int,
    seed: int = 0,
    prof: cProfile.Profile | None = None,
    flush=None,
    trees: tuple[str, ...] = (),
    batch: int = 1,
    sample: int = 0,
    context: int = CONTEXT,
    per_round: tuple[int, int] = (1, 5),
) -> dict:
    """Per-round seconds of ``sync`` + ``take_shadow`` of a warm n-gram drafter scoring the
    shadow of ``batch`` sequences (``shadow_texts``; a fixed ``sample`` of them when 0 <
    ``sample`` < ``batch``), each committing ``per_round`` (1-5 by default) tokens of its
    text per round, walking ``trees`` too; the counts it returned (positions, matches), the
    tokens its shadow read per round (its work) and the ``ShadowAcceptance`` of each round."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(per_round[0], per_round[1] + 1, (rounds, batch))
    texts = shadow_texts(kind, batch, context, sizes)
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, trees, sample)
    d.start([t[:context] for t in texts])
    hist, times, counts, work, shadows = [t[:context] for t in texts], [], [], [], []
    for row in sizes.tolist():
        for h, t, n in zip(hist, texts, row, strict=True):
            h += t[len(h) : len(h) + n]  # in place, as the loop commits
        if flush is not None:
            flush()
        if prof is not None:
            prof.enable()
        read = d.shadow_tokens
        t0 = time.perf_counter()
        d.sync(hist)
        sh = d.take_shadow()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.disable()
        counts.append((sh.positions, sh.matched))
        work.append(d.shadow_tokens - read)
        shadows.append(sh)
    return {"times_s": times, "counts": counts, "work": work, "shadows": shadows, "sizes": sizes}
