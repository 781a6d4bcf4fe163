"""The planner evaluation's profile phase: per regime, the engine decodes code prompts and the
profile the ranking scores with is read from its runs, one function per measured quantity.

- acceptance (``measure_chains``, ``measure_trees``): alpha of every drafter on every tree of
  the space, dense; the n-gram drafter's replaced by its walks over the regime's texts
  (``validation.walks``);
- the factor sparse attention puts on alpha, per drafter (``measure_attention``);
- the group overlap gamma per traversal (``measure_overlap``), from selection statistics;
- the decode loop's host time per round, measured over the regime's steady runs, each timed as
  its least disturbed of ``timing_passes`` interleaved passes (``retimed_runs``), against the
  GPU host's fit that the step model prices (``loop_host_check``).

At batch B > 1 each run decodes B code windows together (``validation.prompts.batch_windows``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from ssvkit.calibration.loop_host_fit import errors as loop_errors
from ssvkit.calibration.loop_host_fit import steady_row
from ssvkit.perfmodel import loop_host
from ssvkit.perfmodel.strategy import Strategy, chain_length, parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens
from ssvkit.planner.estimators import pooled_chain_tokens
from ssvkit.planner.profile import RegimeProfile, attention_key
from ssvkit.planner.rank import concrete
from ssvkit.planner.space import SpaceSpec, describe, strategy_id, valid_strategies
from ssvkit.validation.bench import Bench, steady_figures, steady_run
from ssvkit.validation.passes import interleave, least_disturbed
from ssvkit.validation.prompts import (
    PROFILE_OFFSETS,
    batch_windows,
    code_prompts,
    log_wrapped,
    reuse_line,
)
from ssvkit.validation.walks import walk_ngram, walk_texts

# Dense runs (seeds) on the first profile prompt that the sparse-attention factors divide by:
# one dense run is the denominator of every key's factor, so its draw would move them all.
FACTOR_SEEDS = 3


class RegimeRuns:
    """The profile runs of one regime on its batches of prompts (``texts``, one per run; the
    first, ``prompt``, also decodes the attention and overlap runs). Every steady run is kept --
    its strategy, figures, prompts and job -- for the n-gram walks and the loop host check's
    timing passes."""

    def __init__(self, bench: Bench, regime: str, ctx: int, texts: list[list[list[int]]]):
        self.bench, self.regime, self.ctx, self.texts = bench, regime, ctx, texts
        self.prompt = texts[0]
        self.runs: list[tuple[Strategy, dict]] = []
        self.jobs: list[tuple[str, tuple]] = []  # each steady run's key and call, in order
        self.prompts_of: list[list[list[int]]] = []  # each steady run's batch of prompts
        self.own_tpr: dict[str, float] = {}  # kind@tree -> its own runs' mean tokens per round
        self.first: dict[str, float] = {}  # tokens per round on the first prompt, by strategy id
        self.hists: dict[str, list[tuple[int, list[int]]]] = {}  # kind -> (K, histogram) per run
        self.unpooled: set[str] = set()  # kinds with a chain run lacking its histogram

    def steady(self, key: str, s: Strategy, tokens: list[list[int]], seed: int = 0) -> dict:
        """A steady run of the profile (its text kept for the n-gram walks), kept for the
        loop host check's timing passes."""
        fig = self.bench.run(key, steady_run, self.bench, s, tokens, seed=seed, keep_text=True)
        self.runs.append((s, fig))
        self.prompts_of.append(tokens)
        self.jobs.append((key, (steady_run, (self.bench, s, tokens), {"seed": seed})))
        return fig

    def go(self, s: Strategy, tag: str, fn=steady_run) -> dict:
        """One run of ``s`` on the first prompt, keyed by ``tag``."""
        key = f"{tag}|{self.ctx}|{strategy_id(s)}"
        if fn is steady_run:
            return self.steady(key, s, self.prompt)
        return self.bench.run(key, fn, self.bench, s, self.prompt)

    def tokens(self, s: Strategy) -> float:
        """Mean tokens per round of ``s`` over the profile prompts (a chain's runs kept for
        ``pooled_chain_tokens``)."""
        figs = [self.go(s, "profile")]
        for j, text in enumerate(self.texts[1:], start=1):
            figs.append(self.steady(f"profile|{self.ctx}|p{j}|{strategy_id(s)}", s, text, seed=j))
        self.first[strategy_id(s)] = figs[0]["mean_accepted"] + 1.0
        k = chain_length(s.tree)
        if k and s.attention == "dense":
            for f in figs:
                if "accepted_hist" in f:
                    self.hists.setdefault(s.drafter.kind, []).append((k, f["accepted_hist"]))
                else:  # a figure cached before histograms were recorded
                    self.unpooled.add(s.drafter.kind)
        key = f"{s.drafter.kind}@{s.tree}"
        self.own_tpr[key] = float(np.mean([f["mean_accepted"] for f in figs]) + 1.0)
        return self.own_tpr[key]


