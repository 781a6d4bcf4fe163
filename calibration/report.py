"""End-to-end validation (issue #9): are the predicted speedups real? From committed data only.

Sections, each with the data file it reads:

1. **kernels** -- the calibrated profile's held-out error (``calibration.validate``, the rows
   under ``calibration/profiles/<gpu>/``);
2. **verify step** -- per (baseline, context) of the campaign (``docs/validation/campaign.json``,
   ``benchmarks/validation_campaign.py``): perfmodel's verify time vs the engine's CUDA-event
   verify step (median over seeds);
3. **end to end** -- predicted tokens/s (the step model plus the loop overhead that the planner
   evaluation's profile fitted on its own runs, ``docs/validation/planner.json``, at the
   measured acceptance) vs measured, and the speedup of every baseline over ``ar_dense`` at the
   same context, predicted vs measured;
4. **ranking** -- Kendall tau, regret and adaptive gain of the planner evaluation;
5. **simulator** -- ``sim`` replaying each seed-0 run's accepted counts (acceptance ``trace``)
   with the same costs and loop overhead, vs that run's measured tokens/s.

The prediction is at the measured acceptance (alpha fitted to the run's mean tokens per round,
``planner.profile.alpha_from_tokens``), so the error is the performance model's, not the
acceptance profile's; the planner section is where predicted acceptance is judged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from calibration.fit import error_stats
from perfmodel.files import read_json


def _checkout_root() -> Path:
    """The checkout whose committed measurements the report reads: the package's parent when
    it holds them (a clone, an editable install), else the first folder from the working
    directory up that does (a non-editable ``pip install .`` run inside the clone)."""
    here = Path(__file__).resolve().parent.parent
    for root in (here, Path.cwd().resolve(), *Path.cwd().resolve().parents):
        if (root / "docs" / "validation").is_dir() and (root / "pyproject.toml").is_file():
            return root
    return here


ROOT = _checkout_root()
REPORT_VERSION = 1
TARGETS = {"verify_median_ape": 0.08, "tokens_per_s_median_ape": 0.10, "speedup_median_ape": 0.08}
BASELINE_ORDER = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv", "ssv_planned")


def load_json(path: Path, what: str) -> dict:
    """A JSON document; ``ValueError`` in one line when it is missing or not JSON."""
    return read_json(path, what)


def local_model(label: str | None) -> str | None:
    """A checkpoint path recorded on another machine, found in this checkout (the tiny pair
    lives in ``engine/checkpoints``); registry names and existing paths pass through."""
    if not label or "/" not in label or Path(label).exists():
        return label
    local = ROOT / "engine" / "checkpoints" / Path(label).name
    if local.exists():
        return str(local)
    raise ValueError(f"model {label!r} is not in this checkout (engine/checkpoints)")


def _strategy(d: dict):
    from planner.rank import strategy_from_json

    s = strategy_from_json(d)
    if s.drafter.model:
        drafter = dataclasses.replace(s.drafter, model=local_model(s.drafter.model))
        s = dataclasses.replace(s, drafter=drafter)
    return s


def kernel_section(gpu: str) -> dict:
    from calibration import ceilings
    from calibration.validate import annotate, report
    from perfmodel.calibrated import Profile

    folder = ROOT / "calibration" / "profiles" / gpu  # the checkout's, else the package's
    folder = folder if folder.is_dir() else ceilings.PROFILES / gpu
    path = folder / "profile.json"
    if not path.is_file():
        raise ValueError(f"no calibrated profile for {gpu!r} ({path} is missing)")
    profile = Profile.load(path, gpu=gpu)
    rep = report(annotate(ceilings.profile_rows(gpu, folder), profile))
    return {
        "source": _rel(path),
        "rows": _rel(folder),
        "profile_id": profile.profile_id,
        "overall": rep["overall"],
        "ratios": rep["ratios"]["all"],
        "targets": rep["targets"],
    }


def _predict(model, gpu, s, context_len: int, alpha: float, gamma: float):
    from perfmodel.calibrated import make_predictor
    from perfmodel.models import get_model
    from perfmodel.step import build_columns, predict_columns
    from perfmodel.strategy import DrafterSpec, Workload

    wl = Workload(
        context_len=context_len,
        acceptance=min(max(alpha, 0.0), 1.0),
        overlap=min(max(gamma, 0.0), 1.0),
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


# The step model's verify ops that the engine runs in its ``accept`` step, not in ``verify``.
ACCEPT_STEP_OPS = ("verify.sampling", "verify.accept")


def verify_forward_s(pred) -> float:
    """The step model's verify time without sampling and acceptance: the target forward that
    the engine's CUDA-event ``verify`` step times (its ``accept`` step samples and commits)."""
    return float(pred.verify_s[0]) - sum(
        float(pred.op_seconds[k][0]) for k in ACCEPT_STEP_OPS if k in pred.op_seconds
    )


