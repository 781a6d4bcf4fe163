"""Fit the draft step's host time (``perfmodel.draft_host``) on committed engine runs, and
score the draft step's prediction on others.

    python -m ssvkit.calibration.draft_host_fit --gpu h200 \\
        --out calibration/profiles/h200/draft_host.json

Each row is one committed run that drafts: its measured CUDA-event ``draft`` step beside the
step model's GPU draft time (``perfmodel.step``, without ``draft.host``) for the tree the
engine ran, at the run's batch and context and the per-draft alpha that reproduces its mean of
accepted drafts (``perfmodel.strategy.fit_acceptance``; the draft model's catch-up depends on
it). The host term is the non-negative least squares fit of the drafting rows' residual
(measured minus GPU) on ``draft_host_features`` (``fit``); the output holds its coefficients
and the draft step's median and p90 APE per drafter and set, before and after the host term
(``run``).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from importlib.resources import files
from pathlib import Path

import numpy as np
from scipy.optimize import nnls
from ssvkit.kernels.timing import git_commit
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.draft_host import DRAFT_HOST_TERMS, draft_host_features, draft_host_s
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import (
    DrafterSpec,
    Strategy,
    Workload,
    fit_acceptance,
    parse_tree,
    tree_depth,
)

TARGET = "engine/checkpoints/tiny-target"
DRAFT = "engine/checkpoints/tiny-draft"


@dataclasses.dataclass(frozen=True, slots=True)
class DraftRow:
    """One run's draft step: where it comes from, the strategy as the engine ran it (explicit
    tree), its batch, context, fitted alpha and measured seconds."""

    source: str
    strategy: Strategy
    batch: int
    context_len: int
    alpha: float
    measured_s: float

    def __post_init__(self) -> None:
        if self.batch < 1 or self.context_len < 1 or not self.measured_s > 0:
            raise ValueError(f"draft row of {self.source}: batch, context and time must be > 0")


def _strategy(d: dict) -> Strategy:
    d = dict(d, drafter=DrafterSpec(**d["drafter"]))
    s = Strategy(**d)
    if s.drafter.kind == "draft_model":
        s = dataclasses.replace(s, drafter=dataclasses.replace(s.drafter, model=_repo(DRAFT)))
    parents = parse_tree(s.tree)  # the engine's tree (``engine.tree.DraftTree.from_spec``)
    return dataclasses.replace(s, tree="parents:" + ",".join(map(str, parents)))


def _repo(rel: str) -> str:
    return str(Path(str(files("ssvkit.engine"))).parent / rel)


def decode_rows(path: Path, keep=lambda batch: True) -> list[DraftRow]:
    """The drafting runs of a batched-decode document (``validation.batched_decode``)."""
    out = []
    for r in json.loads(path.read_text())["runs"]:
        rep = r.get("report")
        if not rep or not rep.get("drafted_per_round") or not keep(r["batch"]):
            continue
        s = _strategy(rep["strategy"])
        alpha = fit_acceptance(parse_tree(s.tree), rep["mean_accepted"]["value"])
        draft = rep["steps_s"]["draft"]["value"]
        out.append(DraftRow(path.name, s, r["batch"], rep["context"], alpha, draft))
    return out


def planner_rows(path: Path, ranking: dict) -> list[DraftRow]:
    """The drafting strategies a planner evaluation measured; their strategies from a ranking
    of the same evaluation (``ssvkit rank --evaluation``), matched by description."""
    doc = json.loads(path.read_text())
    batch = doc.get("batch", 1)  # an evaluation before batched decoding ran at batch 1
    out = []
    for regime, v in doc["regimes"].items():
        by = {x["describe"]: x["strategy"] for x in ranking["regimes"][regime]["ranking"]}
        for m in v["strategies"]:
            s = _strategy(by[m["describe"]])
            parents = parse_tree(s.tree)
            if not parents:
                continue
            meas = m["measured"]
            accepted = meas["tokens"] / meas["rounds"] / batch - 1
            alpha = fit_acceptance(parents, accepted)
            draft = meas["steps_s"]["draft"]
            out.append(DraftRow(path.name, s, batch, v["context_len"], alpha, draft))
    return out


def gpu_draft_s(rows: list[DraftRow], gpu: str) -> np.ndarray:
    """The step model's GPU draft seconds of each row (its ``draft.host`` left out)."""
    model, spec = get_model(_repo(TARGET)), get_gpu(gpu)
    out = []
    for r in rows:
        wl = Workload(
            context_len=r.context_len,
            batch=r.batch,
            acceptance=min(max(r.alpha, 0.0), 1.0),
            elementwise="fused",
        )
        cols = build_columns(model, [(r.strategy, wl)])
        pred = predict_columns(model, cols, make_predictor(spec), r.strategy.drafter)
        out.append(float(pred.draft_s[0] - pred.op_seconds.get("draft.host", [0.0])[0]))
    return np.array(out)


