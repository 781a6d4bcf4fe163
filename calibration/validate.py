"""Measured-vs-predicted error of a fitted profile: per op class and overall, fit and held-out
rows apart, and the error of predicted *ratios* (the figures users act on).

Ratios compare two rows of the same configuration but one knob (``ratio_pairs`` lists them): a
grouped sparse mode against per-query loads, 16 query rows against 1, sparse against dense, NSA
fused against unfused, repair against recompute. A ratio counts as held out when either of its
two rows is. Error = |predicted / measured - 1|.
"""

from __future__ import annotations

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.error_table import ape_markdown_row, markdown_header
from ssvkit.calibration.features import depth, features, serial_steps, stage_counts, tile_rows
from ssvkit.calibration.fit import UNFITTED_OPS, error_stats, is_heldout, op_class
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.rows import DERIVED

TARGETS = {"heldout_median_ape": 0.05, "heldout_p90_ape": 0.10, "heldout_ratio_median": 0.05}


# The shape both sides of ``sparse_vs_dense`` share (the two ops have different knobs).
SHARED_SHAPE = (
    "context_len",
    "batch",
    "num_query_tokens",
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
    "dtype",
)


def _key(r: dict, knobs: tuple[str, ...]) -> tuple:
    """Every configuration param of ``r`` but ``knobs``: rows with equal keys are the same
    configuration (geometry included) but for the knobs."""
    p = r["params"]
    return tuple(sorted((k, repr(v)) for k, v in p.items() if k not in knobs and k not in DERIVED))


def _shape(r: dict) -> tuple:
    return tuple(r["params"].get(n) for n in SHARED_SHAPE)


