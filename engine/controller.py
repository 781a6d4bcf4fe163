"""The online-control hook: after each round the decode loop hands the round's statistics to a
controller, which may return the strategy to switch to (issue #7's planner implements it).

The loop switches at the round boundary: the new tree, attention and drafter take effect in the
next round (their CUDA graphs are captured outside the timed steps). Returning ``None`` keeps
the current strategy.

``--controller module:attr`` names a controller class (or factory) to instantiate with no
arguments, or an object that already has ``after_round``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from perfmodel.strategy import Strategy


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What the loop knows after a round (per-sequence tuples have one entry per sequence).

    ``step_s`` holds the round's step times (``draft``, ``verify``, ``accept``, and ``switch``
    -- the host time of installing the strategy -- in the first round after a switch, whose
    CUDA-graph captures also land in its other steps); the per-layer tuples are means over the
    batch, or None when not measured this round.
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

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted)

    @property
    def round_s(self) -> float:
        return sum(self.step_s.values())


@runtime_checkable
class Controller(Protocol):
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
