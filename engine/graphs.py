"""CUDA graphs for the engine's static-shape steps (verify forward, acceptance, commits, a
drafter's whole draft), keyed by everything that changes their shapes or code path.

``GraphRunner(key, fn, inputs, neutral)`` runs ``fn(*inputs)`` eagerly when graphs are off. With
graphs on, the first call per key warms ``fn`` up on a side stream (Triton compiles, the
allocator settles) with the ``neutral`` inputs (a commit of nothing, so warming up leaves the
state unchanged; a callable is called then, so a replay builds none), captures it, and from then
on copies ``inputs`` into the graph's static input tensors and replays it. The CUDA generator's
state is put back after a capture: the warm-up runs draw from it eagerly and the capture
advances it, so without that a decode that captures a graph (the first with a strategy) would
draw other random numbers from then on than the same decode, same seed, replaying the graph
another decode captured -- two runs meant to be paired by their seed would decode different
texts. The returned outputs are the graph's own tensors: valid until the same key is replayed
again, so callers copy what they keep longer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: object


class GraphRunner:
    """Capture-once, replay-many cache of CUDA graphs (eager passthrough when disabled)."""

    def __init__(self, enabled: bool, warmup: int = 2) -> None:
        self.enabled = enabled
        self.warmup = warmup
        self._entries: dict[object, _Entry] = {}
        # Graphs captured so far (a round that captured one carries a start-up cost: a server
        # captures its graphs before requests arrive, ``engine.results.RoundRecord.captured``).
        self.captures = 0
        self.clears = 0  # times the cache was dropped (``clear``)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self.clears += 1

    def __call__(
        self,
        key,
        fn: Callable[..., object],
        inputs: Sequence[torch.Tensor],
        neutral: Sequence[torch.Tensor] | Callable[[], Sequence[torch.Tensor]] | None = None,
        on_launch: Callable[[], None] | None = None,
    ):
        """``on_launch`` runs just before the step's first launch (the input copies, or ``fn``
        when graphs are off): a step timer's mark there separates the time the GPU waits for the
        host from the step's own."""
        if not self.enabled:
            if on_launch is not None:
                on_launch()
            return fn(*inputs)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._capture(fn, inputs, neutral)
            self._entries[key] = entry
            self.captures += 1
        if on_launch is not None:
            on_launch()
        for dst, src in zip(entry.inputs, inputs, strict=True):
            dst.copy_(src, non_blocking=True)
        entry.graph.replay()
        return entry.outputs

    def _capture(self, fn, inputs, neutral) -> _Entry:
        if callable(neutral):
            neutral = neutral()
        static = tuple(x.clone() for x in (neutral if neutral is not None else inputs))
        rng = torch.cuda.get_rng_state()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn(*static)
        # Replays read the generator's seed and offset when they run: putting the state back
        # leaves the draws of the replay that follows as they would be had no capture happened.
        torch.cuda.set_rng_state(rng)
        return _Entry(graph, static, outputs)
