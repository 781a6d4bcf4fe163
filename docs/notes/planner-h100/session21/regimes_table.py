"""The adaptive evaluation per regime: run 33's own (16K, in ``planner.json``) beside the three
``adaptive_regimes.py`` ran with its settings (``adaptive-CTX.json`` here). Per prompt set:
the offline best's tokens/s, the controller's gain with its 90% interval over the seeds, its
switches per timed run, the strongest fixed alternative and the fastest strategy per seed in
hindsight (``planner.evaluate.adaptive_resolution``).

    PYTHONPATH=. python docs/notes/planner-h100/session21/regimes_table.py
"""

import json
from pathlib import Path

from planner.evaluate import OFF_DISTRIBUTION, TARGETS, set_resolution

HERE = Path(__file__).resolve().parent


def main() -> None:
    doc = json.loads((HERE.parents[2] / "validation/planner.json").read_text())
    results = [doc["adaptive"]]
    results += [json.loads(p.read_text()) for p in HERE.glob("adaptive-*.json")]
    results.sort(key=lambda r: r["context_len"])
    print(
        f"{'regime':6s} {'prompts':10s} {'best':>6s} {'gain':>7s} {'90% interval':>16s} "
        f"{'switched':>8s} {'alternative':>11s} {'hindsight':>9s}  alternative"
    )
    verdict = {}
    for res in results:
        for k, v in res["prompt_sets"].items():
            m = set_resolution(v)
            c, h = m["challenger"], m["hindsight"]
            runs = sum(bool(r["switches"]) for r in v["adaptive"]["runs"])
            print(
                f"{res['regime']:6s} {k:10s} {v['offline_best']['tokens_per_s']:6.0f} "
                f"{v['adaptive_gain']:+7.1%} {m['gain_p05']:+7.1%}..{m['gain_p95']:+7.1%} "
                f"{runs:4d} of {len(v['adaptive']['runs'])} {c['gain']:+11.1%} "
                f"{h['gain']:+9.1%}  {c['describe']}"
            )
            if k in OFF_DISTRIBUTION:
                ok = v["adaptive_gain"] >= TARGETS["adaptive_gain_min"]
                verdict[res["regime"]] = verdict.get(res["regime"], True) and ok
    said = ", ".join(f"{r} {'met' if ok else 'not met'}" for r, ok in verdict.items())
    print(f"\nadaptive >= +10% on every off-distribution set: {said}")


if __name__ == "__main__":
    main()