def campaign_section(campaign: dict, planner: dict, sim: bool = True) -> dict:
    """Measured vs predicted per (baseline, context), speedups over ar_dense, and the simulator
    replaying the seed-0 runs."""
    from perfmodel.hardware import get_gpu
    from perfmodel.models import get_model
    from perfmodel.strategy import parse_tree
    from planner.profile import alpha_from_tokens, profile_from_json

    profile = profile_from_json(planner["profile"], "the planner evaluation's profile", "planner")
    model_label = local_model(campaign["model"])
    model = get_model(model_label)
    gpu = get_gpu(_gpu_key(campaign["gpu"]))
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in campaign["rows"]:
        groups.setdefault((r["baseline"], r["context_len"]), []).append(r)
    rows = []
    for (name, ctx), runs in groups.items():
        s = _strategy(runs[0]["strategy"])
        regime = runs[0]["regime"]
        m = [r["measured"] for r in runs]
        tokens = sum(x["tokens"] for x in m)
        rounds = sum(x["rounds"] for x in m)
        tpr = tokens / rounds
        alpha = alpha_from_tokens(s.tree, tpr) if parse_tree(s.tree) else 0.0
        gamma = profile.gamma(regime, s.traversal)
        mid = ctx + campaign["new_tokens"] // 2
        pred = _predict(model, gpu, s, mid, alpha, gamma)
        loop = profile.overhead_s(regime, s)
        round_s = float(pred.round_s[0]) + loop
        p_tps = float(pred.tokens_per_round[0]) / round_s
        row = {
            "baseline": name,
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
                "tokens_per_s": p_tps,
                "tokens_per_round": float(pred.tokens_per_round[0]),
                "verify_s": verify_forward_s(pred),
                "draft_s": float(pred.draft_s[0]),
                "loop_s": loop,
                "round_s": round_s,
                "provenance": pred.provenance,
                "extrapolated": bool(pred.extrapolated[0]),
            },
        }
        if sim:
            row["simulated"] = _simulate(campaign, model_label, s, runs, ctx, gamma, loop)
        rows.append(row)
    rows.sort(key=lambda r: (r["context_len"], BASELINE_ORDER.index(r["baseline"])))
    speedups = []
    for ctx in sorted({r["context_len"] for r in rows}):
        at = {r["baseline"]: r for r in rows if r["context_len"] == ctx}
        base = at.get("ar_dense")
        if base is None:
            continue
        for name, r in at.items():
            if name == "ar_dense":
                continue
            speedups.append(
                {
                    "baseline": name,
                    "context_len": ctx,
                    "measured": r["measured"]["tokens_per_s"] / base["measured"]["tokens_per_s"],
                    "predicted": r["predicted"]["tokens_per_s"] / base["predicted"]["tokens_per_s"],
                }
            )

    def stats(key):
        return error_stats(
            np.array([r["predicted"][key] for r in rows]),
            np.array([r["measured"][key] for r in rows]),
        )

    out = {
        "rows": rows,
        "speedups": speedups,
        "verify": stats("verify_s"),
        "tokens_per_s": stats("tokens_per_s"),
        "round": stats("round_s"),
        "speedup": error_stats(
            np.array([x["predicted"] for x in speedups]),
            np.array([x["measured"] for x in speedups]),
        ),
    }
    if sim:
        sims = [r for r in rows if r.get("simulated")]
        out["simulator"] = error_stats(
            np.array([r["simulated"]["tokens_per_s"] for r in sims]),
            np.array([r["simulated"]["measured_tokens_per_s"] for r in sims]),
        )
    return out


def _gpu_key(name: str) -> str:
    from perfmodel.hardware import get_gpu, gpu_names

    for k in gpu_names():
        if name in (k, get_gpu(k).name):
            return k
    raise ValueError(f"GPU {name!r} of the campaign is not in the registry")


