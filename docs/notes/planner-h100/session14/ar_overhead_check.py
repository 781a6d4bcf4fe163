"""Session 14 check of the overhead fit with autoregressive runs on every profile prompt.

Profiles 16K and 32K with the current code (``planner.evaluate.measure_profile``: the
autoregressive rows now on all ten profile prompts, ``speculative`` signed), ranks the space and
scores the strategies runs 26 and 27 measured (their held-out windows) against the new
predictions: Kendall tau, regret, and autoregressive decoding's predicted tokens/s beside its
measured ones. The profile prompts are not the measured windows, so this is out of sample.

    PYTHONPATH=. python3 docs/notes/planner-h100/session14/ar_overhead_check.py OUT.json
"""

import json
import sys
from pathlib import Path

from kernels.timing import provenance
from planner.evaluate import make_bench, measure_profile, ranking_quality
from planner.rank import rank
from planner.space import SpaceSpec
from ssvkit.options import atomic_write

DOCS = {
    "run26": "docs/notes/planner-h100/planner-run26.json",
    "run27": "docs/validation/planner.json",
}


def main(out: str) -> int:
    docs = {k: json.loads(Path(v).read_text()) for k, v in DOCS.items()}
    doc = docs["run27"]
    contexts = {r: doc["regimes"][r]["context_len"] for r in ("16K", "32K")}
    bench = make_bench(
        "tiny",
        "tiny-draft",
        max(contexts.values()),
        doc["max_new_tokens"],
        doc["repeats"],
        "auto",
        doc["gpu_model"],
        doc["temperature"],
    )
    space = SpaceSpec(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()}
    )
    profile, fits, _, _ = measure_profile(
        bench,
        contexts,
        space,
        doc["profile_reference_tree"],
        doc["profile_attention_tree"],
        doc["profile_prompts"],
    )
    ranking = rank(bench.model, bench.gpu, space, profile, regimes=contexts)
    res = {"provenance": provenance(), "overhead": profile.overhead, "fits": fits, "regimes": {}}
    for regime in contexts:
        pred = {r["id"]: r["tokens_per_s"] for r in ranking["regimes"][regime]["ranking"]}
        res["regimes"][regime] = row = {}
        for name, d in docs.items():
            rows = d["regimes"][regime]["strategies"]
            q = ranking_quality(
                [pred[r["id"]] for r in rows], [r["measured"]["tokens_per_s"] for r in rows]
            )
            old = ranking_quality(
                [r["predicted_tokens_per_s"] for r in rows],
                [r["measured"]["tokens_per_s"] for r in rows],
            )
            ar = [r for r in rows if r["describe"] == "draft_model chain:0 bfs | dense"]
            best = max(rows, key=lambda r: pred[r["id"]])
            row[name] = {
                "kendall_tau": q["kendall_tau"],
                "regret": q["regret"],
                "recorded_kendall_tau": old["kendall_tau"],
                "recorded_regret": old["regret"],
                "predicted_best": best["describe"],
                "ar_predicted": pred[ar[0]["id"]] if ar else None,
                "ar_recorded_predicted": ar[0]["predicted_tokens_per_s"] if ar else None,
                "ar_measured": ar[0]["measured"]["tokens_per_s"] if ar else None,
            }
            print(
                f"{regime} vs {name}: tau {q['kendall_tau']:.3f} (recorded "
                f"{old['kendall_tau']:.3f}) regret {q['regret']:.1%} (recorded "
                f"{old['regret']:.1%}) best {best['describe']}; AR predicted "
                f"{row[name]['ar_predicted']} (recorded {row[name]['ar_recorded_predicted']}) "
                f"measured {row[name]['ar_measured']}"
            )
        terms = ", ".join(f"{t}={c * 1e6:.1f}us" for t, c in profile.overhead[regime].items())
        print(f"{regime} overhead: {terms}")
    atomic_write(out, json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
