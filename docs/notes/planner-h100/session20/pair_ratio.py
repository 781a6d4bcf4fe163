"""Per regime, the measured best dense n-gram strategy against the predicted best (or, where
they agree, the runner-up): the ratio of their tokens per round as predicted (the walks) and as
measured (mean over the measured windows; the first ten, the rest), and the ratio of their round
times as predicted and as measured (median over the windows of each run's least disturbed pass).

    python docs/notes/planner-h100/session20/pair_ratio.py RUNS.jsonl.gz PLANNER.json
"""

import gzip
import json
import sys
from collections import defaultdict

import numpy as np

CONTEXTS = {"<=4K": 3584, "8K": 7680, "16K": 15360, "32K": 30720}


def main(runs_path: str, planner_path: str) -> None:
    doc = json.load(open(planner_path))
    runs = defaultdict(dict)  # (context, id, window) -> pass -> (tokens, rounds, wall_s)
    with gzip.open(runs_path, "rt") as fh:
        for line in fh:
            r = json.loads(line)
            if "key" in r and r["key"].startswith("measure|"):
                f = r["key"].split("|")  # measure|code|ctx|window|id|seed[|tPASS]
                p = int(f[6][1:]) if len(f) == 7 else 0
                v = r["value"]
                runs[(int(f[2]), f[4], int(f[3]))][p] = (v["tokens"], v["rounds"], v["wall_s"])
    for reg, e in doc["regimes"].items():
        rows = {
            r["describe"].split(" bfs")[0]: r
            for r in e["strategies"]
            if r["describe"].startswith("ngram") and "dense" in r["describe"]
        }
        windows = next(iter(rows.values()))["measured"]["runs_window"]
        by_meas = sorted(rows, key=lambda k: -rows[k]["measured"]["tokens_per_s"])
        a = max(rows, key=lambda k: rows[k]["predicted_tokens_per_s"])
        b = by_meas[0] if by_meas[0] != a else by_meas[1]
        big, small = sorted((a, b), key=lambda k: -rows[k]["predicted_tokens_per_round"])

        def per(name, ctx=CONTEXTS[reg], rows=rows, windows=windows):
            tpr, ms = [], []
            for w in windows:
                t, r, s = min(runs[(ctx, rows[name]["id"], w)].values(), key=lambda x: x[2])
                tpr.append(t / r)
                ms.append(s / r)
            return np.array(tpr), np.array(ms)

        tb, mb = per(big)
        ts, msm = per(small)
        pb, ps = rows[big], rows[small]
        tpr_pred = pb["predicted_tokens_per_round"] / ps["predicted_tokens_per_round"]
        round_pred = tpr_pred * ps["predicted_tokens_per_s"] / pb["predicted_tokens_per_s"]
        print(
            f"{reg} {big} / {small}: tpr ratio pred {tpr_pred:.3f}, meas all "
            f"{tb.mean() / ts.mean():.3f} first10 {tb[:10].mean() / ts[:10].mean():.3f} "
            f"last10 {tb[10:].mean() / ts[10:].mean():.3f}; round ratio pred "
            f"{round_pred:.3f} meas {np.median(mb) / np.median(msm):.3f}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
