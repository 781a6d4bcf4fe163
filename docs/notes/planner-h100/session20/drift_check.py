"""Are the profile's rounds slower than the measured phase's because of the prompts or because
of when they ran? Each dense n-gram strategy that run 33 measured at the given contexts decodes
the profile's ten prompts (seed j on prompt j, as the profile does) and the twenty measured
windows (seed i on window i), all in one set of interleaved timing passes (``run_passes`` over
``interleave``d groups, as the evaluation times): one phase, so what still differs between
the two prompt sets is theirs. Per strategy: round ms (median over prompts of each run's least
disturbed pass) and tokens per round on each set, against run 33's profile and measured
rounds (``session20/fit-rows-run33.log``, ``pair_ratio.py``).

    PYTHONPATH=. python docs/notes/planner-h100/session20/drift_check.py OUT.jsonl [CTX ...]
"""

import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

from planner.evaluate import (
    MEASURE_OFFSETS,
    PROFILE_OFFSETS,
    interleave,
    make_bench,
    prompt_tokens,
    regime_of,
    run_passes,
    steady_run,
)
from planner.rank import strategy_from_json
from planner.space import strategy_id

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "session19"))
from walk_texts import Recorder  # noqa: E402  (a run cache that runs and keeps every job)


def dense_ngram(describe: str) -> bool:
    return describe.startswith("ngram") and "dense" in describe


def main(out: str, *contexts: str) -> None:
    t0 = time.perf_counter()
    ctxs = [int(c) for c in contexts] or [15360, 3584]
    doc = json.loads((HERE.parents[2] / "validation/planner.json").read_text())
    with gzip.open(HERE.parents[2] / "validation/planner-ranking.json.gz", "rt") as fh:
        ranking = json.load(fh)
    bench = make_bench("tiny", "tiny-draft", 30720, 384, 5, "auto", "h100-sxm", 1.0)
    bench.timing_passes = 3
    bench.cache = Recorder()
    table = []
    for ctx in ctxs:
        regime = regime_of(ctx)
        rows = doc["regimes"][regime]["strategies"]
        ids = [r["id"] for r in rows if dense_ngram(r["describe"])]
        by_id = {r["id"]: r for r in ranking["regimes"][regime]["ranking"]}
        strategies = [strategy_from_json(by_id[i]["strategy"]) for i in ids]
        sets = {
            "profile": [
                (j, prompt_tokens("code", ctx, offset=o * ctx))
                for j, o in enumerate(PROFILE_OFFSETS)
            ],
            "measured": [
                (i, prompt_tokens("code", ctx, offset=o * ctx))
                for i, o in enumerate(MEASURE_OFFSETS)
            ],
        }
        groups = {}
        for s in strategies:
            sid = strategy_id(s)
            for name, prompts in sets.items():
                groups[(sid, name)] = {
                    f"drift|{ctx}|{name}|{k}|{sid}": (steady_run, (bench, s, p), {"seed": k})
                    for k, p in prompts
                }
        done = run_passes(bench, interleave(list(groups.values())))
        for s in strategies:
            sid = strategy_id(s)
            row = {"regime": regime, "id": sid, "describe": by_id[sid]["describe"]}
            for name in sets:
                figs = [done[k] for k in groups[(sid, name)]]
                row[f"{name}_round_ms"] = float(
                    np.median([1e3 * f["wall_s"] / f["rounds"] for f in figs])
                )
                row[f"{name}_tokens_per_round"] = float(
                    np.mean([f["tokens"] / f["rounds"] for f in figs])
                )
            table.append(row)
        print(f"{regime}: {time.perf_counter() - t0:.0f} s", flush=True)
    with open(out, "w") as fh:
        fh.write(json.dumps({"settings": "drift check", "table": table}) + "\n")
        fh.write("\n".join(bench.cache.lines) + "\n")
    print(f"{'regime':6s} {'strategy':36s} round ms profile / measured   tpr profile / measured")
    for r in table:
        gap = r["profile_round_ms"] / r["measured_round_ms"] - 1
        print(
            f"{r['regime']:6s} {r['describe'][:36]:36s} {r['profile_round_ms']:.3f} / "
            f"{r['measured_round_ms']:.3f} ({gap:+.1%})   "
            f"{r['profile_tokens_per_round']:.2f} / "
            f"{r['measured_tokens_per_round']:.2f}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
