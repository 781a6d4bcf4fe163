"""A decode run's figures beside perfmodel's prediction, shared by ``ssvkit decode``'s report
and the campaigns: the per-draft alpha that reproduces a measured mean of accepted drafts, the
prediction at that alpha and the measured overlap, and the mean selection statistics.
"""

from __future__ import annotations

import dataclasses

from ssvkit.perfmodel.numbers import figure
from ssvkit.perfmodel.strategy import fit_acceptance  # noqa: F401  (the campaigns import it here)

# The step model's verify ops that the engine runs in its ``accept`` step, not in ``verify``.
ACCEPT_STEP_OPS = ("verify.sampling", "verify.accept")


def verify_forward_s(pred) -> float:
    """The step model's verify time without sampling and acceptance: the target forward that
    the engine's CUDA-event ``verify`` step times (its ``accept`` step samples and commits)."""
    return float(pred.verify_s[0]) - sum(
        float(pred.op_seconds[k][0]) for k in ACCEPT_STEP_OPS if k in pred.op_seconds
    )


def predicted_verify_s(
    strategy, model_name: str, context: int, t: int, gpu: str, elementwise: str
) -> tuple[float | None, str]:
    """perfmodel's verify forward (``verify_forward_s``) of ``t`` rows at ``context``, batch 1
    (the engine's element-wise ops as ``elementwise`` runs them; ``model_name`` a ModelSpec,
    ``random:`` prefixed or not) with the committed profile of ``gpu``, and its provenance;
    (None, the reason) where it cannot."""
    from ssvkit.perfmodel.calibrated import make_predictor
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.perfmodel.step import build_columns, predict_columns
    from ssvkit.perfmodel.strategy import Workload

    try:
        spec = get_model(model_name.removeprefix("random:"))
        s = dataclasses.replace(strategy, tree=f"chain:{t - 1}")
        wl = Workload(context_len=context, elementwise=elementwise)
        cols = build_columns(spec, [(s, wl)])
        pred = predict_columns(spec, cols, make_predictor(get_gpu(gpu)), s.drafter)
        return verify_forward_s(pred), pred.provenance
    except ValueError as e:
        return None, str(e).splitlines()[0]


def prediction_intervals(pred):
    """The intervals (``perfmodel.intervals``) of point 0 of ``pred``, as {figure: [low, high]}:
    its verify forward (``verify_forward_s``), verify and draft steps, its round (the loop's
    host time in it with its fit's residuals) and tokens/s; and that round's ``LogBounds``, which a
    speedup's interval combines. (None, None) without residuals."""
    from ssvkit.perfmodel.intervals import bounds, interval

    rnd = pred.spread()
    if rnd is None:
        return None, None
    forward = [k for k in pred.op_seconds if k.startswith("verify.") and k not in ACCEPT_STEP_OPS]
    rb = bounds(rnd)
    ivs = {
        "verify_forward_s": interval(
            [verify_forward_s(pred)], over=bounds(pred.spread(keys=forward))
        ),
        "verify_s": interval(pred.verify_s, over=bounds(pred.spread(prefix="verify."))),
        "draft_s": interval(pred.draft_s, over=bounds(pred.spread(prefix="draft."))),
        "round_s": interval(pred.round_s, over=rb),
        "tokens_per_s": interval(pred.tokens_per_s, under=rb),
    }
    return {k: [float(x) for x in v[0]] for k, v in ivs.items()}, rb.take([0])


def ratio_interval(value: float, over, under, same: bool = False) -> list[float] | None:
    """The interval of a speedup ``value`` of two predictions from their rounds' log bounds
    (``predict``'s ``round_log_bounds``: the base's ``over``, the strategy's ``under``; None:
    no interval); ``same``: both are one prediction (zero width)."""
    import numpy as np
    from ssvkit.perfmodel.intervals import LogBounds, interval

    if over is None or under is None:
        return None
    a, b = (LogBounds(*(np.array([x]) for x in v)) for v in (over, under))
    return [float(x) for x in interval([value], over=a, under=b, same=same)[0]]


def loop_of_run(figures: dict) -> str:
    """The decode loop (``Workload.loop``) of a measured run's figures (``ssvkit decode``'s
    report or ``validation.bench.steady_figures``): ``pipelined`` where they say its rounds
    were, ``serial`` otherwise (a run recorded before the engine pipelined any)."""
    return "pipelined" if figures.get("loop") == "pipelined" else "serial"


