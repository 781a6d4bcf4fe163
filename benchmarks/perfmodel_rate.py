"""How many strategy points per second the vectorised step model evaluates on one core.

    python benchmarks/perfmodel_rate.py [--points 200000]

Builds a grid of strategies (tree x sparse mode x group size x top_n x refresh) times workload
axes (context x acceptance x overlap x batch), then times ``predict_columns`` over it (column
construction is timed separately). Prints the rate; the target is >= 100,000 points/s.
"""

from __future__ import annotations

import itertools
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target is stated per core

import numpy as np  # noqa: E402
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.calibrated import make_predictor  # noqa: E402
from ssvkit.perfmodel.hardware import get_gpu  # noqa: E402
from ssvkit.perfmodel.models import get_model  # noqa: E402
from ssvkit.perfmodel.step import predict_columns, product_columns  # noqa: E402
from ssvkit.perfmodel.strategy import Strategy  # noqa: E402


def strategy_grid() -> list[Strategy]:
    out = [Strategy(name="ar_dense"), Strategy(name="ar_sparse", attention="sparse")]
    trees = ["chain:4", "chain:7", "full:2x3", "best:16:6", "best:32:8", "best:60"]
    for tree in trees:
        out.append(Strategy(name=f"sd_dense/{tree}", tree=tree))
        for mode, c, top_n, every in itertools.product(
            ("per_query", "union", "shared"), (1, 2, 4, 8), (16, 32, 64), (1, 2, 4, 8)
        ):
            out.append(
                Strategy(
                    name=f"sparse/{tree}/{mode}/{c}/{top_n}/{every}",
                    tree=tree,
                    attention="sparse",
                    mode=mode,
                    group_size=c,
                    top_n=top_n,
                    refresh_every=every,
                    fusion="refresh_reuse" if every > 1 else "none",
                )
            )
    return out


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    strategies = strategy_grid()
    contexts = [8192, 16384, 32768, 65536, 131072]
    acceptances = [0.5, 0.6, 0.7, 0.8, 0.9]
    overlaps = [0.5, 0.7, 0.9]
    per_batch = len(strategies) * len(contexts) * len(acceptances) * len(overlaps)
    batches = [1, 2, 4, 8, 16, 32, 64, 128][: max(1, -(-args.points // per_batch))]
    t0 = time.perf_counter()
    cols = product_columns(
        model,
        strategies,
        context_len=contexts,
        acceptance=acceptances,
        overlap=overlaps,
        batch=batches,
    )
    build_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        pred = predict_columns(model, cols, make_predictor(gpu, tp=cols.tp))
        times.append(time.perf_counter() - t0)
    n = len(cols)
    best = float(np.median(times))
    assert np.isfinite(pred.tokens_per_s).all()
    print(
        f"points: {n:,} ({len(strategies)} strategies x {len(contexts)} contexts x "
        f"{len(acceptances)} acceptances x {len(overlaps)} overlaps x {len(batches)} batches)"
    )
    print(f"column build: {build_s:.3f} s ({n / build_s:,.0f} points/s)")
    print(f"evaluation:   {best:.3f} s median of {args.repeat} ({n / best:,.0f} points/s)")
    print(f"end to end:   {n / (best + build_s):,.0f} points/s (target >= 100,000)")


if __name__ == "__main__":
    main()
