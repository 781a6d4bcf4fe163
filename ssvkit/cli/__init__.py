"""The ``ssvkit`` console script: parse, dispatch, and turn bad input into one line + exit 2.

ssvkit predict                       # Llama-3.1-8B on h100-sxm, 8K..128K, all baselines
ssvkit predict --model qwen3-8b --gpu h200 --context 32K --json
ssvkit gpus
ssvkit models
"""

from __future__ import annotations

import argparse
import sys

from ssvkit.cli import (
    calibrate_cmd,
    decode_cmd,
    papers_cmd,
    plot_cmd,
    predict_cmd,
    rank_cmd,
    registry_cmd,
    report_cmd,
    simulate_cmd,
    sweep_cmd,
    train_tiny_cmd,
    validate_cmd,
)
from ssvkit.perfmodel.arguments import OneLineParser

COMMANDS = {
    "predict": predict_cmd,
    "gpus": registry_cmd.Gpus,
    "models": registry_cmd.Models,
    "simulate": simulate_cmd,
    "calibrate": calibrate_cmd,
    "validate": validate_cmd,
    "rank": rank_cmd,
    "sweep": sweep_cmd,
    "plot": plot_cmd,
    "decode": decode_cmd,
    "train-tiny": train_tiny_cmd,
    "report": report_cmd,
    "papers": papers_cmd,
}


GLOSSARY = "terms (APE, gamma, b*, f_load, TTFT/TPOT, extrapolated, ...): docs/glossary.md"


def examples(mod) -> str:
    """The ``ssvkit ...`` example lines of a command's docstring, for its help page."""
    lines = [ln.strip() for ln in (mod.__doc__ or "").splitlines()]
    shown = [f"  {ln}" for ln in lines if ln.startswith("ssvkit ")]
    return "\n".join(["examples:", *shown, "", GLOSSARY]) if shown else GLOSSARY


# Packages the base install leaves out, and how to add them (README, "Install").
OPTIONAL_MODULES = {
    "torch": 'pip install ".[test]" after torch (README: the CPU build, or ".[gpu]" with CUDA)',
    "triton": 'pip install ".[test]" (CPU interpreter) or ".[gpu]"',
}


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="ssvkit",
        description="Predict, simulate and measure speculative decoding with sparse attention.",
        epilog=GLOSSARY,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, mod in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.HELP,
            epilog=examples(mod),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"ssvkit {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL_MODULES:
            raise
        print(
            f"ssvkit {args.command}: error: this command needs {e.name}, which the base install "
            f"leaves out: {OPTIONAL_MODULES[e.name]}",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:
        return 0
