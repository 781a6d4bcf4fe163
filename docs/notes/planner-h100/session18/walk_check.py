"""The n-gram drafter's tokens per round per tree at <=4K, from each tree's own profile runs
and from its walks over every dense profile run's text (``planner.evaluate.walk_ngram``), in a
process set up as the evaluation's (room for 30720 tokens, the same runs in the same order, one
timing pass), against run 31's measured figures on the held-out windows.

    PYTHONPATH=. python docs/notes/planner-h100/session18/walk_check.py --out OUT.json
"""

import argparse
import json
import sys
import time

from planner.evaluate import make_bench, measure_profile
from planner.space import SpaceSpec

TREES = ("chain:0", "chain:2", "chain:4", "chain:7", "best:8:4", "best:16:6", "best:32:8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-context", type=int, default=30720)
    p.add_argument("--context", type=int, default=3584)
    p.add_argument("--new-tokens", type=int, default=384)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    bench = make_bench(
        "tiny", "tiny-draft", args.max_context, args.new_tokens, 1, args.device, "h100-sxm", 1.0
    )
    bench.log = lambda m: print(m, flush=True) if "ngram" in m else None
    space = SpaceSpec(drafters=("draft_model", "ngram"), trees=TREES, draft_model=bench.draft_label)
    t0 = time.perf_counter()
    _, _, _, chain_tokens = measure_profile(
        bench, {"<=4K": args.context}, space, prompts=args.prompts
    )
    rows = {k: v for k, v in chain_tokens["<=4K"].items() if k.startswith("ngram@")}
    with open(args.out, "w") as fh:
        json.dump(
            {
                "context": args.context,
                "max_context": args.max_context,
                "ngram": rows,
                "wall_s": time.perf_counter() - t0,
            },
            fh,
            indent=1,
        )
    for k, v in rows.items():
        print(
            f"{k[:60]:60s} own {v['own']:.2f} walked {v['walked']:.2f} ({v['walked_texts']} texts)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
