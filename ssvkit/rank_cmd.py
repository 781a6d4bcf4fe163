"""``ssvkit rank``: offline strategy rankings per context regime from the calibrated model.

ssvkit rank                                   # llama-3.1-8b on h100-sxm, default space
ssvkit rank --acceptance-profile prof.json --out ranking.json --top 5
"""

from __future__ import annotations

import json

from perfmodel.hardware import get_gpu
from perfmodel.models import get_model
from planner.profile import Profile, load_profile
from planner.rank import rank
from planner.space import SpaceSpec
from ssvkit.options import atomic_write

HELP = "rank every valid strategy per context regime with the calibrated model"


def _tuple(text: str, kind):
    try:
        return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a list of {kind.__name__}") from None


def add_arguments(p) -> None:
    p.add_argument("--model", default="llama-3.1-8b", help="registry name or config.json path")
    p.add_argument("--gpu", default="h100-sxm", help="GPU registry key")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
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
    p.add_argument("--out", metavar="FILE", help="write the ranking JSON here")
    p.add_argument("--top", type=int, default=5, help="strategies printed per regime")
    p.add_argument("--json", action="store_true", help="print the ranking JSON")


def run(args) -> int:
    if args.batch < 1 or args.top < 1:
        raise ValueError(f"--batch and --top must be >= 1, got {args.batch} and {args.top}")
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    profile = load_profile(args.acceptance_profile) if args.acceptance_profile else Profile()
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
    doc = rank(model, gpu, spec, profile, batch=args.batch)
    text = json.dumps(doc, indent=1)
    if args.out:
        atomic_write(args.out, text + "\n")
    if args.json:
        print(text)
        return 0
    print(f"{model.name} on {gpu.name}, batch {args.batch}; acceptance: {profile.source}")
    for regime, entry in doc["regimes"].items():
        print(
            f"\n{regime} (context {entry['context_len']}): {entry['num_valid']} valid, "
            f"rejected {entry['rejected'] or 'none'} [{entry['provenance']}]"
        )
        for i, r in enumerate(entry["ranking"][: args.top], 1):
            flag = " (extrapolated)" if r["extrapolated"] else ""
            print(f"  {i:2d}. {r['tokens_per_s']:8.1f} tok/s  {r['describe']}  [{r['id']}]{flag}")
    return 0
