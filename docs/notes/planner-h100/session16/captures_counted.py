"""Run 29's adaptive gains with the in-run capture rounds counted, from its runs file, as
``planner.evaluate`` now records them (``adaptive_gain_captures_counted``): each run the least
disturbed of its timing passes, the median of five seeds, both sides counted.

    PYTHONPATH=. python docs/notes/planner-h100/session16/captures_counted.py
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np

from planner.evaluate import captures_counted, least_disturbed

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "runs-run29-be2c64a.jsonl.gz"
BEST = "s-627a4729c4"  # run 29's offline best at 16K (ngram chain:7 bfs | dense)


def main() -> int:
    runs = {}
    with gzip.open(RUNS, "rt") as fh:
        for line in fh:
            row = json.loads(line)
            if "key" in row:
                runs[row["key"]] = row["value"]
    out = {}
    for ps in ("code", "prose", "repetitive", "random"):
        base = f"adapt|{ps}|15360|30720"

        def kept(key):
            return least_disturbed([runs[key + t] for t in ("", "|t1", "|t2")])

        ada = [kept(f"{base}|adaptive|{BEST}|{i}") for i in range(5)]
        fix = [kept(f"{base}|{BEST}|{i}") for i in range(5)]
        med = np.median
        tps = [r["tokens_per_s"] for r in ada], [r["tokens_per_s"] for r in fix]
        cc = [captures_counted(r) for r in ada], [captures_counted(r) for r in fix]
        out[ps] = {
            "gain": float(med(tps[0]) / med(tps[1]) - 1),
            "gain_captures_counted": float(med(cc[0]) / med(cc[1]) - 1),
            "capture_rounds": [r["capture_rounds"] for r in ada],
            "capture_s": [r["capture_s"] for r in ada],
        }
        row = out[ps]
        print(
            f"{ps:10s} gain {row['gain']:+.1%}  captures counted "
            f"{row['gain_captures_counted']:+.1%}  capture rounds {row['capture_rounds']}"
        )
    (HERE / "captures-counted-run29.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
