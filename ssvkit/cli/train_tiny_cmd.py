"""``ssvkit train-tiny``: train the byte-level tiny target/draft pair on a CUDA GPU (<= 5 min).

ssvkit train-tiny                                   # H100 recipe -> engine/checkpoints/
ssvkit train-tiny --time-budget-s 120 --context 8K --out /tmp/tiny --json

Writes ``tiny-target/`` and ``tiny-draft/`` (config.json + model.safetensors, bf16) and
``train_summary.json`` (validation loss in nats/byte, greedy agreement, steps, corpus) under
``--out``; ``ssvkit decode --model tiny`` then uses them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ssvkit.cli.options import add_dataclass_options, given, parse_one
from ssvkit.engine.settings import TrainConfig

HELP = "train the byte-level tiny target + draft pair on a CUDA GPU and save them (HF format)"
FIELDS = (
    "batch",
    "time_budget_s",
    "max_steps",
    "lr",
    "warmup_steps",
    "max_corpus_bytes",
    "val_windows",
    "seed",
)


def add_arguments(p) -> None:
    p.add_argument("--out", default=None, help="output folder (default: engine/checkpoints)")
    p.add_argument("--context", default="16K", help="training window in bytes, >= 8K (16K)")
    add_dataclass_options(p, TrainConfig, FIELDS)
    p.add_argument(
        "--corpus-root",
        action="append",
        default=None,
        metavar="DIR",
        help="folder of Python packages to train on (repeatable; default: sys.path)",
    )
    p.add_argument("--device", default="cuda", help="cuda (cpu only for trials of the code)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    context = parse_one(args.context, "--context")
    if context < 8192 and args.device == "cuda":
        raise ValueError(f"--context must be at least 8K for the tiny pair, got {context}")
    cfg = TrainConfig(context=context, **given(args, FIELDS))
    roots = [Path(r) for r in args.corpus_root] if args.corpus_root else None
    for r in roots or []:
        if not r.is_dir():
            raise ValueError(f"--corpus-root {str(r)!r} is not a folder")
    import torch

    from ssvkit.engine.checkpoint import CHECKPOINT_DIR
    from ssvkit.engine.train import train_tiny

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train-tiny needs a CUDA GPU (--device cuda); none is available")
    out = Path(args.out) if args.out else CHECKPOINT_DIR
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    summary = train_tiny(cfg, out_dir=out, device=args.device, roots=roots, log=log)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"saved {out / 'tiny-target'} ({summary['params']['target'] / 1e6:.1f}M params) and "
            f"{out / 'tiny-draft'} ({summary['params']['draft'] / 1e6:.2f}M) after "
            f"{summary['steps']} steps, {summary['tokens_trained'] / 1e6:.0f}M bytes, "
            f"{summary['total_s']:.0f} s in total"
        )
        print(
            f"validation loss: target {summary['target_val_loss']:.3f}, draft "
            f"{summary['draft_val_loss']:.3f} nats/byte; greedy agreement "
            f"{summary['greedy_agreement']:.3f}"
        )
    return 0
