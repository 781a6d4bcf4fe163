"""Run 31's <=4K ranking as the walked n-gram acceptance would have made it: run 31's profile
rebuilt from its runs (``planner_rescore.profile_from_runs``), the n-gram drafter's alpha on
each tree replaced by its walked tokens per round from ``walk-check.json`` -- measured on the
H100 in a process that wrote run 31's profile texts again (each tree's own runs' tokens per
round equal run 31's to two decimals) -- then ranked, and scored against run 31's measured
figures.

    PYTHONPATH=. python docs/notes/planner-h100/session18/walk_rescore.py
"""

import json
import sys
from pathlib import Path

from planner.evaluate import ranking_quality
from planner.profile import alpha_from_tokens
from planner.rank import rank

sys.path.insert(0, "benchmarks")
from planner_rescore import profile_from_runs  # noqa: E402

HERE = Path(__file__).parent
RUNS = HERE.parent / "runs-run31-ae68bee.jsonl.gz"
DOC = Path("docs/notes/planner-h100/planner-run31.json")


def main() -> None:
    doc = json.loads((DOC if DOC.exists() else Path("docs/validation/planner.json")).read_text())
    assert doc["provenance"]["git_commit"].startswith("ae68bee"), "expects run 31's document"
    walked = json.loads((HERE / "walk-check.json").read_text())["ngram"]
    bench, space, contexts, profile, _ = profile_from_runs(RUNS, doc)
    acc = profile.acceptance["<=4K"]
    for key, v in walked.items():
        own_alpha = alpha_from_tokens(key.split("@", 1)[1], v["own"])
        print(
            f"{key[:40]:40s} own {v['own']:.2f} (alpha {acc[key]:.3f}, from own "
            f"{own_alpha:.3f}) walked {v['walked']:.2f}"
        )
        acc[key] = alpha_from_tokens(key.split("@", 1)[1], v["walked"])
    ranking = rank(bench.model, bench.gpu, space, profile, regimes={"<=4K": contexts["<=4K"]})
    pred = {r["id"]: r["tokens_per_s"] for r in ranking["regimes"]["<=4K"]["ranking"]}
    rows = doc["regimes"]["<=4K"]["strategies"]
    q = ranking_quality(
        [pred[r["id"]] for r in rows], [r["measured"]["tokens_per_s"] for r in rows]
    )
    print(
        f"<=4K with walked n-gram acceptance: tau {q['kendall_tau']:.3f}, regret "
        f"{q['regret']:.1%} (recorded: tau {doc['regimes']['<=4K']['kendall_tau']:.3f}, "
        f"regret {doc['regimes']['<=4K']['regret']:.1%})"
    )
    for r in sorted(rows, key=lambda r: -pred[r["id"]])[:6]:
        print(
            f"  pred {pred[r['id']]:7.1f}  meas {r['measured']['tokens_per_s']:7.1f}  "
            f"{r['describe']}"
        )


if __name__ == "__main__":
    main()
