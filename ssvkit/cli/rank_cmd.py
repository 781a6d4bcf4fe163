"""``ssvkit rank``: offline strategy rankings per context regime from the calibrated model.

ssvkit rank                                   # llama-3.1-8b on h100-sxm, default space
ssvkit rank --acceptance-profile prof.json --out ranking.json --top 5
ssvkit rank --evaluation validation/data/planner.json   # the ranking the H100 evaluation used

``--acceptance-profile`` also reads the profile inside a planner evaluation or a ranking
document. ``--evaluation`` ranks as a planner evaluation did -- its model and draft model (found
in this checkout's ``engine/checkpoints``), GPU, space, regime contexts, measured profile and
the element-wise implementation its engine ran (``perfmodel.strategy.elementwise_of_run``) --,
so the ranking it validated is reproduced on the CPU from committed files (the strategy ids of
a draft model differ where its checkpoint's path does: the id hashes the drafter's fields).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ssvkit.cli.options import add_pricing_options, bounded_text, interval_legend, pricing_gpu
from ssvkit.perfmodel.elementwise import ELEMENTWISE, elementwise_of_run, fused_elementwise
from ssvkit.perfmodel.files import atomic_write, check_output, read_json
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.planner.profile import RegimeProfile, load_profile
from ssvkit.planner.rank import rank
from ssvkit.planner.space import SpaceSpec, space_from_json

HELP = "rank every valid strategy per context regime with the calibrated model"


def _tuple(text: str, kind):
    try:
        return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a list of {kind.__name__}") from None


def add_arguments(p) -> None:
    p.add_argument("--model", help="registry name or config.json path (default llama-3.1-8b)")
    p.add_argument("--gpu", help="GPU registry key (default h100-sxm)")
    p.add_argument(
        "--batch",
        type=int,
        help="sequences decoded together (default 1; with --evaluation, the evaluation's)",
    )
    p.add_argument(
        "--acceptance-profile",
        metavar="FILE",
        help="acceptance/overlap per regime (default: workload defaults, 'assumed')",
    )
    p.add_argument("--drafters", help="comma-separated drafter kinds of the space")
    p.add_argument("--draft-model", help="model of the draft_model drafter")
    p.add_argument("--trees", help="comma-separated tree specs (chain:K, full:BxD, best:N[:D])")
    p.add_argument(
        "--metadata",
        help="comma-separated sparse selections: nsa (default), mean, quest (grouped modes)",
    )
    p.add_argument(
        "--evaluation",
        metavar="FILE",
        help="rank as this planner evaluation did (its model, GPU, space, contexts, profile)",
    )
    p.add_argument(
        "--elementwise",
        help=f"the engine's element-wise ops: {' | '.join(ELEMENTWISE)} (default fused, the "
        "triton backend's; with --evaluation, its engine's)",
    )
    add_pricing_options(p)
    p.add_argument("--out", metavar="FILE", help="write the ranking JSON here")
    p.add_argument("--top", type=int, default=5, help="strategies printed per regime")
    p.add_argument("--json", action="store_true", help="print the ranking JSON")


# What ``--evaluation`` sets, by option (dest, flag).
_FROM_EVALUATION = (
    ("model", "--model"),
    ("gpu", "--gpu"),
    ("acceptance_profile", "--acceptance-profile"),
    ("drafters", "--drafters"),
    ("draft_model", "--draft-model"),
    ("trees", "--trees"),
    ("metadata", "--metadata"),
    ("elementwise", "--elementwise"),
)
# The evaluation's GPU is priced as it was when ranked: its own or a transferred profile.
_PRICING_FLAGS = (
    ("roofline", "--roofline"),
    ("any_architecture", "--transfer-across-architectures"),
)


def _from_evaluation(path: str):
    """(model, gpu, space, profile, regime contexts, label, batch, element-wise implementation)
    of a planner evaluation."""
    from ssvkit.planner.profile import profile_from_json
    from ssvkit.validation.records import local_model

    p = Path(path)
    d = read_json(p, "planner evaluation")
    need = ("model", "gpu_model", "space", "profile", "regimes")
    if any(k not in d for k in need):
        raise ValueError(f"{path!r} is not a planner evaluation (it needs {', '.join(need)})")
    where = f"planner evaluation {path!r}"
    for key in ("model", "gpu_model"):
        if not isinstance(d[key], str):
            raise ValueError(f"{where}: {key} must be a name, got {d[key]!r}")
    spec = space_from_json(d["space"], where)
    spec = dataclasses.replace(spec, draft_model=local_model(spec.draft_model))
    regimes = d["regimes"]
    if not isinstance(regimes, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("context_len"), int) for v in regimes.values()
    ):
        raise ValueError(f"{where}: regimes must map each regime to an object with context_len")
    contexts = {r: v["context_len"] for r, v in regimes.items()}
    profile = profile_from_json(d["profile"], f"{path!r}'s profile", f"evaluation:{p.name}")
    provenance = d.get("provenance") or {}
    commit = provenance.get("git_commit") or "unknown"
    return (
        get_model(local_model(d["model"])),
        get_gpu(d["gpu_model"]),
        spec,
        profile,
        contexts,
        f"the evaluation {p.name} (commit {commit[:7]})",
        d.get("batch", 1),
        elementwise_of_run(provenance),
        # Its measured runs' loop: serial in an evaluation recorded before the pipeline.
        d.get("loop", "serial"),
    )


def run(args) -> int:
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    batch = 1 if args.batch is None else args.batch
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if args.out:
        check_output(args.out, "--out")
    if args.evaluation:
        given = [flag for dest, flag in _FROM_EVALUATION if getattr(args, dest) is not None]
        given += [flag for dest, flag in _PRICING_FLAGS if getattr(args, dest)]
        if given:
            raise ValueError(
                f"--evaluation sets the model, GPU, space and profile; drop {', '.join(given)}"
            )
        model, gpu, spec, profile, contexts, what, own, ew, loop = _from_evaluation(args.evaluation)
        batch = own if args.batch is None else batch
        kw = {"regimes": contexts, "elementwise": ew, "loop": loop}
        doc = rank(model, gpu, spec, profile, batch=batch, **kw)
        _emit(args, doc, model, gpu, profile, f"; ranked as {what}")
        return 0
    model, gpu = get_model(args.model or "llama-3.1-8b"), pricing_gpu(args, args.gpu or "h100-sxm")
    profile = load_profile(args.acceptance_profile) if args.acceptance_profile else RegimeProfile()
    kw = {}
    if args.drafters:
        kw["drafters"] = _tuple(args.drafters, str)
    if args.trees:
        kw["trees"] = _tuple(args.trees, str)
    if args.metadata:
        kw["metadata"] = _tuple(args.metadata, str)
    if args.draft_model:
        kw["draft_model"] = args.draft_model
    spec = SpaceSpec(**kw)
    if "draft_model" in spec.drafters and not spec.draft_model:
        raise ValueError("the draft_model drafter needs --draft-model")
    if spec.draft_model and "draft_model" not in spec.drafters:
        raise ValueError(f"--draft-model {spec.draft_model!r} is read with --drafters draft_model")
    elementwise = args.elementwise or "fused"
    fused_elementwise(elementwise)  # a bad value fails here, in one line
    doc = rank(model, gpu, spec, profile, batch=batch, elementwise=elementwise)
    _emit(args, doc, model, gpu, profile)
    return 0


def _emit(args, doc: dict, model, gpu, profile: RegimeProfile, how: str = "") -> None:
    text = json.dumps(doc, indent=1)
    if args.out:
        atomic_write(args.out, text + "\n")
    if args.json:
        print(text)
        return
    print(f"{model.name} on {gpu.name}, batch {doc['batch']}; acceptance: {profile.source}{how}")
    for regime, why in doc.get("skipped", {}).items():
        print(f"\n{regime}: not ranked ({why})")
    for regime, entry in doc["regimes"].items():
        print(
            f"\n{regime} (context {entry['context_len']}): {entry['num_valid']} valid, "
            f"rejected {entry['rejected'] or 'none'} [{entry['provenance']}]"
        )
        if entry["assumed"]:
            print(f"  assumed, not profiled: {'; '.join(entry['assumed'])}")
        shown = entry["ranking"][: args.top]
        texts = [
            bounded_text(r["tokens_per_s"], r.get("tokens_per_s_interval"), ".1f") for r in shown
        ]
        width = max(map(len, texts), default=0)
        for i, (r, text) in enumerate(zip(shown, texts, strict=True), 1):
            flag = " (extrapolated)" if r["extrapolated"] else ""
            print(f"  {i:2d}. {text:>{width}s} tok/s  {r['describe']}  [{r['id']}]{flag}")
    shown = [r for e in doc["regimes"].values() for r in e["ranking"][: args.top]]
    legend = interval_legend(
        [r.get("tokens_per_s_interval") is not None for r in shown],
        "no residuals price the datasheet roofline or a transfer across architectures",
    )
    print("\n" + "\n".join(legend))
