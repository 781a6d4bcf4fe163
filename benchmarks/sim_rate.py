"""How many verification rounds per wall-second the simulator runs for one request on one core.

    python benchmarks/sim_rate.py [--rounds 100000] [--scenarios sd_dense,ssv]

Times ``env.run()`` only (the cost tables are built once per scenario beforehand and reported
separately). Round-granularity scenarios have a target of >= 20,000 rounds/s. The
per-layer designs (``prr``, ``--per-layer``) run one event per layer and are listed for
reference.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target is stated per core

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.strategy import parse_tree, tree_expected_tokens  # noqa: E402
from ssvkit.sim.config import SimConfig, default_strategy  # noqa: E402
from ssvkit.sim.scenarios import simulate  # noqa: E402

TARGET = 20_000


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument(
        "--scenarios",
        default="ar_dense,ar_sparse,sd_dense,sd_sparse_naive,ssv,ssd,ssv/per_layer,prr",
    )
    args = ap.parse_args()
    print(f"{'scenario':18s} {'rounds':>8s} {'build s':>8s} {'run rounds/s':>13s}  target")
    worst = None
    for item in args.scenarios.split(","):
        name, _, mode = item.partition("/")
        per_layer = mode == "per_layer"
        heavy = per_layer or name == "prr"
        rounds = args.rounds // 20 if heavy else args.rounds
        tree = default_strategy(name).tree
        tokens = int(rounds * tree_expected_tokens(parse_tree(tree, 0.7), 0.7))
        cfg = SimConfig(scenario=name, num_tokens=tokens, per_layer=per_layer, timeline_rounds=0)
        r = simulate(cfg)
        rate = r.figures["rounds_per_wall_s"]["value"]
        build = r.figures["wall_s"]["value"] - r.recorder.num_rounds / rate
        verdict = "per-layer (reference)" if heavy else ("ok" if rate >= TARGET else "BELOW")
        if not heavy:
            worst = rate if worst is None else min(worst, rate)
        print(f"{item:18s} {r.recorder.num_rounds:8d} {build:8.2f} {rate:13,.0f}  {verdict}")
    if worst is not None:
        print(f"slowest round-granularity scenario: {worst:,.0f} rounds/s (target >= {TARGET:,})")


if __name__ == "__main__":
    main()
