"""The loop-overhead fit's rows per regime, rebuilt from an evaluation's runs: each profile
run's measured round, the step model's round (measured minus the residual), and the fit's
error on it (relative to the measured round), for the dense n-gram strategies and per group
of the rest. The n-gram walks are left out (the acceptance they set needs the prompts of the
machine that ran the evaluation; the fit does not use it), so this runs anywhere.

    PYTHONPATH=. python docs/notes/planner-h100/session20/fit_rows.py RUNS.jsonl.gz PLANNER.json
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

import planner.evaluate as ev
from planner.profile import fit_overhead, overhead_features

sys.path.insert(0, "benchmarks")
import planner_rescore  # noqa: E402


def main(runs_path: str, planner_path: str) -> None:
    captured = []

    def capture(strategies, residual, measured=None):
        coef, fit = fit_overhead(strategies, residual, measured)
        captured.append((strategies, residual, measured, coef))
        return coef, fit

    ev.fit_overhead = capture
    ev.walk_texts = lambda *a, **k: []  # walks set acceptance only
    ev.walk_ngram = lambda *a, **k: None
    doc = json.loads(Path(planner_path).read_text())
    planner_rescore.profile_from_runs(Path(runs_path), doc)
    for regime, (strategies, residual, measured, coef) in zip(
        doc["regimes"], captured, strict=True
    ):
        c = np.array(list(coef.values()))
        print(f"== {regime}: " + ", ".join(f"{k} {1e6 * v:.1f}" for k, v in coef.items()) + " (us)")
        groups = defaultdict(list)
        for s, y, m in zip(strategies, residual, measured, strict=True):
            fitted = float(overhead_features(s) @ c)
            if s.drafter.kind == "ngram" and not s.is_sparse and "parents" in s.tree:
                label = f"ngram {len(ev.parse_tree(s.tree))}-node tree"
            elif s.drafter.kind == "ngram" and not s.is_sparse:
                label = f"ngram {s.tree}"
            else:
                label = ("ar" if s.tree == "chain:0" else s.drafter.kind) + (
                    " sparse" if s.is_sparse else " dense"
                )
            groups[label].append((m, m - y, (fitted - y) / m))
        for label, rows in sorted(groups.items()):
            a = np.array(rows)
            print(
                f"  {label:24s} n={len(a):3d} round {1e3 * np.median(a[:, 0]):.3f} ms, step "
                f"model {1e3 * np.median(a[:, 1]):.3f} ms, fit error median "
                f"{np.median(a[:, 2]):+.1%}"
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
