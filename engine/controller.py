"""The online-control hook: after each round the decode loop hands the round's statistics
(``RoundStats``) to a controller, which may return the strategy to switch to
(``planner.controller`` implements it). Returning ``None`` keeps the current strategy.

The loop switches at the round boundary: the new tree, attention and drafter take effect in the
next round (their CUDA graphs are captured outside the timed steps). A controller may also
declare the drafters to keep *warm* (a switch to one catches it up instead of restarting it),
what the warm n-gram drafter's shadow acceptance scores (``RoundStats.shadow``), and that its
decisions may land one round late, so its host time hides behind the GPU work: the optional
members of ``Controller``.

``--controller module:attr`` names a controller class (or factory) to instantiate with no
arguments, or an object that already has ``after_round``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ssvkit.perfmodel.strategy import Strategy


@dataclass(frozen=True, slots=True)
class SequenceWalks:
    """One sequence of a shadow's sample over one round (``ShadowAcceptance.by_sequence``): the
    committed tokens the shadow read of it, and per walk -- the chain lengths 1..K, then the
    walked trees in ``ShadowAcceptance.trees`` order -- the rounds walked and the drafts they
    accepted."""

    tokens: int
    rounds: tuple[int, ...]
    drafts: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.tokens < 0 or len(self.rounds) != len(self.drafts):
            raise ValueError(
                f"a sequence's walks need tokens >= 0 and one drafts count per rounds count, got "
                f"tokens={self.tokens}, rounds={self.rounds}, drafts={self.drafts}"
            )


@dataclass(frozen=True, slots=True)
class ShadowAcceptance:
    """What a chain drafter that did not draft would have accepted (``engine.ngram``'s shadow),
    over the committed positions resolved in one round, summed over the batch -- or over the
    sample of its sequences the shadow scores.

    ``positions`` proposals were resolved; ``matched[k - 1]`` of them had their first ``k``
    tokens all equal to the committed ones (k = 1 .. ``len(matched)``, the longest chain scored).
    ``rounds[k - 1]`` and ``drafts[k - 1]``: the rounds a chain of ``k`` drafts walked over the
    resolved positions as its own run would have, and the drafts they accepted (``engine.ngram``:
    the per-round figure, which the average over positions overstates on bursty text); empty
    when not walked (then ``accepted`` is the average over positions). ``trees``: per branching
    tree the shadow walks, ``(spec, rounds, accepted drafts, their squares)`` (``engine.ngram``:
    each round accepts the tree's longest root path matching the committed tokens).

    ``sequences``: None when the counts cover every sequence of the round; with a sample
    (``engine.ngram``: a fixed few sequences of a larger batch), how many sampled sequences
    advanced this round -- the counts are theirs -- and ``by_sequence`` each sampled
    sequence's own walks (``SequenceWalks``; one slot per sampled sequence, the same sequence
    in the same slot every round, tokens 0 when it did not advance), from which a controller
    measures how far the sequences differ: the part of the batch the sample does not see.
    """

    positions: int
    matched: tuple[int, ...]
    rounds: tuple[int, ...] = ()
    drafts: tuple[int, ...] = ()
    trees: tuple[tuple[str, int, int, int], ...] = ()
    sequences: int | None = None
    by_sequence: tuple[SequenceWalks, ...] = ()

    def __post_init__(self) -> None:
        if self.positions < 0:
            raise ValueError(f"positions must be >= 0, got {self.positions}")
        if not self.matched:
            raise ValueError("matched must hold at least one chain length")
        bound = self.positions
        for m in self.matched:  # a plain loop: the decode loop builds one of these per round
            if m > bound or m < 0:
                raise ValueError(
                    f"matched must be non-increasing, >= 0 and <= positions, got {self.matched}"
                )
            bound = m
        if self.rounds or self.drafts:
            k = len(self.matched)
            if len(self.rounds) != k or len(self.drafts) != k:
                raise ValueError(
                    f"rounds and drafts must hold {k} chain lengths each, got "
                    f"{self.rounds} and {self.drafts}"
                )
            for c, (r, d) in enumerate(zip(self.rounds, self.drafts, strict=True), 1):
                if r < 0 or not 0 <= d <= c * r:
                    raise ValueError(
                        f"chain {c}: rounds must be >= 0 and drafts in [0, {c} * rounds], got "
                        f"{r} rounds and {d} drafts"
                    )
        for spec, r, d, sq in self.trees:
            # accepted counts a_i >= 0 are integers: sum a <= sum a^2, (sum a)^2 <= r sum a^2
            if r < 0 or d < 0 or sq < d or d * d > r * sq:
                raise ValueError(
                    f"tree {spec}: rounds, drafts and squares must be >= 0 with drafts <= "
                    f"squares and drafts^2 <= rounds * squares, got {r}, {d} and {sq}"
                )
        if self.sequences is not None and self.sequences < 0:
            raise ValueError(f"sequences must be None or >= 0, got {self.sequences}")
        if self.by_sequence:
            walks = len(self.rounds) + len(self.trees)
            if self.sequences != sum(1 for x in self.by_sequence if x.tokens):
                raise ValueError(
                    f"sequences ({self.sequences}) must count the sampled sequences that "
                    f"advanced ({[x.tokens for x in self.by_sequence]} tokens)"
                )
            if not self.rounds or any(len(x.rounds) != walks for x in self.by_sequence):
                raise ValueError(
                    f"each sampled sequence needs its rounds of the {walks} walks (chains "
                    "walked, then trees)"
                )

    def accepted(self, chain: int) -> float | None:
        """Mean accepted drafts per round of a chain of ``chain`` drafts: its walk's (drafts
        over rounds) when walked, else ``E[min(m, chain)]`` over the positions (None when
        nothing was resolved)."""
        if not 1 <= chain <= len(self.matched):
            raise ValueError(f"chain must lie in [1, {len(self.matched)}], got {chain}")
        if self.rounds:
            r = self.rounds[chain - 1]
            return self.drafts[chain - 1] / r if r else None
        return self.accepted_per_position(chain)

    def tree_accepted(self, spec: str) -> float | None:
        """Mean accepted drafts per round of the walked tree ``spec`` (None when it walked no
        round; ``KeyError`` when it is not walked)."""
        for s, r, d, _ in self.trees:
            if s == spec:
                return d / r if r else None
        raise KeyError(f"tree {spec!r} is not walked (walked: {[t[0] for t in self.trees]})")

    def accepted_per_position(self, chain: int) -> float | None:
        """``E[min(m, chain)]`` over the resolved positions (None when none was)."""
        if not 1 <= chain <= len(self.matched):
            raise ValueError(f"chain must lie in [1, {len(self.matched)}], got {chain}")
        if not self.positions:
            return None
        return sum(self.matched[:chain]) / self.positions


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What the loop knows after a round (per-sequence tuples have one entry per sequence).

    ``step_s`` holds the round's step times (``draft``, ``verify``, ``accept``, and ``switch``
    -- the host time of installing the strategy -- in the first round after a switch, whose
    CUDA-graph captures also land in its other steps, and ``shadow``, the host time of the
    shadow acceptance); the per-layer tuples are means over the batch, or None when not measured
    this round. ``shadow`` maps a drafter kind to its counterfactual acceptance this round (see
    ``Controller.drafter_kinds``; empty without warm drafters that score one).
    """

    round: int
    strategy: Strategy
    context_lens: tuple[int, ...]
    drafted: int
    accepted: tuple[int, ...]
    step_s: dict[str, float]
    tokens_generated: int
    group_overlap: tuple[float, ...] | None = None
    layer_overlap: tuple[float, ...] | None = None
    predict_hit: tuple[float, ...] | None = None
    shadow: Mapping[str, ShadowAcceptance] | None = None

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted)

    @property
    def round_s(self) -> float:
        return sum(self.step_s.values())


