"""Test sets that measure transfer: how well the calibrated model predicts configurations its
fit never saw, computed from the committed rows (``ssvkit validate --sets ...``).

- ``head``: leave one head geometry (``num_q_heads``, ``num_kv_heads``, ``head_dim``) out;
- ``group``: leave one group size out;
- ``context``: leave one context length out;
- ``gpu``: cross-GPU -- fit on one GPU's rows and predict another's with that GPU's measured
  copy and GEMM ceilings, in both directions where the rows allow a fit;
- ``unseen``: the test design's calls (``calibration.unseen_set``), predicted by the committed
  profile, where the GPU has them.

A leave-one-out set refits, for each value of its parameter, every class that has rows with
that value on the class's other rows (``leave_one_out_rows``) and predicts the left-out rows.
Rows that no fit can predict (a class measured at one value only, a class the other GPU's rows
do not fit) are counted apart and do not enter the targets. The interpolation split stays
``calibration.validate``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections import Counter

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import UNFITTED_OPS, error_stats, fit_profile, op_class
from ssvkit.calibration.row_work import (
    is_plan_priced,
    merge_generation,
    sparse_mode,
    union_plan_generation,
)
from ssvkit.calibration.validate import annotate
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.profiles import Profile

LEAVE_ONE_OUT = ("head", "group", "context")
TRANSFER_SETS = (*LEAVE_ONE_OUT, "gpu", "unseen")
SETS = ("interp", *TRANSFER_SETS)
TARGETS = {
    "leave_one_out": {"median_ape": 0.06, "p90_ape": 0.15},
    "cross_gpu": {"median_ape": 0.08, "p90_ape": 0.15},
}
TITLES = {
    "head": "leave one head geometry (num_q_heads, num_kv_heads, head_dim) out",
    "group": "leave one group size out",
    "context": "leave one context length out",
}
HEAD_GEOMETRY = ("num_q_heads", "num_kv_heads", "head_dim")
_GROUP = re.compile(r"/C(\d+)/")


def left_out_value(name: str, row: dict):
    """The value of ``row`` that the leave-one-out set ``name`` leaves out, or None when the
    row has none (the row is not part of the set). A sparse verification row's group size is its
    ``group_size`` (rows of the ``per_query`` launch have none: ``per_query`` rows and groups of
    one query, ``row_work.sparse_mode``); a sparse verification class (per kernel path and grid
    regime) prices every group size from its launch plan's work."""
    p = row["params"]
    if name == "head":
        geometry = tuple(p.get(k) for k in HEAD_GEOMETRY)
        return None if all(x is None for x in geometry) else geometry
    if name == "group":
        if row["op"] == "sparse_verify":
            return None if sparse_mode(row) == "per_query" else p["group_size"]
        m = _GROUP.search(op_class(row))
        return int(m.group(1)) if m else None
    if name == "context":
        return p.get("context_len")
    raise ValueError(f"unknown leave-one-out set {name!r} (choose from {LEAVE_ONE_OUT})")


def value_name(name: str, value) -> str:
    """A left-out value as the reports name it: a head geometry ``<q>q/<kv>kv/d<D>``, a group
    size ``C=<size>``, a context length in tokens."""
    if name == "head":
        return geometry_name({"params": dict(zip(HEAD_GEOMETRY, value, strict=True))})
    return f"C={value}" if name == "group" else str(value)


def geometry_name(row: dict) -> str:
    """``<query heads>q/<KV heads>kv/d<head dim>`` of a row."""
    p = row["params"]
    return f"{p['num_q_heads']}q/{p['num_kv_heads']}kv/d{p['head_dim']}"


def by_geometry(annotated: list[dict]) -> dict[str, dict]:
    """Every family's errors together, per head geometry of the rows that have one, with the
    median signed error (``median_error``: predicted / measured - 1; negative where the
    prediction is low)."""
    headed = [r for r in annotated if r["params"].get("num_q_heads") is not None]
    out = {}
    for g in sorted({geometry_name(r) for r in headed}, key=_natural):
        sub = [r for r in headed if geometry_name(r) == g]
        pred = np.array([r["predicted_s"] for r in sub])
        meas = np.array([r["median_s"] for r in sub])
        out[g] = {**error_stats(pred, meas), "median_error": float(np.median(pred / meas - 1))}
    return out


