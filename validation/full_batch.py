"""A batched run's figures over its full-batch rounds: the rounds in which every sequence of the
batch decodes and none finishes.

A campaign decodes a fixed number of new tokens per sequence; the sequences accept different
counts and so finish at different rounds, and a finished one rides along in the batch's static
shapes, keeping nothing, until the last one is done (``engine.loop``). The run's last rounds
therefore cost a whole round each and emit fewer tokens. perfmodel prices a round of a batch
whose every sequence decodes, as a server that keeps its batch full runs: the full-batch
figures are what it predicts, and the whole run's stay beside them. A run records them when it
is measured (``figures``); a row measured before that has them derived from its per-round
accepted counts (``derived``) or from its histogram of accepted counts (``steady``).
"""

from __future__ import annotations

import numpy as np

# How a full-batch figure's wall time was obtained.
MEASURED_WALL = "measured"
MEAN_ROUND_WALL = "run mean round"
HISTOGRAM_WALL = "run mean round, every decoding (sequence, round) pair"


def full_rounds(active: list[int], batch: int) -> list[bool]:
    """Per round, from the number of sequences decoding in each round of a run (in order):
    whether every one of the ``batch`` sequences decodes in it and in the next round (so none
    finishes in it). The last round of a run is never one: its sequences finish."""
    return [
        n == batch and i + 1 < len(active) and active[i + 1] == batch for i, n in enumerate(active)
    ]


def _summary(accepted: list[list[int]], wall_s: float, batch: int, how: str) -> dict:
    tokens = sum(a + 1 for row in accepted for a in row)
    return {
        "rounds": len(accepted),
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / max(wall_s, 1e-12),
        "round_s": wall_s / len(accepted),
        "tokens_per_round": tokens / (len(accepted) * batch),
        "mean_accepted": float(np.mean([a for row in accepted for a in row])),
        "wall": how,
    }


def figures(result, batch: int) -> dict | None:
    """The full-batch figures of a decode (``engine.results.DecodeResult``) over the rounds
    ``validation.bench.steady_figures`` counts (round 0 and the rounds that captured a graph
    left out), with their wall, switch and controller times; None when it has no such round.

    perfmodel's ``tokens_per_s = batch x E[tokens per round] / round_s`` describes these
    rounds. Their acceptance is the mean accepted count over every (sequence, round) of them
    (the run's ``mean_accepted`` averages each round's mean, so a tail round of one sequence
    weighs as much as a full one)."""
    rounds = result.rounds
    full = full_rounds([len(r.sequences) for r in rounds], batch)
    kept = [r for i, r in enumerate(rounds) if i > 0 and full[i] and not r.captured]
    if not kept:
        return None
    wall = sum(r.wall_s + r.step_s.get("switch", 0.0) + r.step_s.get("control", 0.0) for r in kept)
    return _summary([list(r.accepted) for r in kept], wall, batch, MEASURED_WALL)


def derived(measured: dict, batch: int) -> dict | None:
    """A measured row's full-batch figures: those it recorded, else derived from its per-round
    accepted counts (``accepted_per_sequence``, round 0 included), each round's wall time taken
    as the run's mean round: the batch's shapes are static, so a round's GPU work does not
    depend on how many of its sequences are still decoding. None when it has none: no such
    round, or rounds that captured a CUDA graph (a row cannot say which rounds those were)."""
    if "full_batch" in measured:
        return measured["full_batch"]
    if measured.get("capture_rounds", 0) or "accepted_per_sequence" not in measured:
        return None
    per = measured["accepted_per_sequence"]
    full = full_rounds([len(row) for row in per], batch)
    kept = [per[i] for i in range(1, len(per)) if full[i]]
    if not kept:
        return None
    spent = measured["wall_s"] + measured.get("switch_s", 0.0) + measured.get("control_s", 0.0)
    round_s = spent / measured["rounds"]
    return _summary(kept, round_s * len(kept), batch, MEAN_ROUND_WALL)


def steady(run: dict, batch: int) -> dict | None:
    """The full-batch figures of a steady run (``validation.bench.steady_figures``): those it
    recorded (``full_batch``), else derived from its histogram of accepted counts, which counts
    every (sequence, round) pair that decodes: ``pairs / batch`` full rounds at the run's mean
    round (``HISTOGRAM_WALL``). The shapes are static, so a round's GPU work does not depend on
    how many sequences still decode; the host's per-sequence work (an n-gram drafter's lookups)
    makes the tail rounds a little shorter than a full one, so a derived figure leans high by
    that. None without a histogram."""
    if run.get("full_batch"):
        return run["full_batch"]
    hist = np.asarray(run.get("accepted_hist") or [], dtype=float)
    pairs = float(hist.sum())
    if pairs <= 0 or run.get("rounds", 0) <= 0:
        return None
    tokens = float(((np.arange(hist.size) + 1.0) * hist).sum())
    spent = run["wall_s"] + run.get("switch_s", 0.0) + run.get("control_s", 0.0)
    round_s = spent / run["rounds"]
    wall = round_s * pairs / batch
    return {
        "rounds": pairs / batch,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / max(wall, 1e-12),
        "round_s": round_s,
        "tokens_per_round": tokens / pairs,
        "mean_accepted": tokens / pairs - 1.0,
        "wall": HISTOGRAM_WALL,
    }


def pooled_tokens_per_s(runs: list[dict], batch: int) -> float | None:
    """Full-batch tokens/s of several steady runs as one (``steady`` each: their tokens over
    their time); None when a run has no full-batch figures."""
    figs = [steady(r, batch) for r in runs]
    if not figs or any(f is None for f in figs):
        return None
    return sum(f["tokens"] for f in figs) / max(sum(f["wall_s"] for f in figs), 1e-12)


def row_figures(r: dict) -> tuple[dict | None, float]:
    """A measured row's full-batch figures (``derived``; None: it has
    none, and the whole run stands for them) and the per-draft alpha of their mean accepted
    count under the row's tree (``fit_acceptance``; the run's fitted alpha without them)."""
    from ssvkit.validation.decode_figures import fit_acceptance
    from ssvkit.validation.records import measured_strategy

    full = derived(r["measured"], r["batch"])
    alpha = r["measured_acceptance"]["fitted_alpha"]
    if full is not None and r["acceptance"] is not None:
        alpha = fit_acceptance(list(measured_strategy(r).parents(alpha)), full["mean_accepted"])
    return full, alpha