def _index(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


# The params a ratio pair records, of its first row.
PAIR_PARAMS = (
    "context_len",
    "batch",
    "top_n",
    "overlap",
    "group_size",
    "num_query_tokens",
    "missed_blocks",
    "mode",
    "impl",
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
)


def ratio_pairs(rows: list[dict]) -> list[dict]:
    """Pairs of annotated rows (with ``predicted_s`` and ``split``) and their ratios.

    A pair's two rows match in every configuration param but the knob the ratio varies (head
    counts and head size included), whatever the order of ``rows``; a row pairs with every
    base row of its configuration. The kinds:

    - ``union_vs_per_query`` / ``shared_vs_per_query``: a grouped sparse mode against per-query
      loads at the same context, top_n, overlap and batch;
    - ``t16_vs_t1``: dense verification of 16 query rows against 1, same context and batch;
    - ``sparse_vs_dense``: per-query sparse verification against dense, both at t = 16, same
      context and batch (``SHARED_SHAPE``);
    - ``nsa_fused_vs_unfused``: the fused NSA path against its three separate branches, on one
      stream or side by side (``params.branch_streams``);
    - ``repair_vs_recompute``: repairing the missed blocks against recomputing all selected
      ones."""
    sparse = [r for r in rows if r["op"] == "sparse_verify"]
    mode_knobs = ("mode", "group_size")
    per_query = [r for r in sparse if r["params"]["mode"] == "per_query"]
    out = _ratios(sparse, per_query, lambda r: _key(r, mode_knobs), _grouped_kind)
    dense = [r for r in rows if r["op"] == "dense_verify"]
    t_knob = ("num_query_tokens",)
    t1 = [r for r in dense if r["params"]["num_query_tokens"] == 1]
    t16_kind = _kind_where("t16_vs_t1", "num_query_tokens", 16)
    out += _ratios(dense, t1, lambda r: _key(r, t_knob), t16_kind)
    d16 = [r for r in dense if r["params"]["num_query_tokens"] == 16]
    out += _ratios(sparse, d16, _shape, _sparse_dense_kind)
    nsa = [r for r in rows if r["op"] == "nsa_verify"]
    impl = ("impl", "branch_streams")  # only unfused rows carry branch_streams
    unfused = [r for r in nsa if r["params"]["impl"] == "unfused"]
    fused_kind = _kind_where("nsa_fused_vs_unfused", "impl", "fused")
    out += _ratios(nsa, unfused, lambda r: _key(r, impl), fused_kind)
    repair = [r for r in rows if r["op"] == "repair"]
    rep_knobs = ("mode", "missed_fraction")
    recompute = [r for r in repair if r["params"]["mode"] == "recompute"]
    repair_kind = _kind_where("repair_vs_recompute", "mode", "repair")
    return out + _ratios(repair, recompute, lambda r: _key(r, rep_knobs), repair_kind)


def _ratios(rows: list[dict], bases: list[dict], key, kind) -> list[dict]:
    """Every row of ``rows`` whose ``kind`` is not None over each row of ``bases`` with its
    ``key``."""
    index = _index(bases, key)
    return [
        _pair(k, r, b) for r in rows if (k := kind(r)) is not None for b in index.get(key(r), [])
    ]


def _kind_where(kind: str, knob: str, value):
    """The kind of a row whose param ``knob`` is ``value``, None for any other row."""
    return lambda r: kind if r["params"][knob] == value else None


def _grouped_kind(r: dict) -> str | None:
    """A grouped sparse mode (union or shared, groups of more than one query) against per-query
    loads."""
    mode, c = r["params"]["mode"], r["params"]["group_size"]
    return f"{mode}_vs_per_query" if mode in ("union", "shared") and c > 1 else None


def _sparse_dense_kind(r: dict) -> str | None:
    """Per-query sparse verification of 16 query rows against dense."""
    p = r["params"]
    return "sparse_vs_dense" if p["mode"] == "per_query" and p["num_query_tokens"] == 16 else None


def _pair(kind: str, a: dict, b: dict) -> dict:
    """The ratio of row ``a`` over row ``b``, measured and predicted; held out when either row
    is."""
    return {
        "kind": kind,
        "measured": a["median_s"] / b["median_s"],
        "predicted": a["predicted_s"] / b["predicted_s"],
        "heldout": a["split"] == "heldout" or b["split"] == "heldout",
        "rows": (a, b),
        "params": {k: v for k, v in a["params"].items() if k in PAIR_PARAMS},
    }


def report(annotated: list[dict], worst: int = 8) -> dict:
    """Error tables of annotated rows: per class and overall for each split, ratio errors per
    kind and overall, the worst rows, and whether the targets hold."""
    out: dict = {"classes": {}, "overall": {}, "ratios": {}, "worst": {}}
    for split in ("fit", "heldout"):
        sub = [r for r in annotated if r["split"] == split]
        pred = np.array([r["predicted_s"] for r in sub])
        meas = np.array([r["median_s"] for r in sub])
        out["overall"][split] = error_stats(pred, meas)
        ape = np.abs(pred / meas - 1) if len(sub) else np.array([])
        order = np.argsort(-ape)[:worst]
        out["worst"][split] = [
            {
                "class": sub[i]["class"],
                "params": sub[i]["params"],
                "measured_s": sub[i]["median_s"],
                "predicted_s": sub[i]["predicted_s"],
                "ape": float(ape[i]),
            }
            for i in order
        ]
    for cls in sorted({r["class"] for r in annotated}):
        out["classes"][cls] = {}
        for split in ("fit", "heldout"):
            sub = [r for r in annotated if r["class"] == cls and r["split"] == split]
            out["classes"][cls][split] = error_stats(
                np.array([r["predicted_s"] for r in sub]), np.array([r["median_s"] for r in sub])
            )
    pairs = ratio_pairs(annotated)
    for kind in sorted({p["kind"] for p in pairs}) + ["all"]:
        sel = [p for p in pairs if kind in ("all", p["kind"])]
        out["ratios"][kind] = {}
        for split, keep in (("fit", False), ("heldout", True)):
            s = [p for p in sel if p["heldout"] == keep]
            out["ratios"][kind][split] = error_stats(
                np.array([p["predicted"] for p in s]), np.array([p["measured"] for p in s])
            )
    h, hr = out["overall"]["heldout"], out["ratios"]["all"]["heldout"]
    values = {
        "heldout_median_ape": h.get("median_ape", float("inf")),
        "heldout_p90_ape": h.get("p90_ape", float("inf")),
        "heldout_ratio_median": hr.get("median_ape", float("inf")),
    }
    out["targets"] = {
        k: {"value": v, "threshold": TARGETS[k], "met": v <= TARGETS[k]} for k, v in values.items()
    }
    out["pairs"] = pairs
    return out


def annotate(rows: list[dict], profile: Profile) -> list[dict]:
    """Every graph row of a fitted class with the stored profile's prediction, its split, and
    whether the call lies inside its class's measured range (``ClassFit.in_range``: outside,
    ``ssvkit predict`` labels a figure extrapolated and widens its interval)."""
    spec = get_gpu(profile.gpu, measured=False)
    out = []
    for r in rows:
        if r["timing"] != "graph" or r["op"] in UNFITTED_OPS:
            continue
        cls = op_class(r)
        if cls not in profile.classes:
            continue
        nbytes, flops, dedup = features(r, spec)
        steps, rows, chain = serial_steps(r, spec.num_sms, spec), tile_rows(r, spec), depth(r, spec)
        pred = float(
            profile.call_time_s(
                cls, nbytes, max(flops, 1.0), dedup, chain, steps, rows, stage_counts(r, spec)
            )
        )
        bw, peak = profile.copy_bytes_per_s, profile.gemm_flops_per_s
        inside = profile.classes[cls].in_range(
            nbytes, max(flops, 1.0), bw, peak, chain, r["params"].get("head_dim", 0), steps
        )
        out.append(
            {
                **r,
                "class": cls,
                "predicted_s": pred,
                "split": "heldout" if is_heldout(r) else "fit",
                "in_range": bool(inside),
            }
        )
    return out


# Two fits of the same rows agree when their predictions are equal on the median row and
# within 5 % on 99 % of rows, and no class's fit or held-out median APE moves by two points.
AGREEMENT_LIMITS = {"median_rel_diff": 1e-3, "p99_rel_diff": 0.05, "max_median_ape_change": 0.02}


def disagreements(agreement: dict) -> list[str]:
    """The limits of ``AGREEMENT_LIMITS`` that a ``fit_agreement`` result exceeds."""
    return [
        f"{k} {agreement[k]:.3g} > {limit}"
        for k, limit in AGREEMENT_LIMITS.items()
        if agreement[k] > limit
    ]


def fit_agreement(rows: list[dict], a: dict, b: dict) -> dict:
    """How far two fitted profiles (JSON documents) of the same rows are apart: the relative
    difference of their predictions on every graph row (median, p99, max), and per class the
    larger change of its fit and held-out median APE.

    A profile's efficiency parameters are not all identified by its rows (a bandwidth-bound
    class says little about its FLOP efficiency), so a refit under another scipy or numpy build
    can stop at another optimum of equal error: a fit is reproducible in what it predicts, not
    in every parameter (nor in its id, a hash of them).
    """
    if set(a["classes"]) != set(b["classes"]):
        diff = sorted(set(a["classes"]) ^ set(b["classes"]))
        raise ValueError(f"the profiles fit different classes: {diff}")
    pa = annotate(rows, Profile.from_json(a))
    pb = annotate(rows, Profile.from_json(b))
    x = np.array([r["predicted_s"] for r in pa])
    rel = np.abs(x - np.array([r["predicted_s"] for r in pb])) / x
    ape_change = {}
    for name, ca in a["classes"].items():
        cb = b["classes"][name]
        ape_change[name] = max(
            (
                abs(ca["error"][s]["median_ape"] - cb["error"][s]["median_ape"])
                for s in ("fit", "heldout")
                if ca["error"][s].get("n") and cb["error"][s].get("n")
            ),
            default=0.0,
        )
    return {
        "rows": int(rel.size),
        "median_rel_diff": float(np.median(rel)),
        "p99_rel_diff": float(np.quantile(rel, 0.99)),
        "max_rel_diff": float(rel.max()),
        "max_median_ape_change": max(ape_change.values()),
        "median_ape_change": ape_change,
    }


def committed_report(gpu: str) -> tuple[Profile, list[dict], dict]:
    """The committed profile of ``gpu``, its committed rows annotated with its predictions, and
    their ``report``; ``ValueError`` when the profile is missing or of another device."""
    path = ceilings.PROFILES / gpu / "profile.json"
    if not path.is_file():
        raise ValueError(f"no calibrated profile for {gpu!r} ({path} is missing)")
    profile = Profile.load(path, gpu=gpu)
    rows = ceilings.profile_rows(gpu)
    if profile.device_name not in ceilings.DEVICE_NAMES[gpu]:
        raise ValueError(f"profile device {profile.device_name!r} does not match {gpu!r}")
    annotated = annotate(rows, profile)
    return profile, annotated, report(annotated)


def summary_markdown(rep: dict, pid: str) -> str:
    """The summary the README embeds (``ssvkit validate --markdown``; regenerated, never typed:
    the tests check it)."""
    h, f = rep["overall"]["heldout"], rep["overall"]["fit"]
    rh = rep["ratios"]["all"]["heldout"]
    lines = [
        f"Profile `{pid}` (`ssvkit validate --markdown`):",
        "",
        *markdown_header(("rows", "n", "median APE", "p90 APE", "max APE")),
    ]
    for name, d in (("held-out op times", h), ("fitted op times", f), ("held-out ratios", rh)):
        lines.append(ape_markdown_row(name, d))
    met = [f"{k} {'met' if t['met'] else 'missed'}" for k, t in rep["targets"].items()]
    lines += ["", "Targets: " + ", ".join(met) + "."]
    return "\n".join(lines)