def parse_sets(text: str) -> tuple[str, ...]:
    """The sets of a comma-separated list, in ``SETS`` order; ``all`` is every set."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return SETS
    bad = [s for s in names if s not in SETS] or ([] if names else [text])
    if bad:
        raise ValueError(f"unknown test set {bad[0]!r}: choose from {', '.join(SETS)} or all")
    return tuple(s for s in SETS if s in names)


def fitted_rows(rows: list[dict]) -> list[dict]:
    """The rows a profile fits: CUDA-graph timings of op classes."""
    return [r for r in rows if r["timing"] == "graph" and r["op"] not in UNFITTED_OPS]


def fit_classes(rows: list[dict], gpu: str, ceiling: dict) -> dict[str, ClassFit]:
    """The class fits of ``fit_profile`` on ``rows`` (classes with too few fit rows absent)."""
    if not rows:
        return {}
    profile, _ = fit_profile(rows, gpu, ceiling)
    return Profile.from_json(profile).classes


def predicting_class(name: str, classes: dict) -> str | None:
    """The class whose fit predicts rows of class ``name``: itself when fitted, else for a
    group-size class the fitted class of the nearest group size (the smaller on a tie) of the
    same mode and regime; None when there is none."""
    if name in classes:
        return name
    m = _GROUP.search(name)
    if not m:
        return None
    family = _GROUP.sub("/C*/", name)
    c = int(m.group(1))
    sizes = [
        int(_GROUP.search(k).group(1))
        for k in classes
        if _GROUP.search(k) and _GROUP.sub("/C*/", k) == family
    ]
    if not sizes:
        return None
    return _GROUP.sub(f"/C{min(sizes, key=lambda s: (abs(s - c), s))}/", name)


def predict(rows: list[dict], classes: dict, gpu: str, ceiling: dict) -> tuple[list, dict]:
    """``rows`` annotated with the prediction of their predicting class (``predicting_class``)
    on ``gpu`` with ``ceiling``'s copy and GEMM rates, each with its ``from`` class; and the
    count of rows per class that no fit predicts."""
    by_name = {op_class(r) for r in rows}
    chosen = {c: predicting_class(c, classes) for c in by_name}
    profile = Profile(
        profile_id="transfer",
        gpu=gpu,
        device_name="",
        copy_bytes_per_s=ceiling["hbm_bytes_per_s"],
        gemm_flops_per_s=ceiling["bf16_flops_per_s"],
        classes={c: classes[k] for c, k in chosen.items() if k is not None},
    )
    annotated = [{**r, "from": chosen[r["class"]]} for r in annotate(rows, profile)]
    missing = Counter(c for c in map(op_class, rows) if chosen[c] is None)
    return annotated, dict(missing)


def summarize(annotated: list[dict], missing: dict, target: dict, values=None) -> dict:
    """Per class: n, median / p90 / max APE, the classes whose fits predicted it, the left-out
    values it has (``values``), and whether it meets ``target``; where the rows name the value
    left out of their fit (``left_out``), the errors per value (``by_left_out``, with the median
    signed error: where a class misses, which value's refit it misses on, and in which
    direction); the same errors per op family (every class of one op, the part of its name
    before the first ``/``, together); the rows no fit predicts; and whether every predicted
    class meets the target."""
    classes = {}
    for c in sorted({r["class"] for r in annotated}):
        sub = [r for r in annotated if r["class"] == c]
        stats = error_stats(
            np.array([r["predicted_s"] for r in sub]), np.array([r["median_s"] for r in sub])
        )
        stats["from"] = sorted({r["from"] for r in sub})
        if values is not None:
            stats["values"] = len(values[c])
        if all("left_out" in r for r in sub):
            stats["by_left_out"] = _by_left_out(sub, target["p90_ape"])
        stats["met"] = all(stats[k] <= t for k, t in target.items())
        classes[c] = stats
    families = {}
    for fam in sorted({r["class"].split("/")[0] for r in annotated}):
        sub = [r for r in annotated if r["class"].split("/")[0] == fam]
        families[fam] = error_stats(
            np.array([r["predicted_s"] for r in sub]), np.array([r["median_s"] for r in sub])
        )
    return {
        "target": target,
        "classes": classes,
        "families": families,
        "unpredicted": dict(sorted(missing.items())),
        "met": all(s["met"] for s in classes.values()),
    }


def _by_left_out(rows: list[dict], p90_target: float) -> dict[str, dict]:
    """The errors of ``rows`` per left-out value (numbers in their numeric order), each with its
    median signed error (``median_error``: predicted / measured - 1; negative where the refit
    prices low) and its rows whose APE exceeds ``p90_target`` (``beyond_p90_target``)."""
    out = {}
    for v in sorted({r["left_out"] for r in rows}, key=_natural):
        sub = [r for r in rows if r["left_out"] == v]
        pred = np.array([r["predicted_s"] for r in sub])
        meas = np.array([r["median_s"] for r in sub])
        out[v] = {
            **error_stats(pred, meas),
            "median_error": float(np.median(pred / meas - 1)),
            "beyond_p90_target": int(np.sum(np.abs(pred / meas - 1) > p90_target)),
        }
    return out


def _natural(name: str) -> list:
    """A sort key that orders the numbers in ``name`` by value (``8kv`` before ``16kv``)."""
    return [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"(\d+)", name)]


def worst_left_out(stats: dict) -> tuple[str, dict] | None:
    """The left-out value of a class's ``summarize`` stats with the most rows beyond the p90
    target (the largest p90 APE among equals): where the class's misses concentrate; and its
    errors. None without per-value errors."""
    by = stats.get("by_left_out")
    if not by:
        return None
    return max(by.items(), key=lambda kv: (kv[1]["beyond_p90_target"], kv[1]["p90_ape"]))


# Leave-one-out sets already computed in this process, by set, GPU, the rows' checksums and the
# ceilings: a fit of a folder holding the committed rows (``calibration.fit.fit_folder``) finds
# the sets ``ssvkit validate`` computed, instead of refitting every left-out value again.
_LOO_MEMO: dict[tuple, tuple[list[dict], Counter, dict[str, set]]] = {}


def leave_one_out_rows(
    name: str, rows: list[dict], gpu: str, ceiling: dict, base: dict
) -> tuple[list[dict], Counter, dict[str, set]]:
    """The rows of the leave-one-out set ``name`` of ``gpu``'s rows, each annotated with the
    prediction of a fit without its value: for each value, every class that has rows with it is
    refitted on its other rows; ``base`` holds the fits of all rows, which a class without the
    value keeps (its rows, and so its fit, are unchanged); each refit is
    ``calibration.fit.fit_profile``'s, held-out rule included. Also the count of rows per class no
    fit predicts and the left-out values of each class. Sealed rows (each with its checksum) are
    computed once per process."""
    sums = tuple(r.get("checksum") for r in rows)
    key = (name, gpu, sums, repr(sorted(ceiling.items()))) if all(sums) else None
    if key is not None and key in _LOO_MEMO:
        return _LOO_MEMO[key]
    out = _leave_one_out_rows(name, rows, gpu, ceiling, base)
    if key is not None:
        _LOO_MEMO[key] = out
    return out


def _leave_one_out_rows(
    name: str, rows: list[dict], gpu: str, ceiling: dict, base: dict
) -> tuple[list[dict], Counter, dict[str, set]]:
    graph = [r for r in fitted_rows(rows) if left_out_value(name, r) is not None]
    values: dict[str, set] = {}
    for r in graph:
        values.setdefault(op_class(r), set()).add(left_out_value(name, r))
    annotated, missing = [], Counter()
    for v in sorted({left_out_value(name, r) for r in graph}, key=repr):
        left = [r for r in graph if left_out_value(name, r) == v]
        hit = {op_class(r) for r in left}
        kept = [r for r in fitted_rows(rows) if op_class(r) in hit and left_out_value(name, r) != v]
        classes = {k: f for k, f in base.items() if k not in hit}
        classes.update(fit_classes(kept, gpu, ceiling))
        got, miss = predict(left, classes, gpu, ceiling)
        annotated += [{**r, "left_out": value_name(name, v)} for r in got]
        missing.update(miss)
    return annotated, missing, values


def leave_one_out(name: str, rows: list[dict], gpu: str, ceiling: dict, base: dict) -> dict:
    """The leave-one-out set ``name`` of ``gpu``'s rows (``leave_one_out_rows``), summarized."""
    return _loo_summary(name, *leave_one_out_rows(name, rows, gpu, ceiling, base))


