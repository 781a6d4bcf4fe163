"""Re-score a finished planner evaluation under the current model, on the CPU, from its runs.

    python -m ssvkit.validation.rescore --runs build/planner-runs.jsonl.gz \\
        --evaluation validation/data/planner.json

``python -m ssvkit.validation.planner_eval --resume FILE`` keeps every run it decoded in FILE.
This rebuilds the profile from those runs with the current code (``profile_from_runs``), ranks
the space again, pools the measured strategies' runs again with the evaluation's own code
(``measured_again``) and scores them as the evaluation does now (``rescore``), for the current
model's predictions and for the recorded ones. A change to the step model, the loop host fit
or the profile's reduction is thus checked on real GPU runs without a GPU. It decodes nothing:
a run the current code would ask for that the file lacks is an error. Run it where the
evaluation ran (the code prompts are cut from the installed packages' sources): a run whose
prompt's CRC-32 differs is an error.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.elementwise import elementwise_of_run
from ssvkit.perfmodel.files import atomic_write
from ssvkit.planner.rank import rank, strategy_from_json
from ssvkit.planner.space import SpaceSpec, strategy_id
from ssvkit.validation.bench import make_bench, read_runs
from ssvkit.validation.evaluate import measure_strategies, ranked_figure, regime_quality
from ssvkit.validation.profile_runs import measure_profile
from ssvkit.validation.records import add_pair_args


class CachedRuns:
    """The run cache's figures by key, read-only: a key it lacks is an error, not a run."""

    reused = 0

    def __init__(self, path: Path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            lines = fh.read().splitlines()
        self.runs = read_runs(lines, path)

    def get(self, key: str, fn) -> dict:
        if key not in self.runs:
            raise ValueError(
                f"the runs lack {key!r}: the current code asks for a run "
                "the evaluation did not decode; re-run planner_eval on the GPU"
            )
        return self.runs[key]


def profile_from_runs(runs: Path, doc: dict, model: str = "tiny", draft_model: str = "tiny-draft"):
    """The evaluation ``doc``'s profile rebuilt with the current code from its run cache
    ``runs`` (decoding nothing): the bench, space, regime contexts, profile and loop host checks.

    The code (``validation.profile_runs.measure_profile``: acceptance, attention factors,
    overlap and the loop host check) asks for its runs by key; one the cache lacks (another
    tree axis, more profile prompts) is an error (``CachedRuns``). The n-gram walks run over the
    runs' texts after their prompts, which are cut from the installed packages' sources: on a
    machine with other packages the prompts differ past some window and the walks would be
    wrong: a run that kept its text kept its prompt's CRC-32 too, and a mismatch is an error."""
    contexts = {r: v["context_len"] for r, v in doc["regimes"].items()}
    bench = make_bench(
        model,
        draft_model,
        max(contexts.values()),
        doc["max_new_tokens"],
        doc["repeats"],
        "cpu",
        doc["gpu_model"],
        doc["temperature"],
    )
    bench.log = lambda m: None
    # The evaluation's batch prices the ranking and lays out its prompts; the runners hold one
    # sequence, as nothing decodes here (the run cache answers every run).
    bench.batch = doc.get("batch", 1)
    # An evaluation before the profile's timing passes timed its profile runs once.
    bench.timing_passes = doc.get("profile_timing_passes", 1)
    bench.cache = CachedRuns(runs)
    bench.measure_texts = doc["measure_texts"]
    space = SpaceSpec(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in doc["space"].items()}
    )
    profile, checks, _, _ = measure_profile(
        bench,
        contexts,
        space,
        doc["profile_reference_tree"],
        doc["profile_attention_tree"],
        doc["profile_prompts"],
        doc.get("profile_walk_prompts", 0),
    )
    return bench, space, contexts, profile, checks