def _codes(rows):
    kinds = {"draft_model": 1, "ngram": 2}
    return (
        np.array([kinds.get(r.strategy.drafter.kind, 0) for r in rows]),
        np.array([r.batch for r in rows], dtype=float),
        np.array([len(parse_tree(r.strategy.tree)) for r in rows], dtype=float),
        np.array([tree_depth(parse_tree(r.strategy.tree)) for r in rows], dtype=float),
    )


def fit(rows: list[DraftRow], gpu_s: np.ndarray) -> tuple[dict[str, float], dict]:
    """NNLS of the drafting rows' residual (measured minus GPU) on ``draft_host_features``,
    weighted by 1 / the measured step (relative error): the n-gram terms from the n-gram rows,
    ``model_level`` from the draft model's (the features of the two never share a row). A term
    the rows cannot tell apart is held at 0 and named (``not_identified``): ``sequence`` where
    every n-gram row has one batch size (it is then the per-round term's twin), ``model_level``
    without a draft-model row."""
    x = draft_host_features(*_codes(rows))
    y = np.array([r.measured_s for r in rows]) - gpu_s
    ngram = x[:, 0] > 0
    on = ngram | (x[:, DRAFT_HOST_TERMS.index("model_level")] > 0)
    batches = sorted({r.batch for r, o in zip(rows, ngram, strict=True) if o})
    unknown = [] if len(batches) > 1 else ["sequence"]
    if not (on & ~ngram).any():
        unknown.append("model_level")
    keep = [i for i, t in enumerate(DRAFT_HOST_TERMS) if t not in unknown]
    if ngram.sum() < len(keep) - ("model_level" not in unknown):
        raise ValueError(f"the fit set has {ngram.sum()} n-gram rows, fewer than the terms")
    w = 1.0 / np.array([r.measured_s for r in rows])[on]
    coef = np.zeros(len(DRAFT_HOST_TERMS))
    coef[keep], _ = nnls(x[on][:, keep] * w[:, None], y[on] * w)
    figures = {
        "rows": int(on.sum()),
        "ngram_rows": int(ngram.sum()),
        "batches": [min(r.batch for r in rows), max(r.batch for r in rows)],
        "not_identified": unknown,
    }
    return dict(zip(DRAFT_HOST_TERMS, map(float, coef), strict=True)), figures


def errors(rows: list[DraftRow], gpu_s: np.ndarray, coef: dict[str, float]) -> dict:
    """Median and p90 APE of the draft step per drafter: GPU ops alone and with the host term."""
    host = draft_host_s(coef, *_codes(rows))
    meas = np.array([r.measured_s for r in rows])
    out = {}
    for kind in ("draft_model", "ngram"):
        sel = np.array([r.strategy.drafter.kind == kind for r in rows])
        if not sel.any():
            continue
        row = {"rows": int(sel.sum())}
        for name, pred in (("gpu_only", gpu_s), ("with_host", gpu_s + host)):
            ape = np.abs(pred[sel] / meas[sel] - 1)
            row[name] = {
                "median_ape": float(np.median(ape)),
                "p90_ape": float(np.quantile(ape, 0.9)),
            }
        out[kind] = row
    return out


def short_commit() -> str:
    """The checkout's commit as a fit file records it (``kernels.timing.git_commit``, its
    first seven hex digits, ``+dirty`` kept)."""
    full = git_commit()
    return full if full == "unknown" else full[:7] + full[40:]


