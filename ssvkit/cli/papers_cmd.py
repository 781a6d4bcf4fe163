"""``ssvkit papers``: the five seeds' headline figures beside ssvkit's on the papers' settings.

ssvkit papers                      # every seed: paper, ssvkit, ratio, status and the reasons
ssvkit papers --seed 004 --json    # one seed; every figure with its settings and provenance
ssvkit papers --markdown           # the table of docs/results/papers.md

The figures are ``validation/data/papers.json`` (typed from the papers, each with its table or
section); ``validation.papers`` computes ssvkit's side with the predictor and the simulator.
"""

from __future__ import annotations

import json

from ssvkit.validation.papers import SEEDS, check_seed, markdown, reproduce, text_table

HELP = "the seeds' headline figures beside ssvkit's, with the settings and a status each"


def add_arguments(p) -> None:
    p.add_argument("--seed", default=None, help=f"one seed only: {', '.join(SEEDS)}")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON (every figure, provenance)")
    out.add_argument("--markdown", action="store_true", help="print the docs page's table")


def run(args) -> int:
    rep = reproduce(check_seed(args.seed))
    if args.json:
        print(json.dumps(rep, indent=2))
    elif args.markdown:
        print(markdown(rep), end="")
    else:
        print(text_table(rep))
    return 0
