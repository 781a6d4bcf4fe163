"""What the adaptive machinery costs a decode round when it never switches: the offline best
decoded fixed, against the same strategy under controllers that keep it.

    PYTHONPATH=. python benchmarks/adaptive_overhead.py --runs 8 --out /tmp/overhead.json

Variants (each decodes the ``--prompt-set`` prompt of the planner's adaptive phase, window 2, at
``--context``, with the regime's offline best of the installed evaluation's ranking, or
``--strategy`` DRAFTER:TREE, dense):

- ``fixed``: no controller (``planner.evaluate.steady_run``);
- ``plumbing``: a controller that never switches but, like ``OnlineController``, declares both
  drafter kinds (the loop keeps the draft model warm and the n-gram shadow scores every round)
  and takes its calls behind the next round's GPU work (``overlap``);
- ``plumbing_trees``: ``plumbing`` whose shadow also walks the n-gram trees the controller
  would have it walk (``OnlineController.shadow_trees``);
- ``plumbing_no_shadow``: the same, declaring no drafter kind (nothing kept warm, no shadow);
- ``controller`` / ``controller_stride1`` / ``controller_stride16`` / ``controller_serial``:
  ``OnlineController`` with its defaults, with ``stride`` 1 and 16, and without ``overlap``;
- ``spin_50us`` / ``spin_200us_every_4th``: a controller that declares nothing and holds the
  host for 50 us every call, or 200 us every fourth (the default controller's stride), behind
  the next round's GPU work: whether host time there is hidden at all.

Every variant runs ``--runs`` times, interleaved (run i of every variant, then run i + 1), and
its figure is the mean round time (us) of its least disturbed run and the median over runs.
A controller run that switched is reported and left out of the figures (its rounds differ).
Each variant's text is compared with the fixed run's of the same seed: the position of the
first token that differs (none: the same text).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


class _Keep:
    """Never switches; declares ``kinds`` and overlaps its calls as ``OnlineController`` does."""

    overlap = True

    def __init__(self, kinds: tuple[str, ...], trees=None):
        self.kinds, self.trees = kinds, trees

    def drafter_kinds(self) -> tuple[str, ...]:
        return self.kinds

    def shadow_trees(self, context_len: int) -> tuple[str, ...]:
        """The n-gram trees the shadow walks: the controller's (``trees``), or none."""
        return self.trees(context_len) if self.trees else ()

    def after_round(self, stats):
        return None


