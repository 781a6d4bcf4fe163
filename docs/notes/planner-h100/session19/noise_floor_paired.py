"""The noise floor of ``session18/noise_floor.py`` with the windows resampled jointly: every
measured strategy decoded the same ten prompt windows (``runs_window``) with the same seeds, so
the window is the unit of sampling: a prompt that favours deep n-gram trees favours them on
every such strategy's side (n-gram acceptance moves with the prompt as much as with the tree).
Resampling each strategy's runs on its own, as session 18's script does, breaks that pairing and
overstates the noise of the differences. (Runs of one window share their text only while their
numerics agree: in run 32's profile, 2-3 of 13 strategies per prompt wrote one text.)

One draw picks ten windows with replacement and pools every strategy over them. First, a
predictor that knew each strategy's figure exactly (the measured one) scored against the draw.
Second, the other way round: a predictor that ranks by a draw (it saw another sample of the
same prompts, timed exactly) scored against the measured figures -- the regret that a profile
of a finite sample of prompts leaves with no other error. Each with the probability of a regret
at least the recorded one. Last, the standard error (over the draws) of the measured ratio of
each pair among the five strategies predicted best, its median over the pairs: how finely the
measurement tells near-tied strategies apart.

    python docs/notes/planner-h100/session19/noise_floor_paired.py PLANNER.json [--draws 4000]
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
        "regime  n  recorded tau / regret | perfect predictor, windows drawn jointly: tau "
        "mean (p10), regret mean (p90), P(regret >= recorded) | predictor from a draw: "
        "the same"
    )
    for regime, v in doc["regimes"].items():
        rows = v["strategies"]
        windows = [tuple(r["measured"]["runs_window"]) for r in rows]
        if len(set(windows)) != 1:
            raise SystemExit(f"{regime}: the strategies decoded different windows")
        runs = np.array([r["measured"]["runs_tokens_per_s"] for r in rows])  # [strategy, text]
        truth = np.array([r["measured"]["tokens_per_s"] for r in rows])
        k = runs.shape[1]
        top = np.argsort([-r["predicted_tokens_per_s"] for r in rows])[:5]
        pairs = [(i, j) for n, i in enumerate(top) for j in top[n + 1 :]]
        taus, regrets, ptaus, pregrets, ratios = [], [], [], [], []
        for _ in range(args.draws):
            idx = rng.integers(0, k, k)
            draw = k / np.sum(1.0 / runs[:, idx], axis=1)
            taus.append(kendalltau(truth, draw)[0])
            regrets.append(1.0 - draw[np.argmax(truth)] / draw.max())
            ptaus.append(taus[-1])  # tau is symmetric
            pregrets.append(1.0 - truth[np.argmax(draw)] / truth.max())
            ratios.append([np.log(draw[i] / draw[j]) for i, j in pairs])
        taus, regrets = np.array(taus), np.array(regrets)
        ptaus, pregrets = np.array(ptaus), np.array(pregrets)
        rec = v["regret"] - 1e-12
        print(
            f"{regime:6s} {len(rows):2d}  {v['kendall_tau']:.2f} / {v['regret']:5.1%}       | "
            f"{taus.mean():.2f} ({np.percentile(taus, 10):.2f}), "
            f"{regrets.mean():5.1%} ({np.percentile(regrets, 90):5.1%}), "
            f"{np.mean(regrets >= rec):.2f} | {ptaus.mean():.2f}, {pregrets.mean():5.1%} "
            f"({np.percentile(pregrets, 90):5.1%}), {np.mean(pregrets >= rec):.2f} | "
            f"pair ratio s.e. {np.median(np.std(ratios, axis=0)):.1%}"
        )


if __name__ == "__main__":
    main()
