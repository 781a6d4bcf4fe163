"""Pipelined rounds: the next round's GPU work issued before the host reads the round before.

A round ends in one host read of the kept tokens, and the host work after it (the kept tokens
appended, the trace, the controller) leaves the GPU idle in a serial loop: on the H200
machine's host, 69-199 us of a batch-32 round of the tiny pair whose GPU work is 0.6-1 ms.
Where nothing the host learns from a round decides the next one's GPU work, the loop issues
round r + 1 first and reads round r while it runs, so the host's time hides behind the GPU's:

- the next roots are round r's bonus tokens, on the device;
- a sequence that is done keeps nothing: the acceptance graph caps each kept count by the
  tokens it may still emit, a device counter (``engine.accept_graph``);
- nothing else the next round launches may depend on the host's copy of the tokens.

That holds with no drafter (autoregressive decoding) and with drafters that declare
``device_resident`` (they draft from device state alone, and their ``observe`` only keeps
books), under a controller that never switches (``KeepStrategy``) and without the selection
statistics, whose per-round host reads would serialise the loop anyway. ``blocker`` names what
keeps an engine serial. The tokens are bitwise those of the serial loop: the GPU runs the same
launches in the same order; only the host's reads move.

The read of round r must survive round r + 1's replay of the same acceptance graph, whose
output buffers it overwrites: ``stage`` copies the packed rows to pinned host memory on the
stream, behind round r's acceptance and ahead of round r + 1, and records an event that
``InFlight.rows`` waits for.

Round r + 1 is issued while some sequence may still be unfinished after round r: each active
sequence emits at least one token a round, so with at most one token left everywhere round r
ends the decode. A tree round may end it earlier (more drafts kept than that bound assumes);
the round issued past the end then keeps nothing, and ``InFlight.drain`` waits for it so that
its GPU time counts in the last round's wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from ssvkit.engine.controller import KeepStrategy
from ssvkit.engine.timing import StepTimer


def blocker(config, controller, drafter, record_stats: bool) -> str | None:
    """What keeps an engine's loop serial, or None when its rounds can be pipelined."""
    if not config.pipeline:
        return "the decode settings ask for a serial loop"
    if not isinstance(controller, KeepStrategy):
        return "the controller may switch strategies after a round"
    if record_stats:
        return "the selection statistics read each round on the host"
    if drafter is not None and not getattr(drafter, "device_resident", False):
        return f"the {drafter.kind} drafter drafts from the host's copy of the tokens"
    return None


def may_continue(generated: list[list[int]], max_new_tokens: int) -> bool:
    """Whether some sequence may still be unfinished after the round in flight, whose tokens
    ``generated`` lacks: one with at least two tokens left (each active sequence emits at
    least one a round)."""
    return max(max_new_tokens - len(g) for g in generated) >= 2


def stage(packed: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A host copy of the round's packed rows that the next round cannot overwrite, and the
    event after which it is complete (None on the CPU, where the copy is done on return)."""
    if packed.device.type != "cuda":
        return packed.clone(), None
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


@dataclass(slots=True)
class InFlight:
    """A round whose GPU work is issued and whose host read is pending."""

    roots: torch.Tensor  # [B] the next round's roots: this round's bonus tokens, on the device
    packed: torch.Tensor  # the packed rows: on the device (serial) or staged on the host
    ready: torch.cuda.Event | None  # the staged copy's event (None: nothing to wait for)
    timer: StepTimer
    recorded: object  # the per-layer queries the selection statistics read (or None)
    lens_before: torch.Tensor | None  # the cache lengths at the round's start (statistics)
    warm: bool  # the round captures graphs and compiles kernels
    captured: bool  # see ``engine.results.RoundRecord.captured``
    issued_s: float  # ``time.perf_counter()`` when the round's host work began
    oracle_probes: int = 0  # the oracle drafter's probes before the round (``engine.oracle``)
    oracle_s: float = 0.0  # and their host time

    def rows(self) -> list[list[int]]:
        """The round's packed rows on the host: the one read that waits for its GPU work."""
        if self.ready is not None:
            self.ready.synchronize()
            return self.packed.tolist()
        return self.packed.cpu().tolist()

    def drain(self) -> None:
        """Wait for a round issued past the end of the decode, which must keep nothing
        (``RuntimeError`` otherwise: the device's remaining-token counter would be wrong)."""
        kept = [row[0] for row in self.rows()]
        if any(kept):
            raise RuntimeError(f"a round issued past the end kept tokens: {kept}")


def serial_rounds(
    issue: Callable, complete: Callable, after_round: Callable, roots, generated, max_new_tokens
) -> list:
    """Rounds until every sequence of ``generated`` has ``max_new_tokens``, each issued
    (``issue(roots, stage)`` -> ``InFlight``), read (``complete(flight, index, wall0)`` -> its
    ``RoundRecord``, which appends the kept tokens to ``generated``) and handed over
    (``after_round(record, key)``, which may change the strategy) before the next is issued."""
    rounds = []
    while min(len(g) for g in generated) < max_new_tokens:
        flight = issue(roots, False)
        rec = complete(flight, len(rounds), flight.issued_s)
        roots = flight.roots
        rounds.append(rec)
        after_round(rec, "control")
    return rounds


def pipelined_rounds(
    issue: Callable, complete: Callable, after_round: Callable, roots, generated, max_new_tokens
) -> list:
    """``serial_rounds`` with round r + 1 issued before round r is read. A round's wall time
    runs from the end of the previous round's host work to the end of its own, its hand-over
    included (the controller's time as ``control_overlap``): consecutive rounds' wall times add
    up to the loop's. A round issued past the end is drained (``InFlight.drain``)."""
    rounds = []
    if min(len(g) for g in generated) >= max_new_tokens:
        return rounds
    mark = time.perf_counter()
    flight = issue(roots, True)
    while True:
        ahead = issue(flight.roots, True) if may_continue(generated, max_new_tokens) else None
        rec = complete(flight, len(rounds), mark)
        rounds.append(rec)
        after_round(rec, "control_overlap")
        done = min(len(g) for g in generated) >= max_new_tokens
        if done and ahead is not None:
            ahead.drain()
        now = time.perf_counter()
        rec.wall_s, mark = now - mark, now
        if done:
            return rounds
        flight = ahead
