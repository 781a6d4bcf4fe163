"""The planner evaluation's adaptive phase: does online adaptation pay off?

Per prompt set (code in distribution; prose, repetitive text and random bytes off it), at one
context: (a) a fixed default (the ``ssv`` baseline on the draft model), (b) the fixed offline
best of the regime, (c) ``OnlineController`` starting from (b), and with the oracle every
fixed strategy the controller could switch to (``oracle_strategies``).
``adaptive_gain`` = (c) / (b) - 1; without a switch it is the measurement's spread.

Two untimed adaptive runs, cold then warm, give the timed runs' controllers the switch costs
per destination kind (``_warm_up``); the timed runs go interleaved in whole timing passes
(``validation.passes``, ``prompt_set_row``). At batch B > 1 every run decodes B prompts of the
set together (``validation.prompts.set_prompts``) and the controller decides on the batch's
figures (``planner.controller``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.planner.controller import ControllerConfig, OnlineController
from ssvkit.planner.profile import RegimeProfile, regime_of
from ssvkit.planner.rank import strategy_from_json
from ssvkit.planner.space import describe, strategy_id
from ssvkit.validation.bench import Bench, captures_counted, steady_figures, steady_run
from ssvkit.validation.passes import interleave, measure_jobs, median_run, run_passes
from ssvkit.validation.prompts import reuse_line, set_prompts
from ssvkit.validation.stats import adaptive_resolution

# What an adaptive run keeps of each timed run (with timing passes, their figures too).
RUN_FIELDS = (
    "tokens_per_s",
    "switches",
    "switch_s",
    "control_s",
    "control_overlap_s",
    "warm_s",
    "shadow",
    "capture_rounds",
    "capture_s",
    "capture_tokens",
    "tokens",
)


def adaptive_run(
    bench: Bench,
    strategy: Strategy,
    prompts: list[list[int]],
    ranking: dict,
    profile: RegimeProfile,
    config: ControllerConfig,
    seed: int = 0,
    switch_cost_s: float = 0.0,
) -> dict:
    """One run of the batch ``prompts`` under a fresh ``OnlineController`` (scoring at the
    bench's batch) starting from ``strategy`` (knowing ``switch_cost_s`` from earlier runs: one
    figure, or one per destination kind): its steady figures, the controller's switches and the
    switch costs it knows at the end."""
    ctl = OnlineController(
        ranking, bench.model, bench.gpu, profile, config, bench.batch, switch_cost_s
    )
    ctl.warm()  # before decoding, as a server scores its candidates before requests arrive
    result = bench.generate(strategy, prompts, controller=ctl, seed=seed)
    return {
        **steady_figures(result),
        "switches": ctl.switches,
        "warm_s": result.warm_s,
        "shadow": shadow_summary(result),
        "switch_costs": ctl.switch_costs,
    }


def shadow_summary(result) -> dict:
    """Per drafter kind, the run's shadow estimate over all its rounds: positions scored, the
    tokens per round of each chain length it scores as its walk found them (``engine.ngram``:
    1 + accepted drafts per walked round; what the controller uses) and as the average over
    positions (``1 + E[min(m, K)]``, which overstates bursty text); the branching trees it
    walked, under their specs, as their walks found them; the most sequences a round's counts
    covered (``sequences``: the sample's size when the shadow scores a sample, else None)."""
    out = {}
    for kind in {k for r in result.rounds for k in (r.shadow or {})}:
        rows = [r.shadow[kind] for r in result.rounds if r.shadow and kind in r.shadow]
        n = sum(x.positions for x in rows)
        sampled = [len(x.by_sequence) for x in rows if getattr(x, "by_sequence", ())]
        matched = np.sum([x.matched for x in rows], axis=0)
        per_position = {
            f"chain:{k}": 1.0 + float(matched[:k].sum()) / n if n else None
            for k in range(1, len(matched) + 1)
        }
        tpr = dict(per_position)
        if all(x.rounds for x in rows):
            walked = np.sum([x.rounds for x in rows], axis=0)
            drafts = np.sum([x.drafts for x in rows], axis=0)
            tpr = {
                f"chain:{k}": 1.0 + float(drafts[k - 1]) / walked[k - 1] if walked[k - 1] else None
                for k in range(1, len(matched) + 1)
            }
        # Branching trees the shadow walked: 1 + accepted drafts per walked round.
        for spec in dict.fromkeys(t[0] for x in rows for t in getattr(x, "trees", ())):
            walked = [t for x in rows for t in x.trees if t[0] == spec]
            r, d = sum(t[1] for t in walked), sum(t[2] for t in walked)
            tpr[spec] = 1.0 + d / r if r else None
        out[kind] = {
            "positions": int(n),
            "sequences": max(sampled) if sampled else None,
            "tokens_per_round": tpr,
            "tokens_per_round_per_position": per_position,
        }
    return out


def oracle_strategies(ranking: dict, regime: str, ok) -> list[Strategy]:
    """The fixed strategies a per-prompt-set oracle picks among: the best-ranked strategy of
    each (drafter kind, tree) of the regime's ranking that ``ok`` accepts, autoregressive
    decoding once (it drafts nothing, so its drafter does not matter) -- the choices the
    controller re-scores, at their best attention."""
    out, seen = [], set()
    for r in ranking["regimes"][regime]["ranking"]:
        s = strategy_from_json(r["strategy"])
        key = (s.drafter.kind, s.tree) if parse_tree(s.tree) else ("", "chain:0")
        if key not in seen and ok(s):
            seen.add(key)
            out.append(s)
    return out


def _costs(run: dict, measured_only: bool = False) -> dict[str, float]:
    """The switch costs per destination kind an adaptive run knew at its end (``default``: the
    figure it was given for kinds it had not measured, left out with ``measured_only``)."""
    costs = run.get("switch_costs", {})
    return {k: v for k, v in costs.items() if not (measured_only and k == "default")}


def _warm_up(bench: Bench, key: str, adapt: tuple, bid: str) -> tuple[dict, dict, dict]:
    """The cold and the warm untimed adaptive runs, and the switch costs per destination kind
    the timed runs' controllers know from them: the cold run's figures hold first-time
    compilation, so the warm run, told them, measures again where it switches."""
    cold = bench.run(f"{key}|cold|{bid}", *adapt, seed=bench.repeats)
    warm = bench.run(
        f"{key}|warm|{bid}", *adapt, seed=bench.repeats + 1, switch_cost_s=_costs(cold)
    )
    return cold, warm, {**_costs(cold), **_costs(warm, measured_only=True)}


def _adaptive_figures(
    bench: Bench, runs: list[dict], cold: dict, warm: dict, known_cost: dict
) -> dict:
    """The controller's median run, with the untimed runs' figures, every timed run's kept
    fields (``RUN_FIELDS``) and the switch costs it knew."""
    adaptive = median_run(runs)
    for name, run in (("cold", cold), ("warm", warm)):
        adaptive[name] = {k: run[k] for k in ("tokens_per_s", "switch_s", "switches")}
    keep = RUN_FIELDS
    if bench.timing_passes > 1:
        keep = (*keep, "passes_tokens_per_s", "passes_kept")
    adaptive["runs"] = [{k: r[k] for k in keep if k in r} for r in runs]
    adaptive["known_switch_cost_s"] = known_cost
    return adaptive


def _oracle_row(done: dict, oracles: list[Strategy], jobs: dict, best_tps: float) -> dict:
    """The oracle's fixed strategies (their medians) and the best of them over the offline
    best (``ceiling``: what any choice of one fixed strategy per prompt set gains at most)."""
    fixed_all = []
    for s in oracles:
        m = median_run([done[k] for k in jobs[strategy_id(s)]])
        fixed_all.append(
            {
                "id": strategy_id(s),
                "describe": describe(s),
                "tokens_per_s": m["tokens_per_s"],
                "runs_tokens_per_s": m["runs_tokens_per_s"],
                "mean_accepted": m["mean_accepted"],
            }
        )
    top = max(fixed_all, key=lambda x: x["tokens_per_s"])
    return {
        "best": top["id"],
        "describe": top["describe"],
        "tokens_per_s": top["tokens_per_s"],
        "ceiling": top["tokens_per_s"] / best_tps - 1,
        "strategies": fixed_all,
    }


def prompt_set_row(
    bench: Bench,
    kind: str,
    ctx: int,
    strategies: tuple[Strategy, Strategy, list[Strategy], tuple[int, ...]],
    controller: tuple[dict, RegimeProfile, ControllerConfig],
) -> dict:
    """One prompt set's figures: ``strategies`` is (offline best, default, oracle's, the code
    set's windows),
    ``controller`` the adaptive runs' (ranking, profile, config). The timed runs go in whole
    passes, interleaved seed by seed -- the default, the offline best, the controller and the
    oracle's strategies (the offline best's runs among them are the same jobs, not run again)
    -- so a drift of the machine falls on every one alike; all runs of repeat i draw with
    seed i."""
    best, default, oracles, code_windows = strategies
    prompts = set_prompts(kind, ctx, bench.batch, code_windows)
    key, bid = f"adapt|{kind}|{ctx}|{2 * ctx}", strategy_id(best)
    adapt = (adaptive_run, bench, best, prompts, *controller)
    cold, warm, known_cost = _warm_up(bench, key, adapt, bid)
    fixed, adaptive_jobs = {}, {}
    for i in range(bench.repeats):
        fixed[f"{key}|{bid}|{i}"] = (steady_run, (bench, best, prompts), {"seed": i})
        adaptive_jobs[f"{key}|adaptive|{bid}|{i}"] = (
            adapt[0],
            adapt[1:],
            {"seed": i, "switch_cost_s": known_cost},
        )
    oracle_jobs = {strategy_id(s): measure_jobs(bench, s, prompts, key) for s in oracles}
    default_jobs = measure_jobs(bench, default, prompts, key)
    groups = [default_jobs, fixed, adaptive_jobs, *oracle_jobs.values()]
    done = run_passes(bench, interleave(groups))
    runs = [done[k] for k in adaptive_jobs]
    row = {"default": {**median_run([done[k] for k in default_jobs]), "id": strategy_id(default)}}
    row["offline_best"] = {**median_run([done[k] for k in fixed]), "id": bid}
    row["adaptive"] = adaptive = _adaptive_figures(bench, runs, cold, warm, known_cost)
    row["adaptive_gain"] = adaptive["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1
    # The same gain with the in-run capture rounds counted, both sides (reported, not the
    # target's figure: a server captures before requests arrive).
    row["adaptive_gain_captures_counted"] = float(
        np.median([captures_counted(r) for r in runs])
        / np.median([captures_counted(done[k]) for k in fixed])
        - 1
    )
    # Without a switch the adaptive run decodes what the offline best does: its "gain" is
    # the spread of the measurement, and says so.
    row["switched"] = bool(adaptive["switches"])
    if oracles:
        best_tps = row["offline_best"]["tokens_per_s"]
        row["oracle"] = _oracle_row(done, oracles, oracle_jobs, best_tps)
    row["resolution"] = adaptive_resolution(row)
    return row


def _log_row(bench: Bench, kind: str, row: dict) -> None:
    adaptive = row["adaptive"]
    bench.log(
        f"adapt {kind:10s} default {row['default']['tokens_per_s']:8.1f} best "
        f"{row['offline_best']['tokens_per_s']:8.1f} adaptive "
        f"{adaptive['tokens_per_s']:8.1f} tok/s ({len(adaptive['switches'])} switches"
        f"{''.join(' ' + x['reason'] for x in adaptive['switches'])},"
        f" gain {row['adaptive_gain']:+.1%}, captures counted "
        f"{row['adaptive_gain_captures_counted']:+.1%}; per round shadow "
        f"{adaptive['steps_s']['shadow'] * 1e6:.0f} us, verify "
        f"{adaptive['steps_s']['verify'] * 1e6:.0f} us)"
    )
    if "oracle" in row:
        o = row["oracle"]
        bench.log(
            f"oracle {kind:10s} best fixed {o['tokens_per_s']:8.1f} tok/s "
            f"({o['ceiling']:+.1%} over the offline best): {o['describe']}"
        )


def evaluate_adaptive(
    bench: Bench,
    ranking: dict,
    profile: RegimeProfile,
    ctx: int,
    prompt_sets: tuple[str, ...],
    config: ControllerConfig,
    oracle: bool = True,
    code_windows: tuple[int, ...] = (2,),
) -> dict:
    """Per prompt set: a fixed default, the fixed offline best and the controller (median of
    ``repeats`` paired runs each); with ``oracle``, also every strategy of
    ``oracle_strategies`` fixed on the same prompts and seeds: the best of them bounds what any
    choice of one fixed strategy per prompt set gains over the offline best (``ceiling``).
    ``code_windows``: the corpus windows of the code set's batch
    (``validation.prompts.adaptive_windows``)."""
    regime = regime_of(ctx)
    best = strategy_from_json(ranking["regimes"][regime]["ranking"][0]["strategy"])
    default = dataclasses.replace(Strategy.from_name("ssv"), drafter=bench.drafter("draft_model"))
    if bench.runnable(default) is not None:
        default = dataclasses.replace(default, drafter=bench.drafter("ngram"))
    ok = lambda s: bench.runnable(s) is None  # noqa: E731
    oracles = oracle_strategies(ranking, regime, ok) if oracle else []
    line = reuse_line("adaptive code", code_windows, 1, bench.batch, ctx)
    if line and "code" in prompt_sets:
        bench.log(line)
    out = {}
    for kind in prompt_sets:
        strategies = (best, default, oracles, code_windows)
        out[kind] = prompt_set_row(bench, kind, ctx, strategies, (ranking, profile, config))
        _log_row(bench, kind, out[kind])
    return {
        "context_len": ctx,
        "regime": regime,
        "controller": dataclasses.asdict(config),
        "prompt_sets": out,
    }
