"""The planner's evaluation in the real decode loop on the trained tiny pair.

    python -m ssvkit.validation.planner_eval --out validation/data/planner.json \\
        --ranking-out validation/data/planner-ranking.json --resume build/planner-runs.jsonl
    python -m ssvkit.validation.planner_eval --contexts 2K --per-regime 6 --device cpu \\
        --new-tokens 32 --repeats 1 --out /tmp/planner.json          # a CPU smoke run

Profiles the acceptance and overlap of the tiny pair per regime, ranks the space with the
calibrated model, decodes ``--per-regime`` strategies per regime, then compares a fixed default,
the fixed offline best and the online controller on four prompt sets (``validation.evaluate``
says how; ``main``: what a call writes, its exit status). The tiny model's 32K positions bound
the regimes: ``64K+`` cannot be measured with it. ``--batch B`` decodes B prompts per run in
every phase; ``docs/planner.md`` gives the commands at batch 32, ``--plan`` and
``--adaptive-from``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.planner.controller import ControllerConfig
from ssvkit.planner.space import SpaceSpec
from ssvkit.validation.bench import Bench, RunCache, make_bench
from ssvkit.validation.evaluate import evaluate, summary_table
from ssvkit.validation.planner_eval_args import (
    add_call_args,
    add_decode_args,
    add_space_args,
    add_timing_args,
    apply_batch_defaults,
)
from ssvkit.validation.prompts import (
    MEASURE_OFFSETS,
    PROFILE_OFFSETS,
    PROMPT_SETS,
    WALK_OFFSETS,
    regime_contexts,
)
from ssvkit.validation.records import add_pair_args, command_line


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    add_pair_args(p)
    p.set_defaults(contexts=None)
    add_decode_args(p)
    add_timing_args(p)
    add_space_args(p)
    add_call_args(p)
    args = p.parse_args(argv)
    apply_batch_defaults(args)
    return args


def build_bench(args) -> Bench:
    contexts = parse_count_list(args.contexts, "--contexts")
    actx = parse_count_list(args.adaptive_context, "--adaptive-context")[0]
    bench = make_bench(
        args.model,
        args.draft_model,
        max(contexts + [actx]),
        args.new_tokens,
        args.repeats,
        args.device,
        args.gpu,
        args.temperature,
        args.batch,
    )
    bench.timing_passes = args.timing_passes
    bench.measure_texts = args.measure_texts
    return bench


# The settings a run cache is keyed by (with the provenance but its timestamp).
CACHE_SETTINGS = (
    "model",
    "draft_model",
    "contexts",
    "adaptive_context",
    "per_regime",
    "new_tokens",
    "repeats",
    "temperature",
    "trees",
    "drafters",
    "prompt_sets",
    "gpu",
    "profile_prompts",
    "timing_passes",
    "measure_texts",
    "walk_prompts",
)


def check_args(args) -> None:
    """``ValueError`` in one line for a bad count or temperature, before any model is built."""
    if min(args.per_regime, args.new_tokens, args.repeats, args.timing_passes) < 1:
        raise ValueError("--per-regime, --new-tokens, --repeats and --timing-passes must be >= 1")
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if not args.out and not args.plan:
        raise ValueError("--out is needed (the evaluation JSON), or --plan")
    if args.stop_after is not None and (args.stop_after < 0 or not args.resume):
        raise ValueError(
            f"--stop-after {args.stop_after} needs --resume and a number of seconds >= 0"
        )
    if not 1 <= args.measure_texts <= len(MEASURE_OFFSETS):
        raise ValueError(
            f"--measure-texts must lie in 1..{len(MEASURE_OFFSETS)}, got {args.measure_texts}"
        )
    if not 1 <= args.profile_prompts <= len(PROFILE_OFFSETS):
        raise ValueError(
            f"--profile-prompts must lie in 1..{len(PROFILE_OFFSETS)}, got {args.profile_prompts}"
        )
    if not 0 <= args.walk_prompts <= len(WALK_OFFSETS):
        raise ValueError(
            f"--walk-prompts must lie in 0..{len(WALK_OFFSETS)}, got {args.walk_prompts}"
        )
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")


def settings_of(args) -> tuple[dict[str, int], SpaceSpec, tuple[str, ...]]:
    """The regimes' contexts, the space (its draft model not yet named) and the prompt sets
    of ``args``, checked (``ValueError`` in one line), before any model is built."""
    check_args(args)
    contexts = regime_contexts(args.contexts, "--contexts", args.new_tokens)
    adaptive = regime_contexts(args.adaptive_context, "--adaptive-context", args.new_tokens)
    sets = tuple(x for x in args.prompt_sets.split(",") if x)
    bad = [x for x in sets if x not in PROMPT_SETS]
    if bad:
        raise ValueError(f"unknown prompt set {bad[0]!r}; expected {', '.join(PROMPT_SETS)}")
    # The adaptive phase starts from its regime's ranking: --contexts must rank that regime.
    for regime in adaptive:
        if regime not in contexts:
            raise ValueError(
                f"--adaptive-context {args.adaptive_context} falls in regime {regime}, which "
                f"--contexts {args.contexts} does not rank"
            )
    space = SpaceSpec(drafters=tuple(args.drafters.split(",")), trees=tuple(args.trees.split(",")))
    return contexts, space, sets


def cache_settings(args) -> dict:
    """What a run cache is keyed by: ``CACHE_SETTINGS``, the batch when it is not 1 (so a cache
    of batch 1 written before batches reads the same), and the provenance but its timestamp."""
    from ssvkit.kernels.timing import provenance

    prov = {k: v for k, v in provenance().items() if k != "timestamp"}
    batch = {"batch": args.batch} if args.batch > 1 else {}
    return {**{k: getattr(args, k) for k in CACHE_SETTINGS}, **batch, **prov}


def setup(args) -> tuple[Bench, dict[str, int], SpaceSpec, tuple[str, ...]]:
    """The bench (with its run cache under ``--resume``), the regimes' contexts, the space and
    the prompt sets of ``args``."""
    contexts, space, sets = settings_of(args)
    bench = build_bench(args)
    space = dataclasses.replace(space, draft_model=bench.draft_label)
    if args.resume:
        bench.cache = RunCache(args.resume, cache_settings(args))
        if bench.cache.runs:
            print(f"resuming: {len(bench.cache.runs)} runs in {args.resume}", flush=True)
    return bench, contexts, space, sets


def plan_of(args) -> dict:
    """``validation.eval_plan.plan`` at ``args``: the ranking of the evaluation of record's
    profile at this batch stands for the run's own (nothing decoded, no model built)."""
    from ssvkit.engine.strategy_check import check_strategy
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.planner.profile import profile_from_json
    from ssvkit.planner.rank import rank
    from ssvkit.validation.bench import pair_sources
    from ssvkit.validation.eval_plan import Settings, plan
    from ssvkit.validation.records import record_path

    contexts, space, sets = settings_of(args)
    tsrc, dsrc, model, draft_label = pair_sources(args.model, args.draft_model)
    space = dataclasses.replace(space, draft_model=draft_label)
    doc = json.loads(record_path("planner.json").read_text())
    profile = profile_from_json(doc["profile"], "the evaluation of record's profile", "record")
    gpu = get_gpu(args.gpu)
    ranking = rank(model, gpu, space, profile, batch=args.batch, regimes=contexts)

    def ok(s) -> bool:
        try:
            check_strategy(s, tsrc.config, dsrc.config, "triton")
        except ValueError:
            return False
        return True

    st = Settings(
        batch=args.batch,
        contexts=contexts,
        adaptive_context=parse_count_list(args.adaptive_context, "--adaptive-context")[0],
        per_regime=args.per_regime,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        measure_texts=args.measure_texts,
        timing_passes=args.timing_passes,
        profile_prompts=args.profile_prompts,
        walk_prompts=args.walk_prompts,
        prompt_sets=sets,
        oracle=args.oracle,
    )
    return plan(st, space, model, gpu, profile, ranking, ok)


