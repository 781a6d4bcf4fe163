"""The planner evaluation's adaptive phase alone, on the profile and space of an earlier
evaluation (``planner_eval --adaptive-from EVAL.json``).

The adaptive phase decides nothing from the other phases' runs but the ranking, which comes
from the profile, the space, the regimes and the model: the earlier evaluation's profile,
space and regimes, ranked again at the batch here (a CPU computation, the same ranking when the
ranking code has not changed), give the same offline best and the same candidates, so a change
to the controller or the decode loop is measured again without the profile and the measured
strategies (``evaluate.evaluate``'s phases 1 and 3). The document holds the adaptive phase
(``adaptive.evaluate_adaptive``), the gains per prompt set, and the offline best's identity
beside the earlier evaluation's, which must agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.profile import profile_from_json
from ssvkit.planner.rank import rank
from ssvkit.planner.space import space_from_json
from ssvkit.validation.adaptive import evaluate_adaptive
from ssvkit.validation.bench import Bench
from ssvkit.validation.evaluate import EVAL_VERSION, adaptive_table, bench_settings
from ssvkit.validation.prompts import OFF_DISTRIBUTION, adaptive_windows
from ssvkit.validation.records import file_label


def load_source(path: str, batch: int) -> dict:
    """The earlier evaluation at ``path``: its document, checked to hold a profile, a space,
    regimes and an adaptive phase at ``batch`` (``ValueError`` in one line otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--adaptive-from {path!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError:
        raise ValueError(f"--adaptive-from {path!r} is not JSON") from None
    missing = [k for k in ("profile", "space", "regimes", "adaptive") if k not in doc]
    if missing:
        raise ValueError(f"--adaptive-from {path!r} lacks {', '.join(missing)}")
    if doc.get("batch", 1) != batch:
        raise ValueError(
            f"--adaptive-from {path!r} was evaluated at batch {doc.get('batch', 1)}, not {batch}"
        )
    return doc


def adaptive_phase(
    bench: Bench,
    source: dict,
    source_path: str,
    ctx: int,
    prompt_sets: tuple[str, ...],
    walk_prompts: int,
    oracle: bool,
    provenance: dict,
) -> dict:
    """The adaptive phase at context ``ctx`` on ``source``'s profile, space and regimes (see the
    module): its document."""
    t0 = time.perf_counter()
    profile = profile_from_json(source["profile"], source_path, "planner")
    space = space_from_json(source["space"], source_path)
    regimes = {r: v["context_len"] for r, v in source["regimes"].items()}
    ranking = rank(
        bench.model, bench.gpu, space, profile, bench.batch, regimes, bench.elementwise, bench.loop
    )
    code_windows = adaptive_windows(ctx, bench.batch, walk_prompts)
    adaptive = evaluate_adaptive(
        bench, ranking, profile, ctx, prompt_sets, ControllerConfig(), oracle, code_windows
    )
    gains = {k: v["adaptive_gain"] for k, v in adaptive["prompt_sets"].items()}
    off = [gains[k] for k in OFF_DISTRIBUTION if k in gains]
    before = {
        k: v["offline_best"]["id"] for k, v in source["adaptive"].get("prompt_sets", {}).items()
    }
    return {
        "version": EVAL_VERSION,
        "provenance": {
            **provenance,
            "backend": bench.target.backend,
            "wall_s": time.perf_counter() - t0,
        },
        "from": file_label(source_path),
        **bench_settings(bench),
        "adaptive_gain": gains,
        "adaptive_gain_off_distribution_mean": float(np.mean(off)) if off else None,
        "offline_best_before": before,
        "adaptive": adaptive,
    }


def phase_table(doc: dict) -> str:
    """``evaluate.adaptive_table`` and, per prompt set, the adaptive run's host time of the
    shadow and its verify step per round, and whether the offline best is the earlier
    evaluation's."""
    lines = [adaptive_table(doc["adaptive"]), "", "prompts    shadow us/round  verify us/round"]
    for k, v in doc["adaptive"]["prompt_sets"].items():
        steps = v["adaptive"]["steps_s"]
        same = doc["offline_best_before"].get(k) in (None, v["offline_best"]["id"])
        lines.append(
            f"{k:10s} {steps['shadow'] * 1e6:15.0f} {steps['verify'] * 1e6:16.0f}"
            + ("" if same else "  (offline best differs from the earlier evaluation's)")
        )
    return "\n".join(lines)