class _Spin(_Keep):
    """Declares nothing (no warm drafter, no shadow) and holds the host for ``us``
    microseconds every ``every``-th call, behind the next round's GPU work (``overlap``):
    whether host time there is hidden at all, whatever it computes."""

    def __init__(self, us: float, every: int = 1):
        super().__init__(())
        self.s, self.every, self.calls = us * 1e-6, every, 0

    def after_round(self, stats):
        self.calls += 1
        if self.calls % self.every == 0:
            end = time.perf_counter() + self.s
            while time.perf_counter() < end:
                pass
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=15360)
    p.add_argument("--new-tokens", type=int, default=384)
    p.add_argument("--seed", type=int, default=4, help="sampling seed of every run")
    p.add_argument("--runs", type=int, default=8, help="runs per variant")
    p.add_argument(
        "--strategy",
        default="",
        help="DRAFTER:TREE decoded (e.g. draft_model:chain:2; default: the offline best)",
    )
    p.add_argument("--prompt-set", default="code", help="code, prose, repetitive or random")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from perfmodel.strategy import DrafterSpec, Strategy, parse_tree
    from planner.evaluate import PROMPT_SETS

    try:
        if args.runs < 1 or args.context < 1:
            raise ValueError("--runs and --context must be >= 1")
        if args.prompt_set not in PROMPT_SETS:
            raise ValueError(
                f"unknown --prompt-set {args.prompt_set!r}; one of {', '.join(PROMPT_SETS)}"
            )
        chosen = None
        if args.strategy:
            kind, _, tree = args.strategy.partition(":")
            if kind not in ("draft_model", "ngram") or not tree:
                raise ValueError(
                    f"--strategy {args.strategy!r}: expected DRAFTER:TREE with "
                    "DRAFTER draft_model or ngram"
                )
            parse_tree(tree)
            # The draft model's name is the bench's, set below.
            model = "tiny-draft" if kind == "draft_model" else None
            chosen = Strategy(
                name="overhead", tree=tree, drafter=DrafterSpec(kind=kind, model=model)
            )
    except ValueError as e:
        print(f"adaptive_overhead: {e}", file=sys.stderr)
        return 2
    from controller_cost import load_setting

    from kernels.timing import provenance
    from planner.controller import ControllerConfig, OnlineController
    from planner.evaluate import make_bench, prompt_tokens, run_once, steady_figures
    from planner.profile import regime_of
    from planner.rank import strategy_from_json
    from planner.space import describe

    ranking, model, gpu, profile = load_setting()
    regime = regime_of(args.context)
    best = chosen or strategy_from_json(ranking["regimes"][regime]["ranking"][0]["strategy"])
    bench = make_bench("tiny", "tiny-draft", args.context, args.new_tokens, 1, temperature=1.0)
    best = dataclasses.replace(
        best,
        drafter=dataclasses.replace(
            best.drafter, model=bench.draft_label if best.drafter.kind == "draft_model" else None
        ),
    )
    prompt = prompt_tokens(args.prompt_set, args.context, offset=2 * args.context)

    def ctl(**kw):
        return lambda: OnlineController(ranking, model, gpu, profile, ControllerConfig(**kw))

    variants = {
        "fixed": lambda: None,
        "plumbing": lambda: _Keep(("draft_model", "ngram")),
        "plumbing_trees": lambda: _Keep(("draft_model", "ngram"), ctl()().shadow_trees),
        "plumbing_no_shadow": lambda: _Keep(()),
        "controller": ctl(),
        "controller_stride1": ctl(stride=1),
        "controller_stride16": ctl(stride=16),
        "controller_serial": ctl(overlap=False),
        "spin_50us": lambda: _Spin(50.0),
        "spin_200us_every_4th": lambda: _Spin(200.0, 4),
    }
    runs, text = [], {}
    for i in range(args.runs + 1):  # run 0 of each: warm-up (graphs, compilation), not kept
        for name, make in variants.items():
            c = make()
            if hasattr(c, "warm"):
                c.warm()
            res = run_once(bench, best, prompt, controller=c, seed=args.seed)
            f = steady_figures(res)
            text.setdefault(name, list(res.tokens[0]))
            if i:
                runs.append(
                    {
                        "variant": name,
                        "repeat": i,
                        "rounds": f["rounds"],
                        "tokens": f["tokens"],
                        "round_us": 1e6
                        / f["rounds"]
                        * (f["wall_s"] + f["switch_s"] + f["control_s"]),
                        "control_overlap_us": 1e6 * f["control_overlap_s"] / f["rounds"],
                        "steps_us": {k: 1e6 * v for k, v in f["steps_s"].items()},
                        "switches": len(getattr(c, "switches", [])),
                    }
                )
    # Where each variant's text (its first run's) first differs from the fixed run's of the
    # same seed: None when it decodes the same text (a paired comparison compares like with
    # like only then).
    differs = {}
    for name, t in text.items():
        ref = text["fixed"]
        differs[name] = next(
            (j for j, (x, y) in enumerate(zip(ref, t, strict=False)) if x != y),
            None if len(ref) == len(t) else min(len(ref), len(t)),
        )
    rows = []
    for name in variants:
        rs = [r for r in runs if r["variant"] == name and not r["switches"]]
        t = [r["round_us"] for r in rs]
        rows.append(
            {
                "variant": name,
                "runs_kept": len(rs),
                "runs_switched": sum(1 for r in runs if r["variant"] == name) - len(rs),
                "rounds": sorted({r["rounds"] for r in rs}),
                "min_round_us": min(t) if t else None,
                "median_round_us": float(np.median(t)) if t else None,
                "control_overlap_us": float(np.median([r["control_overlap_us"] for r in rs]))
                if rs
                else None,
                "text_differs_at": differs[name],
            }
        )
    doc = {
        "provenance": provenance(),
        "context": args.context,
        "seed": args.seed,
        "prompt_set": args.prompt_set,
        "strategy": describe(best),
        "runs": runs,
        "summary": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    base = rows[0]["min_round_us"]
    print(f"{describe(best)} at {args.context}, {args.prompt_set} prompt, seed {args.seed}")
    print(
        f"{'variant':22s} {'kept':>4s} {'switched':>8s} {'min us':>7s} {'median':>7s} "
        f"{'over fixed':>10s} {'ctl us/round':>12s} {'text differs at':>15s}"
    )
    for r in rows:
        if r["min_round_us"] is None:
            print(f"{r['variant']:22s} {0:4d} {r['runs_switched']:8d}")
            continue
        print(
            f"{r['variant']:22s} {r['runs_kept']:4d} {r['runs_switched']:8d} "
            f"{r['min_round_us']:7.0f} {r['median_round_us']:7.0f} "
            f"{r['min_round_us'] / base - 1:+10.1%} {r['control_overlap_us']:12.1f} "
            f"{str(r['text_differs_at']):>15s}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