def run_evaluation(
    args,
    bench: Bench,
    source: dict | None,
    contexts: dict[str, int],
    space: SpaceSpec,
    sets: tuple[str, ...],
    command: str,
) -> tuple[dict, dict | None]:
    """The adaptive phase alone on ``source`` (``--adaptive-from``'s evaluation), else the
    whole evaluation: its document, and the full ranking (None for the adaptive phase)."""
    from ssvkit.kernels.timing import provenance
    from ssvkit.validation.adaptive_phase import adaptive_phase

    actx = parse_count_list(args.adaptive_context, "--adaptive-context")[0]
    if source is not None:
        doc = adaptive_phase(
            bench,
            source,
            args.adaptive_from,
            actx,
            sets,
            args.walk_prompts,
            args.oracle,
            {**provenance(), "command": command},
        )
        return doc, None
    return evaluate(
        bench,
        contexts,
        space,
        per_regime=args.per_regime,
        adaptive_context=actx,
        prompt_sets=sets,
        profile_prompts=args.profile_prompts,
        walk_prompts=args.walk_prompts,
        controller=ControllerConfig(),
        provenance={**provenance(), "command": command},
        oracle=args.oracle,
    )


def write_outputs(args, bench: Bench, doc: dict, ranking: dict | None) -> None:
    """The document to ``--out`` (with how many runs came from the run cache) and the full
    ranking to ``--ranking-out`` when both are there."""
    if bench.cache is not None:
        doc["provenance"]["runs_from_cache"] = bench.cache.reused
        doc["provenance"]["wall_s_note"] = "this call only; runs from the cache took earlier calls"
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    if args.ranking_out and ranking is not None:
        atomic_write(args.ranking_out, json.dumps(ranking) + "\n")


