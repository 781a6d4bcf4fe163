"""The online controller's settings: when a deviation counts, how long it must last, what a
switch must gain and how the controller paces its work.

Each field carries a one-line help string (its ``metadata``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Thresholds, windows and pacing of ``planner.controller.OnlineController``."""

    # 0.05, not 0.1: on the tiny pair at 16K the draft model's chain:4 stops beating
    # autoregressive decoding 0.07-0.12 below its profiled alpha, so a 0.1 trigger fires at or
    # past the crossover; a re-score costs ~0.1 ms and hysteresis decides whether to switch.
    epsilon: float = field(default=0.05, metadata={"help": "acceptance deviation that counts"})
    patience: int = field(default=16, metadata={"help": "consecutive deviating rounds to act"})
    ema: float = field(default=0.05, metadata={"help": "weight of the newest round in the EMA"})
    hysteresis: float = field(default=0.05, metadata={"help": "relative gain needed to switch"})
    cooldown: int = field(default=16, metadata={"help": "rounds between two switches"})
    candidates: int = field(default=24, metadata={"help": "ranked strategies re-scored"})
    horizon_rounds: int = field(default=64, metadata={"help": "rounds a switch is amortised"})
    probe_after: int = field(
        default=64, metadata={"help": "rounds without drafts before probing a drafting strategy"}
    )
    probe_max: int = field(
        default=512, metadata={"help": "longest wait between probes (the wait doubles per probe)"}
    )
    # ln 100: at most a 1% chance per stint that a working chain triggers; a chain:4 whose
    # acceptance fell from 0.52 to ~0.03 (n-gram lookup on random bytes) triggers after ~10
    # rounds, a draft model's from 0.72 to ~0.1 after ~6. 0 turns the trigger off.
    collapse_llr: float = field(
        default=4.6,
        metadata={"help": "log-likelihood ratio at which a chain's acceptance drop acts at once"},
    )
    # 4: the work of four rounds in one call. Each call that finds the CPU caches cold (the
    # rest of a decode round evicts them) costs ~5x a warm one (benchmarks/controller_cost.py:
    # ~36 against ~7 us per round), and on the tiny pair a round is ~1 ms.
    stride: int = field(
        default=4,
        metadata={"help": "rounds taken in one go (decisions up to stride - 1 rounds later)"},
    )
    # True: the loop calls the controller while the next round's GPU work runs (its host time
    # hidden there, a decision one round later); False: between rounds.
    overlap: bool = field(
        default=True,
        metadata={"help": "take decisions a round late, behind the next round's GPU work"},
    )
    # 0: a drafter not tried on this text is scored at its profile, and trying it finds out
    # (a chain that fails collapses within a few rounds). Off-distribution on the H100 the
    # draft model's first-depth acceptance moves by +3% to -20% where the n-gram drafter's
    # falls 29-65%, and the replay of those worlds (benchmarks/adaptive_replay.py) gains more
    # at 0 than at 0.5 on every off-distribution set; 0.5 pays only where the draft model
    # falls as far as the n-gram drafter.
    transfer: float = field(
        default=0.0,
        metadata={
            "help": "share of the largest acceptance drop observed on this text that a "
            "drafter not yet tried on it is scored with (0: its profile)"
        },
    )
    # 8: the shadow's host time grows with the sequences it scores, ~25-30 us per sequence
    # and round with the 32K regime's trees (``python -m ssvkit.validation.controller_cost
    # --batch 32``): 1 ms a round at batch 32 on the H200's host, twice the verify step it
    # hides behind; a sample of 8 bounds it at a quarter of that whatever the batch, its
    # sequences' spread measured and carried into the intervals (``planner.shadow``).
    shadow_sequences: int = field(
        default=8,
        metadata={"help": "most sequences of a batch the n-gram shadow scores (0: all)"},
    )
    # 1.645: the switch pays at both ends of a 90% interval of the observed acceptance.
    confidence_z: float = field(
        default=1.645,
        metadata={
            "help": "standard errors of the observed acceptance a switch must pay across "
            "(0: the point estimate alone)"
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"ema must lie in (0, 1], got {self.ema}")
        for name in ("patience", "candidates", "horizon_rounds", "probe_after", "stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.probe_max < 1:
            raise ValueError(f"probe_max must be >= 1, got {self.probe_max}")
        if self.epsilon < 0 or self.hysteresis < 0 or self.cooldown < 0:
            raise ValueError("epsilon, hysteresis and cooldown must be >= 0")
        if not self.collapse_llr >= 0:
            raise ValueError(f"collapse_llr must be >= 0, got {self.collapse_llr}")
        if not 0 <= self.transfer <= 1:
            raise ValueError(f"transfer must lie in [0, 1], got {self.transfer}")
        if not self.confidence_z >= 0:
            raise ValueError(f"confidence_z must be >= 0, got {self.confidence_z}")
        if self.shadow_sequences < 0 or self.shadow_sequences == 1:
            raise ValueError(
                f"shadow_sequences must be 0 (all) or >= 2 (a sample's spread needs two), got "
                f"{self.shadow_sequences}"
            )