def _h200_sets(data: Path, gpu: str):
    """The H200's sets: the fit on the tiny pair's batched decodes at batch 1 and 8
    (``batched-decode-contexts-<gpu>.json``); the tests on the same file at batch 32, the batch
    sweep at 16K (``batched-decode-<gpu>.json``) and the measured strategies of the planner
    evaluation at batch 32 (``planner-b32-<gpu>.json``)."""
    contexts = data / f"batched-decode-contexts-{gpu}.json"
    with gzip.open(data / f"planner-ranking-b32-{gpu}.json.gz", "rt") as fh:
        ranking = json.load(fh)
    tests = {
        "contexts_b32": decode_rows(contexts, lambda b: b == 32),
        "batch_sweep_16k": decode_rows(data / f"batched-decode-{gpu}.json"),
        "planner_b32": planner_rows(data / f"planner-b32-{gpu}.json", ranking),
    }
    fit_set = ("fit_b1_b8", f"{contexts.name}, batch 1 and 8, drafting rows")
    return fit_set, decode_rows(contexts, lambda b: b < 32), tests


def _h100_sets(data: Path, gpu: str):
    """The H100's sets: the fit on the tiny pair's batched decodes of every baseline at 16K and
    batch 1 and 4 (``batched-decode-loop-h100.json``); the tests on the same file at batch 16
    and 64 and on the measured strategies of the planner evaluation at batch 1
    (``planner.json``)."""
    loop = data / "batched-decode-loop-h100.json"
    with gzip.open(data / "planner-ranking.json.gz", "rt") as fh:
        ranking = json.load(fh)
    tests = {
        "loop_b16_b64": decode_rows(loop, lambda b: b >= 16),
        "planner_b1": planner_rows(data / "planner.json", ranking),
    }
    fit_set = ("fit_b1_b4", f"{loop.name}, batch 1 and 4, drafting rows")
    return fit_set, decode_rows(loop, lambda b: b < 16), tests


SETS = {"h200": _h200_sets, "h100-sxm": _h100_sets}


def run(data: Path, gpu: str) -> dict:
    """The fit on ``gpu``'s fit set and the errors on every set (``SETS``)."""
    if gpu not in SETS:
        raise ValueError(
            f"no committed engine runs time the draft step on {gpu!r}: {', '.join(SETS)}"
        )
    (fit_name, fit_label), fit_rows, tests = SETS[gpu](data, gpu)
    fit_gpu = gpu_draft_s(fit_rows, gpu)
    coef, fit_info = fit(fit_rows, fit_gpu)
    sets = {fit_name: errors(fit_rows, fit_gpu, coef)}
    for name, rows in tests.items():
        sets[name] = errors(rows, gpu_draft_s(rows, gpu), coef)
    return {
        "gpu": gpu,
        "terms": list(DRAFT_HOST_TERMS),
        "coefficients": coef,
        "fit": {
            **fit_info,
            "set": fit_label,
            "commit": short_commit(),
            "command": f"python -m ssvkit.calibration.draft_host_fit --gpu {gpu}",
        },
        "draft_step_ape": sets,
    }


def fit_cli(prog: str, description: str, fit_run, argv) -> dict | None:
    """The command line of a host fit: ``--gpu``, ``--data`` and ``--out``; the document of
    ``fit_run(data, gpu)``, written to ``--out`` when given, or None after a one-line error
    naming the bad input on stderr."""
    p = OneLineParser(description=description)
    p.add_argument("--gpu", default="h200", help="the GPU host whose committed runs are read")
    p.add_argument("--data", default="validation/data", help="folder of the committed runs")
    p.add_argument("--out", default=None, help="write the coefficients and errors here (JSON)")
    args = p.parse_args(argv)
    try:
        doc = fit_run(Path(args.data), args.gpu)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    if args.out:
        atomic_write(Path(args.out), json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    doc = fit_cli("draft_host_fit", __doc__.splitlines()[0], run, argv)
    if doc is None:
        return 2
    c = doc["coefficients"]
    print(
        f"draft host: {c['round'] * 1e6:.1f} us/round + {c['sequence'] * 1e6:.2f} us/sequence"
        f" + {c['sequence_node'] * 1e6:.3f} us/(sequence x node) (n-gram);"
        f" {c['model_level'] * 1e6:.1f} us/level (draft model)"
    )
    print(f"{'set':18s} {'drafter':12s} {'rows':>4s} {'GPU only':>16s} {'with host':>16s}")
    for name, per in doc["draft_step_ape"].items():
        for kind, e in per.items():
            a, b = e["gpu_only"], e["with_host"]
            print(
                f"{name:18s} {kind:12s} {e['rows']:4d} {a['median_ape']:7.1%}/{a['p90_ape']:7.1%}"
                f" {b['median_ape']:7.1%}/{b['p90_ape']:7.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
