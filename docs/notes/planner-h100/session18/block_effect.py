"""How much of the measured runs' slowdown falls on a strategy's whole block of runs in a pass
(a shared slow stretch) rather than on single runs: per strategy and pass, each run's tokens/s
over its best pass, then the spread of the block means against what independent runs would
give (the within-block spread over sqrt(runs)). Blocked passes (run 31, ae68bee) against
interleaved ones (the 16K check at 3179d93).

    python docs/notes/planner-h100/session18/block_effect.py RUNS.jsonl[.gz] CONTEXT
"""

import gzip
import json
import sys
from collections import defaultdict

import numpy as np


def main(path: str, ctx: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    runs, order = {}, []
    with opener(path, "rt") as fh:
        for line in fh:
            r = json.loads(line)
            if "key" in r:
                runs[r["key"]] = r["value"]
                order.append(r["key"])
    first = [k for k in order if k.startswith(f"measure|code|{ctx}|") and "|t" not in k]
    by = defaultdict(list)
    for k in first:
        by[k.split("|")[-2]].append(k)
    block_sd, within_sd = [], []
    for keys in by.values():
        rel = np.array(
            [
                [
                    runs[k]["tokens_per_s"],
                    runs[f"{k}|t1"]["tokens_per_s"],
                    runs[f"{k}|t2"]["tokens_per_s"],
                ]
                for k in keys
            ]
        )
        rel = rel / rel.max(axis=1, keepdims=True)
        block_sd.append(rel.mean(axis=0).std(ddof=1))  # across the 3 passes' block means
        within_sd.append(rel.std(axis=0, ddof=1).mean() / np.sqrt(len(keys)))
    print(
        f"{path}: {len(by)} strategies, pass-block means sd {np.mean(block_sd):.3f} "
        f"(independent runs would give {np.mean(within_sd):.3f})"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
