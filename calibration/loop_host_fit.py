"""Fit the decode loop's host time per round (``perfmodel.loop_host``) on committed engine runs,
and score it on others.

    python -m ssvkit.calibration.loop_host_fit --gpu h200 \\
        --out calibration/profiles/h200/loop_host.json

Each row is one committed run of a fixed strategy: its measured loop host time per round (the
mean round's host wall time minus its CUDA-event ``draft``, ``verify`` and ``accept`` steps,
each a mean over the same counted rounds), its batch, drafter, draft nodes and tokens kept per
sequence and round. The fit is the non-negative least squares of the loop host time on
``loop_host_features``, each row weighted by 1 / its round wall time, so that it minimises the
relative error of the round, which tokens/s inherits (``fit``). Runs whose controller switches
strategies online (``ssv_planned``) are left out: their controller's host work is its own; so
are pipelined runs (``engine.pipeline``), whose wall time holds only the host time the GPU did
not hide.

The sets per GPU host (``SETS``): each GPU's fit set is its batched decodes of every baseline
at batch 1-64 (``batched-decode-loop-h200.json``, ``batched-decode-loop-h100.json``), its test
set the measured strategies of its planner evaluation (the H200's at batch 32, the H100's at
batch 1: another bench, other prompts and trees).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls
from ssvkit.calibration.draft_host_fit import fit_cli, short_commit
from ssvkit.perfmodel.intervals import Residuals
from ssvkit.perfmodel.loop_host import LOOP_HOST_TERMS, loop_host_features, measured_loop_host_s
from ssvkit.perfmodel.strategy import parse_tree

DRAFTER_CODES = {"draft_model": 1, "ngram": 2}


@dataclasses.dataclass(frozen=True, slots=True)
class LoopRow:
    """One run's loop: where it comes from, what it ran (a label), its drafter code (0: none
    drafting), batch, draft nodes, tokens kept per sequence and round, measured round wall time
    and loop host time (seconds)."""

    source: str
    label: str
    drafter: int
    batch: int
    num_draft: int
    tokens: float
    round_wall_s: float
    loop_host_s: float

    def __post_init__(self) -> None:
        if self.batch < 1 or not self.round_wall_s > 0 or not self.tokens >= 1:
            raise ValueError(f"loop row {self.label} of {self.source}: bad batch, wall or tokens")


def _drafter_code(kind: str, num_draft: int) -> int:
    return DRAFTER_CODES.get(kind, 0) if num_draft > 0 else 0


def decode_rows(path: Path) -> list[LoopRow]:
    """The fixed-strategy runs of a batched-decode document (``validation.batched_decode``)
    that record their round wall time (``ssvkit decode``'s ``round_wall_s``)."""
    out = []
    for r in json.loads(path.read_text())["runs"]:
        rep = r.get("report")
        if not rep or "round_wall_s" not in rep or r["baseline"] == "ssv_planned":
            continue
        if rep.get("loop") == "pipelined":  # its wall time hides the host's behind the GPU's
            continue
        steps = rep["steps_s"]
        wall = rep["round_wall_s"]["value"]
        k = rep["drafted_per_round"]
        out.append(
            LoopRow(
                source=path.name,
                label=f"{r['baseline']}|{r['drafter']}|b{r['batch']}",
                drafter=_drafter_code(rep["strategy"]["drafter"]["kind"], k),
                batch=r["batch"],
                num_draft=k,
                tokens=1.0 + rep["mean_accepted"]["value"],
                round_wall_s=wall,
                loop_host_s=measured_loop_host_s(wall, {k: v["value"] for k, v in steps.items()}),
            )
        )
    return out


def steady_row(source: str, label: str, kind: str, tree: str, batch: int, f: dict) -> LoopRow:
    """The loop row of a bench's steady figures ``f`` (``validation.bench.steady_figures``:
    the counted rounds' wall time, rounds, tokens and mean steps) of a run drafting with
    ``kind`` on ``tree`` at ``batch``."""
    k = len(parse_tree(tree))
    wall = f["wall_s"] / f["rounds"]
    return LoopRow(
        source=source,
        label=label,
        drafter=_drafter_code(kind, k),
        batch=batch,
        num_draft=k,
        tokens=f["tokens"] / f["rounds"] / batch,
        round_wall_s=wall,
        loop_host_s=measured_loop_host_s(wall, f["steps_s"]),
    )


def planner_rows(path: Path, ranking_path: Path) -> list[LoopRow]:
    """The measured strategies of a planner evaluation (``validation.evaluate``); each one's
    drafter and tree from the evaluation's ranking (``ssvkit rank --evaluation``), matched by
    description. Its wall time is the counted rounds' (``validation.bench.steady_figures``)."""
    doc = json.loads(path.read_text())
    with gzip.open(ranking_path, "rt") as fh:
        ranking = json.load(fh)
    batch = doc.get("batch", 1)
    out = []
    for regime, v in doc["regimes"].items():
        by = {x["describe"]: x["strategy"] for x in ranking["regimes"][regime]["ranking"]}
        for m in v["strategies"]:
            s = by[m["describe"]]
            if m["measured"].get("loop") == "pipelined":
                continue  # its wall time hides the host's behind the GPU's
            label = f"{regime} {m['describe']}"
            kind, tree = s["drafter"]["kind"], s["tree"]
            out.append(steady_row(path.name, label, kind, tree, batch, m["measured"]))
    return out


def _features(rows: list[LoopRow]) -> np.ndarray:
    return loop_host_features(
        [r.drafter for r in rows],
        [r.batch for r in rows],
        [r.num_draft for r in rows],
        [r.tokens for r in rows],
    )


def fit(rows: list[LoopRow]) -> tuple[dict[str, float], dict]:
    """NNLS of the rows' loop host time on ``loop_host_features``, weighted by 1 / the round's
    wall time. A term whose feature the rows cannot tell from another's (``sequence`` when
    every row has one batch size, ``ngram_token`` without an n-gram row) is held at 0 and
    named in the figures (``not_identified``)."""
    if not rows:
        raise ValueError("the fit set has no rows")
    x = _features(rows)
    y = np.array([r.loop_host_s for r in rows])
    w = 1.0 / np.array([r.round_wall_s for r in rows])
    unknown = []
    if len({r.batch for r in rows}) < 2:
        unknown.append("sequence")
    if not x[:, LOOP_HOST_TERMS.index("ngram_token")].any():
        unknown.append("ngram_token")
    keep = [i for i, t in enumerate(LOOP_HOST_TERMS) if t not in unknown]
    if len(rows) < len(keep):
        raise ValueError(f"the fit set has {len(rows)} rows, fewer than its {len(keep)} terms")
    coef = np.zeros(len(LOOP_HOST_TERMS))
    coef[keep], _ = nnls(x[:, keep] * w[:, None], y * w)
    batches = [min(r.batch for r in rows), max(r.batch for r in rows)]
    figures = {"rows": len(rows), "batches": batches, "not_identified": unknown}
    return dict(zip(LOOP_HOST_TERMS, map(float, coef), strict=True)), figures


def errors(rows: list[LoopRow], coef: dict[str, float]) -> dict:
    """The loop host time's median and p90 absolute error (seconds) and the round wall time's
    median and p90 relative error when the round is its measured steps plus the priced loop
    host time (what the loop term adds to a prediction's error), per drafter."""
    w = np.array([coef[t] for t in LOOP_HOST_TERMS])
    pred = _features(rows) @ w
    meas = np.array([r.loop_host_s for r in rows])
    wall = np.array([r.round_wall_s for r in rows])
    out = {}
    for name, code in (("none", 0), *DRAFTER_CODES.items()):
        sel = np.array([r.drafter == code for r in rows])
        if not sel.any():
            continue
        err = np.abs(pred[sel] - meas[sel])
        out[name] = {
            "rows": int(sel.sum()),
            "measured_median_s": float(np.median(meas[sel])),
            "abs_error_median_s": float(np.median(err)),
            "abs_error_p90_s": float(np.quantile(err, 0.9)),
            "round_ape_median": float(np.median(err / wall[sel])),
            "round_ape_p90": float(np.quantile(err / wall[sel], 0.9)),
        }
    return out


# Per GPU host: the fit set and the test sets, as (name, rows reader) over the data folder.
SETS = {
    "h200": (
        ("batched_decode_b1_b64", lambda d: decode_rows(d / "batched-decode-loop-h200.json")),
        (
            (
                "planner_b32",
                lambda d: planner_rows(
                    d / "planner-b32-h200.json", d / "planner-ranking-b32-h200.json.gz"
                ),
            ),
        ),
    ),
    "h100-sxm": (
        ("batched_decode_b1_b64", lambda d: decode_rows(d / "batched-decode-loop-h100.json")),
        (
            (
                "planner_b1",
                lambda d: planner_rows(d / "planner.json", d / "planner-ranking.json.gz"),
            ),
        ),
    ),
}


def residuals(sets: dict[str, list[LoopRow]], coef: dict[str, float]) -> dict | None:
    """The log residuals ln(measured / priced) of the loop host time over every run of
    ``sets`` (the fit set's and the test sets'), as ``perfmodel.intervals.Residuals`` at the
    intervals' coverage: what widens a round by its loop host time; None when too few."""
    rows = [r for rs in sets.values() for r in rs]
    w = np.array([coef[t] for t in LOOP_HOST_TERMS])
    priced = _features(rows) @ w
    meas = np.array([r.loop_host_s for r in rows])
    ok = (priced > 0) & (meas > 0)
    res = Residuals.of(f"loop host: {', '.join(sets)}", np.log(meas[ok] / priced[ok]))
    return None if res is None else {"source": res.source, **res.to_json()}


def run(data: Path, gpu: str) -> dict:
    """The fit on ``gpu``'s fit set, the errors on every set (``SETS``) and the residuals of
    them all."""
    if gpu not in SETS:
        raise ValueError(
            f"no committed engine runs name the loop host of {gpu!r}: {', '.join(SETS)}"
        )
    (fit_name, read), tests = SETS[gpu]
    rows = {fit_name: read(data)}
    coef, figures = fit(rows[fit_name])
    for name, reader in tests:
        rows[name] = reader(data)
    sets = {name: errors(rs, coef) for name, rs in rows.items()}
    return {
        "gpu": gpu,
        "terms": list(LOOP_HOST_TERMS),
        "coefficients": coef,
        "fit": {
            **figures,
            "set": fit_name,
            "commit": short_commit(),
            "command": f"python -m ssvkit.calibration.loop_host_fit --gpu {gpu}",
        },
        "errors": sets,
        "residuals": residuals(rows, coef),
    }


def main(argv=None) -> int:
    doc = fit_cli("loop_host_fit", __doc__.splitlines()[0], run, argv)
    if doc is None:
        return 2
    c, f = doc["coefficients"], doc["fit"]
    print(
        f"loop host: {c['round'] * 1e6:.1f} us/round + {c['sequence'] * 1e6:.2f} us/sequence"
        f" + {c['ngram_token'] * 1e6:.2f} us/(sequence x kept token, n-gram); fitted on "
        f"{f['rows']} runs, batch {f['batches'][0]}-{f['batches'][1]}"
        + (f"; not identified: {', '.join(f['not_identified'])}" if f["not_identified"] else "")
    )
    print(
        f"{'set':22s} {'drafter':12s} {'rows':>4s} {'measured':>9s} {'|error| median/p90':>19s}"
        f" {'round error median/p90':>23s}"
    )
    for name, per in doc["errors"].items():
        for kind, e in per.items():
            print(
                f"{name:22s} {kind:12s} {e['rows']:4d} {e['measured_median_s'] * 1e6:6.0f} us"
                f" {e['abs_error_median_s'] * 1e6:7.0f} /{e['abs_error_p90_s'] * 1e6:5.0f} us"
                f" {e['round_ape_median']:10.1%} / {e['round_ape_p90']:6.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