def _loo_summary(name: str, annotated: list[dict], missing: Counter, values: dict) -> dict:
    return {
        **summarize(annotated, missing, TARGETS["leave_one_out"], values),
        "title": TITLES[name],
    }


def same_kernels(
    rows: list[dict], classes: dict, fit_generations: dict[str, dict[str, set]] | None = None
) -> tuple[list[dict], Counter]:
    """``rows`` whose predicting class (``predicting_class``) was fitted on rows of the same
    kernels, and the count per class of the others. A class fitted on its kernels' launch-plan
    counts (``ClassFit.slot_plan``) describes the current kernels (``row_work.is_plan_priced``);
    one fitted otherwise describes earlier ones (NSA before the slot plan, selection with the
    torch pick). A sparse verification call runs launches whose kernels changed: a split call's
    merge (``row_work.merge_generation``), a union call's plan
    (``row_work.union_plan_generation``). Such a row is compared only where its class's fit rows
    of that launch (``fit_generations``: ``generations_by_class`` of the fit rows) ran the same
    kernel. Pricing one generation's rows with the other's fit measures the kernels' change, not
    the model's transfer between GPUs. Rows no class predicts stay (``predict`` counts them)."""
    fit_generations = fit_generations or {}
    same, other = [], Counter()
    for r in rows:
        name = predicting_class(op_class(r), classes)
        fit = fit_generations.get(name, {})
        if name is not None and (
            classes[name].slot_plan != is_plan_priced(r)
            or any(fit.get(kind, set()) - {gen} for kind, gen in _generations(r).items())
        ):
            other[op_class(r)] += 1
        else:
            same.append(r)
    return same, other


