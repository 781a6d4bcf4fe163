"""Where the offline best changes with the prompt set: the ranking, per prompt set, at each
candidate batch and context (a CPU computation; it decodes nothing).

    python -m ssvkit.validation.adaptive_regime --batches 1,8,32 --gpu h200

The adaptive evaluation can only gain where some strategy beats the offline best on a prompt
set, so its regime is chosen where the prompt sets' best strategies differ most (``choose``).
A set's profile is a planner evaluation's (default: the one of record) with every
``kind@tree`` acceptance moved by the set's ratio to code, from the oracle's fixed strategies
of its adaptive phase (``set_ratios``, ``set_profile``); the space is ranked under each set's
profile at every candidate batch and regime context, and each set's own best is scored
against the code profile's best on that set's acceptance (``candidate_rows``). The ratios are
measured at one context and batch 1: the evaluation at the chosen batch measures them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.files import read_json
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens, expected_tokens_interp
from ssvkit.planner.profile import RegimeProfile, profile_from_json
from ssvkit.planner.rank import concrete, rank
from ssvkit.planner.space import SpaceSpec, space_from_json, strategy_id
from ssvkit.validation.prompts import OFF_DISTRIBUTION
from ssvkit.validation.records import local_model, record_path


def _resolved(space: SpaceSpec, profile: RegimeProfile, regime: str, kind: str) -> dict:
    """Each drafting tree of the space as the ranking resolves it in ``regime``, to its spec."""
    out = {}
    for spec in space.trees:
        if parse_tree(spec):
            model = space.draft_model if kind == "draft_model" else None
            s = Strategy(name="x", tree=spec, drafter=DrafterSpec(kind=kind, model=model))
            out[concrete(s, profile.alpha(regime, kind)).tree] = spec
    return out


def set_ratios(
    fixed: dict[str, list[tuple[Strategy, float]]],
    space: SpaceSpec,
    profile: RegimeProfile,
    regime: str,
) -> dict[str, dict]:
    """Per prompt set, per drafter kind and space tree spec, the set's accepted drafts per round
    over code's, from the fixed strategies each set decoded in ``regime`` (``fixed``: per set,
    each strategy with its mean accepted drafts; the same strategy on both sets, so attention
    factors cancel); per kind, ``*`` holds the median of its trees'."""
    if "code" not in fixed:
        raise ValueError("the evaluation's adaptive phase did not decode code")
    spec_of = {k: _resolved(space, profile, regime, k) for k in space.drafters}

    def accepted(rows) -> dict[tuple[str, str], float]:
        out = {}
        for s, m in rows:
            spec = spec_of.get(s.drafter.kind, {}).get(s.tree)
            if spec is not None:
                out[(s.drafter.kind, spec)] = m
        return out

    code = accepted(fixed["code"])
    ratios = {}
    for name, rows in fixed.items():
        per: dict[str, dict] = {}
        for (kind, spec), a in accepted(rows).items():
            if code.get((kind, spec)):
                per.setdefault(kind, {})[spec] = a / code[(kind, spec)]
        for r in per.values():
            r["*"] = float(np.median(list(r.values())))
        ratios[name] = per
    return ratios


def fixed_strategies(doc: dict) -> dict[str, list[tuple[Strategy, float]]]:
    """Per prompt set of ``doc``'s adaptive phase, the oracle's fixed strategies (from the
    ranking the evaluation measured, by id) with their mean accepted drafts."""
    from ssvkit.planner.rank import strategy_from_json

    adaptive = doc["adaptive"]
    ranked = _ranking_for(doc)["regimes"][adaptive["regime"]]["ranking"]
    # The evaluation's ids hash its draft model's label, not this machine's path to it.
    label = doc["space"].get("draft_model")
    by_id = {}
    for r in ranked:
        s = strategy_from_json(r["strategy"])
        if s.drafter.model is not None:
            s = dataclasses.replace(s, drafter=dataclasses.replace(s.drafter, model=label))
        by_id[strategy_id(s)] = strategy_from_json(r["strategy"])
    out = {}
    for name, row in adaptive["prompt_sets"].items():
        if "oracle" not in row:
            raise ValueError(f"the evaluation's prompt set {name!r} has no oracle strategies")
        out[name] = [
            (by_id[x["id"]], x["mean_accepted"])
            for x in row["oracle"]["strategies"]
            if x["id"] in by_id
        ]
    return out


def set_profile(profile: RegimeProfile, space: SpaceSpec, ratios: dict) -> RegimeProfile:
    """``profile`` with every ``kind@tree`` acceptance moved to the set's: the tree's accepted
    drafts per round (``expected_tokens_interp - 1`` at the profile's alpha) times the set's
    ratio for its tree spec (the kind's median where the tree was not measured), inverted on
    the tree (``alpha_from_tokens``; the ratio of the alphas themselves would overstate a
    drop, the inversion being steep where few drafts are accepted). The drafters' reference
    acceptance stays, so trees resolve as for code."""
    acc = {}
    for regime, table in profile.acceptance.items():
        spec_of = {k: _resolved(space, profile, regime, k) for k in space.drafters}
        out = dict(table)
        for key, a in table.items():
            kind, _, tree = key.partition("@")
            r = ratios.get(kind)
            if tree and r and parse_tree(tree):
                spec = spec_of.get(kind, {}).get(tree, tree)
                drafts = (expected_tokens_interp(tree, a) - 1.0) * r.get(spec, r["*"])
                out[key] = alpha_from_tokens(tree, 1.0 + drafts)
        acc[regime] = out
    return dataclasses.replace(profile, acceptance=acc, source=f"{profile.source}+set-ratios")


