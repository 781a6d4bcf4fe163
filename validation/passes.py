"""Timing passes: every timed run of the planner evaluation goes several times, and its figure
is its least disturbed pass.

On a shared host one decode's round time, the same tokens and rounds every time, moves by up to
~40% from run to run in slow stretches of the machine and never falls below a floor; with one
pass, two strategies 3% apart trade places from one evaluation to the next. So the measured and
adaptive runs go ``timing_passes`` times (``run_passes``): a whole pass over a phase's runs,
then the next, and each run keeps its least disturbed pass among those that decoded the same
(``least_disturbed``). Within a pass the strategies' runs are interleaved (``interleave``: the
i-th run of every strategy in turn), so a slow stretch falls on a few runs of every strategy
instead of on one strategy's block. Several runs of one strategy pool into one figure
(``pooled_figures``) or take their median (``median_run``).
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.planner.space import strategy_id
from ssvkit.validation import full_batch
from ssvkit.validation.bench import Bench, steady_run


def median_run(runs: list[dict]) -> dict:
    """The run with the median tokens/s (its figures), with every run's tokens/s beside it."""
    tps = [r["tokens_per_s"] for r in runs]
    out = dict(runs[int(np.argsort(tps)[len(tps) // 2])])
    out["runs_tokens_per_s"] = tps
    out["tokens_per_s"] = float(np.median(tps))
    return out


def _decoded(run: dict) -> tuple:
    """What a run decoded, as far as its figures tell: tokens, rounds and switches (round and
    destination). Runs of one strategy, prompt and seed decode the same (sampling is seeded);
    an adaptive run's controller may still decide otherwise where a measured switch cost sits
    at a threshold. The rounds that captured a graph count: they are left out of the steady
    figures, not out of what the run decoded."""
    return (
        run["tokens"] + run.get("capture_tokens", 0),
        run["rounds"] + run.get("capture_rounds", 0),
        tuple((w["round"], w["to"]) for w in run.get("switches", ())),
    )


def least_disturbed(passes: list[dict]) -> dict:
    """One run timed in several passes (``run_passes``): the pass with the least wall time
    (most tokens/s) among those that decoded what the first pass did (``_decoded``), with
    every pass's tokens/s and the number kept beside it. Interference from the rest of a
    shared machine only ever adds time to a decode whose work is fixed, so the least disturbed
    pass is the estimate of what the decode costs; keeping only passes that decoded the same
    keeps an adaptive run's luckier decisions out of it."""
    first = _decoded(passes[0])
    same = [r for r in passes if _decoded(r) == first]
    out = dict(max(same, key=lambda r: r["tokens_per_s"]))
    out["passes_tokens_per_s"] = [r["tokens_per_s"] for r in passes]
    out["passes_kept"] = len(same)
    return out


def interleave(groups: list[dict]) -> dict:
    """The jobs of ``groups`` (each one strategy's runs, in order) in one order that takes the
    i-th run of every group in turn, the groups' order rotated by one each turn (group i mod n
    first): so one strategy's runs lie spread over the whole pass instead of side by side, and
    a slow stretch of the host (several seconds) falls on a few runs of every strategy. A key
    in several groups keeps its first place."""
    lists = [list(g.items()) for g in groups]
    out: dict = {}
    for i in range(max(map(len, lists), default=0)):
        for j in range(len(lists)):
            items = lists[(i + j) % len(lists)]
            if i < len(items) and items[i][0] not in out:
                out[items[i][0]] = items[i][1]
    return out


def run_passes(bench: Bench, jobs: dict[str, tuple]) -> dict[str, dict]:
    """Run every job (``key -> (fn, args, kwargs)``, one run each) ``timing_passes`` times, a
    whole pass over the jobs after another -- so the passes of one run lie apart by the time a
    pass takes, longer than a slow stretch of the machine lasts -- and keep each job's least
    disturbed pass (``least_disturbed``; with one pass, its run as it is). Pass p > 0 caches
    under ``key|t<p>``."""
    passes: dict[str, list[dict]] = {k: [] for k in jobs}
    for p in range(bench.timing_passes):
        for key, (fn, args, kwargs) in jobs.items():
            passes[key].append(bench.run(key if p == 0 else f"{key}|t{p}", fn, *args, **kwargs))
    return {k: v[0] if len(v) == 1 else least_disturbed(v) for k, v in passes.items()}


def measure_jobs(bench: Bench, strategy: Strategy, prompts: list[list[int]], key: str) -> dict:
    """``repeats`` runs of ``strategy`` on one batch of prompts (``key`` names it for the run
    cache), run i with seed i, as jobs for ``run_passes``."""
    sid = strategy_id(strategy)
    return {
        f"{key}|{sid}|{i}": (steady_run, (bench, strategy, prompts), {"seed": i})
        for i in range(bench.repeats)
    }


def prompts_jobs(
    bench: Bench,
    strategy: Strategy,
    prompts: dict[int, list[list[int]]],
    key: str,
    runs: int | None = None,
) -> dict:
    """``runs`` (default ``repeats``) runs of ``strategy``, run i on the i-th batch of prompts
    (cyclically; ``prompts`` by label: the corpus window at batch 1, the run's index at batch >
    1, ``validation.prompts.batch_windows``) with seed i, as jobs for ``run_passes``; the label
    each decodes is its key's third field from the end."""
    sid = strategy_id(strategy)
    windows = list(prompts)
    jobs = {}
    for i in range(bench.repeats if runs is None else runs):
        w = windows[i % len(windows)]
        jobs[f"{key}|{w}|{sid}|{i}"] = (steady_run, (bench, strategy, prompts[w]), {"seed": i})
    return jobs


def pooled_prompts(done: dict[str, dict], jobs: dict, batch: int | None = None) -> dict:
    """The figures of ``prompts_jobs``' runs (``done``, by key) pooled (``pooled_figures``:
    tokens/s is their tokens over their time, what the model predicts, not one prompt's or one
    seed's), with every run's tokens/s and window beside them; given the runs' ``batch``, their
    full-batch tokens/s too (``validation.full_batch.pooled_tokens_per_s``; None where a run
    has none), pooled and per run."""
    runs = [{**done[k], "window": int(k.split("|")[-3])} for k in jobs]
    out = pooled_figures(runs)
    out["runs_tokens_per_s"] = [r["tokens_per_s"] for r in runs]
    out["runs_window"] = [r["window"] for r in runs]
    if batch is not None:
        out["full_batch_tokens_per_s"] = full_batch.pooled_tokens_per_s(runs, batch)
        out["runs_full_batch_tokens_per_s"] = [
            full_batch.pooled_tokens_per_s([r], batch) for r in runs
        ]
    return out


def pooled_figures(runs: list[dict]) -> dict:
    """Steady figures of several runs as one: sums of tokens, rounds and times, tokens/s over
    them, round-weighted mean step times and mean accepted drafts."""
    rounds = sum(r["rounds"] for r in runs)
    w = np.array([r["rounds"] for r in runs], dtype=float) / max(rounds, 1)
    sums = {k: float(sum(r[k] for r in runs)) for k in ("wall_s", "switch_s", "control_s")}
    tokens = int(sum(r["tokens"] for r in runs))
    steps = {
        k: float(sum(wi * r["steps_s"].get(k, 0.0) for wi, r in zip(w, runs, strict=True)))
        for k in runs[0]["steps_s"]
    }
    return {
        "tokens_per_s": tokens / max(sum(sums.values()), 1e-12),
        "tokens": tokens,
        "rounds": rounds,
        **sums,
        "steps_s": steps,
        "mean_accepted": float(sum(wi * r["mean_accepted"] for wi, r in zip(w, runs, strict=True))),
    }