def inside(iv, measured: float) -> bool | None:
    """Whether ``measured`` lies in the interval ``iv`` ([low, high]; None: no interval)."""
    return None if iv is None else bool(iv[0] <= measured <= iv[1])


def step_prediction(
    strategy,
    target_spec: str,
    draft_spec: str | None,
    context: int,
    batch: int,
    alpha: float,
    overlap: float | None,
    gpu_name: str,
    *,
    elementwise: str,
    loop: str,
):
    """perfmodel's step prediction (``perfmodel.step.StepPrediction``, one point) of a run whose
    engine ran the element-wise ops as ``elementwise`` (``perfmodel.elementwise.ELEMENTWISE``) and
    its rounds as ``loop`` (``Workload.loop``), the GPU spec it priced and its workload;
    ``ValueError`` where it cannot predict."""
    from ssvkit.perfmodel.calibrated import make_predictor
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.perfmodel.step import build_columns, predict_columns
    from ssvkit.perfmodel.strategy import Workload, check_feasible

    model = get_model(target_spec)
    s = strategy
    drafts = s.num_draft_tokens(min(max(alpha, 0.0), 1.0)) > 0
    if s.drafter.kind == "draft_model" and drafts:
        s = dataclasses.replace(s, drafter=dataclasses.replace(s.drafter, model=draft_spec))
    wl = Workload(
        context_len=context,
        batch=batch,
        acceptance=min(max(alpha, 0.0), 1.0),
        elementwise=elementwise,
        loop=loop,
    )
    if overlap is not None:
        wl = dataclasses.replace(wl, overlap=min(max(overlap, 0.0), 1.0))
    check_feasible(s, wl, model)
    gpu = get_gpu(gpu_name)
    cols = build_columns(model, [(s, wl)])
    return predict_columns(model, cols, make_predictor(gpu), s.drafter), gpu, wl


def predict(
    strategy,
    target_spec: str,
    draft_spec: str | None,
    context: int,
    batch: int,
    alpha: float,
    overlap: float | None,
    gpu_name: str,
    *,
    elementwise: str,
    loop: str,
) -> dict:
    """perfmodel's step prediction for the run (or ``{"error": reason}``), its element-wise
    ops as ``elementwise`` runs them, its rounds as ``loop`` does."""
    try:
        pred, gpu, wl = step_prediction(
            strategy,
            target_spec,
            draft_spec,
            context,
            batch,
            alpha,
            overlap,
            gpu_name,
            elementwise=elementwise,
            loop=loop,
        )
    except ValueError as e:
        return {"error": str(e).splitlines()[0]}
    ivs, rb = prediction_intervals(pred)
    return {
        "gpu": gpu.name,
        "elementwise": wl.elementwise,
        "loop": wl.loop,
        "provenance": pred.provenance
        + (" (extrapolated)" if pred.extrapolated[0] else "")
        + (" (stand-in)" if pred.stand_in[0] else ""),
        "draft_s": float(pred.draft_s[0]),
        "verify_s": float(pred.verify_s[0]),
        "verify_forward_s": verify_forward_s(pred),
        "loop_s": float(pred.loop_s[0]),
        "round_s": float(pred.round_s[0]),
        "tokens_per_s": float(pred.tokens_per_s[0]),
        "tokens_per_round": float(pred.tokens_per_round[0]),
        "overlap": figure(
            wl.overlap, "share", "measured:group_overlap" if overlap is not None else "default"
        ),
        "intervals": ivs,
        "round_log_bounds": None
        if rb is None
        else [float(rb.centre[0]), float(rb.up2[0]), float(rb.down2[0])],
    }


def mean_selection(result, name: str) -> float | None:
    """Mean over rounds, sequences and layers (layer 0 has no previous layer to overlap)."""
    import numpy as np

    rows = [getattr(r.selection, name) for r in result.timed() if r.selection is not None]
    if not rows:
        return None
    v = np.concatenate(rows, axis=0)
    if name == "layer_overlap":
        v = v[:, 1:]
    return None if v.size == 0 or np.isnan(v).all() else float(np.nanmean(v))
