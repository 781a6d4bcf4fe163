"""The test sets of ``calibration.transfer_sets`` for the physical model of the attention
families (``ssvkit validate --model physical``): one fit of the GPU-level constants serves
``dense_verify`` and ``sparse_verify`` rows of every configuration, so a left-out head
geometry, group size or context, or another GPU's rows, is predicted by the same constants
refitted without them (cross-GPU: fitted on one GPU's rows, priced with the other GPU's
measured ceilings and SM count).

``interp`` is the profile's held-out split: fit on the rows ``calibration.fit.is_heldout``
keeps, predict the held-out ones. Every fit applies that rule to its rows, as the class fits
of ``fit_profile`` do.
"""

from __future__ import annotations

import functools

from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import is_heldout
from ssvkit.calibration.physical_fit import (
    PHYSICAL_CLASS,
    PHYSICAL_FAMILIES,
    fit_physical,
    predict_rows,
)
from ssvkit.calibration.transfer_sets import (
    LEAVE_ONE_OUT,
    TARGETS,
    TITLES,
    TRANSFER_SETS,
    fitted_rows,
    left_out_value,
    measured_gpus,
    op_class,
    summarize,
)
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.physical import PhysicalFit

INTERP_TARGET = {"median_ape": 0.05, "p90_ape": 0.10}


@functools.lru_cache(maxsize=4)
def committed(gpu: str) -> tuple[list[dict], dict]:
    """``gpu``'s committed graph rows of the physical families and its measured ceilings."""
    rows = ceilings.profile_rows(gpu)
    ceiling = ceilings.derive(gpu, rows)["ceilings"]
    return [r for r in fitted_rows(rows) if r["op"] in PHYSICAL_FAMILIES], ceiling


def fit_rows(rows: list[dict], gpu: str, ceiling: dict) -> PhysicalFit | None:
    """The constants fitted on ``rows``' non-held-out rows (None with fewer than 3)."""
    keep = [r for r in rows if not is_heldout(r)]
    if len(keep) < 3:
        return None
    spec = get_gpu(gpu, measured=False)
    return fit_physical(keep, ceiling["hbm_bytes_per_s"], ceiling["bf16_flops_per_s"], spec)


def annotate(fit: PhysicalFit, rows: list[dict], gpu: str, ceiling: dict) -> list[dict]:
    """``rows`` with ``fit``'s prediction on ``gpu`` (its ceilings and SMs), class and source."""
    spec = get_gpu(gpu, measured=False)
    bw, peak = ceiling["hbm_bytes_per_s"], ceiling["bf16_flops_per_s"]
    pred = predict_rows(fit, rows, bw, peak, spec)
    return [
        {**r, "class": op_class(r), "from": PHYSICAL_CLASS, "predicted_s": float(p)}
        for r, p in zip(rows, pred, strict=True)
    ]


def interp_set(gpu: str) -> dict:
    rows, ceiling = committed(gpu)
    fit = fit_rows(rows, gpu, ceiling)
    held = [r for r in rows if is_heldout(r)]
    out = summarize(annotate(fit, held, gpu, ceiling), {}, INTERP_TARGET)
    out["title"] = "held-out split (interpolation)"
    return out


def leave_one_out(name: str, gpu: str) -> dict:
    """For each value of ``name``, the constants refitted on the rows without it predict the
    rows with it."""
    rows, ceiling = committed(gpu)
    rows = [r for r in rows if left_out_value(name, r) is not None]
    values: dict[str, set] = {}
    for r in rows:
        values.setdefault(op_class(r), set()).add(left_out_value(name, r))
    annotated = []
    for v in sorted({left_out_value(name, r) for r in rows}, key=repr):
        fit = fit_rows([r for r in rows if left_out_value(name, r) != v], gpu, ceiling)
        left = [r for r in rows if left_out_value(name, r) == v]
        if fit is not None:
            annotated += annotate(fit, left, gpu, ceiling)
    out = summarize(annotated, {}, TARGETS["leave_one_out"], values)
    out["title"] = TITLES[name]
    return out


def cross_gpu(fit_gpu: str, other: str) -> dict:
    rows, ceiling = committed(fit_gpu)
    o_rows, o_ceiling = committed(other)
    fit = fit_rows(rows, fit_gpu, ceiling)
    out = summarize(annotate(fit, o_rows, other, o_ceiling), {}, TARGETS["cross_gpu"])
    out["title"] = f"fit on {fit_gpu}'s rows, predict {other}'s with its measured ceilings"
    return out


def physical_report(gpu: str = "h100-sxm", sets=("interp", *TRANSFER_SETS)) -> dict:
    """The chosen sets for the physical model, keyed as ``transfer_sets.transfer_report``
    keys them, ``interp`` first."""
    out = {}
    if "interp" in sets:
        out["interp"] = interp_set(gpu)
    for name in LEAVE_ONE_OUT:
        if name in sets:
            out[name] = leave_one_out(name, gpu)
    if "gpu" in sets:
        for other in measured_gpus():
            if other != gpu:
                out[f"{gpu}->{other}"] = cross_gpu(gpu, other)
                out[f"{other}->{gpu}"] = cross_gpu(other, gpu)
    return out
