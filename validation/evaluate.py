"""The planner's evaluation in the real decode loop: does the offline ranking order strategies
the way the engine measures them, and does online adaptation pay off?

Four phases, all on one pair of model runners (target and draft) built once
(``validation.bench``), all at the bench's batch:

1. **profile** (``validation.profile_runs``) -- per regime, the profile read from the engine's
   decodes of code prompts: acceptance, attention factors, overlap, and the loop's host time
   against the GPU host's fit the step model prices;
2. **rank** -- ``planner.rank`` scores the whole space per regime under that profile;
3. **measure** (``evaluate_regime``) -- per regime, ``per_regime`` strategies decode other code
   prompts, scored by Kendall tau and the regret of the predicted best on their full-batch
   tokens/s (``ranked_figure``);
4. **adapt** (``validation.adaptive``) -- per prompt set, the fixed default, the fixed offline
   best and the online controller.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.profile import RegimeProfile, regime_of
from ssvkit.planner.rank import rank, score, strategy_from_json
from ssvkit.planner.space import SpaceSpec, describe, strategy_id
from ssvkit.validation.adaptive import evaluate_adaptive
from ssvkit.validation.bench import Bench
from ssvkit.validation.passes import interleave, pooled_prompts, prompts_jobs, run_passes
from ssvkit.validation.profile_runs import measure_profile
from ssvkit.validation.prompts import (
    MEASURE_OFFSETS,
    OFF_DISTRIBUTION,
    PROMPT_SETS,
    adaptive_windows,
    batch_windows,
    code_prompts,
    measure_windows,
    reuse_line,
)
from ssvkit.validation.stats import (
    family,
    measurement_resolution,
    pick,
    ranking_quality,
    regime_resolution,
    set_resolution,
)

EVAL_VERSION = 1
TARGETS = {"kendall_tau_min": 0.8, "regret_max": 0.05, "adaptive_gain_min": 0.10}


def measured_batches(bench: Bench, regime: str, ctx: int) -> dict[int, tuple[int, ...]]:
    """The corpus windows of each measured run, by its label: at batch 1 the first
    ``measure_texts`` windows that fit in the corpus, one per run (labelled by the window); at
    batch B, ``measure_texts`` runs of B over every measured window that fits
    (``batch_windows``, labelled by the run)."""
    if bench.batch == 1:
        windows = measure_windows(ctx, bench.measure_texts)
        if len(windows) < bench.measure_texts:
            bench.log(
                f"{regime} measured on {len(windows)} code prompts: only those fit in the "
                f"corpus at {ctx} tokens"
            )
        return {o: (o,) for o in windows}
    windows = measure_windows(ctx, len(MEASURE_OFFSETS))
    line = reuse_line(f"{regime} measured", windows, bench.measure_texts, bench.batch, ctx)
    if line:
        bench.log(line)
    return dict(enumerate(batch_windows(windows, bench.measure_texts, bench.batch)))


def measure_strategies(bench: Bench, strategies, regime: str, ctx: int) -> tuple[dict, list]:
    """Every strategy's runs on the regime's measured windows, all strategies in one set of
    passes, interleaved (a run's passes lie a whole pass apart, and one strategy's runs of a
    pass are spread over it): the pooled figures by strategy id, and the windows (at batch > 1,
    per run)."""
    batches = measured_batches(bench, regime, ctx)
    prompts = {label: code_prompts(ctx, ws) for label, ws in batches.items()}
    jobs = {
        strategy_id(s): prompts_jobs(bench, s, prompts, f"measure|code|{ctx}", runs=len(batches))
        for s in strategies
    }
    t0 = time.perf_counter()
    done = run_passes(bench, interleave(list(jobs.values())))
    bench.log(
        f"{regime} measured {len(strategies)} strategies x {len(batches)} runs x "
        f"{bench.timing_passes} passes ({time.perf_counter() - t0:.1f}s)"
    )
    windows = list(batches) if bench.batch == 1 else [list(ws) for ws in batches.values()]
    return {sid: pooled_prompts(done, j, bench.batch) for sid, j in jobs.items()}, windows


def ranked_figure(measured: dict) -> float:
    """The measured tokens/s a regime's ranking is scored on: full-batch where the runs have
    it, else the whole runs'.

    The full-batch figure (``validation.full_batch.steady``: every sequence decoding) is what
    the model prices, a batch a server keeps full; a run of B sequences with a fixed token
    budget ends in rounds that carry finished sequences at a full round's cost, more of them the
    more a strategy's acceptance varies between sequences, so the whole run's figure charges
    speculation for the benchmark's drain."""
    full = measured.get("full_batch_tokens_per_s")
    return measured["tokens_per_s"] if full is None else full


