"""The planner evaluation's statistics: which ranked strategies are measured, how well the
ranking orders them, and how finely the measurement itself resolves the differences it reports.

Every measured strategy of a regime decodes the same windows with the same seeds, and every
adaptive repeat of a prompt set shares its seed with the fixed runs of that repeat, so the
window (the seed) is the unit of sampling: the resolutions resample them jointly. Nothing here
decodes; the report derives the same figures from committed evaluations.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import bootstrap, kendalltau
from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.planner.rank import strategy_from_json


def family(s: Strategy) -> str:
    """A strategy's family, the strata of a stratified ``pick``: its drafter kind
    (``autoregressive`` when it drafts nothing) and its attention (``dense`` or ``sparse``)."""
    kind = s.drafter.kind if parse_tree(s.tree) else "autoregressive"
    return f"{kind}|{s.attention}"


def pick(ranking: list[dict], n: int, ok, top: int = 4, strata=None) -> list[dict]:
    """The first ``top`` runnable entries, then runnable ranks spread evenly over the rest:
    ``n`` entries in all (fewer when fewer are runnable), in rank order. With ``strata`` (a
    strategy's stratum, e.g. ``family``), the best-ranked runnable entry of every stratum the
    first ``top`` miss joins them before the spread (while ``n`` allows), so that a ranking
    whose top is all one family still measures the best of the others."""
    runnable = [r for r in ranking if ok(strategy_from_json(r["strategy"]))]
    if len(runnable) <= n:
        return runnable
    head = list(range(min(top, n)))  # n < top: the first n
    if strata is not None:
        seen = {strata(strategy_from_json(runnable[i]["strategy"])) for i in head}
        for i in range(len(head), len(runnable)):
            label = strata(strategy_from_json(runnable[i]["strategy"]))
            if len(head) < n and label not in seen:
                seen.add(label)
                head.append(i)
    rest = [i for i in range(len(runnable)) if i not in set(head)]
    k = n - len(head)
    idx = np.unique(np.round(np.linspace(0, len(rest) - 1, k)).astype(int)) if k else []
    return [runnable[i] for i in sorted(head + [rest[j] for j in idx])]


def _draws(samples, statistic, draws: int, seed: int) -> np.ndarray:
    """``statistic`` (vectorised over the last axis) on ``draws`` resamples of the last axis,
    taken jointly across ``samples`` (``scipy.stats.bootstrap``, paired): its bootstrap
    distribution, the draws on the last axis."""
    rng = np.random.default_rng(seed)
    res = bootstrap(
        samples,
        statistic,
        paired=True,
        vectorized=True,
        axis=-1,
        n_resamples=draws,
        method="percentile",
        rng=rng,
    )
    return np.asarray(res.bootstrap_distribution)


def _median_draws(samples: list[np.ndarray], draws: int, seed: int) -> np.ndarray:
    """``[sample, draw]`` medians of each sample over joint resamples of its entries."""
    return _draws(samples, lambda *xs, axis: np.median(np.stack(xs), axis=axis), draws, seed)


def ranking_quality(predicted: list[float], measured: list[float]) -> dict:
    """Kendall tau-b, its p-value, and the regret of the predicted best."""
    tau = kendalltau(predicted, measured)
    best_pred = int(np.argmax(predicted))
    return {
        "kendall_tau": float(tau.statistic),
        "tau_p_value": float(tau.pvalue),
        "regret": 1.0 - measured[best_pred] / max(measured),
        "n": len(measured),
    }


def measurement_resolution(
    rows: list[dict], top: int = 5, draws: int = 2000, seed: int = 0
) -> dict | None:
    """How finely a regime's measurement orders its strategies (``rows``: the regime's
    ``strategies`` entries): ``draws`` resamples of the windows, jointly, each strategy pooled
    over them (the harmonic mean of its runs' tokens/s: its runs' tokens are equal to within
    1%; ``scipy.stats.bootstrap`` draws the windows). Returns the standard error of the log
    ratio of two of the ``top`` strategies predicted best (the median over their pairs), and
    the regret (mean, p90) of a predictor that ranked by one such draw -- one that saw another
    sample of the same prompts, timed exactly -- against the measured figures: the regret a
    measurement this coarse leaves a perfect predictor. The figures are the full-batch ones
    where every run has them (``runs_full_batch_tokens_per_s``, what the regime is scored on:
    ``validation.evaluate.regime_quality``), else the whole runs'. None when the rows lack their
    runs per window, decoded different windows or fewer than two."""
    ms = [r["measured"] for r in rows]
    if len(ms) < 2 or any("runs_window" not in m or "runs_tokens_per_s" not in m for m in ms):
        return None
    if len({tuple(m["runs_window"]) for m in ms}) != 1:
        return None
    full = all(None not in m.get("runs_full_batch_tokens_per_s", [None]) for m in ms)
    key, total = (
        ("runs_full_batch_tokens_per_s", "full_batch_tokens_per_s")
        if full
        else ("runs_tokens_per_s", "tokens_per_s")
    )
    runs = np.array([m[key] for m in ms], dtype=float)  # [strategy, window]
    k = runs.shape[1]
    if k < 2:
        return None
    truth = np.array([m[total] for m in ms], dtype=float)
    best = np.argsort([-r["predicted_tokens_per_s"] for r in rows], kind="stable")[:top]
    pairs = np.array([(i, j) for n, i in enumerate(best) for j in best[n + 1 :]])
    pooled = _draws((runs,), lambda x, axis: k / np.sum(1.0 / x, axis=axis), draws, seed)
    ratio = np.log(pooled[pairs[:, 0]] / pooled[pairs[:, 1]])  # [pair, draw]
    regret = 1.0 - truth[np.argmax(pooled, axis=0)] / truth.max()
    return {
        "windows": k,
        "draws": draws,
        "pair_ratio_se": float(np.median(ratio.std(axis=1))),
        "draw_regret_mean": float(regret.mean()),
        "draw_regret_p90": float(np.percentile(regret, 90)),
    }


def adaptive_resolution(row: dict, draws: int = 4000, seed: int = 0) -> dict | None:
    """How finely a prompt set's adaptive figures are measured (``row``: an entry of the
    adaptive evaluation's ``prompt_sets``): ``draws`` resamples of the seeds, jointly, each
    figure recomputed as recorded (the ratio of medians). Returns the gain (as recorded:
    ``adaptive_gain``), the gain of each paired run (the controller's run over the offline
    best's of the same seed), the 5th and 95th percentiles of the gain over the draws, and,
    with the oracle's runs, the ``challenger`` and the ``hindsight`` bound (``_challenger``,
    ``_hindsight``). With five repeats the intervals are coarse: read a target against them,
    not against the point figure alone. None when the runs per seed were not kept or do not
    pair up."""
    best = row.get("offline_best", {}).get("runs_tokens_per_s")
    runs = row.get("adaptive", {}).get("runs")
    if not best or not runs or len(runs) != len(best) or len(best) < 2:
        return None
    b = np.asarray(best, dtype=float)
    a = np.array([r["tokens_per_s"] for r in runs], dtype=float)
    others = [
        x
        for x in (row.get("oracle") or {}).get("strategies", [])
        if x["id"] != row["offline_best"].get("id")
        and len(x.get("runs_tokens_per_s") or ()) == len(b)
    ]
    # The challenger is chosen once, from the recorded figures; its runs are drawn with the
    # same seeds as the offline best's and the controller's.
    top = max(others, key=lambda x: x["tokens_per_s"]) if others else None
    samples = [b, a] + ([np.asarray(top["runs_tokens_per_s"], dtype=float)] if top else [])
    medians = _median_draws(samples, draws, seed)  # [sample, draw]
    gain = medians[1] / medians[0] - 1.0
    out = {
        "seeds": len(b),
        "draws": draws,
        "gain": float(np.median(a) / np.median(b) - 1.0),
        "paired_gains": (a / b - 1.0).tolist(),
        "gain_p05": float(np.percentile(gain, 5)),
        "gain_p95": float(np.percentile(gain, 95)),
    }
    if top is not None:
        out["challenger"] = _challenger(row, top, medians[2] / medians[0] - 1.0)
        out["hindsight"] = _hindsight(b, others)
    return out


def _challenger(row: dict, top: dict, drawn_gain: np.ndarray) -> dict:
    """The best fixed strategy other than the offline best (``top``), its gain over it as
    recorded and the 5th and 95th percentiles of that gain over the seeds' draws
    (``drawn_gain``). Chosen once: chosen again on every draw, the maximum of a dozen noisy
    medians would only say how noisy they are. The adaptive ceiling is its gain where
    positive."""
    lo, hi = np.percentile(drawn_gain, [5, 95])
    return {
        "id": top["id"],
        "describe": top["describe"],
        "gain": top["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1,
        "gain_p05": float(lo),
        "gain_p95": float(hi),
    }


def _hindsight(best: np.ndarray, others: list[dict]) -> dict:
    """For each seed, the fastest of the offline best (``best``, its runs per seed) and every
    oracle strategy on that seed, picked after the fact: the most a controller could gain by
    running one fixed strategy of them per prompt (more, in fact: a maximum over a dozen noisy
    runs leans high); switching inside a run is not bound by it."""
    fastest = np.max(
        [best, *(np.asarray(x["runs_tokens_per_s"], dtype=float) for x in others)], axis=0
    )
    return {
        "strategies": len(others) + 1,
        "gain": float(np.median(fastest) / np.median(best) - 1.0),
        "paired_gains": (fastest / best - 1.0).tolist(),
    }


def set_resolution(row: dict) -> dict | None:
    """A prompt set's recorded adaptive ``resolution``, or one derived from its runs per seed
    for evaluations made before it was recorded (``adaptive_resolution``)."""
    return row.get("resolution") or adaptive_resolution(row)


def regime_resolution(regime: dict) -> dict | None:
    """A regime entry's recorded ``measurement``, or one derived from its runs per window for
    evaluations made before it was recorded (``measurement_resolution``)."""
    return regime.get("measurement") or measurement_resolution(regime["strategies"])
