"""What ``Engine.generate`` returns: every round on the host, and the run's figures.

``DecodeResult`` computes tokens/s from the rounds' wall time (host included), the mean
accepted drafts per round and the mean step times, leaving out the warm-up rounds (CUDA-graph
capture and kernel compilation) when there are others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.engine.stats import RoundSelection

STEPS = ("draft", "launch", "verify", "accept")


@dataclass(slots=True)
class RoundRecord:
    """One round on the host."""

    round: int
    strategy: str
    context_lens: list[int]
    drafted: int
    accepted: list[int]
    step_s: dict[str, float]
    wall_s: float
    warmup: bool
    t_s: float = 0.0  # round start, seconds after the first round began
    selection: RoundSelection | None = None
    stats_s: float = 0.0
    shadow: dict | None = None  # drafter kind -> engine.controller.ShadowAcceptance
    # The round captured a CUDA graph (of the target or the draft model) that the run had not
    # dropped itself: one missing when the run began, a start-up cost a server pays before
    # requests arrive. (A capture after a switch of this run dropped the graphs -- a change of
    # the cache's summaries, ``ModelRunner.prepare``/``retain`` -- is that switch's cost.)
    captured: bool = False
    # Tokens each sequence appended: accepted + 1, less where its max_new_tokens cut the round
    # short (``accepted`` stays what the verification accepted). None: accepted + 1.
    emitted: list[int] | None = None
    # The sequences still generating this round, in the order of ``context_lens``, ``accepted``
    # and ``emitted`` (a finished one rides along in the batch and keeps nothing). None: all.
    sequences: list[int] | None = None
    # The oracle drafter's probes before the round (``engine.oracle``): verify forwards run to
    # anchor its draft, and their host wall time. Outside ``wall_s``, ``step_s`` and ``t_s``:
    # the oracle's own overhead, no drafting cost.
    oracle_probes: int = 0
    oracle_s: float = 0.0

    def __post_init__(self) -> None:
        if self.sequences is None:
            self.sequences = list(range(len(self.accepted)))
        if self.emitted is None:
            self.emitted = [a + 1 for a in self.accepted]

    @property
    def tokens(self) -> int:
        return sum(self.emitted)


@dataclass(slots=True)
class DecodeResult:
    """Generated tokens per sequence (truncated to ``max_new_tokens``) and the rounds;
    ``warm_s``: the start of the warm drafters after the prefill (host wall clock);
    ``prefill_reused``: the target's prefill was one its cache already held
    (``ModelRunner.prefill``), so ``prefill_s`` timed no forward; ``prefill_forward_s``: the
    measured time of the prefill whose KV the decode read (that earlier one when reused);
    ``serial_reason``: what kept the loop serial (``engine.pipeline.blocker``), or None when
    each round was issued before the host read the one before, so that a round's wall time
    holds its host work only where the GPU waited for it."""

    tokens: list[list[int]]
    rounds: list[RoundRecord]
    prefill_s: float
    timer: str
    warm_s: float = 0.0
    prefill_reused: bool = False
    prefill_forward_s: float | None = None
    serial_reason: str | None = "the decode did not record its loop"

    @property
    def loop(self) -> str:
        """``pipelined`` or ``serial``: the loop the rounds ran in (``perfmodel.loop_host``)."""
        return "serial" if self.serial_reason is not None else "pipelined"

    def timed(self) -> list[RoundRecord]:
        """Rounds that count in the figures (warm-up rounds left out when others exist)."""
        steady = [r for r in self.rounds if not r.warmup]
        return steady or self.rounds

    def tokens_per_s(self) -> float:
        """Generated tokens (all sequences) per second of the counted rounds' wall time and the
        online controller's host time between them (its serial calls, ``step_s["control"]``,
        and its switches, ``step_s["switch"]``), as ``validation.bench.steady_figures`` counts
        them: a switch is paid in the decode's time whichever round it precedes."""
        rs = self.timed()
        spent = sum(
            r.wall_s + r.step_s.get("switch", 0.0) + r.step_s.get("control", 0.0) for r in rs
        )
        return sum(r.tokens for r in rs) / max(spent, 1e-12)

    def mean_accepted(self) -> float:
        rs = self.timed()
        return float(np.mean([np.mean(r.accepted) for r in rs]))

    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted tokens (0 when nothing was drafted)."""
        rs = self.timed()
        drafted = sum(r.drafted * len(r.accepted) for r in rs)
        return sum(sum(r.accepted) for r in rs) / drafted if drafted else 0.0

    def oracle_overhead(self) -> dict:
        """The oracle drafter's probes over every round that drafted with it (warm-up
        included): forwards, forwards per such round, and their host wall time."""
        rs = [r for r in self.rounds if r.oracle_probes]
        probes = sum(r.oracle_probes for r in rs)
        return {
            "probes": probes,
            "probes_per_round": probes / len(rs) if rs else 0.0,
            "seconds": sum(r.oracle_s for r in rs),
        }

    def mean_wall_s(self) -> float:
        """Mean host wall time of a counted round: its timed steps and the host work around
        them (the launches before the first step reaches the GPU, the host read after the
        last, the kept tokens' bookkeeping)."""
        return float(np.mean([r.wall_s for r in self.timed()]))

    def mean_step_s(self) -> dict[str, float]:
        rs = self.timed()
        return {k: float(np.mean([r.step_s.get(k, 0.0) for r in rs])) for k in STEPS}


def reuse_summary(rounds: list[RoundRecord]) -> dict:
    """Per-layer means of the reuse-last-round hit rate for the trace header (each round
    carries its own in ``reuse_hit``)."""
    rows = [r.selection.reuse_hit for r in rounds if r.selection is not None]
    rows = [x for x in rows if not np.isnan(x).all()]
    if not rows:
        return {}
    mean = np.nanmean(np.concatenate(rows, axis=0), axis=0)
    return {"reuse_hit_mean": [float(x) for x in np.nan_to_num(mean)]}