def candidate_rows(
    doc: dict, batches: list[int], gpu: str, regimes: tuple[str, ...] | None = None
) -> list[dict]:
    """Per candidate (batch, regime context of ``doc``, those of ``regimes`` when given): per
    prompt set its predicted best, and its gain over the code profile's best on that set's
    acceptance."""
    unknown = sorted(set(regimes or ()) - set(doc["regimes"]))
    if unknown:
        raise ValueError(
            f"regime {unknown[0]!r} is not one of the evaluation's: {', '.join(doc['regimes'])}"
        )
    space = space_from_json(doc["space"], "the evaluation")
    space = dataclasses.replace(space, draft_model=local_model(space.draft_model))
    profile = profile_from_json(doc["profile"], "the evaluation's profile", "evaluation")
    ratios = set_ratios(fixed_strategies(doc), space, profile, doc["adaptive"]["regime"])
    model, g = get_model(local_model(doc["model"])), get_gpu(gpu)
    ew = elementwise_of_run(doc["provenance"])
    # Candidates are runs still to make: their fixed strategies run the engine's default loop,
    # whichever loop ``doc``'s own runs used.
    loop = "pipelined"
    profiles = {k: set_profile(profile, space, r) for k, r in ratios.items()}
    rows = []
    for b in batches:
        for regime, v in doc["regimes"].items():
            if regimes and regime not in regimes:
                continue
            ctx = {regime: v["context_len"]}
            code_top = rank(model, g, space, profiles["code"], b, ctx, ew, loop)["regimes"][regime]
            best_id = code_top["ranking"][0]["id"]
            sets = {}
            for name, prof in profiles.items():
                ranked = rank(model, g, space, prof, b, ctx, ew, loop)["regimes"][regime]["ranking"]
                tps = {r["id"]: r["tokens_per_s"] for r in ranked}
                sets[name] = {
                    "best": ranked[0]["describe"],
                    "best_tokens_per_s": ranked[0]["tokens_per_s"],
                    "code_best_tokens_per_s": tps[best_id],
                    "gain": ranked[0]["tokens_per_s"] / tps[best_id] - 1.0,
                }
            off = [sets[k]["gain"] for k in OFF_DISTRIBUTION if k in sets]
            rows.append(
                {
                    "batch": b,
                    "regime": regime,
                    "context_len": v["context_len"],
                    "code_best": code_top["ranking"][0]["describe"],
                    "sets": sets,
                    "min_off_gain": min(off) if off else None,
                    "mean_off_gain": float(np.mean(off)) if off else None,
                }
            )
    return rows


def _ranking_for(doc: dict) -> dict:
    """The ranking ``doc`` measured: ranked again from its model, GPU, space and profile."""
    space = space_from_json(doc["space"], "the evaluation")
    space = dataclasses.replace(space, draft_model=local_model(space.draft_model))
    profile = profile_from_json(doc["profile"], "the evaluation's profile", "evaluation")
    contexts = {r: v["context_len"] for r, v in doc["regimes"].items()}
    model, gpu = get_model(local_model(doc["model"])), get_gpu(doc["gpu_model"])
    ew = elementwise_of_run(doc["provenance"])
    loop = doc.get("loop", "serial")  # as its runs ran: serial before the pipeline
    return rank(model, gpu, space, profile, doc.get("batch", 1), contexts, ew, loop)


def choose(rows: list[dict]) -> dict:
    """The candidate whose off-distribution sets' own bests gain most over the code profile's
    best, on their mean (ties: the smallest of them): where the offline best changes most with
    the prompt set. (The smallest alone is prose's nearly everywhere, a few percent apart.)"""
    ok = [r for r in rows if r["min_off_gain"] is not None]
    if not ok:
        raise ValueError("no candidate has an off-distribution prompt set")
    return max(ok, key=lambda r: (r["mean_off_gain"], r["min_off_gain"]))


def table(rows: list[dict], chosen: dict) -> str:
    sets = list(rows[0]["sets"]) if rows else []
    head = f"{'batch':>5s} {'regime':6s} {'context':>7s}  " + "".join(f"{k:>12s}" for k in sets)
    lines = ["gain of each prompt set's own best over the code profile's best (predicted)"]
    lines.append(head + f"{'off mean':>10s}{'off min':>9s}")
    for r in rows:
        mark = "  <- chosen" if r is chosen else ""
        gains = "".join(f"{r['sets'][k]['gain']:+12.1%}" for k in sets)
        off = f"{r['mean_off_gain']:+10.1%}{r['min_off_gain']:+9.1%}"
        lines.append(f"{r['batch']:5d} {r['regime']:6s} {r['context_len']:7d}  {gains}{off}{mark}")
    lines.append("")
    lines.append(f"chosen: batch {chosen['batch']}, {chosen['context_len']} ({chosen['regime']})")
    for k, v in chosen["sets"].items():
        lines.append(f"  {k:10s} best {v['best']}  ({v['gain']:+.1%})")
    lines.append(f"  code profile's best: {chosen['code_best']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--evaluation", default=None, help="planner evaluation (default: of record)")
    p.add_argument("--batches", default="1,4,8,16,32", help="candidate batches")
    p.add_argument("--regimes", default="", help="candidate regimes (default: the evaluation's)")
    p.add_argument("--gpu", default="h200", help="GPU registry key of the predictions")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    try:
        path = Path(args.evaluation) if args.evaluation else record_path("planner.json")
        doc = read_json(path, "planner evaluation")
        batches = parse_count_list(args.batches, "--batches")
        regimes = tuple(r for r in args.regimes.split(",") if r) or None
        rows = candidate_rows(doc, batches, args.gpu, regimes)
        chosen = choose(rows)
    except ValueError as e:
        print(f"adaptive_regime: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": rows, "chosen": chosen}, indent=1))
    else:
        print(table(rows, chosen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