def measure_chains(
    rr: RegimeRuns, space: SpaceSpec, ref_tree: str, a: dict[str, float], record: dict
) -> None:
    """Alpha of every drafter on every chain of the space and ``ref_tree`` into ``a``: its
    chains run first (the reference among them), then each chain's tokens per round is pooled
    over its drafter's chains at least as long (``pooled_chain_tokens``: a k-chain accepts
    min(m, k) where a longer chain accepted m). ``record`` gets, per ``kind@chain``, its own
    and pooled tokens per round and the runs pooled; ``a[kind]`` is the drafter's alpha on
    ``ref_tree``."""
    chains = [
        t
        for t in dict.fromkeys((ref_tree, *space.trees))
        if t == ref_tree or (t.startswith("chain:") and chain_length(t))
    ]
    for kind in space.drafters:
        own = {}
        for tree in chains:
            s = Strategy(name="profile", tree=tree, drafter=rr.bench.drafter(kind))
            if tree == ref_tree or rr.bench.runnable(s) is None:
                own[tree] = rr.tokens(s)
        for tree, tpr in own.items():
            k = chain_length(tree)
            hists = rr.hists.get(kind, [])
            pooled = pooled_chain_tokens(hists, k) if k else None
            n = sum(big >= k for big, _ in hists) if k else len(rr.texts)
            # Without every run's histogram, the chain's own mean.
            use = tpr if pooled is None or kind in rr.unpooled else pooled
            a[f"{kind}@{tree}"] = alpha_from_tokens(tree, use)
            record.setdefault(rr.regime, {})[f"{kind}@{tree}"] = {
                "own": tpr,
                "pooled": pooled,
                "runs": n,
                "used": use,
            }
            rr.bench.log(
                f"profile {rr.regime} {kind} {tree}: {tpr:.2f} tokens/round, pooled "
                f"{use:.2f} over {n} runs, alpha={a[f'{kind}@{tree}']:.3f} "
                f"({len(rr.texts) * rr.bench.batch} prompts)"
            )
        a[kind] = a[f"{kind}@{ref_tree}"]


def measure_trees(rr: RegimeRuns, space: SpaceSpec, a: dict[str, float]) -> None:
    """Alpha of every drafter on every other tree of the space into ``a`` (``best:N`` resolved
    at the drafter's alpha on the reference tree, as the ranking resolves it), from the mean
    tokens per round over the prompts. Autoregressive decoding has no acceptance: its runs on
    every prompt (once, not per drafter) give the loop host check its rounds that draft
    nothing."""
    for kind in space.drafters:
        for tree in space.trees:
            base = Strategy(name="profile", tree=tree, drafter=rr.bench.drafter(kind))
            s = concrete(base, a[kind])
            if f"{kind}@{s.tree}" in a or rr.bench.runnable(s) is not None:
                continue
            if not parse_tree(s.tree):
                if kind == space.drafters[0]:
                    rr.tokens(s)
                continue
            tpr = rr.tokens(s)
            a[f"{kind}@{s.tree}"] = alpha_from_tokens(s.tree, tpr)
            rr.bench.log(
                f"profile {rr.regime} {kind} {describe(s)}: {tpr:.2f} tokens/round, "
                f"alpha={a[f'{kind}@{s.tree}']:.3f}"
            )


def attention_keys(valid: list[Strategy]) -> dict[str, Strategy]:
    """The first valid strategy of each sparse attention key (``attention_key``)."""
    keys: dict[str, Strategy] = {}
    for v in valid:
        k = attention_key(v)
        if k is not None and k not in keys:
            keys[k] = v
    return keys


def measure_attention(
    rr: RegimeRuns,
    space: SpaceSpec,
    attention_tree: str,
    a: dict[str, float],
    keys: dict[str, Strategy],
) -> tuple[dict[str, Strategy], dict[str, dict[str, float]]]:
    """The factor sparse attention puts on alpha, per drafter kind and attention key: the
    drafter on ``attention_tree`` (large enough for every group size; resolved at its alpha)
    with that attention on the first prompt, over the same tree dense on that prompt (mean of
    ``FACTOR_SEEDS`` seeds). Returns each drafter's base strategy (the dense tree) and its
    factors per key."""
    bases, factors = {}, {}
    for kind in space.drafters:
        tree = Strategy(name="profile", tree=attention_tree, drafter=rr.bench.drafter(kind))
        base = concrete(tree, a[kind])
        if rr.bench.runnable(base) is not None or not parse_tree(base.tree):
            continue
        bases[kind] = base
        dense_alpha = _dense_alpha(rr, base, a)
        factors[kind] = _attention_factors(rr, base, keys, dense_alpha)
    return bases, factors


