"""Offline ranking per context regime (seed 000, Mechanism 3, phase 1) from the calibrated model.

For each regime's representative context, every valid strategy of the space is scored with
perfmodel's step model under the default predictor (the fitted profile for a calibrated GPU,
else the roofline), with the acceptance of its drafter and the overlap of its traversal taken
from the acceptance profile. The result is a versioned ranking document: per regime, the
strategies by predicted tokens/s with their breakdown and provenance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.baselines import op_group
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.costs import memory_shortfall
from ssvkit.perfmodel.files import read_json
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.intervals import bounds, interval
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload, parse_tree
from ssvkit.planner.profile import REGIMES, RegimeProfile
from ssvkit.planner.space import SpaceSpec, describe, strategy_id, valid_strategies

RANKING_VERSION = 1


@dataclass(frozen=True, slots=True)
class Scored:
    strategy: Strategy
    tokens_per_s: float
    tokens_per_round: float
    round_s: float
    breakdown_s: dict[str, float]
    extrapolated: bool
    tokens_per_s_interval: tuple[float, float] | None = None  # perfmodel.intervals; None: none


def score(
    model: ModelSpec,
    gpu: GpuSpec,
    strategies: list[Strategy],
    context_len: int,
    profile: RegimeProfile,
    regime: str,
    batch: int = 1,
    acceptance_scale: float | dict[str, float] = 1.0,
    elementwise: str = "fused",
    loop: str = "pipelined",
) -> tuple[list[Scored], str]:
    """Predicted tokens/s of each strategy at ``context_len`` (one vectorised evaluation per
    drafter model): the step model at the strategy's acceptance from ``profile``
    (``RegimeProfile.alpha_for``, times ``acceptance_scale`` -- one factor, or one per drafter kind,
    1 for a kind it lacks --, at most 1), its round with the loop's host time
    (``perfmodel.loop_host``, ``loop`` in the breakdown), with the tokens/s interval of a
    calibrated prediction (``perfmodel.intervals``; the loop's host time with its fit's
    residuals); the engine runs the element-wise ops as ``elementwise``
    (``perfmodel.elementwise.ELEMENTWISE``) and its rounds as ``loop`` (``Workload.loop``: a
    fixed strategy's rounds are pipelined where it allows, an online controller's serial)."""
    if not strategies:
        return [], "none"
    out: list[Scored] = []
    prov = "none"
    by_draft: dict[str | None, list[Strategy]] = {}
    for s in strategies:
        by_draft.setdefault(s.drafter.model, []).append(s)
    for draft_model, group in by_draft.items():
        points = [
            (s, _workload(s, context_len, profile, regime, batch, acceptance_scale, elementwise))
            for s in group
        ]
        points = [(s, dataclasses.replace(w, loop=loop)) for s, w in points]
        cols = build_columns(model, points)
        drafter = DrafterSpec(kind="draft_model", model=draft_model) if draft_model else None
        pred = predict_columns(model, cols, make_predictor(gpu, "bf16", cols.tp), drafter)
        prov = pred.provenance
        out += _scored(group, pred, batch)
    out.sort(key=lambda x: (-x.tokens_per_s, strategy_id(x.strategy)))
    return out, prov


def _workload(
    s: Strategy,
    context_len: int,
    profile: RegimeProfile,
    regime: str,
    batch: int,
    acceptance_scale: float | dict[str, float],
    elementwise: str,
) -> Workload:
    """What ``score`` prices ``s`` at: its drafter's acceptance from ``profile`` times its
    kind's ``acceptance_scale``, at most 1, and the overlap of its traversal."""
    scale = (
        acceptance_scale.get(s.drafter.kind, 1.0)
        if isinstance(acceptance_scale, dict)
        else acceptance_scale
    )
    alpha = min(1.0, profile.alpha_for(regime, s) * scale)
    return Workload(
        context_len=context_len,
        batch=batch,
        acceptance=alpha,
        overlap=profile.gamma(regime, s.traversal),
        elementwise=elementwise,
    )


def _scored(group: list[Strategy], pred, batch: int) -> list[Scored]:
    """``group``'s strategies scored from their prediction ``pred`` (the step model's op seconds
    summed per op group, ``loop`` always among them), and the tokens/s interval when ``pred``
    has a spread."""
    groups = {}
    for k, v in pred.op_seconds.items():
        groups.setdefault(op_group(k), []).append(v)
    grouped = {g: np.sum(v, axis=0) for g, v in groups.items()}
    grouped.setdefault("loop", np.zeros(len(group)))
    rnd = pred.spread()
    ivs = None
    if rnd is not None:
        tps = batch * np.asarray(pred.tokens_per_round, dtype=float) / pred.round_s
        ivs = interval(tps, under=bounds(rnd))
    out = []
    for i, s in enumerate(group):
        round_s = float(pred.round_s[i])
        tpr = float(pred.tokens_per_round[i])
        out.append(
            Scored(
                s,
                batch * tpr / round_s,
                tpr,
                round_s,
                {g: float(v[i]) for g, v in grouped.items()},
                bool(pred.extrapolated[i]),
                None if ivs is None else (float(ivs[i, 0]), float(ivs[i, 1])),
            )
        )
    return out


