"""The device time a planner evaluation will take, before it runs (``planner_eval --plan``): the
decodes each phase asks for at its settings and the GPU seconds they take, worked out on the
CPU.

Per decode (the tiny pair; every phase decodes batches of ``batch`` prompts): the prefill of
``batch x context`` prompt tokens at the per-token rates the committed H200 decodes measured
(``validation/data/batched-decode-h200.json``, ``measured_rates``), then ``new_tokens`` over
the tokens per round the ranking predicts, each round the calibrated step model's times the
measured over predicted round of the strategy's family (``plan``); per regime, the n-gram walks
over the profile's texts, timed here (``walk_seconds``). Not counted: loading the models,
first-use kernel compilation and each decode's first round (CUDA-graph captures), which the
measured figures leave out -- keep ``--stop-after`` well below a call's limit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
from ssvkit.engine.ngram import shadow_sample
from ssvkit.perfmodel.files import read_json
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, chain_length, parse_tree
from ssvkit.planner.controller_config import ControllerConfig
from ssvkit.planner.profile import RegimeProfile, regime_of
from ssvkit.planner.rank import concrete, score, strategy_from_json
from ssvkit.planner.space import SpaceSpec, describe, strategy_id, valid_strategies
from ssvkit.validation.adaptive import oracle_strategies
from ssvkit.validation.profile_runs import FACTOR_SEEDS, attention_keys
from ssvkit.validation.records import record_path
from ssvkit.validation.stats import family, pick

# The batched-decode baseline of each family: (drafts, sparse) -> name.
FAMILY_BASELINE = {
    (False, False): "ar_dense",
    (False, True): "ar_sparse",
    (True, False): "sd_dense",
    (True, True): "ssv",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """What the plan counts: an evaluation's settings (``planner_eval``'s flags)."""

    batch: int
    contexts: dict[str, int]
    adaptive_context: int
    per_regime: int
    new_tokens: int
    repeats: int
    measure_texts: int
    timing_passes: int
    profile_prompts: int
    walk_prompts: int
    prompt_sets: tuple[str, ...]
    oracle: bool
    ref_tree: str = "chain:4"
    attention_tree: str = "best:16:6"


@dataclass(frozen=True, slots=True)
class Decodes:
    """``count`` decodes of ``strategy`` at ``context`` in one phase; ``adaptive``: under the
    controller, every drafter warm."""

    phase: str
    regime: str
    strategy: Strategy
    context: int
    count: int
    adaptive: bool = False


@dataclass
class Rates:
    """Seconds per prompt token of each prefill part; per family (drafter kind or "",
    drafts, sparse) the measured over predicted round at 16K by batch."""

    target_s: float
    draft_model_s: float
    ngram_s: float
    family: dict[tuple[str, bool, bool], list[tuple[int, float]]]

    def correction(self, s: Strategy, batch: int) -> float:
        """Measured over predicted round of ``s``'s family, interpolated in the batch."""
        drafts = bool(parse_tree(s.tree))
        key = (s.drafter.kind if drafts else "", drafts, s.is_sparse)
        pts = self.family.get(key) or self.family[("", False, s.is_sparse)]
        b, c = zip(*pts, strict=True)
        return float(np.interp(batch, b, c))

    def prefill_s(self, d: Decodes, batch: int, kinds: tuple[str, ...]) -> float:
        """Prefill of ``d``: the target and the drafters it starts (every kind of ``kinds``
        warm for an adaptive decode, the n-gram drafter with the shadow's indexes of its
        sample, ``engine.ngram.shadow_sample``)."""
        drafting = d.strategy.drafter.kind if parse_tree(d.strategy.tree) else None
        started = set(kinds) if d.adaptive else {drafting} - {None}
        per_token = self.target_s + self.draft_model_s * ("draft_model" in started)
        indexes = batch * ("ngram" in started)
        if d.adaptive and indexes:
            indexes += len(shadow_sample(batch, ControllerConfig().shadow_sequences))
        return (per_token * batch + self.ngram_s * indexes) * d.context


