"""The residual sets that a fitted profile's prediction intervals come from, computed from the
committed rows and stored in the profile under ``intervals`` (read by ``perfmodel.intervals``),
and what each class's rows span beside its fit (``calibration.fit.measured_by_class``: head
dimensions, serial steps), which decides where its figures are extrapolations with wider
intervals.

    python -m ssvkit.calibration.intervals --gpu h100-sxm           # both, in place
    python -m ssvkit.calibration.intervals --gpu h100-sxm --check   # exit 1 where they differ

Of each set (``residual_rows``: ``heldout``, ``leave_one_out``, ``cross_gpu``,
``current_kernels``), per kernel
family (``perfmodel.intervals.kernel_family``) and pooled over families (``"*"``): the median
and the split-conformal bounds of a central ``COVERAGE`` interval of the log residuals
ln(measured / predicted) of rows that the predicting fit never saw. The fit
(``calibration.fit.fit_folder``) stores them with every profile; this command recomputes them
for a committed profile without refitting it, since a refit under other numerical libraries can
land on another optimum of equal error (``calibration.validate.fit_agreement``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import MEASURED_KEYS, dumps, is_heldout, measured_by_class
from ssvkit.calibration.transfer_sets import (
    LEAVE_ONE_OUT,
    committed_leave_one_out_rows,
    fit_classes,
    fitted_rows,
    leave_one_out_rows,
    measured_gpus,
    predict,
)
from ssvkit.calibration.validate import annotate
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.intervals import (
    COVERAGE,
    POOLED,
    SETS,
    Residuals,
    kernel_family,
)
from ssvkit.perfmodel.profiles import Profile

RULE = (
    "per kernel family, ln(measured / predicted) of rows the predicting fit never saw; "
    "median and split-conformal bounds (order statistics of rank floor((n+1)a) and "
    "ceil((n+1)(1-a)), a = (1 - coverage) / 2)"
)


def log_residuals(annotated: list[dict]) -> dict[str, np.ndarray]:
    """ln(measured / predicted) of annotated rows, per kernel family."""
    out: dict[str, list[float]] = {}
    for r in annotated:
        out.setdefault(kernel_family(r["class"]), []).append(
            float(np.log(r["median_s"] / r["predicted_s"]))
        )
    return {f: np.array(v) for f, v in sorted(out.items())}


def residual_rows(
    gpu: str, rows: list[dict], ceiling: dict, profile: Profile, loo: list[dict] | None = None
) -> tuple[dict[str, list[dict]], tuple[str, ...]]:
    """The annotated rows of each residual set of ``profile``, fitted on ``gpu``'s ``rows``
    with measured ceilings ``ceiling``, ``loo`` the leave-one-out sets' when already computed
    (``committed_leave_one_out_rows``); and the other GPUs of ``cross_gpu``. The sets:

    - ``heldout``: the interpolation split's held-out rows (``calibration.fit.is_heldout``)
      under the profile's own class fits;
    - ``leave_one_out``: the rows of the leave-one-head-geometry-, group-size- and context-out
      sets that ``ssvkit validate`` prints (``calibration.transfer_sets.leave_one_out_rows``),
      each predicted by a refit of its classes without its value, a fit of all the rows
      standing for the classes without it: the fitting procedure's error on values it never
      saw;
    - ``cross_gpu``: every other GPU's committed rows of the current kernels
      (``ceilings.current_kernel_rows``) predicted by the profile's fits on that GPU's measured
      ceilings (``calibration.transfer_sets.predict``);
    - ``current_kernels``: ``gpu``'s own rows of kernels that changed after the fit rows were
      timed (its ``unfitted/`` folder, less any row the fit read) under the profile's fits on
      its ceilings ``ceiling``: what the profile's figures miss of the kernels the code runs
      (none where the folder is absent)."""
    heldout = [r for r in annotate(rows, profile) if is_heldout(r)]
    if loo is None:
        base = fit_classes(fitted_rows(rows), gpu, ceiling)
        loo = [r for n in LEAVE_ONE_OUT for r in leave_one_out_rows(n, rows, gpu, ceiling, base)[0]]
    cross, others = [], []
    for other in measured_gpus():
        if other == gpu:
            continue
        o_rows = ceilings.current_kernel_rows(other)
        o_ceiling = ceilings.derive(other, o_rows)["ceilings"]
        got = predict(fitted_rows(o_rows), profile.classes, other, o_ceiling)[0]
        cross += got
        others.append(other)
    current = _current_kernel_rows(gpu, rows, ceiling, profile)
    sets = {"heldout": heldout, "leave_one_out": loo, "cross_gpu": cross}
    return {**sets, "current_kernels": current}, tuple(others)


def _current_kernel_rows(gpu: str, rows: list[dict], ceiling: dict, profile: Profile):
    """``gpu``'s ``unfitted/`` rows that ``rows`` do not hold, annotated with the profile's
    fits on ``ceiling`` (``residual_rows``' ``current_kernels``)."""
    if not ceilings.has_unfitted(gpu):
        return []
    seen = {r["checksum"] for r in rows}
    newer = ceilings.profile_rows(gpu, ceilings.PROFILES / gpu / ceilings.UNFITTED)
    newer = [r for r in fitted_rows(newer) if r["checksum"] not in seen]
    return predict(newer, profile.classes, gpu, ceiling)[0]


def committed_loo(gpu: str) -> list[dict]:
    """The rows of ``gpu``'s committed leave-one-out sets, as ``ssvkit validate`` computes them
    (once per process)."""
    return [r for n in LEAVE_ONE_OUT for r in committed_leave_one_out_rows(gpu, n)[0]]


def residual_table(sets: dict[str, list[dict]], coverage: float = COVERAGE) -> dict:
    """The ``sets`` part of a profile's ``intervals``: per set, per family with enough rows for
    ``coverage`` and pooled (``"*"``), ``Residuals.to_json``."""
    out = {}
    for name in SETS:
        by_family = log_residuals(sets.get(name, []))
        fams = {}
        for fam, values in by_family.items():
            r = Residuals.of(name, values, coverage)
            if r is not None:
                fams[fam] = r.to_json()
        pooled = [v for vs in by_family.values() for v in vs]
        r = Residuals.of(name, pooled, coverage) if pooled else None
        if r is not None:
            fams[POOLED] = r.to_json()
        out[name] = fams
    return out


def intervals_json(gpu: str, rows: list[dict], ceiling: dict, profile: dict, loo=None) -> dict:
    """A profile's ``intervals`` document: coverage, rule, the other GPUs of ``cross_gpu``, the
    row count of each set and its residual table (``loo``: as ``residual_rows``)."""
    sets, others = residual_rows(gpu, rows, ceiling, Profile.from_json(profile), loo)
    return {
        "coverage": COVERAGE,
        "rule": RULE,
        "cross_gpus": list(others),
        "rows": {k: len(v) for k, v in sets.items()},
        "sets": residual_table(sets),
    }


def _recomputed(gpu: str, folder: Path | None) -> tuple[Path, dict, dict, dict]:
    """``folder``'s ``profile.json`` (default: the committed ``calibration/profiles/<gpu>/``),
    its document, its ``intervals`` recomputed from its rows, its fits as they are, and its
    classes' head dimensions from the same rows."""
    committed = folder is None
    folder = folder or ceilings.PROFILES / gpu
    path = folder / "profile.json"
    if not path.is_file():
        raise ValueError(f"no fitted profile for {gpu!r} ({path} is missing)")
    profile = json.loads(path.read_text())
    if profile.get("gpu") != gpu:
        raise ValueError(f"{path} is a profile of {profile.get('gpu')!r}, not {gpu!r}")
    rows = ceilings.profile_rows(gpu, folder)
    ceiling = {
        "hbm_bytes_per_s": profile["ceilings"]["copy_bytes_per_s"],
        "bf16_flops_per_s": profile["ceilings"]["gemm_flops_per_s"],
    }
    loo = committed_loo(gpu) if committed else None
    measured = measured_by_class(rows, gpu)
    return path, profile, intervals_json(gpu, rows, ceiling, profile, loo), measured


def add_intervals(gpu: str, folder: Path | None = None) -> dict:
    """Recompute the ``intervals`` of ``folder``'s ``profile.json`` (default: the committed
    ``calibration/profiles/<gpu>/``) and what its classes' rows span beside their fits
    (``calibration.fit.measured_by_class``), leaving its fits as they are; written in place.
    Returns the profile."""
    path, profile, got, measured = _recomputed(gpu, folder)
    profile["intervals"] = got
    for name, entry in profile["classes"].items():
        for key in MEASURED_KEYS:
            entry.pop(key, None)
        entry.update(measured.get(name, {}))
    atomic_write(path, dumps(profile))
    return profile


def measured_differences(profile: dict, measured: dict[str, dict]) -> list[str]:
    """Where the classes of ``profile`` store another span of their rows than ``measured``
    (``calibration.fit.measured_by_class``)."""
    return [
        f"{name} {key}: {measured.get(name, {}).get(key)!r}, stored {entry.get(key)!r}"
        for name, entry in sorted(profile["classes"].items())
        for key in MEASURED_KEYS
        if entry.get(key) != measured.get(name, {}).get(key)
    ]


def differences(got: dict, want: dict, rel: float = 1e-9) -> list[str]:
    """Where the ``intervals`` document ``got`` differs from ``want``: row counts, the other
    GPUs, the sets and families present, and each residual figure beyond ``rel`` (a refit of
    the leave-out sets under other numerical libraries moves figures in their last bits)."""
    out = [
        f"{k}: {got.get(k)!r}, stored {want.get(k)!r}"
        for k in ("coverage", "rows", "cross_gpus")
        if got.get(k) != want.get(k)
    ]
    for name in sorted(set(got["sets"]) | set(want["sets"])):
        g, w = got["sets"].get(name, {}), want["sets"].get(name, {})
        for fam in sorted(set(g) | set(w)):
            if fam not in g or fam not in w:
                out.append(f"{name}/{fam}: {'missing' if fam not in g else 'not stored'}")
                continue
            for key, stored in w[fam].items():
                new = g[fam].get(key)
                if new is None or abs(new - stored) > rel * abs(stored) + 1e-12:
                    out.append(f"{name}/{fam} {key}: {new!r}, stored {stored!r}")
    return out


def check_intervals(gpu: str, folder: Path | None = None) -> list[str]:
    """The differences between the stored ``intervals`` and measured spans of ``folder``'s
    profile (default: the committed one) and those its rows give now."""
    _, profile, got, measured = _recomputed(gpu, folder)
    stored = profile.get("intervals") or {"sets": {}}
    return differences(got, stored) + measured_differences(profile, measured)


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="registry GPU whose committed profile to update")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the stored intervals or measured spans differ from those the rows "
        "give; write nothing",
    )
    args = ap.parse_args(argv)
    try:
        if args.check:
            diffs = check_intervals(args.gpu)
        else:
            profile = add_intervals(args.gpu)
    except ValueError as e:  # no profile of that GPU, or a profile of another one
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    if args.check:
        for line in diffs:
            print(f"{args.gpu} intervals: {line}", file=sys.stderr)
        return 1 if diffs else 0
    n = profile["intervals"]["rows"]
    print(
        f"profile {profile['profile_id']}: residuals of "
        + ", ".join(f"{k} {v} rows" for k, v in n.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