def rescore(
    runs: Path, evaluation: Path, model: str = "tiny", draft_model: str = "tiny-draft"
) -> dict:
    """Per regime: tau and regret now and as recorded, the predicted best now, and how the loop
    host fit prices the profile's runs (``loop_round_error``: the largest of the drafters'
    median round errors; None without a fit for the GPU)."""
    doc = json.loads(evaluation.read_text())
    bench, space, contexts, profile, checks = profile_from_runs(runs, doc, model, draft_model)
    ew = elementwise_of_run(doc["provenance"])
    loop = doc.get("loop", "serial")  # as its runs ran: serial before the pipeline
    ranking = rank(bench.model, bench.gpu, space, profile, bench.batch, contexts, ew, loop)
    bench.timing_passes = doc["timing_passes"]
    out = {}
    for regime, v in doc["regimes"].items():
        ranked = ranking["regimes"][regime]["ranking"]
        pred = {r["id"]: r["tokens_per_s"] for r in ranked}
        rows = measured_again(bench, v, regime, {r["id"]: r for r in ranked})
        now = [{**r, "predicted_tokens_per_s": pred[r["id"]]} for r in rows]
        q, then = regime_quality(now), regime_quality(rows)
        best = max(now, key=lambda r: r["predicted_tokens_per_s"])
        out[regime] = {
            "measured_figure": q["measured_figure"],
            "kendall_tau": q["kendall_tau"],
            "regret": q["regret"],
            "whole_run_kendall_tau": q["whole_run"]["kendall_tau"],
            "whole_run_regret": q["whole_run"]["regret"],
            "recorded_predictions_kendall_tau": then["kendall_tau"],
            "recorded_predictions_regret": then["regret"],
            "recorded_kendall_tau": v["kendall_tau"],
            "recorded_regret": v["regret"],
            "predicted_best": best["describe"],
            "predicted_best_measured_tokens_per_s": ranked_figure(best["measured"]),
            "loop_host": checks[regime],
            "loop_round_error": _loop_round_error(checks[regime]),
        }
    return out


def _loop_round_error(check: dict) -> float | None:
    per = check.get("drafters") or {}
    return max((e["round_ape_median"] for e in per.values()), default=None)


def measured_again(bench, regime_doc: dict, regime: str, ranked: dict) -> list[dict]:
    """A regime's measured rows with their figures pooled again from the run cache by the
    evaluation's own code (full-batch figures included; the strategies from the ``ranked``
    entries by id); a pooled whole-run tokens/s that differs from the recorded one means the
    cache is not the evaluation's: an error."""
    rows = regime_doc["strategies"]
    strategies = [strategy_from_json(ranked[r["id"]]["strategy"]) for r in rows]
    measured, _ = measure_strategies(bench, strategies, regime, regime_doc["context_len"])
    out = []
    for r, s in zip(rows, strategies, strict=True):
        m = measured[strategy_id(s)]
        if not math.isclose(m["tokens_per_s"], r["measured"]["tokens_per_s"], rel_tol=1e-9):
            raise ValueError(
                f"the runs of {r['describe']!r} in {regime} pool to {m['tokens_per_s']:.1f} "
                f"tok/s, the evaluation recorded {r['measured']['tokens_per_s']:.1f}"
            )
        out.append({**r, "measured": m})
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True, help="the evaluation's run cache (JSONL, or .gz)")
    p.add_argument("--evaluation", required=True, help="the evaluation JSON of those runs")
    add_pair_args(p, contexts=False)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    try:
        for flag, path in (("--runs", args.runs), ("--evaluation", args.evaluation)):
            if not Path(path).is_file():
                raise ValueError(f"{flag} {path!r} is not a file")
        res = rescore(Path(args.runs), Path(args.evaluation), args.model, args.draft_model)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"rescore: {e}", file=sys.stderr)
        return 2
    print(
        "regime  measured     tau now (whole run)  regret now (whole run)  recorded "
        "predictions: tau, regret  recorded: tau, regret  loop error  predicted best"
    )
    for regime, r in res.items():
        print(
            f"{regime:6s}  {r['measured_figure']:10s}  {r['kendall_tau']:6.3f} "
            f"({r['whole_run_kendall_tau']:6.3f})  {r['regret']:8.1%} "
            f"({r['whole_run_regret']:6.1%})"
            f"   {r['recorded_predictions_kendall_tau']:6.3f} "
            f"{r['recorded_predictions_regret']:6.1%}            {r['recorded_kendall_tau']:6.3f} "
            f"{r['recorded_regret']:6.1%}  {_pct(r['loop_round_error']):>10s}  "
            f"{r['predicted_best']} "
            f"({r['predicted_best_measured_tokens_per_s']:.0f} tok/s measured)"
        )
    if args.out:
        atomic_write(
            args.out,
            json.dumps(
                {
                    "runs": args.runs,
                    "evaluation": args.evaluation,
                    "provenance": provenance(),
                    "regimes": res,
                },
                indent=1,
            )
            + "\n",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
