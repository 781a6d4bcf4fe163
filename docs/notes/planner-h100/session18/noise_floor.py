"""The ranking quality a perfect predictor could expect against the evaluation's measurement:
each measured strategy's figure is pooled over ten texts (tokens over wall time), and a text
draws its own acceptance at temperature 1. Resampling each strategy's ten runs with replacement
(bootstrap) gives measurements as another draw of texts would; a predictor that knew every
strategy's figure exactly (here: the measured one) scores Kendall tau and regret against
those. Per-run tokens are equal to within 1%, so a pooled figure is the harmonic mean of its
runs' tokens/s (checked against the recorded figure). Correlated shifts of the machine (a slow
stretch over a block of runs) are not in the resampling: the floor is lower than this.

    python docs/notes/planner-h100/session18/noise_floor.py PLANNER.json [--draws 4000]
"""

import argparse
import json

import numpy as np
from scipy.stats import kendalltau


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("planner")
    p.add_argument("--draws", type=int, default=4000)
    args = p.parse_args()
    doc = json.load(open(args.planner))
    rng = np.random.default_rng(0)
    print(
        "regime  n  recorded tau / regret | perfect predictor: tau mean (p10), regret mean "
        "(p90); pooled-figure check"
    )
    for regime, v in doc["regimes"].items():
        rows = v["strategies"]
        runs = [np.asarray(r["measured"]["runs_tokens_per_s"]) for r in rows]
        truth = np.array([r["measured"]["tokens_per_s"] for r in rows])
        hm = np.array([len(x) / np.sum(1.0 / x) for x in runs])
        taus, regrets = [], []
        for _ in range(args.draws):
            draw = np.array([len(x) / np.sum(1.0 / rng.choice(x, len(x))) for x in runs])
            taus.append(kendalltau(truth, draw)[0])
            regrets.append(1.0 - draw[np.argmax(truth)] / draw.max())
        taus, regrets = np.array(taus), np.array(regrets)
        print(
            f"{regime:6s} {len(rows):2d}  {v['kendall_tau']:.2f} / {v['regret']:5.1%}       | "
            f"{taus.mean():.2f} ({np.percentile(taus, 10):.2f}), "
            f"{regrets.mean():5.1%} ({np.percentile(regrets, 90):5.1%}); "
            f"max |hm/pooled - 1| {np.max(np.abs(hm / truth - 1)):.1%}"
        )


if __name__ == "__main__":
    main()
