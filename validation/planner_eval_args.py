"""The flags of ``python -m ssvkit.validation.planner_eval`` in four groups (what each phase
decodes, how each run is timed, the space and the prompt sets, the device and the files), and
the defaults that depend on the batch (``BATCH_DEFAULTS``).

The groups add their flags in the order ``--help`` lists them; ``planner_eval.parse_args``
builds the parser from them and fills in the batch-dependent defaults.
"""

from __future__ import annotations

import argparse

from ssvkit.validation.prompts import PROMPT_SETS

DEFAULT_TREES = ("chain:0", "chain:2", "chain:4", "chain:7", "best:8:4", "best:16:6", "best:32:8")

# Flags whose default depends on the batch: (batch 1, batch > 1). Batch 1: the evaluation of
# record's. Batch > 1: the regimes where sparse and dense strategies compete at batch 32
# (``validation/data/batched-decode-h200.json``: ar_sparse 1.40x ar_dense at 16K), the
# adaptive runs at the context ``python -m ssvkit.validation.adaptive_regime --batches 32
# --regimes 16K,32K`` chooses, and a run a batch of 32 holds to about nine minutes of one H200
# (``--plan``): every run decodes 32 prompts, so one run per profile entry and two per
# measured strategy see more prompts than batch 1's ten and twenty.
BATCH_DEFAULTS = {
    "contexts": ("3584,7680,15360,30720", "15360,30720"),
    "adaptive_context": ("15360", "30720"),
    "per_regime": (12, 10),
    "new_tokens": (384, 256),
    "repeats": (3, 2),
    "measure_texts": (20, 2),
    "timing_passes": (3, 1),
    "profile_prompts": (10, 1),
}


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """What each phase decodes: the batch, the adaptive runs' context, the strategies measured
    per regime, the tokens generated and the prompts of the profile and of the walks."""
    p.add_argument(
        "--batch", type=int, default=1, help="sequences each run decodes together (prompts)"
    )
    p.add_argument("--adaptive-context", default=None, help="context of the adaptive runs")
    p.add_argument("--per-regime", type=int, default=None, help="strategies measured per regime")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per sequence")
    p.add_argument(
        "--profile-prompts",
        type=int,
        default=None,
        help="runs of code prompts per profile entry (<= 10; validation.profile_runs)",
    )
    p.add_argument(
        "--walk-prompts",
        type=int,
        default=20,
        help="code prompts past the measured ones whose autoregressive texts the "
        "n-gram trees' walks add (one each, where the corpus holds them)",
    )


def add_timing_args(p: argparse.ArgumentParser) -> None:
    """How each run is timed and sampled: repeats, texts per measured strategy, timing passes
    and the sampling temperature."""
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs per measurement (median), seeds 0, 1, ...",
    )
    p.add_argument(
        "--measure-texts",
        type=int,
        default=None,
        help="runs each measured strategy decodes (<= 20): one code prompt each at batch 1 "
        "(fewer where fewer fit in the corpus), a batch of them at batch > 1 "
        "(validation.prompts)",
    )
    p.add_argument(
        "--timing-passes",
        type=int,
        default=None,
        help="passes over the measured and adaptive runs; each run keeps its least "
        "disturbed (validation.passes.run_passes)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature (0 = greedy); see the module",
    )


def add_space_args(p: argparse.ArgumentParser) -> None:
    """The space ranked (its trees and drafters) and the prompt sets the adaptive phase
    compares on, with or without the oracle's fixed strategies."""
    p.add_argument("--trees", default=",".join(DEFAULT_TREES), help="tree axis of the space")
    p.add_argument("--drafters", default="draft_model,ngram", help="drafter axis of the space")
    p.add_argument("--prompt-sets", default=",".join(PROMPT_SETS))
    p.add_argument(
        "--no-oracle",
        dest="oracle",
        action="store_false",
        help="skip the fixed strategies measured per prompt set (the adaptive "
        "ceiling; validation.adaptive.oracle_strategies)",
    )


def add_call_args(p: argparse.ArgumentParser) -> None:
    """The GPU predicted and the device decoding, the files written, and how a call resumes,
    stops, runs the adaptive phase alone or only plans."""
    p.add_argument("--gpu", default="h100-sxm", help="GPU registry key of the predictions")
    p.add_argument("--device", default="auto", help="cuda | cpu")
    p.add_argument("--out", default=None, help="evaluation JSON (needed but with --plan)")
    p.add_argument("--ranking-out", default=None, help="the full ranking JSON")
    p.add_argument(
        "--resume",
        default=None,
        metavar="FILE",
        help="run cache (JSONL): each finished run is appended; a later call with the "
        "same settings, device and commit skips them",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="start no run after S seconds (needs --resume): exit 3, the same command goes on",
    )
    p.add_argument(
        "--adaptive-from",
        default=None,
        metavar="EVAL.json",
        help="run the adaptive phase alone on this evaluation's profile, space and regimes "
        "(same batch; validation.adaptive_phase)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the decodes and their estimated device seconds (CPU, nothing decoded)",
    )


def apply_batch_defaults(args: argparse.Namespace) -> None:
    """Give every flag of ``BATCH_DEFAULTS`` left unset its default at ``args.batch``."""
    at_batch = int(args.batch > 1)
    for name, values in BATCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, values[at_batch])