# Launch paths of one kernel generation: a split call of the current kernels merges in a launch
# of its own ("tile") or in its last split programs ("fused"), as its launch plan says, and a
# class prices both from that plan; a fit of either path describes the other's kernels.
SAME_GENERATION = {"fused": "tile"}


def _generations(row: dict) -> dict[str, str]:
    """The changed launches a row's call ran, by kind (``merge``, ``union_plan``): the kernel
    generation of each (``SAME_GENERATION``: paths of one generation count as one)."""
    gens = {"merge": merge_generation(row), "union_plan": union_plan_generation(row)}
    return {kind: SAME_GENERATION.get(gen, gen) for kind, gen in gens.items() if gen is not None}


def generations_by_class(rows: list[dict]) -> dict[str, dict[str, set]]:
    """Per class of ``rows``: per changed launch (``_generations``), the kernel generations its
    rows ran."""
    out: dict[str, dict[str, set]] = {}
    for r in rows:
        for kind, gen in _generations(r).items():
            out.setdefault(op_class(r), {}).setdefault(kind, set()).add(gen)
    return out


def cross_gpu(
    fit_gpu: str, fit: dict, fit_rows: list[dict], other: str, rows: list[dict], ceiling: dict
) -> dict:
    """``other``'s rows predicted by ``fit_gpu``'s class fits ``fit`` (of its rows ``fit_rows``)
    with ``other``'s measured ceilings ``ceiling``: the rows of the kernels the fits describe
    (``same_kernels``); the count per class of the rest, which time other kernels, under
    ``other_kernels``."""
    generations = generations_by_class(fitted_rows(fit_rows))
    same, other_kernels = same_kernels(fitted_rows(rows), fit, generations)
    annotated, missing = predict(same, fit, other, ceiling)
    out = summarize(annotated, missing, TARGETS["cross_gpu"])
    out["title"] = (
        f"fit on {fit_gpu}'s rows, predict {other}'s with its measured ceilings "
        "(both GPUs' rows of the current kernels)"
    )
    out["other_kernels"] = dict(sorted(other_kernels.items()))
    out["geometries"] = by_geometry(annotated)
    return out