def regime_quality(rows: list[dict]) -> dict:
    """Kendall tau and regret of a regime's measured ``rows`` on their full-batch figures
    (``ranked_figure``), with the whole runs' beside them (``whole_run``)."""
    pred = [r["predicted_tokens_per_s"] for r in rows]
    q = ranking_quality(pred, [ranked_figure(r["measured"]) for r in rows])
    full = all(r["measured"].get("full_batch_tokens_per_s") is not None for r in rows)
    q["measured_figure"] = "full_batch" if full else "whole_run"
    q["whole_run"] = ranking_quality(pred, [r["measured"]["tokens_per_s"] for r in rows])
    return q


def evaluate_regime(
    bench: Bench, ranking: dict, regime: str, ctx: int, profile: RegimeProfile, per_regime: int
) -> dict:
    """Phase 3 for one regime: its measured strategies, each predicted and measured, and how
    well the ranking orders them (``ranking_quality``, ``measurement_resolution``).

    ``per_regime`` strategies the engine can run (the predicted top ones plus ranks spread
    evenly over the rest, ``stats.pick``; at batch > 1 also the best-ranked of each attention
    and drafter family, so sparse and dense strategies are both measured) decode each of
    ``measure_texts`` other code prompts (runs of ``batch`` prompts each at batch > 1), run i
    with seed i, their runs pooled (a regime's throughput, as the profile's acceptance is a
    regime's, not one prompt's), each strategy scored again at the measured context: Kendall
    tau (predicted vs measured tokens/s) and the regret of the predicted best, on the runs'
    full-batch figures (``regime_quality``)."""
    entry = ranking["regimes"][regime]
    strata = family if bench.batch > 1 else None
    chosen = pick(entry["ranking"], per_regime, lambda s: bench.runnable(s) is None, strata=strata)
    strategies = [strategy_from_json(r["strategy"]) for r in chosen]
    scored, prov = score(
        bench.model,
        bench.gpu,
        strategies,
        ctx,
        profile,
        regime,
        bench.batch,
        elementwise=bench.elementwise,
        loop=bench.loop,
    )
    pred = {strategy_id(x.strategy): x for x in scored}
    rank_of = {r["id"]: i for i, r in enumerate(entry["ranking"])}
    measured, windows = measure_strategies(bench, strategies, regime, ctx)
    rows = []
    for s in strategies:
        sid = strategy_id(s)
        m, p = measured[sid], pred[sid]
        rows.append(
            {
                "id": sid,
                "describe": describe(s),
                "offline_rank": rank_of[sid],
                "predicted_tokens_per_s": p.tokens_per_s,
                "predicted_tokens_per_round": p.tokens_per_round,
                "extrapolated": p.extrapolated,
                "measured": m,
            }
        )
        bench.log(
            f"{regime} #{rank_of[sid]:4d} pred {p.tokens_per_s:9.1f} meas "
            f"{ranked_figure(m):9.1f} tok/s (whole run {m['tokens_per_s']:9.1f}) {describe(s)}"
        )
    q = regime_quality(rows)
    return {
        "context_len": ctx,
        "provenance": prov,
        "space_size": entry["num_valid"],
        "measure_windows": windows,
        **q,
        "measurement": measurement_resolution(rows),
        "strategies": rows,
    }