def main(argv=None) -> int:
    """Run the evaluation, or its adaptive phase alone (``--adaptive-from``), or print its plan
    (``--plan``).

    Writes the evaluation JSON to ``--out`` (whole or not at all) and the full ranking to
    ``--ranking-out`` when given, logs each run as it goes and prints a summary table last.
    With ``--resume FILE`` every finished run is appended to FILE, and a call cut off by a time
    limit is continued by the same command (same settings, device and commit). Exit status 0;
    2 on bad input, in one line before any model is built; 3 when ``--stop-after S`` stopped
    it (no run starts after S seconds; the runs so far stay in the ``--resume`` file, nothing
    else is written, and the same command goes on).
    """
    from ssvkit.validation.adaptive_phase import load_source, phase_table
    from ssvkit.validation.bench import StopAfter
    from ssvkit.validation.eval_plan import plan_table

    args = parse_args(argv)
    try:
        if args.plan:
            print(plan_table(plan_of(args), args.batch))
            return 0
        source = None
        if args.adaptive_from:
            source = load_source(args.adaptive_from, args.batch)
            settings_of(args)  # the flags checked before any model is built
        bench, contexts, space, sets = setup(args)
    except ValueError as e:
        print(f"planner_eval: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.stop_after is not None:
        bench.stop_at = t0 + args.stop_after
    command = command_line("ssvkit.validation.planner_eval", sys.argv[1:] if argv is None else argv)
    try:
        doc, ranking = run_evaluation(args, bench, source, contexts, space, sets, command)
    except StopAfter as stop:
        print(
            f"\nstopped by --stop-after {args.stop_after:g} before run {stop.args[0]!r}: "
            f"{len(bench.cache.runs)} runs in {args.resume}; the same command goes on",
            flush=True,
        )
        return 3
    write_outputs(args, bench, doc, ranking)
    table = phase_table(doc) if source is not None else summary_table(doc)
    print(f"\n({time.perf_counter() - t0:.0f} s)\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