def fill_speedup(context: int) -> float:
    """The n-gram index's token-by-token build time over its fill's on a code prompt of
    ``context`` tokens, timed here (best of three each)."""
    from ssvkit.engine.ngram_index import NgramIndex
    from ssvkit.validation.prompts import prompt_tokens

    prompt = prompt_tokens("code", context)
    best = {"fill": math.inf, "push": math.inf}
    for _ in range(3):
        idx, t0 = NgramIndex(3), time.perf_counter()
        idx.extend(prompt)
        best["fill"] = min(best["fill"], time.perf_counter() - t0)
        idx, t0 = NgramIndex(3), time.perf_counter()
        for tok in prompt:
            idx.extend([tok])
        best["push"] = min(best["push"], time.perf_counter() - t0)
    return best["push"] / best["fill"]


def measured_rates(model, gpu, profile: RegimeProfile, draft: str, context: int) -> Rates:
    """``Rates`` from the committed batched decodes (``validation/data/batched-decode-h200.json``).

    Prefill: the seconds per prompt token of the target, the draft model and the n-gram
    drafter's index, from the decodes at the file's largest batch (``ar_dense``, and
    ``sd_dense`` with either drafter less the target's), the n-gram index's divided by how much
    faster its fill is than the token-by-token build those decodes ran (``fill_speedup``, timed
    here on a ``context``-token code prompt). Rounds: per family (autoregressive, or drafting
    with its drafter; dense or sparse: ``ar_dense``, ``ar_sparse``, ``sd_dense``, ``ssv`` in
    that file, at 16K) the measured over predicted round at each of the file's batches, which
    ``Rates.correction`` interpolates in the batch."""
    doc = read_json(record_path("batched-decode-h200.json"), "batched decodes")
    runs = [r for r in doc["runs"] if "report" in r]
    top = max(r["batch"] for r in runs)

    def prefill(name: str, kind: str | None) -> float:
        return next(
            r["report"]["prefill_s"]["value"]
            for r in runs
            if (r["batch"], r["baseline"], r["drafter"]) == (top, name, kind)
        )

    tokens = top * runs[0]["report"]["context"]
    target = prefill("ar_dense", None)
    fam: dict[tuple, list] = {}
    for r in runs:
        rep = r["report"]
        s = strategy_from_json(rep["strategy"])
        drafts = bool(parse_tree(s.tree))
        if FAMILY_BASELINE[(drafts, s.is_sparse)] != r["baseline"]:
            continue
        model_of = draft if s.drafter.kind == "draft_model" else None
        s = dataclasses.replace(s, drafter=DrafterSpec(kind=s.drafter.kind, model=model_of))
        s = concrete(s, profile.alpha("16K", s.drafter.kind))
        (pred,), _ = score(model, gpu, [s], rep["context"], profile, "16K", r["batch"])
        key = (s.drafter.kind if drafts else "", drafts, s.is_sparse)
        fam.setdefault(key, []).append((r["batch"], rep["round_s"]["value"] / pred.round_s))
    return Rates(
        target / tokens,
        (prefill("sd_dense", "draft_model") - target) / tokens,
        (prefill("sd_dense", "ngram") - target) / tokens / fill_speedup(context),
        {k: sorted(v) for k, v in fam.items()},
    )