def _dense_alpha(rr: RegimeRuns, base: Strategy, a: dict[str, float]) -> float:
    """Alpha of ``base`` dense on the first prompt, the mean of ``FACTOR_SEEDS`` seeds (its
    alpha over all prompts goes into ``a`` when the trees did not measure it)."""
    kind, sid = base.drafter.kind, strategy_id(base)
    if f"{kind}@{base.tree}" not in a:
        a[f"{kind}@{base.tree}"] = alpha_from_tokens(base.tree, rr.tokens(base))
    if sid not in rr.first:
        rr.first[sid] = rr.go(base, "profile")["mean_accepted"] + 1.0
    dense = [rr.first[sid]]
    for j in range(1, FACTOR_SEEDS):
        fig = rr.steady(f"attention-dense|{rr.ctx}|s{j}|{sid}", base, rr.prompt, seed=j)
        dense.append(fig["mean_accepted"] + 1.0)
    return alpha_from_tokens(base.tree, float(np.mean(dense)))


def _attention_factors(
    rr: RegimeRuns, base: Strategy, keys: dict[str, Strategy], dense_alpha: float
) -> dict[str, float]:
    """Per attention key, alpha of ``base`` with that attention over ``dense_alpha``."""
    factors = {}
    for k, v in keys.items():
        s = dataclasses.replace(
            v, name="profile", drafter=base.drafter, tree=base.tree, traversal="bfs"
        )
        if rr.bench.runnable(s) is not None or dense_alpha <= 0:
            continue
        fig = rr.go(s, "attention")
        sa = alpha_from_tokens(base.tree, fig["mean_accepted"] + 1.0)
        factors[k] = sa / dense_alpha
        kind = base.drafter.kind
        rr.bench.log(f"profile {rr.regime} {kind}@{k}: alpha={sa:.3f} (dense {dense_alpha:.3f})")
    return factors


def overlap_run(bench: Bench, s: Strategy, prompts: list[list[int]]) -> dict:
    """A run with selection statistics: its steady figures and the mean group overlap (None
    when there are no statistics)."""
    result = bench.generate(s, prompts, record_stats=True)
    fig = steady_figures(result)
    g = [r.selection.group_overlap for r in result.rounds if r.selection is not None]
    if not g:
        return {**fig, "gamma": None}
    v = float(np.nanmean(np.concatenate([x.ravel() for x in g])))
    return {**fig, "gamma": None if math.isnan(v) else v}


def measure_overlap(
    rr: RegimeRuns, space: SpaceSpec, base: Strategy | None, valid: list[Strategy]
) -> dict[str, float]:
    """Gamma of each traversal a valid sparse strategy uses: a union C4 strategy on ``base``
    (the reference drafter's attention tree) with selection statistics, clipped to [0, 1]."""
    used = {v.traversal for v in valid if v.is_sparse}
    out = {}
    for trav in (x for x in space.traversals if x in used and base is not None):
        s = dataclasses.replace(
            base, traversal=trav, attention="sparse", mode="union", group_size=4
        )
        v = rr.go(s, "overlap", overlap_run)["gamma"]
        if v is not None:
            out[trav] = min(max(v, 0.0), 1.0)
            rr.bench.log(f"profile {rr.regime} {trav}: gamma={v:.3f}")
    return out


def retimed_runs(rr: RegimeRuns) -> tuple[list[tuple[Strategy, dict]], dict]:
    """The regime's steady runs, each timed as its least disturbed of ``timing_passes``: the
    first pass went strategy by strategy, as the acceptance needed them; the later passes go
    over the strategies' runs interleaved (``interleave``), so that the runs of one strategy
    do not share one slow stretch of the host. Returns the runs and the fit's note."""
    bench = rr.bench
    if bench.timing_passes <= 1:
        return rr.runs, {"timing_passes": 1}
    passes = [[fig] for _, fig in rr.runs]
    groups: dict[str, dict] = {}
    for i, ((s, _), (key, job)) in enumerate(zip(rr.runs, rr.jobs, strict=True)):
        groups.setdefault(strategy_id(s), {})[i] = (key, job)
    order = interleave(list(groups.values()))
    for p in range(1, bench.timing_passes):
        for i, (key, (fn, args, kwargs)) in order.items():
            passes[i].append(bench.run(f"{key}|t{p}", fn, *args, **kwargs))
    runs = [(s, least_disturbed(ps)) for (s, _), ps in zip(rr.runs, passes, strict=True)]
    kept = [f["passes_kept"] for _, f in runs]
    return runs, {"timing_passes": bench.timing_passes, "passes_kept_min": min(kept)}


