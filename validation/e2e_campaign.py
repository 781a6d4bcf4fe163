"""The end-to-end validation campaign: every baseline decoded by the real engine on the trained
tiny pair, per context regime, for ``ssvkit report``.

    python -m ssvkit.validation.e2e_campaign --out validation/data/campaign.json \\
        --resume build/campaign-runs.jsonl                                   # on the H100
    python -m ssvkit.validation.e2e_campaign --contexts 1K --seeds 1 \\
        --new-tokens 16 --device cpu --out /tmp/campaign.json                # a CPU smoke run

Baselines: ``ar_dense``, ``ar_sparse``, ``sd_dense``, ``sd_sparse_naive``, ``ssv`` (perfmodel's
definitions, the draft model as drafter: the tiny pair has no EAGLE head) and ``ssv_planned``
(the regime's offline best under the planner evaluation's profile, ``--planner``). Each
(baseline, context, seed) decodes a code prompt no profile or planner run used, seed 0 with
every round's (context, drafted, accepted), the trace the simulator replays (``measure_rows``).
The measured rows only: the predictions are ``ssvkit report``'s, on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy
from ssvkit.planner.profile import profile_from_json
from ssvkit.planner.rank import concrete, rank, strategy_from_json
from ssvkit.planner.space import SpaceSpec, describe, strategy_id
from ssvkit.validation.bench import RunCache, make_bench, steady_figures
from ssvkit.validation.prompts import prompt_tokens, regime_contexts
from ssvkit.validation.records import (
    add_pair_args,
    command_line,
    file_label,
    record_path,
    run_schedule,
)

CAMPAIGN_VERSION = 1
NAMES = ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv", "ssv_planned")
PROMPT_OFFSET = 3  # prompt window: context x 3 (profile used x 0, the planner x 1 and x 2)


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    add_pair_args(p)
    p.add_argument("--baselines", default=",".join(NAMES))
    p.add_argument("--seeds", type=int, default=3, help="runs per (baseline, context)")
    p.add_argument("--new-tokens", type=int, default=384, help="tokens generated per run")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument(
        "--planner",
        default=str(record_path("planner.json")),
        help="planner evaluation whose profile ranks ssv_planned (default: the one of record)",
    )
    p.add_argument("--gpu", default="h100-sxm", help="GPU registry key of the ranking")
    p.add_argument("--device", default="auto", help="cuda | cpu")
    p.add_argument("--out", required=True, help="campaign JSON")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    return p.parse_args(argv)


def load_planner(path: str):
    try:
        doc = json.loads(open(path).read())
    except FileNotFoundError:
        raise ValueError(f"--planner {path!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--planner {path!r} is not valid JSON: {e.msg}") from None
    if "profile" not in doc or "space" not in doc:
        raise ValueError(f"--planner {path!r} has no profile or space (not a planner evaluation)")
    profile = profile_from_json(doc["profile"], f"--planner {path!r}", "planner")
    space = SpaceSpec(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()}
    )
    return profile, space


def strategies_for(bench, profile, space, regime: str, ctx: int, names) -> dict[str, Strategy]:
    """The strategy each baseline name runs at ``ctx`` (draft model as drafter, ``best:N``
    trees resolved at the profile's acceptance of the drafter, as the ranking resolves them, so
    the engine and the prediction run one tree); ``ssv_planned`` is the regime's offline best."""
    out = {}
    for name in names:
        if name == "ssv_planned":
            ranking = rank(
                bench.model,
                bench.gpu,
                dataclasses.replace(space, draft_model=bench.draft_label),
                profile,
                regimes={regime: ctx},
                elementwise=bench.elementwise,
                loop=bench.loop,
            )
            best = ranking["regimes"][regime]["ranking"][0]["strategy"]
            s = dataclasses.replace(strategy_from_json(best), name="ssv_planned")
        else:
            s = BASELINES[name]
            if s.tree != "chain:0":
                dm = DrafterSpec(kind="draft_model", model=bench.draft_label)
                s = dataclasses.replace(s, drafter=dm)
            s = concrete(s, profile.alpha(regime, s.drafter.kind))
            s = dataclasses.replace(s, name=name)
        why = bench.runnable(s)
        if why is not None:
            raise ValueError(f"{name} at context {ctx}: the engine cannot run it ({why})")
        out[name] = s
    return out


def campaign_run(bench, strategy: Strategy, prompt: list[int], seed: int, trace: bool) -> dict:
    """One run's steady figures; with ``trace``, every round's (context, drafted, accepted):
    the trace the simulator replays."""
    result = bench.generate(strategy, [prompt], seed=seed)
    fig = steady_figures(result)
    if trace:
        fig["rounds_trace"] = [
            [max(r.context_lens), r.drafted, r.accepted[0]] for r in result.rounds
        ]
    return fig