@runtime_checkable
class Controller(Protocol):
    """What the decode loop calls after every round: ``after_round``, and optional members the
    loop reads when present.

    Attributes
    ----------
    drafter_kinds : callable, optional
        ``drafter_kinds()``: the drafter kinds the controller may switch to. The loop starts
        every one of them during prefill (outside the decode timing; ``DecodeResult.warm_s``)
        and keeps them *warm*: a switch to one catches it up with the tokens committed since it
        last drafted instead of restarting it on the whole context. A warm n-gram drafter also
        scores, every round, what an n-gram chain would have accepted on the committed tokens
        (``RoundStats.shadow``), so a controller learns about n-gram drafting without drafting
        with it.
    shadow_trees : callable, optional
        ``shadow_trees(context_len)``: the branching tree specs whose walks the warm n-gram
        drafter's shadow scores as well (``ShadowAcceptance.trees``), asked with the longest
        prompt's length when the drafter starts.
    shadow_sequences : int, optional
        The most sequences of a batch the shadow scores (0 or absent: all of them), a fixed
        sample that bounds the shadow's host time per round whatever the batch
        (``engine.ngram``).
    overlap : bool, optional
        True lets the controller's decisions take effect one round late: the loop then calls
        it while the next round's GPU work runs, so its host time (and the shadow's) hides
        behind that work instead of adding to each round (``engine.hand_over``).
    """

    def after_round(self, stats: RoundStats) -> Strategy | None:
        """Return a strategy to switch to from the next round on, or None to keep going."""


class KeepStrategy:
    """The default controller: never switches."""

    def after_round(self, stats: RoundStats) -> Strategy | None:
        return None


def load_controller(spec: str | None) -> Controller:
    """``None`` -> ``KeepStrategy()``; ``module:attr`` -> that controller (instantiated when it
    is a class or factory). ``ValueError`` names what could not be found."""
    if not spec:
        return KeepStrategy()
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--controller {spec!r} must be module:attribute")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError:
        raise ValueError(f"controller module {module!r} cannot be imported") from None
    except AttributeError:
        raise ValueError(f"controller module {module!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Controller) and callable(obj):
        obj = obj()
    if not isinstance(obj, Controller):
        raise ValueError(f"controller {spec!r} has no after_round(stats) method")
    return obj
