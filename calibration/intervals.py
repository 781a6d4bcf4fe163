"""The residual sets that a fitted profile's prediction intervals come from, computed from the
committed rows and stored in the profile under ``intervals`` (read by ``perfmodel.intervals``).

    python -m ssvkit.calibration.intervals --gpu h100-sxm   # profile.json's intervals, in place

Per kernel family (``perfmodel.intervals.kernel_family``), the log residuals ln(measured /
predicted) of rows that the predicting fit never saw:

- ``heldout``: the interpolation split's held-out rows (``calibration.fit.is_heldout``) under the
  profile's own class fits;
- ``leave_one_out``: the rows of the leave-one-head-geometry-, group-size- and context-out sets
  that ``ssvkit validate`` prints (``calibration.transfer_sets.leave_one_out_rows``), each
  predicted by a refit of its classes without its value, a fit of all the rows standing for the
  classes without it: the fitting procedure's error on values it never saw;
- ``cross_gpu``: every other GPU's committed rows predicted by the profile's fits on that GPU's
  measured ceilings (``calibration.transfer_sets.predict``: a group size the profile lacks is
  priced by the nearest one).

Of each set, per family and pooled over families (``"*"``), the median and the split-conformal
bounds of a central ``COVERAGE`` interval (``perfmodel.intervals.Residuals.of``). The fit
(``calibration.fit.fit_folder``) stores them with every profile; this command recomputes them
for a committed profile without refitting it, since a refit under other numerical libraries can
land on another optimum of equal error (``calibration.validate.fit_agreement``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from scipy.stats import binomtest
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import dumps, is_heldout
from ssvkit.calibration.transfer_sets import (
    LEAVE_ONE_OUT,
    committed_leave_one_out_rows,
    fit_classes,
    fitted_rows,
    leave_one_out_rows,
    measured_gpus,
    predict,
)
from ssvkit.calibration.validate import annotate, ratio_pairs
from ssvkit.perfmodel.calibrated import Profile
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.intervals import (
    COVERAGE,
    POOLED,
    SETS,
    Residuals,
    Spread,
    bounds,
    interval,
    kernel_family,
)
from ssvkit.perfmodel.rows import canonical

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
) -> dict:
    """The annotated rows of each residual set (module docstring) of ``profile``, fitted on
    ``gpu``'s ``rows`` with measured ceilings ``ceiling``, ``loo`` the leave-one-out sets' when
    already computed (``committed_leave_one_out_rows``); and the other GPUs of ``cross_gpu``."""
    heldout = [r for r in annotate(rows, profile) if is_heldout(r)]
    if loo is None:
        base = fit_classes(fitted_rows(rows), gpu, ceiling)
        loo = [r for n in LEAVE_ONE_OUT for r in leave_one_out_rows(n, rows, gpu, ceiling, base)[0]]
    cross, others = [], []
    for other in measured_gpus():
        if other == gpu:
            continue
        o_rows = ceilings.profile_rows(other)
        o_ceiling = ceilings.derive(other, o_rows)["ceilings"]
        got = predict(fitted_rows(o_rows), profile.classes, other, o_ceiling)[0]
        cross += got
        others.append(other)
    return {"heldout": heldout, "leave_one_out": loo, "cross_gpu": cross}, tuple(others)


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


def add_intervals(gpu: str, folder: Path | None = None) -> dict:
    """Recompute the ``intervals`` of ``folder``'s ``profile.json`` (default: the committed
    ``calibration/profiles/<gpu>/``) from its rows, leaving its fits as they are; written in
    place. Returns the profile."""
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
    profile["intervals"] = intervals_json(gpu, rows, ceiling, profile, loo)
    atomic_write(path, dumps(profile))
    return profile


def half(row: dict) -> int:
    """0 or 1: a fixed split of the rows in two halves, by hash bits other than the held-out
    rule's, for checking intervals on rows they were not derived from."""
    key = canonical({"op": row["op"], "params": row["params"], "timing": row["timing"]})
    return int(hashlib.sha1(key.encode()).hexdigest()[8:16], 16) % 2


def _family_residuals(table: dict, name: str, family: str) -> Residuals:
    """A set's residuals of ``family`` from a ``residual_table``, else its pooled ones."""
    fams = table[name]
    source = name if family in fams else f"{name}, all families"
    return Residuals(source, **fams.get(family, fams[POOLED]))


def row_coverage(table: dict, name: str, annotated: list[dict]) -> tuple[int, int]:
    """How many of ``annotated`` rows measured inside the interval their family's residuals of
    set ``name`` in ``table`` give their prediction; and how many rows."""
    inside = 0
    for r in annotated:
        res = _family_residuals(table, name, kernel_family(r["class"]))
        inside += res.low <= float(np.log(r["median_s"] / r["predicted_s"])) <= res.high
    return inside, len(annotated)


def ratio_coverage(table: dict, name: str, pairs: list[dict]) -> tuple[int, int]:
    """How many ratio pairs (``calibration.validate.ratio_pairs``) measured inside the interval
    ``perfmodel.intervals.interval`` gives their predicted ratio, each side one op with its
    family's residuals of set ``name``; and how many pairs."""
    inside = 0
    for p in pairs:
        sides = []
        for row in p["rows"]:
            sp = Spread.zeros(1, 1)
            res = _family_residuals(table, name, kernel_family(row["class"]))
            sp.add_op(np.array([row["predicted_s"]]), 0, res)
            sides.append(sp)
        over, under = (bounds(sp) for sp in sides)
        lo, hi = interval(np.array([p["predicted"]]), over=over, under=under)[0]
        inside += lo <= p["measured"] <= hi
    return inside, len(pairs)


def coverage_check(inside: int, n: int, coverage: float = COVERAGE) -> dict:
    """The observed coverage and the one-sided binomial p-value of seeing at most ``inside`` of
    ``n`` if the true coverage were ``coverage``: a small p says the intervals cover less."""
    p = binomtest(inside, n, coverage, alternative="less").pvalue if n else float("nan")
    inside, n = int(inside), int(n)
    return {"inside": inside, "n": n, "coverage": inside / n if n else float("nan"), "p": float(p)}


def heldout_coverage(annotated: list[dict], coverage: float = COVERAGE) -> list[dict]:
    """The held-out split's intervals derived from one half of the held-out rows and checked on
    the other half's rows and on the held-out ratio pairs whose held-out rows all lie in it,
    both ways round (``half``)."""
    held = [r for r in annotated if r["split"] == "heldout"]
    pairs = [p for p in ratio_pairs(annotated) if p["heldout"]]
    out = []
    for h in (0, 1):
        table = residual_table({"heldout": [r for r in held if half(r) == h]}, coverage)
        rows = [r for r in held if half(r) != h]
        mine = [p for p in pairs if all(half(r) != h for r in p["rows"] if r["split"] == "heldout")]
        for what, got in (
            ("rows", row_coverage(table, "heldout", rows)),
            ("ratios", ratio_coverage(table, "heldout", mine)),
        ):
            out.append(
                {
                    "from": f"half {h}",
                    "checked_on": f"{what} of half {1 - h}",
                    **coverage_check(*got, coverage),
                }
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="registry GPU whose committed profile to update")
    args = ap.parse_args(argv)
    profile = add_intervals(args.gpu)
    n = profile["intervals"]["rows"]
    print(
        f"profile {profile['profile_id']}: residuals of "
        + ", ".join(f"{k} {v} rows" for k, v in n.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
