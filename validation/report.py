"""End-to-end validation: are the predicted speedups real? From the measurements of record only.
Sections (``build``), each with the data file it reads:

1. **kernels** -- the calibrated profile's held-out error (``calibration/profiles/<gpu>/``);
2. **verify step** -- per (baseline, context) of the campaign (``validation/data/campaign.json``,
   ``validation.e2e_campaign``): perfmodel's verify time vs the engine's CUDA-event verify step;
3. **end to end** -- predicted tokens/s (the loop's host time with the GPU host's fit,
   ``perfmodel.loop_host``; overlap from the planner evaluation's profile,
   ``validation/data/planner.json``) vs measured, and the speedups over ``ar_dense``;
4. **ranking** -- Kendall tau, regret and adaptive gain of the planner evaluation;
5. **simulator** -- ``sim`` replaying each seed-0 run's accepted counts vs its tokens/s.

Every run is priced with the NSA row schedule it was measured with, at its measured acceptance,
so the error is the performance model's, not the acceptance profile's (``campaign_section``).
The report renders as markdown and PNGs in ``validation.report_markdown``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.fit import error_stats
from ssvkit.calibration.validate import annotate, report
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.files import malformed, read_json
from ssvkit.perfmodel.hardware import get_gpu, gpu_names
from ssvkit.perfmodel.intervals import COVERAGE, interval
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Workload, parse_tree
from ssvkit.perfmodel.trace import dumps_trace, make_header, make_round
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens
from ssvkit.planner.profile import profile_from_json
from ssvkit.sim.config import SimConfig
from ssvkit.sim.scenarios import simulate
from ssvkit.validation.decode_figures import (
    inside,
    loop_of_run,
    prediction_intervals,
    verify_forward_s,
)
from ssvkit.validation.records import local_model, measured_strategy, project_label, record_path
from ssvkit.validation.stats import regime_resolution, set_resolution

REPORT_VERSION = 1
TARGETS = {"verify_median_ape": 0.08, "tokens_per_s_median_ape": 0.10, "speedup_median_ape": 0.08}
BASELINE_ORDER = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv", "ssv_planned")


def kernel_section(gpu: str) -> dict:
    """The calibrated profile of ``gpu`` and its error on the held-out rows."""
    folder = ceilings.PROFILES / gpu
    path = folder / "profile.json"
    if not path.is_file():
        raise ValueError(f"no calibrated profile for {gpu!r} ({path} is missing)")
    profile = Profile.load(path, gpu=gpu)
    rep = report(annotate(ceilings.profile_rows(gpu, folder), profile))
    return {
        "source": project_label(path),
        "rows": project_label(folder),
        "profile_id": profile.profile_id,
        "overall": rep["overall"],
        "ratios": rep["ratios"]["all"],
        "targets": rep["targets"],
    }


def _predict(model, gpu, s, context_len: int, alpha: float, gamma: float, elementwise, loop):
    wl = Workload(
        context_len=context_len,
        acceptance=min(max(alpha, 0.0), 1.0),
        overlap=min(max(gamma, 0.0), 1.0),
        elementwise=elementwise,
        loop=loop,
    )
    cols = build_columns(model, [(s, wl)])
    drafter = (
        DrafterSpec(kind="draft_model", model=s.drafter.model)
        if s.drafter.kind == "draft_model" and s.drafter.model
        else None
    )
    if drafter is not None:
        get_model(drafter.model)  # fails with the model's name when it cannot be found
    return predict_columns(model, cols, make_predictor(gpu, "bf16", cols.tp), drafter)


def _campaign_row(campaign, model_label, model, gpu, profile, runs, sim: bool) -> dict:
    """One (baseline, context) of the campaign: its seeds' measured figures and the
    prediction at their pooled acceptance (and the simulator's replay of seed 0)."""
    s = measured_strategy(runs[0])
    regime, ctx = runs[0]["regime"], runs[0]["context_len"]
    m = [r["measured"] for r in runs]
    rounds = sum(x["rounds"] for x in m)
    tpr = sum(x["tokens"] for x in m) / rounds
    alpha = alpha_from_tokens(s.tree, tpr) if parse_tree(s.tree) else 0.0
    gamma = profile.gamma(regime, s.traversal)
    elementwise = elementwise_of_run(campaign["provenance"])
    loop = loop_of_run(m[0])
    pred = _predict(
        model, gpu, s, ctx + campaign["new_tokens"] // 2, alpha, gamma, elementwise, loop
    )
    round_s = float(pred.round_s[0])
    intervals, round_bounds = prediction_intervals(pred)
    row = {
        "baseline": runs[0]["baseline"],
        "context_len": ctx,
        "regime": regime,
        "describe": runs[0]["describe"],
        "seeds": len(runs),
        "alpha": alpha,
        "measured": {
            "tokens_per_s": float(np.median([x["tokens_per_s"] for x in m])),
            "tokens_per_round": tpr,
            "verify_s": float(np.median([x["steps_s"]["verify"] for x in m])),
            "round_s": float(sum(x["wall_s"] for x in m) / rounds),
        },
        "predicted": {
            "tokens_per_s": float(pred.tokens_per_round[0]) / round_s,
            "tokens_per_round": float(pred.tokens_per_round[0]),
            "verify_s": verify_forward_s(pred),
            "draft_s": float(pred.draft_s[0]),
            "loop_s": float(pred.loop_s[0]),
            "round_s": round_s,
            "provenance": pred.provenance,
            "extrapolated": bool(pred.extrapolated[0]),
            "stand_ins": pred.stood_in_for(0),
            "intervals": intervals,
        },
        "_round_bounds": round_bounds,
    }
    if sim:
        row["simulated"] = _simulate(campaign, model_label, s, runs, ctx, gamma, elementwise, loop)
    return row


def _speedups(rows: list[dict]) -> list[dict]:
    """Every baseline's tokens/s over ``ar_dense``'s at the same context, measured and
    predicted."""
    out = []
    for ctx in sorted({r["context_len"] for r in rows}):
        at = {r["baseline"]: r for r in rows if r["context_len"] == ctx}
        base = at.get("ar_dense")
        if base is None:
            continue
        for name, r in at.items():
            if name == "ar_dense":
                continue
            predicted = r["predicted"]["tokens_per_s"] / base["predicted"]["tokens_per_s"]
            over, under = base["_round_bounds"], r["_round_bounds"]
            out.append(
                {
                    "baseline": name,
                    "context_len": ctx,
                    "measured": r["measured"]["tokens_per_s"] / base["measured"]["tokens_per_s"],
                    "predicted": predicted,
                    "interval": None
                    if over is None
                    else [float(x) for x in interval([predicted], over=over, under=under)[0]],
                }
            )
    return out


def _errors(pairs: list[tuple[float, float]]) -> dict:
    """``error_stats`` of (predicted, measured) pairs."""
    return error_stats(np.array([p for p, _ in pairs]), np.array([m for _, m in pairs]))


def campaign_section(campaign: dict, planner: dict, sim: bool = True) -> dict:
    """Measured vs predicted per (baseline, context), speedups over ar_dense, and the simulator
    replaying the seed-0 runs.

    Each (baseline, context) is priced with the NSA row schedule it was measured with
    (``validation.records.measured_strategy``), at the measured acceptance (alpha fitted to the
    seeds' pooled tokens per round, ``perfmodel.tree_tokens.alpha_from_tokens``), its round with
    the loop's host time (``perfmodel.loop_host``); its verify step is the median over the
    seeds. The error is then the performance model's, not the acceptance
    profile's: predicted acceptance is judged in ``planner_section``."""
    profile = profile_from_json(planner["profile"], "the planner evaluation's profile", "planner")
    model_label = local_model(campaign["model"])
    model = get_model(model_label)
    gpu = get_gpu(_gpu_key(campaign["gpu"]))
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in campaign["rows"]:
        groups.setdefault((r["baseline"], r["context_len"]), []).append(r)
    rows = [
        _campaign_row(campaign, model_label, model, gpu, profile, g, sim) for g in groups.values()
    ]
    rows.sort(key=lambda r: (r["context_len"], BASELINE_ORDER.index(r["baseline"])))
    speedups = _speedups(rows)
    for r in rows:
        del r["_round_bounds"]

    def stats(key):
        return _errors([(r["predicted"][key], r["measured"][key]) for r in rows])

    out = {
        "rows": rows,
        "speedups": speedups,
        "verify": stats("verify_s"),
        "tokens_per_s": stats("tokens_per_s"),
        "round": stats("round_s"),
        "speedup": _errors([(x["predicted"], x["measured"]) for x in speedups]),
        "coverage": _coverage(rows, speedups),
    }
    if sim:
        sims = [r["simulated"] for r in rows if r.get("simulated")]
        out["simulator"] = _errors([(x["tokens_per_s"], x["measured_tokens_per_s"]) for x in sims])
    return out


def _coverage(rows: list[dict], speedups: list[dict]) -> dict:
    """Per figure, how many measured values lie inside their predicted intervals, of how many
    rows have one (``perfmodel.intervals``; the verify step, round, tokens/s, speedups)."""
    out = {}
    # The measured verify step is the target forward: the verify forward's interval.
    for key, iv_key in (
        ("verify_s", "verify_forward_s"),
        ("round_s", "round_s"),
        ("tokens_per_s", "tokens_per_s"),
    ):
        got = [
            inside(r["predicted"]["intervals"][iv_key], r["measured"][key])
            for r in rows
            if r["predicted"]["intervals"]
        ]
        out[key] = {"inside": sum(got), "n": len(got)}
    got = [inside(x["interval"], x["measured"]) for x in speedups if x["interval"]]
    out["speedup"] = {"inside": sum(got), "n": len(got)}
    return {**out, "coverage": COVERAGE}


def _gpu_key(name: str) -> str:
    for k in gpu_names():
        if name in (k, get_gpu(k).name):
            return k
    raise ValueError(f"GPU {name!r} of the campaign is not in the registry")


def _simulate(campaign, model_label, s, runs, ctx, gamma, elementwise, loop) -> dict | None:
    """The simulator replaying the seed-0 run's accepted counts (its first round, graph capture,
    left out as in the measurement) with the step model's costs, the loop's host time among
    them."""
    seed0 = next((r for r in runs if "rounds_trace" in r["measured"]), None)
    if seed0 is None:
        return None
    trace_rounds = seed0["measured"]["rounds_trace"][1:]
    if not trace_rounds:
        return None
    layers = get_model(model_label).num_layers
    sid = s.name
    # The campaign keeps per-round (context, drafted, accepted) only; every round carries the
    # run's mean step times (the replay reads the accepted counts, not the times).
    head = make_header(
        "engine:validation-campaign (step_s: the run's means)", model_label, layers, {sid: {}}
    )
    steps = seed0["measured"]["steps_s"]
    lines = [make_round(i, 0, sid, c, d, a, steps) for i, (c, d, a) in enumerate(trace_rounds)]
    tokens = sum(a + 1 for _, _, a in trace_rounds)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text(dumps_trace(head, lines))
        cfg = SimConfig(
            scenario="sd_dense" if s.tree != "chain:0" else "ar_dense",
            model=model_label,
            gpu=_gpu_key(campaign["gpu"]),
            strategy=s,
            context_len=trace_rounds[0][0],
            num_tokens=tokens,
            acceptance_model="trace",
            trace=str(path),
            overlap=gamma,
            elementwise=elementwise,
            loop=loop,
            timeline_rounds=0,
        )
        res = simulate(cfg)
    return {
        "tokens_per_s": res.figures["simulated_tokens_per_s"]["value"],
        "measured_tokens_per_s": seed0["measured"]["tokens_per_s"],
        "rounds": len(trace_rounds),
        "provenance": res.figures["simulated_tokens_per_s"]["provenance"],
    }


def planner_section(planner: dict) -> dict:
    """The planner evaluation's ranking quality and adaptive gains, with how finely each is
    measured (derived from its runs where the evaluation did not record it): where the
    report judges predicted acceptance."""
    return {
        "kendall_tau": planner["kendall_tau"],
        "regret": planner["regret"],
        # How finely each regime's measurement orders its strategies (None where the
        # evaluation kept no runs per window): derived from the measured runs.
        "measurement": {r: regime_resolution(v) for r, v in planner.get("regimes", {}).items()},
        "adaptive_gain": planner["adaptive_gain"],
        # How finely each prompt set's adaptive gain and its strongest fixed alternative are
        # measured (None where the runs per seed were not kept): derived from the timed runs.
        "adaptive_resolution": {
            k: set_resolution(v)
            for k, v in planner.get("adaptive", {}).get("prompt_sets", {}).items()
        },
        # Absent from evaluations made before it was recorded.
        "adaptive_gain_captures_counted": planner.get("adaptive_gain_captures_counted"),
        # The best fixed strategy per prompt set over the offline best (None without the
        # oracle's runs): what choosing among the space's fixed strategies could gain at most.
        "adaptive_ceiling": planner.get("adaptive_ceiling"),
        "targets": planner["targets"],
        "met": planner["met"],
        "provenance": planner["provenance"],
    }


def build(
    gpu: str = "h100-sxm",
    campaign: str | Path | None = None,
    planner: str | Path | None = None,
    sim: bool = True,
) -> dict:
    """The whole report as a dict (``targets`` says which hold); the campaign and the planner
    evaluation default to the measurements of record."""
    cpath = Path(campaign) if campaign else record_path("campaign.json")
    ppath = Path(planner) if planner else record_path("planner.json")
    cdoc, pdoc = read_json(cpath, "campaign"), read_json(ppath, "planner evaluation")
    if cdoc.get("version") != 1 or "rows" not in cdoc:
        raise ValueError(f"campaign {str(cpath)!r} is not a version-1 campaign document")
    what = f"campaign {str(cpath)!r} or planner evaluation {str(ppath)!r}"
    with malformed(what):
        e2e = campaign_section(cdoc, pdoc, sim=sim)
        planner_part = planner_section(pdoc)
        provenance = cdoc["provenance"]
    values = {
        "verify_median_ape": e2e["verify"]["median_ape"],
        "tokens_per_s_median_ape": e2e["tokens_per_s"]["median_ape"],
        "speedup_median_ape": e2e["speedup"].get("median_ape", float("inf")),
    }
    return {
        "version": REPORT_VERSION,
        "sources": {"campaign": project_label(cpath), "planner": project_label(ppath)},
        "campaign_provenance": provenance,
        "kernels": kernel_section(gpu),
        "e2e": e2e,
        "planner": planner_part,
        "targets": {
            k: {"value": v, "threshold": TARGETS[k], "met": bool(v <= TARGETS[k])}
            for k, v in values.items()
        },
    }