def _simulate(campaign, model_label, s, runs, ctx, gamma, loop) -> dict | None:
    """The simulator replaying the seed-0 run's accepted counts (its first round, graph capture,
    left out as in the measurement) with the step model's costs and the loop overhead."""
    from perfmodel.trace import dumps_trace, make_header, make_round
    from sim.config import SimConfig
    from sim.scenarios import simulate

    seed0 = next((r for r in runs if "rounds_trace" in r["measured"]), None)
    if seed0 is None:
        return None
    trace_rounds = seed0["measured"]["rounds_trace"][1:]
    if not trace_rounds:
        return None
    from perfmodel.models import get_model

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
            loop_overhead_s=loop,
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
    from planner.evaluate import regime_resolution, set_resolution

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


@contextlib.contextmanager
def _malformed(what: str):
    """A document that lacks a field or holds one of the wrong type, as one ``ValueError``
    naming the documents (their structure is checked by reading it)."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{what} is malformed ({type(e).__name__}: {e})") from None


def build(
    gpu: str = "h100-sxm",
    campaign: str | Path | None = None,
    planner: str | Path | None = None,
    sim: bool = True,
) -> dict:
    """The whole report as a dict (``targets`` says which hold)."""
    cpath = Path(campaign) if campaign else ROOT / "docs" / "validation" / "campaign.json"
    ppath = Path(planner) if planner else ROOT / "docs" / "validation" / "planner.json"
    for given, path, flag in ((campaign, cpath, "--campaign"), (planner, ppath, "--planner")):
        if not given and not path.is_file():
            raise ValueError(
                f"the committed measurements ({path.relative_to(ROOT)}) ship with a clone of "
                f"the repository, not with the installed package: run from a clone, or give "
                f"{flag} FILE"
            )
    cdoc, pdoc = load_json(cpath, "campaign"), load_json(ppath, "planner evaluation")
    if cdoc.get("version") != 1 or "rows" not in cdoc:
        raise ValueError(f"campaign {str(cpath)!r} is not a version-1 campaign document")
    what = f"campaign {str(cpath)!r} or planner evaluation {str(ppath)!r}"
    with _malformed(what):
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
        "sources": {"campaign": _rel(cpath), "planner": _rel(ppath)},
        "campaign_provenance": provenance,
        "kernels": kernel_section(gpu),
        "e2e": e2e,
        "planner": planner_part,
        "targets": {
            k: {"value": v, "threshold": TARGETS[k], "met": bool(v <= TARGETS[k])}
            for k, v in values.items()
        },
    }


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


# ----------------------------------------------------------------------------- rendering


def _pct(d: dict, key: str = "median_ape") -> str:
    return f"{100 * d[key]:.1f}%" if d.get("n") else "-"


def markdown(rep: dict, link_prefix: str = "../../") -> str:
    """REPORT.md: every figure beside the data file it comes from (links relative to
    ``docs/validation/``)."""
    src = rep["sources"]
    k, e, pl = rep["kernels"], rep["e2e"], rep["planner"]
    cprov = rep["campaign_provenance"]

    def link(path: str) -> str:
        return f"[`{path}`]({link_prefix}{path})"

    lines = [
        "# End-to-end validation: measured vs predicted on the H100",
        "",
        "Generated by `ssvkit report` from committed measurements only; do not edit by hand.",
        f"Campaign: {link(src['campaign'])} ({cprov.get('device_name')}, torch "
        f"{cprov.get('torch_version')}, Triton {cprov.get('triton_version')}, commit "
        f"{cprov.get('git_commit')}, {cprov.get('timestamp')}); planner evaluation: "
        f"{link(src['planner'])} (commit {pl['provenance'].get('git_commit')}).",
        "Predictions are at each run's measured acceptance: the performance model's error, not "
        "the acceptance profile's (the ranking section judges that).",
        "",
        "## Targets",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
    ]
    for name, t in rep["targets"].items():
        lines.append(
            f"| {name} | {100 * t['value']:.1f}% | <= {100 * t['threshold']:.0f}% | "
            f"{'yes' if t['met'] else '**no**'} |"
        )
    lines += [
        "",
        "## Kernels (calibrated profile, held-out rows)",
        "",
        f"Profile `{k['profile_id']}` ({link(k['source'])}, rows under {link(k['rows'])}):",
        "",
        "| split | rows | median APE | p90 APE | max APE | ratio median APE |",
        "|---|---|---|---|---|---|",
    ]
    for split in ("heldout", "fit"):
        o, r = k["overall"][split], k["ratios"][split]
        lines.append(
            f"| {split} | {o.get('n', 0)} | {_pct(o)} | {_pct(o, 'p90_ape')} | "
            f"{_pct(o, 'max_ape')} | {_pct(r)} |"
        )
    lines += [
        "",
        f"## Verify step, tokens/s and speedups ({link(src['campaign'])})",
        "",
        f"Every baseline on the trained tiny pair, {e['rows'][0]['seeds']} seeds per row "
        "(medians); "
        "predicted tokens/s = predicted tokens per round / (step model's round + the loop "
        f"overhead the planner profile fitted on its own runs, {link(src['planner'])}); "
        "the verify step is the target forward (the engine samples and commits in its accept "
        "step, timed apart).",
        "",
        "| context | baseline | strategy | tokens/s meas | pred | err | verify ms meas | pred "
        "| err | speedup meas | pred | sim tokens/s | err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sp = {(x["baseline"], x["context_len"]): x for x in e["speedups"]}
    for r in e["rows"]:
        m, p = r["measured"], r["predicted"]
        x = sp.get((r["baseline"], r["context_len"]))
        sim = r.get("simulated") or {}
        speed = f"{x['measured']:.2f}x | {x['predicted']:.2f}x" if x else "1 | 1"
        simtxt = "- | -"
        if sim:
            err = sim["tokens_per_s"] / sim["measured_tokens_per_s"] - 1
            simtxt = f"{sim['tokens_per_s']:.0f} | {100 * err:+.1f}%"
        lines.append(
            f"| {r['context_len']} | {r['baseline']} | {r['describe'].replace('|', '/')} | "
            f"{m['tokens_per_s']:.0f} | {p['tokens_per_s']:.0f} | "
            f"{100 * (p['tokens_per_s'] / m['tokens_per_s'] - 1):+.1f}% | "
            f"{1e3 * m['verify_s']:.3f} | {1e3 * p['verify_s']:.3f} | "
            f"{100 * (p['verify_s'] / m['verify_s'] - 1):+.1f}% | {speed} | {simtxt} |"
        )
    lines += [
        "",
        "| error over all rows | n | median APE | p90 APE | max APE |",
        "|---|---|---|---|---|",
    ]
    for name, key in (
        ("verify step", "verify"),
        ("round time", "round"),
        ("tokens/s", "tokens_per_s"),
        ("speedup over ar_dense", "speedup"),
        ("simulator (replaying seed 0) vs measured", "simulator"),
    ):
        d = e.get(key)
        if d:
            lines.append(
                f"| {name} | {d['n']} | {_pct(d)} | {_pct(d, 'p90_ape')} | {_pct(d, 'max_ape')} |"
            )
    lines += [
        "",
        f"## Ranking quality ({link(src['planner'])})",
        "",
        "| regime | Kendall tau | regret | measured pair s.e. | regret p90, exact predictor |",
        "|---|---|---|---|---|",
    ]
    res = pl.get("measurement") or {}
    for reg, tau in pl["kendall_tau"].items():
        m = res.get(reg)
        tail = (
            f"{100 * m['pair_ratio_se']:.1f}% | {100 * m['draw_regret_p90']:.1f}%"
            if m
            else "n/a | n/a"
        )
        lines.append(f"| {reg} | {tau:.3f} | {100 * pl['regret'][reg]:.1f}% | {tail} |")
    if any(res.values()):
        lines += [
            "",
            "The last two columns say how finely the measurement orders a regime's strategies: "
            "the measured windows resampled jointly, the standard error of the ratio of two of "
            "the five strategies predicted best (median pair), and the 90th percentile of the "
            "regret of a predictor that ranked by such a draw (exact timing, another sample of "
            "the same prompts).",
        ]

    def per_set(figures: dict) -> str:
        return ", ".join(f"{k2} {100 * v:+.1f}%" for k2, v in figures.items())

    lines += [
        "",
        f"Adaptive vs fixed offline best: {per_set(pl['adaptive_gain'])}. Targets: tau >= "
        f"{pl['targets']['kendall_tau_min']}, regret <= {100 * pl['targets']['regret_max']:.0f}%, "
        f"adaptive >= {100 * pl['targets']['adaptive_gain_min']:.0f}% off distribution; met: "
        f"{', '.join(f'{k2} {v}' for k2, v in pl['met'].items())}.",
    ]
    sets = {k: v for k, v in (pl.get("adaptive_resolution") or {}).items() if v}
    if sets:
        lines += [
            "",
            "| prompt set | adaptive gain | 90% interval | per seed | strongest fixed alternative "
            "| its gain | 90% interval | fastest per seed, in hindsight |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for k2, m in sets.items():
            seeds = " ".join(f"{100 * g:+.1f}" for g in m["paired_gains"])
            c = m.get("challenger")
            name = c["describe"].replace("|", "\\|") if c else ""  # a table cell
            alt = (
                f"{name} | {100 * c['gain']:+.1f}% | {100 * c['gain_p05']:+.1f}% to "
                f"{100 * c['gain_p95']:+.1f}%"
                if c
                else "n/a | n/a | n/a"
            )
            h = m.get("hindsight")
            late = "n/a"
            if h:
                per = " ".join(f"{100 * g:+.1f}" for g in h["paired_gains"])
                late = f"{100 * h['gain']:+.1f}% ({per})"
            lines.append(
                f"| {k2} | {100 * m['gain']:+.1f}% | "
                f"{100 * m['gain_p05']:+.1f}% to {100 * m['gain_p95']:+.1f}% | {seeds} "
                f"| {alt} | {late} |"
            )
        lines += [
            "",
            "Each repeat of the controller, the offline best and every fixed alternative decodes "
            "the prompt with the same seed; the intervals resample the seeds jointly (the ratio "
            "of medians, as recorded). The alternative is the best fixed strategy other than the "
            "offline best, chosen once on the recorded medians. The last column takes, for each "
            "seed, the fastest of the offline best and every alternative on that seed, picked "
            "after the fact: more than a controller that runs one fixed strategy per prompt "
            "could gain (a maximum of noisy runs leans high); one that switches inside a run is "
            "not bound by it.",
        ]
    # Each absent from evaluations made before it was recorded (or without the oracle's runs).
    for key, text in (
        (
            "adaptive_gain_captures_counted",
            "With the rounds that captured a CUDA graph inside "
            "an adaptive run counted (left out above, as a server captures before requests "
            "arrive): ",
        ),
        (
            "adaptive_ceiling",
            "The best fixed strategy of each prompt set over the fixed offline "
            "best (the most a controller that picks among the space's fixed strategies could "
            "gain): ",
        ),
    ):
        if pl.get(key):
            lines += ["", text + per_set(pl[key]) + "."]
    lines += [
        "",
        "Figures: `verify.png`, `tokens_per_s.png`, `speedup.png` (predicted vs measured).",
        "",
    ]
    return "\n".join(lines)


def plots(rep: dict) -> dict[str, bytes]:
    """Predicted-vs-measured PNGs of the verify step, tokens/s and speedups."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e = rep["e2e"]
    series = {
        "verify.png": (
            "verify step (ms)",
            [
                (r["baseline"], 1e3 * r["measured"]["verify_s"], 1e3 * r["predicted"]["verify_s"])
                for r in e["rows"]
            ],
        ),
        "tokens_per_s.png": (
            "tokens/s",
            [
                (r["baseline"], r["measured"]["tokens_per_s"], r["predicted"]["tokens_per_s"])
                for r in e["rows"]
            ],
        ),
        "speedup.png": (
            "speedup over ar_dense",
            [(x["baseline"], x["measured"], x["predicted"]) for x in e["speedups"]],
        ),
    }
    out = {}
    for name, (label, pts) in series.items():
        fig, ax = plt.subplots(figsize=(6, 5.5))
        for i, b in enumerate(BASELINE_ORDER):  # one colour and marker per baseline everywhere
            sel = [(m, p) for n, m, p in pts if n == b]
            if sel:
                ax.plot(*zip(*sel, strict=True), "osD^vP"[i], color=f"C{i}", label=b, alpha=0.8)
        vals = [v for _, m, p in pts for v in (m, p)]
        lo, hi = min(vals) * 0.9, max(vals) * 1.1
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(f"{label}: predicted vs measured")
        ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        out[name] = buf.getvalue()
    return out