def measured_gpus() -> tuple[str, ...]:
    """The GPUs with committed measurement rows."""
    return tuple(g for g in ceilings.DEVICE_NAMES if any((ceilings.PROFILES / g).glob("*.jsonl")))


@functools.lru_cache(maxsize=4)
def _committed(gpu: str) -> tuple[list[dict], dict, dict]:
    """``gpu``'s committed rows, the ceilings derived from them, and the class fits of all of
    them (the rows are package data: one process reads and fits them once)."""
    rows = ceilings.profile_rows(gpu)
    ceiling = ceilings.derive(gpu, rows)["ceilings"]
    return rows, ceiling, fit_classes(fitted_rows(rows), gpu, ceiling)


@functools.lru_cache(maxsize=4)
def current_kernels(gpu: str) -> tuple[list[dict], dict, dict]:
    """``_committed`` of ``gpu``'s rows of the current kernels (``ceilings.current_kernel_rows``:
    its profile's rows, with the families its profile of record does not fit yet timed again),
    the ceilings their runs measured and the class fits of them: what the cross-GPU sets fit on
    and predict, so both sides time the same kernels wherever both GPUs have timed them."""
    if not ceilings.has_unfitted(gpu):
        return _committed(gpu)
    rows = ceilings.current_kernel_rows(gpu)
    ceiling = ceilings.derive(gpu, rows)["ceilings"]
    return rows, ceiling, fit_classes(fitted_rows(rows), gpu, ceiling)


@functools.lru_cache(maxsize=16)
def committed_leave_one_out_rows(gpu: str, name: str) -> tuple[list[dict], Counter, dict]:
    """``leave_one_out_rows`` of the set ``name`` on ``gpu``'s committed rows, the fits of all
    of them standing for the classes without the value (computed once per process)."""
    rows, ceiling, base = _committed(gpu)
    return leave_one_out_rows(name, rows, gpu, ceiling, base)


@functools.lru_cache(maxsize=16)
def _committed_set(gpu: str, name: str) -> dict:
    """The set ``name`` of ``gpu``'s committed rows, keyed as ``transfer_report`` keys it."""
    if name in LEAVE_ONE_OUT:
        return {name: _loo_summary(name, *committed_leave_one_out_rows(gpu, name))}
    out = {}
    rows, ceiling, base = current_kernels(gpu)
    for other in measured_gpus():
        if other != gpu:
            o_rows, o_ceiling, o_fit = current_kernels(other)
            out[f"{gpu}->{other}"] = cross_gpu(gpu, base, rows, other, o_rows, o_ceiling)
            out[f"{other}->{gpu}"] = cross_gpu(other, o_fit, o_rows, gpu, rows, ceiling)
    return out


def transfer_report(gpu: str = "h100-sxm", sets=TRANSFER_SETS) -> dict:
    """The transfer sets of ``sets`` for the fit GPU ``gpu``, by set key: the leave-one-out
    sets by name, the cross-GPU sets as ``<fit gpu>-><predicted gpu>`` for every other GPU with
    rows, both directions. Computed from the committed rows once per process."""
    out = {}
    for name in TRANSFER_SETS:
        if name in sets and name != "unseen":
            out.update(copy.deepcopy(_committed_set(gpu, name)))
    if "unseen" in sets:
        # Imported here: the set summarizes with this module's functions.
        from ssvkit.calibration.unseen_set import unseen_set

        unseen = unseen_set(gpu)
        if unseen is not None:
            out["unseen"] = unseen
    return out
