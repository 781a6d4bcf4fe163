"""Does a run's acceptance depend on what ran before it? The n-gram chain:7 at <=4K accepted
2.20 tokens a round in the profile (after the n-gram chain:4 and chain:2 runs on the same
prompts and seeds) and 1.87 measured (the first measured strategy, other prompts) in runs 30
and 31; on the CPU the profile's prompts give 1.85 and the measured ones 1.95.

Per prompt (the profile's windows, seed j on window j): chain:7 first in a fresh process, then
n-gram chain:4 and chain:2 on every prompt, then chain:7 again -- tokens per round and a hash
of each run's text; then chain:7 on the measured windows.

    PYTHONPATH=. python docs/notes/planner-h100/session18/order_check.py --out OUT.json
"""

import argparse
import hashlib
import json
import sys

import numpy as np

from planner.evaluate import (
    MEASURE_OFFSETS,
    PROFILE_OFFSETS,
    _drafter,
    make_bench,
    prompt_tokens,
    run_once,
    steady_figures,
)
from planner.space import Strategy


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=3584)
    p.add_argument("--new-tokens", type=int, default=384)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    bench = make_bench(
        "tiny", "tiny-draft", args.context, args.new_tokens, 1, args.device, "h100-sxm", 1.0
    )
    ng = _drafter(bench, "ngram")
    s = {t: Strategy(name="profile", tree=t, drafter=ng) for t in ("chain:7", "chain:4", "chain:2")}
    out: dict = {"context": args.context, "runs": []}

    def go(label: str, tree: str, offsets, j: int) -> float:
        prompt = prompt_tokens("code", args.context, offset=offsets[j] * args.context)
        res = run_once(bench, s[tree], prompt, seed=j)
        text = hashlib.sha1(np.asarray(res.tokens[0], dtype=np.int64).tobytes()).hexdigest()
        tpr = steady_figures(res)["mean_accepted"] + 1.0  # as the evaluation counts it
        out["runs"].append(
            {
                "label": label,
                "tree": tree,
                "window": offsets[j],
                "seed": j,
                "tokens_per_round": tpr,
                "text": text[:12],
            }
        )
        return tpr

    n = args.prompts
    first = [go("first", "chain:7", PROFILE_OFFSETS, j) for j in range(n)]
    for tree in ("chain:4", "chain:2"):
        for j in range(n):
            go("between", tree, PROFILE_OFFSETS, j)
    again = [go("again", "chain:7", PROFILE_OFFSETS, j) for j in range(n)]
    measured = [go("measured", "chain:7", MEASURE_OFFSETS, j) for j in range(n)]
    texts = {(r["label"], r["window"]): r["text"] for r in out["runs"] if r["tree"] == "chain:7"}
    same = sum(texts[("first", w)] == texts[("again", w)] for w in PROFILE_OFFSETS[:n])
    out["summary"] = {
        "first": float(np.mean(first)),
        "again": float(np.mean(again)),
        "measured_windows": float(np.mean(measured)),
        "same_text": same,
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(" ".join(f"{x:.2f}" for x in first), "| first")
    print(" ".join(f"{x:.2f}" for x in again), "| again (after chain:4, chain:2)")
    print(" ".join(f"{x:.2f}" for x in measured), "| measured windows")
    print(json.dumps(out["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
