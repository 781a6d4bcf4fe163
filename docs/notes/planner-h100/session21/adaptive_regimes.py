"""The adaptive evaluation in the regimes run 33 did not run it in. Every evaluation since run
1 ran the controller at 15360 tokens (16K) only; this runs ``evaluate_adaptive`` as run 33 did
-- its ranking (``docs/validation/planner-ranking.json.gz``), its profile and controller
settings (``planner.json``), five seeds, three interleaved timing passes, 384 new tokens at
temperature 1, the oracle of every (drafter, tree) -- at the other regimes' contexts, so each
regime's gain, its 90% interval over the seeds, the strongest fixed alternative and the
fastest strategy per seed in hindsight are known. Supplementary: the installed document and
its 16K figures stay what the evaluation recorded.

    PYTHONPATH=. python docs/notes/planner-h100/session21/adaptive_regimes.py CACHE OUT CTX...

``CACHE`` is a run cache (``RunCache``) that a call cut off by the device's time limit resumes
from; ``OUT`` gets one JSON per finished context (``adaptive-CTX.json``).
"""

import gzip
import json
import os
import sys
import time
from pathlib import Path

from planner.controller import ControllerConfig
from planner.evaluate import (
    PROMPT_SETS,
    RunCache,
    evaluate_adaptive,
    make_bench,
    set_resolution,
)
from planner.profile import profile_from_json

HERE = Path(__file__).resolve().parent
VALIDATION = HERE.parents[2] / "validation"
SETTINGS = {
    "script": "session21/adaptive_regimes.py",
    "evaluation": "run 33 (02258d9)",
    "new_tokens": 384,
    "repeats": 5,
    "temperature": 1.0,
    "timing_passes": 3,
}


def main(cache: str, out: str, *contexts: str) -> None:
    t0 = time.perf_counter()
    doc = json.loads((VALIDATION / "planner.json").read_text())
    with gzip.open(VALIDATION / "planner-ranking.json.gz", "rt") as fh:
        ranking = json.load(fh)
    profile = profile_from_json(doc["profile"], "run 33's profile", "planner")
    config = ControllerConfig(**doc["adaptive"]["controller"])
    bench = make_bench("tiny", "tiny-draft", 30720, 384, 5, "auto", "h100-sxm", 1.0)
    bench.timing_passes = 3
    bench.cache = RunCache(cache, SETTINGS)
    print(
        f"{len(bench.cache.runs)} runs in the cache; commit "
        f"{os.environ.get('SSVKIT_GIT_COMMIT', 'unknown')}",
        flush=True,
    )
    for ctx in map(int, contexts):
        res = evaluate_adaptive(bench, ranking, profile, ctx, PROMPT_SETS, config, oracle=True)
        Path(out, f"adaptive-{ctx}.json").write_text(json.dumps(res) + "\n")
        print(f"{ctx} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(
        f"\n{'ctx':>6s} {'prompts':10s} {'best':>7s} {'gain':>7s} {'90% interval':>16s} "
        f"{'alternative':>11s} {'hindsight':>9s}  alternative"
    )
    for ctx in map(int, contexts):
        res = json.loads(Path(out, f"adaptive-{ctx}.json").read_text())
        for k, v in res["prompt_sets"].items():
            m = set_resolution(v)
            c, h = m["challenger"], m["hindsight"]
            print(
                f"{ctx:6d} {k:10s} {v['offline_best']['tokens_per_s']:7.0f} "
                f"{v['adaptive_gain']:+7.1%} {m['gain_p05']:+7.1%}..{m['gain_p95']:+7.1%} "
                f"{c['gain']:+11.1%} {h['gain']:+9.1%}  {c['describe']}"
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
