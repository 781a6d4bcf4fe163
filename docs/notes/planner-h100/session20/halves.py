"""Regret of an evaluation's dense n-gram strategies on all its measured windows, on the first
ten (the windows of run 32) and on the rest: the harmonic mean of each strategy's runs over the
windows, the measured best against the predicted best.

    python docs/notes/planner-h100/session20/halves.py PLANNER.json [PLANNER.json ...]
"""

import json
import sys

import numpy as np


def dense_ngram(describe: str) -> bool:
    return describe.startswith("ngram") and describe.endswith("dense")


def main(paths: list[str]) -> None:
    for path in paths:
        doc = json.load(open(path))
        print("==", path)
        for name, reg in doc["regimes"].items():
            rows = [r for r in reg["strategies"] if dense_ngram(r["describe"])]
            pred = max(rows, key=lambda r: r["predicted_tokens_per_s"])
            out = []
            for label, sel in (
                ("all", slice(None)),
                ("first10", slice(0, 10)),
                ("last10", slice(10, None)),
            ):
                runs = {
                    r["describe"]: np.array(r["measured"]["runs_tokens_per_s"])[sel] for r in rows
                }
                if not len(runs[pred["describe"]]):
                    continue
                hm = {k: len(v) / np.sum(1 / v) for k, v in runs.items()}
                best = max(hm, key=hm.get)
                got = hm[pred["describe"]]
                regret = 1 - got / hm[best]
                out.append(
                    f"{label}: best {best.split(' bfs')[0]} {hm[best]:.0f}, "
                    f"predicted best {got:.0f}, regret {regret:.1%}"
                )
            print(name, "predicted best", pred["describe"].split(" bfs")[0], "|", "; ".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