def _met(regimes: dict, off: list[float]) -> dict:
    """Which of ``TARGETS`` hold: tau and regret in every regime, the gain on every
    off-distribution prompt set."""
    return {
        "kendall_tau": all(
            v["kendall_tau"] >= TARGETS["kendall_tau_min"] for v in regimes.values()
        ),
        "regret": all(v["regret"] <= TARGETS["regret_max"] for v in regimes.values()),
        "adaptive_gain_off_distribution": bool(off)
        and all(g >= TARGETS["adaptive_gain_min"] for g in off),
    }


def _headline(regimes: dict, adaptive: dict, oracle: bool) -> dict:
    """The document's summary figures: tau and regret per regime, the adaptive gains (as
    measured, their mean off distribution, with the capture rounds counted) and the ceiling."""
    sets = adaptive["prompt_sets"]
    gains = {k: v["adaptive_gain"] for k, v in sets.items()}
    off = [gains[k] for k in OFF_DISTRIBUTION if k in gains]
    return {
        "kendall_tau": {r: v["kendall_tau"] for r, v in regimes.items()},
        "regret": {r: v["regret"] for r, v in regimes.items()},
        "adaptive_gain": gains,
        "adaptive_gain_off_distribution_mean": float(np.mean(off)) if off else None,
        # The gains with the rounds that captured a CUDA graph inside a run counted.
        "adaptive_gain_captures_counted": {
            k: v["adaptive_gain_captures_counted"] for k, v in sets.items()
        },
        # The best fixed strategy per prompt set over the offline best: what a controller
        # that picked the right fixed strategy from the first round would gain.
        "adaptive_ceiling": {k: v["oracle"]["ceiling"] for k, v in sets.items()}
        if oracle
        else None,
        "targets": TARGETS,
        "met": _met(regimes, off),
    }


def bench_settings(bench: Bench) -> dict:
    """The decode settings an evaluation document records of its bench: the batch (absent at
    batch 1, as in the documents before batches), the models, the GPU of the predictions,
    the tokens, temperature, seeds and timing passes."""
    return {
        **({"batch": bench.batch} if bench.batch > 1 else {}),
        "model": bench.model.name,
        "draft_model": bench.draft_label,
        "gpu_model": bench.gpu.name,
        "max_new_tokens": bench.max_new_tokens,
        "temperature": bench.temperature,
        "repeats": bench.repeats,
        "timing_passes": bench.timing_passes,
        "loop": bench.loop,
    }


def evaluate(
    bench: Bench,
    contexts: dict[str, int],
    space: SpaceSpec,
    *,
    per_regime: int = 12,
    adaptive_context: int | None = None,
    prompt_sets: tuple[str, ...] = PROMPT_SETS,
    ref_tree: str = "chain:4",
    attention_tree: str = "best:16:6",
    profile_prompts: int = 3,
    walk_prompts: int = 0,
    controller: ControllerConfig | None = None,
    provenance: dict | None = None,
    oracle: bool = True,
) -> tuple[dict, dict]:
    """The evaluation document and the full ranking it used."""
    t0 = time.perf_counter()
    profile, loop_checks, per_key, chain_tokens = measure_profile(
        bench, contexts, space, ref_tree, attention_tree, profile_prompts, walk_prompts
    )
    ranking = rank(
        bench.model, bench.gpu, space, profile, bench.batch, contexts, bench.elementwise, bench.loop
    )
    regimes = {
        r: evaluate_regime(bench, ranking, r, ctx, profile, per_regime)
        for r, ctx in contexts.items()
    }
    actx = adaptive_context or max(contexts.values())
    adaptive = _adapt(bench, ranking, profile, actx, prompt_sets, controller, oracle, walk_prompts)
    doc = {
        "version": EVAL_VERSION,
        "provenance": {
            **(provenance or {}),
            "backend": bench.target.backend,
            "wall_s": time.perf_counter() - t0,
        },
        **bench_settings(bench),
        "measure_texts": bench.measure_texts,
        "profile": profile.to_json(),
        "profile_reference_tree": ref_tree,
        "profile_attention_tree": attention_tree,
        "profile_prompts": profile_prompts,
        "profile_walk_prompts": walk_prompts,
        "profile_timing_passes": bench.timing_passes,
        "profile_loop_host": loop_checks,
        "profile_attention_factor_per_key": per_key,
        "profile_chain_tokens": chain_tokens,
        "space": dataclasses.asdict(space),
        **_headline(regimes, adaptive, oracle),
        "regimes": regimes,
        "adaptive": adaptive,
    }
    return doc, ranking