def loop_host_check(rr: RegimeRuns, runs: list[tuple[Strategy, dict]]) -> dict:
    """How the GPU host's loop host fit (``perfmodel.loop_host``, the one the step model
    prices) matches the regime's steady ``runs``: each run's loop host time is its counted
    rounds' mean wall time minus their CUDA-event draft, verify and accept steps
    (``calibration.loop_host_fit``); the figures (``loop_host_fit.errors``) per drafter, or
    ``{"fit": None}`` where no fit ships for the bench's GPU."""
    bench = rr.bench
    shipped = loop_host.shipped(bench.gpu.name)
    if shipped is None:
        return {"fit": None}
    rows = [
        steady_row("profile", describe(s), s.drafter.kind, s.tree, bench.batch, f) for s, f in runs
    ]
    figures = loop_errors(rows, shipped.coefficients)
    for kind, e in figures.items():
        bench.log(
            f"profile {rr.regime} loop host, {kind}: {e['rows']} runs, measured "
            f"{e['measured_median_s'] * 1e6:.0f} us, |error| {e['abs_error_median_s'] * 1e6:.0f} us"
            f" median, round error {e['round_ape_median']:.1%}"
        )
    return {"fit": shipped.label, "drafters": figures}


def measure_profile(
    bench: Bench,
    contexts: dict[str, int],
    space: SpaceSpec,
    ref_tree: str = "chain:4",
    attention_tree: str = "best:16:6",
    prompts: int = 3,
    walk_prompts: int = 0,
) -> tuple[RegimeProfile, dict, dict, dict]:
    """The profile of the space's strategies, measured per regime on ``prompts`` runs of code
    prompts (windows ``PROFILE_OFFSETS`` of the corpus, ``bench.batch`` per run, a run's
    acceptance the mean over its sequences; run j decodes with seed j): acceptance
    (``measure_chains``, ``measure_trees``, the n-gram drafter's from its walks), attention
    factors (``measure_attention``), overlap (``measure_overlap``) and the loop host time's
    check (``loop_host_check``, at the bench's batch: the host's per-sequence work, an n-gram
    drafter's lookups above all, grows with it).

    Returns the profile, the loop host checks' figures per regime, the factor each attention
    key's run measured per regime and drafter (the profile holds each drafter's median over
    the keys, ``"<kind>@sparse"``: one run's draw per key would rank the strategies by their
    luck), and per regime and ``kind@chain`` its own and pooled tokens per round."""
    if not 1 <= prompts <= len(PROFILE_OFFSETS):
        raise ValueError(f"profile prompts must lie in 1..{len(PROFILE_OFFSETS)}, got {prompts}")
    acc, att, ovl, checks, per_key, chain_tokens = {}, {}, {}, {}, {}, {}
    ref_kind = "ngram" if "ngram" in space.drafters else space.drafters[0]
    for regime, ctx in contexts.items():
        batches = batch_windows(PROFILE_OFFSETS, prompts, bench.batch)
        texts = [code_prompts(ctx, ws) for ws in batches]
        log_wrapped(bench.log, f"profile {regime}", sorted({o for ws in batches for o in ws}), ctx)
        line = reuse_line(f"profile {regime}", PROFILE_OFFSETS, prompts, bench.batch, ctx)
        if line:
            bench.log(line)
        rr = RegimeRuns(bench, regime, ctx, texts)
        acc[regime] = a = {}
        measure_chains(rr, space, ref_tree, a, chain_tokens)
        measure_trees(rr, space, a)
        valid, _ = valid_strategies(space, bench.model, bench.gpu, ctx)
        bases, factors = measure_attention(rr, space, attention_tree, a, attention_keys(valid))
        for kind, f in factors.items():
            if f:
                att.setdefault(regime, {})[f"{kind}@sparse"] = float(np.median(list(f.values())))
                per_key.setdefault(regime, {})[kind] = f
        base = bases.get(ref_kind) or next(iter(bases.values()), None)
        gamma = measure_overlap(rr, space, base, valid)
        if gamma:
            ovl[regime] = gamma
        if "ngram" in space.drafters:
            extra = walk_texts(bench, space, ctx, walk_prompts, regime)
            walk_ngram(bench, regime, a, rr.runs, rr.prompts_of, rr.own_tpr, chain_tokens, extra)
        runs, note = retimed_runs(rr)
        checks[regime] = {**loop_host_check(rr, runs), **note}
    profile = RegimeProfile(acc, ovl, "measured:engine-code-prompts", att)
    return profile, checks, per_key, chain_tokens