# The settings a run cache is keyed by (with the provenance but its timestamp).
CACHE_SETTINGS = (
    "model",
    "draft_model",
    "contexts",
    "baselines",
    "seeds",
    "new_tokens",
    "temperature",
    "planner",
    "gpu",
)


def setup(args):
    """The bench (with its run cache under ``--resume``), the regimes' contexts and each
    regime's strategy per baseline name; ``ValueError`` in one line on bad input."""
    from ssvkit.kernels.timing import provenance

    if min(args.seeds, args.new_tokens) < 1:
        raise ValueError("--seeds and --new-tokens must be >= 1")
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    names = tuple(x for x in args.baselines.split(",") if x)
    bad = [x for x in names if x not in NAMES]
    if bad:
        raise ValueError(f"unknown baseline {bad[0]!r}; expected {', '.join(NAMES)}")
    contexts = regime_contexts(args.contexts, "--contexts", args.new_tokens)
    profile, space = load_planner(args.planner)
    bench = make_bench(
        args.model,
        args.draft_model,
        max(contexts.values()),
        args.new_tokens,
        1,
        args.device,
        args.gpu,
        args.temperature,
    )
    plans = {r: strategies_for(bench, profile, space, r, c, names) for r, c in contexts.items()}
    if args.resume:
        prov = {k: v for k, v in provenance().items() if k != "timestamp"}
        settings = {**{k: getattr(args, k) for k in CACHE_SETTINGS}, **prov}
        bench.cache = RunCache(args.resume, settings)
    return bench, contexts, plans


def measure_rows(bench, contexts: dict[str, int], plans: dict, seeds: int) -> list[dict]:
    """Every (regime, baseline, seed) decoded on the regime's code prompt (seed 0 with its
    rounds' trace), as the campaign's rows.

    The prompt is the built-in corpus at an offset no profile or planner run used
    (``PROMPT_OFFSET``); each run samples at the bench's temperature with its seed and keeps its
    steady figures (``validation.bench.steady_figures``: round 0, graph capture and compilation
    left out) with the mean CUDA-event step times."""
    rows = []
    for regime, ctx in contexts.items():
        prompt = prompt_tokens("code", ctx, offset=PROMPT_OFFSET * ctx)
        for name, s in plans[regime].items():
            for seed in range(seeds):
                key = f"{name}|{ctx}|{strategy_id(s)}|{seed}"
                fig = bench.run(key, campaign_run, bench, s, prompt, seed, seed == 0)
                rows.append(
                    {
                        "baseline": name,
                        "regime": regime,
                        "context_len": ctx,
                        "seed": seed,
                        "strategy": dataclasses.asdict(s),
                        **run_schedule(s),
                        "describe": describe(s),
                        "measured": fig,
                    }
                )
                print(
                    f"{regime:5s} {name:16s} seed {seed}: {fig['tokens_per_s']:8.1f} tok/s, "
                    f"{fig['mean_accepted'] + 1:.2f} tokens/round, verify "
                    f"{fig['steps_s']['verify'] * 1e3:.3f} ms  {describe(s)}",
                    flush=True,
                )
    return rows


def main(argv=None) -> int:
    """Decode the campaign and write its document to ``--out``, whole or not at all.

    ``--resume FILE`` appends each finished run to FILE and skips finished runs on a later call
    with the same settings, device and commit, so the campaign fits calls of at most 10
    minutes. Exit status 0, 2 on bad input (one line).
    """
    from ssvkit.kernels.timing import provenance

    args = parse_args(argv)
    try:
        bench, contexts, plans = setup(args)
    except ValueError as e:
        print(f"e2e_campaign: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = measure_rows(bench, contexts, plans, args.seeds)
    doc = {
        "version": CAMPAIGN_VERSION,
        "provenance": {
            **provenance(),
            "backend": bench.target.backend,
            "command": command_line(
                "ssvkit.validation.e2e_campaign", sys.argv[1:] if argv is None else argv
            ),
            "wall_s": time.perf_counter() - t0,
            "runs_from_cache": bench.cache.reused if bench.cache else 0,
        },
        "model": bench.model.name,
        "draft_model": bench.draft_label,
        "gpu": bench.gpu.name,
        "planner": file_label(args.planner),
        "temperature": args.temperature,
        "new_tokens": args.new_tokens,
        "seeds": args.seeds,
        "prompt": f"code, offset {PROMPT_OFFSET} x context",
        "rows": rows,
    }
    atomic_write(args.out, json.dumps(doc) + "\n")
    print(f"\n({time.perf_counter() - t0:.0f} s) {len(rows)} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