def _adapt(
    bench: Bench,
    ranking: dict,
    profile: RegimeProfile,
    actx: int,
    prompt_sets: tuple[str, ...],
    controller: ControllerConfig | None,
    oracle: bool,
    walk_prompts: int,
) -> dict:
    """Phase 4 at context ``actx`` (``evaluate_adaptive``'s document), with the default
    controller where ``controller`` is None; ``ValueError`` when the ranking has no regime of
    ``actx``."""
    if regime_of(actx) not in ranking["regimes"]:
        raise ValueError(f"adaptive context {actx} falls in regime {regime_of(actx)}, not ranked")
    code_windows = adaptive_windows(actx, bench.batch, walk_prompts)
    return evaluate_adaptive(
        bench,
        ranking,
        profile,
        actx,
        prompt_sets,
        controller or ControllerConfig(),
        oracle,
        code_windows,
    )


def summary_table(doc: dict) -> str:
    """The evaluation as a plain-text table: ranking quality per regime, then per prompt set
    the adaptive figures with their resolution, the best fixed strategy and hindsight."""
    lines = ["regime   ctx     n  kendall_tau  p_value  regret  pair s.e.  draw regret p90"]
    for r, v in doc["regimes"].items():
        m = regime_resolution(v)
        res = f"  {m['pair_ratio_se']:9.1%}  {m['draw_regret_p90']:15.1%}" if m else ""
        lines.append(
            f"{r:7s} {v['context_len']:6d} {v['n']:3d}  {v['kendall_tau']:11.3f}  "
            f"{v['tau_p_value']:7.3f}  {v['regret']:6.1%}{res}"
        )
    lines.append("\n" + adaptive_table(doc["adaptive"]))
    lines.append(f"met: {doc['met']}")
    return "\n".join(lines)


def adaptive_table(a: dict) -> str:
    """The adaptive phase (``evaluate_adaptive``'s document) as a plain-text table: per prompt
    set the fixed default, the offline best and the controller, the gain with its resolution,
    the best fixed strategy and hindsight."""
    lines = [f"adaptive at {a['context_len']} ({a['regime']}): tokens/s"]
    lines.append(
        "prompts      default  offline_best  adaptive  switches  gain   gain 90%"
        "         best fixed  ceiling  hindsight"
    )
    for k, v in a["prompt_sets"].items():
        o = v.get("oracle")
        m = set_resolution(v)
        band = f"{m['gain_p05']:+6.1%}..{m['gain_p95']:+6.1%}" if m else " " * 16
        tail = f" {o['tokens_per_s']:11.1f} {o['ceiling']:+8.1%}" if o else ""
        if m and m.get("hindsight"):
            tail += f" {m['hindsight']['gain']:+10.1%}"
        lines.append(
            f"{k:10s} {v['default']['tokens_per_s']:9.1f} "
            f"{v['offline_best']['tokens_per_s']:13.1f} "
            f"{v['adaptive']['tokens_per_s']:9.1f} {len(v['adaptive']['switches']):9d} "
            f"{v['adaptive_gain']:+6.1%}  {band}{tail}"
        )
    return "\n".join(lines)
