"""Where an evaluation's prediction of its dense n-gram strategies parts from the measurement,
per regime: each strategy's round time as predicted (the ranking), as the profile's own runs
took it (the overhead fit's rows, median), and as measured; then the measured tokens per round
on each measured window (least disturbed pass's decode; every pass decodes the same).

    PYTHONPATH=. python docs/notes/planner-h100/session19/miss16k.py RUNS.jsonl.gz PLANNER.json
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np

import planner.evaluate as ev
from planner.profile import fit_overhead
from planner.rank import rank

sys.path.insert(0, "benchmarks")
import planner_rescore  # noqa: E402


def main(runs_path: str, planner_path: str) -> None:
    captured = []

    def capture(strategies, residual, measured=None):
        captured.append((strategies, measured))
        return fit_overhead(strategies, residual, measured)

    ev.fit_overhead = capture  # the profile's rows, as the fit sees them
    doc = json.loads(Path(planner_path).read_text())
    bench, space, contexts, profile, _ = planner_rescore.profile_from_runs(Path(runs_path), doc)
    ranking = rank(bench.model, bench.gpu, space, profile, regimes=contexts)
    with gzip.open(runs_path, "rt") as fh:
        runs = {}
        for line in fh.read().splitlines()[1:]:
            row = json.loads(line)
            runs[row["key"]] = row["value"]
    for regime, (strategies, measured) in zip(doc["regimes"], captured, strict=True):
        ctx = doc["regimes"][regime]["context_len"]
        own: dict[str, list[float]] = {}
        for s, m in zip(strategies, measured, strict=True):
            if s.drafter.kind == "ngram" and not s.is_sparse:
                own.setdefault(s.tree, []).append(m)
        pred = {r["id"]: r for r in ranking["regimes"][regime]["ranking"]}
        print(
            f"== {regime}: round ms predicted / profile's runs / measured; measured tokens "
            f"per round on windows {doc['regimes'][regime]['measure_windows']}"
        )
        for row in doc["regimes"][regime]["strategies"]:
            if not (row["describe"].startswith("ngram") and row["describe"].endswith("dense")):
                continue
            p, m = pred[row["id"]], row["measured"]
            tree = p["strategy"]["tree"]
            tpr = []
            for i, w in enumerate(doc["regimes"][regime]["measure_windows"]):
                fig = runs[f"measure|code|{ctx}|{w}|{row['id']}|{i}"]
                tpr.append(fig["tokens"] / fig["rounds"])
            print(
                f"  {row['describe'][:30]:30s} {1e3 * p['round_s']:.3f} / "
                f"{1e3 * np.median(own.get(tree, [np.nan])):.3f} / "
                f"{1e3 * m['wall_s'] / m['rounds']:.3f}  tpr pred {p['tokens_per_round']:.2f}"
                f" meas {m['tokens'] / m['rounds']:.2f}: " + " ".join(f"{x:.2f}" for x in tpr)
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
