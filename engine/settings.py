"""Run settings of ``ssvkit decode`` and ``ssvkit train-tiny``: plain dataclasses with a help
string per field, torch-free, so the CLI builds its options from them without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Sampling and bookkeeping of one ``generate`` call."""

    max_new_tokens: int = field(default=128, metadata={"help": "tokens to generate per sequence"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy, else sampling"})
    draft_temperature: float | None = field(
        default=None, metadata={"help": "drafter sampling temperature; None = temperature"}
    )
    seed: int = field(default=0, metadata={"help": "seed of every random draw"})
    record_stats: bool = field(
        default=False, metadata={"help": "selection overlaps and PRR hit rates per round"}
    )
    ngram_max_n: int = field(default=3, metadata={"help": "longest n-gram the ngram drafter uses"})
    pipeline: bool = field(
        default=True,
        metadata={
            "help": "issue each round's GPU work before the host reads the round before, where "
            "nothing on the host decides it (engine.pipeline)"
        },
    )
    oracle_acceptance: tuple[float, ...] | None = field(
        default=None,
        metadata={
            "help": "draft with the oracle (the target's own continuation, corrupted): its "
            "synthetic acceptance per depth, one value for every depth or one per depth"
        },
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        temps = (self.temperature, self.draft_temperature or 0.0)
        if not all(math.isfinite(t) and t >= 0 for t in temps):
            raise ValueError(f"temperatures must be finite and >= 0, got {temps}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        acc = self.oracle_acceptance
        if acc is not None and (
            not acc or not all(isinstance(a, (int, float)) and 0 < a <= 1 for a in acc)
        ):
            raise ValueError(f"oracle acceptance must be values in (0, 1], got {acc}")

    def oracle_profile(self, depth: int) -> tuple[float, ...]:
        """The oracle's acceptance at depths 1..``depth``: one value for every depth, or one
        per depth (``ValueError`` naming the lengths otherwise)."""
        acc = self.oracle_acceptance or ()
        if len(acc) == 1:
            return acc * depth
        if len(acc) != depth:
            raise ValueError(
                f"oracle acceptance has {len(acc)} values; the tree has depth {depth} "
                "(give one value, or one per depth)"
            )
        return acc

    @staticmethod
    def parse_acceptance(text: str) -> tuple[float, ...]:
        """``"0.8"`` or ``"0.9,0.8,0.6"`` as acceptance values in (0, 1] (``ValueError``
        naming the bad value)."""
        out = []
        for part in str(text).split(","):
            try:
                a = float(part)
            except ValueError:
                raise ValueError(f"oracle acceptance {part.strip()!r} is not a number") from None
            if not (math.isfinite(a) and 0 < a <= 1):
                raise ValueError(f"oracle acceptance {a} is outside (0, 1]")
            out.append(a)
        return tuple(out)

    @property
    def draft_temp(self) -> float:
        return self.temperature if self.draft_temperature is None else self.draft_temperature


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """The recipe's knobs (defaults: the H100 run)."""

    context: int = field(default=16384, metadata={"help": "training window in bytes (>= 8K)"})
    batch: int = field(default=4, metadata={"help": "windows per step"})
    time_budget_s: float = field(default=240.0, metadata={"help": "seconds of training steps"})
    max_steps: int = field(default=100_000, metadata={"help": "upper bound on steps"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final lr / peak lr"})
    warmup_steps: int = field(default=50, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay"})
    max_corpus_bytes: int = field(default=256 << 20, metadata={"help": "corpus size cap"})
    val_windows: int = field(default=8, metadata={"help": "validation windows at the end"})
    seed: int = field(default=0, metadata={"help": "seed of init and sampling"})

    def __post_init__(self) -> None:
        for name in ("context", "batch", "max_steps", "val_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.time_budget_s <= 0 or self.lr <= 0:
            raise ValueError("time_budget_s and lr must be > 0")