def profile_decodes(st: Settings, space: SpaceSpec, model, gpu, profile, regime, ctx, ok):
    """The profile's decodes in one regime (``validation.profile_runs``, run for run): the
    steady ones, the overlap's and the walks', and the steady ones again per later pass."""
    drafter = lambda k: DrafterSpec(  # noqa: E731
        kind=k, model=space.draft_model if k == "draft_model" else None
    )
    n, out, measured, bases = st.profile_prompts, [], set(), {}
    chains = [
        t
        for t in dict.fromkeys((st.ref_tree, *space.trees))
        if t == st.ref_tree or (t.startswith("chain:") and chain_length(t))
    ]
    for kind in space.drafters:
        for tree in chains:
            s = Strategy(name="profile", tree=tree, drafter=drafter(kind))
            if tree == st.ref_tree or ok(s):
                out.append((s, n))
                measured.add(f"{kind}@{tree}")
    for kind in space.drafters:
        for tree in space.trees:
            s = concrete(
                Strategy(name="p", tree=tree, drafter=drafter(kind)), profile.alpha(regime, kind)
            )
            if f"{kind}@{s.tree}" in measured or not ok(s):
                continue
            if parse_tree(s.tree) or kind == space.drafters[0]:
                out.append((s, n))
            measured.add(f"{kind}@{s.tree}")
    valid, _ = valid_strategies(space, model, gpu, ctx)
    keys = attention_keys(valid)
    for kind in space.drafters:
        tree = Strategy(name="p", tree=st.attention_tree, drafter=drafter(kind))
        base = concrete(tree, profile.alpha(regime, kind))
        if not ok(base) or not parse_tree(base.tree):
            continue
        bases[kind] = base
        if f"{kind}@{base.tree}" not in measured:
            out.append((base, n))
        out.append((base, FACTOR_SEEDS - 1))
        for v in keys.values():
            s = dataclasses.replace(v, drafter=base.drafter, tree=base.tree, traversal="bfs")
            if ok(s):
                out.append((s, 1))
    rows = [Decodes("profile", regime, s, ctx, c) for s, c in out]
    ref = "ngram" if "ngram" in space.drafters else space.drafters[0]
    base = bases.get(ref) or next(iter(bases.values()), None)
    used = {v.traversal for v in valid if v.is_sparse}
    for trav in (t for t in space.traversals if t in used and base is not None):
        s = dataclasses.replace(
            base, traversal=trav, attention="sparse", mode="union", group_size=4
        )
        rows.append(Decodes("profile", regime, s, ctx, 1))
    if st.walk_prompts:
        ar = Strategy(name="walk", tree="chain:0", drafter=drafter(space.drafters[0]))
        rows.append(Decodes("profile", regime, ar, ctx, -(-st.walk_prompts // st.batch)))
    again = st.timing_passes - 1
    rows += [Decodes("profile passes", regime, s, ctx, c * again) for s, c in out if again]
    return rows


def plan_decodes(st: Settings, space: SpaceSpec, model, gpu, profile, ranking, ok):
    """Every decode the evaluation asks for, phase by phase."""
    rows = []
    for regime, ctx in st.contexts.items():
        rows += profile_decodes(st, space, model, gpu, profile, regime, ctx, ok)
    for regime, ctx in st.contexts.items():
        entry = ranking["regimes"][regime]["ranking"]
        strata = family if st.batch > 1 else None
        for r in pick(entry, st.per_regime, ok, strata=strata):
            count = st.measure_texts * st.timing_passes
            rows.append(Decodes("measure", regime, strategy_from_json(r["strategy"]), ctx, count))
    actx = st.adaptive_context
    regime = regime_of(actx)
    entry = ranking["regimes"][regime]["ranking"]
    best = strategy_from_json(entry[0]["strategy"])
    default = Strategy.from_name("ssv", drafter=DrafterSpec("draft_model", model=space.draft_model))
    if not ok(default):
        default = Strategy.from_name("ssv", drafter=DrafterSpec("ngram"))
    oracles = oracle_strategies(ranking, regime, ok) if st.oracle else []
    fixed = {strategy_id(s): s for s in [default, best, *oracles]}
    timed = st.repeats * st.timing_passes
    for _ in st.prompt_sets:
        rows.append(Decodes("adapt", regime, best, actx, 2 + timed, adaptive=True))
        rows += [Decodes("adapt", regime, s, actx, timed) for s in fixed.values()]
    return rows


def walk_seconds(
    st: Settings, space: SpaceSpec, profile: RegimeProfile, rows: list[Decodes]
) -> dict[str, float]:
    """Per regime, the host time of the n-gram walks over the profile's texts: every dense
    steady profile run's and the walk runs' sequences, each text's walk of every n-gram tree
    (resolved as the ranking resolves it) timed here on a code prompt of the regime's
    context."""
    from ssvkit.engine.ngram_shadow import walk_text
    from ssvkit.validation.prompts import prompt_tokens

    if "ngram" not in space.drafters:
        return {}
    out = {}
    for regime, ctx in st.contexts.items():
        ngram = DrafterSpec(kind="ngram")
        alpha = profile.alpha(regime, "ngram")
        specs = tuple(
            dict.fromkeys(
                concrete(Strategy(name="w", tree=t, drafter=ngram), alpha).tree
                for t in space.trees
                if parse_tree(t)
            )
        )
        prompt = prompt_tokens("code", ctx)
        text = prompt_tokens("code", st.new_tokens, offset=ctx)
        per_text = math.inf
        for _ in range(3):  # best of three: this CPU may be busy
            t0 = time.perf_counter()
            walk_text(prompt, text, specs)
            per_text = min(per_text, time.perf_counter() - t0)
        runs = sum(
            d.count
            for d in rows
            if d.phase == "profile" and d.regime == regime and not d.strategy.is_sparse
        )
        out[regime] = per_text * runs * st.batch
    return out


def plan(st: Settings, space: SpaceSpec, model, gpu, profile, ranking, ok) -> dict:
    """The plan: per phase and regime the decodes and their estimated seconds, the walks', the
    total, and the rates used.

    A decode's seconds: its prefill (``Rates.prefill_s``: the target's, the draft model's and
    the n-gram index's of ``batch x context`` prompt tokens, and the shadow's indexes of its
    sample when an adaptive run keeps the n-gram drafter warm), then ``new_tokens`` over the
    tokens per round ``ranking``'s model predicts for the strategy, each round the calibrated
    step model's at the batch and context times ``Rates.correction``. The strategies are those
    ``ranking`` picks (``planner_eval --plan``: the evaluation of record's profile ranked at the
    batch, standing for the run's own)."""
    rows = plan_decodes(st, space, model, gpu, profile, ranking, ok)
    rates = measured_rates(model, gpu, profile, space.draft_model, max(st.contexts.values()))
    kinds = tuple(k for k in space.drafters if k in ("draft_model", "ngram"))
    by_point: dict[tuple, list[Strategy]] = {}
    for d in rows:
        by_point.setdefault((d.regime, d.context), []).append(d.strategy)
    pred = {}
    for (regime, ctx), strategies in by_point.items():
        unique = list({strategy_id(s): s for s in strategies}.values())
        scored, _ = score(model, gpu, unique, ctx, profile, regime, st.batch)
        pred.update({(regime, ctx, strategy_id(x.strategy)): x for x in scored})
    phases: dict[tuple[str, str], list[float]] = {}
    for d in rows:
        x = pred[(d.regime, d.context, strategy_id(d.strategy))]
        rounds = math.ceil(st.new_tokens / max(x.tokens_per_round, 1.0))
        decode_s = rounds * x.round_s * rates.correction(d.strategy, st.batch)
        each = rates.prefill_s(d, st.batch, kinds) + decode_s
        cell = phases.setdefault((d.phase, d.regime), [0, 0.0])
        cell[0] += d.count
        cell[1] += d.count * each
    for regime, s in walk_seconds(st, space, profile, rows).items():
        phases[("walks (host)", regime)] = [0, s]
    total = sum(v[1] for v in phases.values())
    names = {"": "autoregressive", "draft_model": "draft model", "ngram": "n-gram"}
    measured_over_model = {
        f"{names[k[0]]} {'sparse' if k[2] else 'dense'}": float(
            np.interp(st.batch, *zip(*v, strict=True))
        )
        for k, v in rates.family.items()
    }
    measured = {
        regime: [d.strategy for d in rows if d.phase == "measure" and d.regime == regime]
        for regime in st.contexts
    }
    return {
        # What the ranking of this profile would measure per regime: rank order, sparse or not.
        "measured": {r: [describe(s) for s in v] for r, v in measured.items()},
        "measured_over_model": measured_over_model,
        "phases": [
            {"phase": p, "regime": r, "decodes": n, "seconds": s}
            for (p, r), (n, s) in phases.items()
        ],
        "decodes": sum(v[0] for v in phases.values()),
        "seconds": total,
        "rates": {
            "prefill_s_per_token": {
                "target": rates.target_s,
                "draft_model": rates.draft_model_s,
                "ngram": rates.ngram_s,
            },
            "round_correction": {"|".join(map(str, k)): v for k, v in rates.family.items()},
        },
    }


def plan_table(p: dict, batch: int) -> str:
    lines = [f"plan at batch {batch}: decodes and estimated device seconds"]
    lines.append(f"{'phase':16s} {'regime':7s} {'decodes':>8s} {'seconds':>9s}")
    for r in p["phases"]:
        lines.append(f"{r['phase']:16s} {r['regime']:7s} {r['decodes']:8d} {r['seconds']:9.1f}")
    lines.append(f"{'total':16s} {'':7s} {p['decodes']:8d} {p['seconds']:9.1f}")
    for regime, names in p["measured"].items():
        sparse = sum(" | dense" not in n for n in names)
        lines.append(f"{regime} measures {len(names)} strategies, {sparse} sparse:")
        lines += [f"  {n}" for n in names]
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in p["measured_over_model"].items())
    lines.append(f"measured over predicted round at 16K and this batch (H200): {ratios}")
    lines.append(
        "not counted: model load, first-use kernel compilation, each decode's first round "
        "(graph captures)"
    )
    return "\n".join(lines)