def concrete(s: Strategy, acceptance: float) -> Strategy:
    """``s`` with a ``best:N`` tree replaced by the explicit tree it resolves to at
    ``acceptance``: what the engine runs, and what re-scoring at another acceptance keeps."""
    if not s.tree.startswith("best:"):
        return s
    parents = parse_tree(s.tree, acceptance)
    fixed = dataclasses.replace(s, tree="parents:" + ",".join(map(str, parents)))
    return dataclasses.replace(fixed, name=strategy_id(fixed))


def rank(
    model: ModelSpec,
    gpu: GpuSpec,
    spec: SpaceSpec,
    profile: RegimeProfile,
    batch: int = 1,
    regimes: dict[str, int] | None = None,
    elementwise: str = "fused",
    loop: str = "pipelined",
) -> dict:
    """The ranking document (version 1) for every regime, the engine's element-wise ops priced
    as ``elementwise`` runs them and its rounds as ``loop`` does (``score``). A regime whose
    context lies past the model's trained positions (``max_position_embeddings``, when known)
    is not ranked:
    ``skipped`` says why. Each ranked regime lists under ``assumed`` what its predictions take
    from the workload defaults rather than from ``profile`` (``RegimeProfile.assumed``)."""
    regimes = regimes or REGIMES
    doc = {
        "version": RANKING_VERSION,
        "model": model.name,
        "gpu": gpu.name,
        "batch": batch,
        "elementwise": elementwise,
        "loop": loop,
        "space": dataclasses.asdict(spec),
        "profile": profile.to_json(),
        "regimes": {},
    }
    skipped = {}
    for regime, ctx in regimes.items():
        why = _skip_reason(model, gpu, batch, ctx)
        if why:
            skipped[regime] = why
            continue
        doc["regimes"][regime] = _ranked_regime(
            model, gpu, spec, profile, regime, ctx, batch, elementwise, loop
        )
    if skipped:
        if not doc["regimes"]:
            raise ValueError(
                f"no regime to rank for {model.name}: "
                f"{'; '.join(f'{r}: {w}' for r, w in skipped.items())}"
            )
        doc["skipped"] = skipped
    return doc


def _skip_reason(model: ModelSpec, gpu: GpuSpec, batch: int, ctx: int) -> str | None:
    """Why ``rank`` leaves out a regime of context ``ctx``: past the model's trained positions,
    or a batch whose KV does not fit beside the weights (``memory_shortfall``); None if neither."""
    limit = model.max_position_embeddings
    if limit and ctx > limit:
        return f"context {ctx} > the model's {limit} trained positions"
    return memory_shortfall(model, gpu, 1, 2, batch, ctx)


def _ranked_regime(
    model: ModelSpec,
    gpu: GpuSpec,
    spec: SpaceSpec,
    profile: RegimeProfile,
    regime: str,
    ctx: int,
    batch: int,
    elementwise: str,
    loop: str,
) -> dict:
    """One regime's entry of the ranking document: its valid strategies (``best:N`` trees made
    ``concrete`` at the regime's acceptance) scored at ``ctx``, best first."""
    valid, rejected = valid_strategies(spec, model, gpu, ctx)
    valid = [concrete(s, profile.alpha(regime, s.drafter.kind)) for s in valid]
    scored, prov = score(model, gpu, valid, ctx, profile, regime, batch, 1.0, elementwise, loop)
    return {
        "context_len": ctx,
        "provenance": prov,
        "acceptance_source": profile.source,
        "assumed": profile.assumed(regime, valid),
        "num_valid": len(valid),
        "rejected": rejected,
        "ranking": [
            {
                "id": strategy_id(x.strategy),
                "describe": describe(x.strategy),
                "strategy": dataclasses.asdict(x.strategy),
                "tokens_per_s": x.tokens_per_s,
                "tokens_per_s_interval": x.tokens_per_s_interval,
                "tokens_per_round": x.tokens_per_round,
                "round_s": x.round_s,
                "breakdown_s": x.breakdown_s,
                "extrapolated": x.extrapolated,
            }
            for x in scored
        ],
    }


def strategy_from_json(d: dict) -> Strategy:
    d = dict(d)
    d["drafter"] = DrafterSpec(**d["drafter"])
    return Strategy(**d)


def load_ranking(path) -> dict:
    doc = read_json(path, "ranking")
    if doc.get("version") != RANKING_VERSION:
        raise ValueError(f"ranking {str(path)!r} has version {doc.get('version')!r}, expected 1")
    return doc
