"""What a simulation leaves behind: the per-round log, timeline spans and per-request records.

Rounds are kept as column lists (cheap to append at tens of thousands per second) and turned
into trace records only when a trace is written. Spans, for the Chrome trace and the Gantt
chart, are kept for the first ``timeline_rounds`` rounds or steps only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ssvkit.perfmodel.trace import make_round
from ssvkit.sim.progress import Progress


@dataclass(slots=True)
class RequestRecord:
    """One request's life, in simulated seconds."""

    request: int
    arrival_s: float
    prompt_len: int
    target_tokens: int
    admitted_s: float = -1.0
    first_token_s: float = -1.0
    finish_s: float = -1.0
    output_tokens: int = 0
    rounds: int = 0
    accepted_drafts: int = 0
    drafted: int = 0
    offloads: int = 0
    slo_met: bool | None = None
    context: int = 0  # current KV tokens while decoding (serving state)

    def count_round(self, now_s: float, drafted: int, accepted: int, made: int) -> None:
        """A decode round of the request ending at ``now_s``: ``drafted`` drafts, ``accepted``
        of them kept, ``made`` tokens out; the first round's end is the first token's time."""
        if self.rounds == 0:
            self.first_token_s = now_s
        self.rounds += 1
        self.drafted += drafted
        self.accepted_drafts += accepted
        self.output_tokens += made

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class Span:
    lane: str
    name: str
    start_s: float
    dur_s: float
    args: dict | None = None


@dataclass(slots=True)
class Recorder:
    """Round log columns, spans and request records of one run."""

    timeline_rounds: int
    step_names: tuple[str, ...]
    request: list[int] = field(default_factory=list)
    strategy: list[str] = field(default_factory=list)
    t_s: list[float] = field(default_factory=list)
    context_len: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)
    layers: list[tuple] = field(default_factory=list)  # (group, layer, predict_hit) or None
    spans: list[Span] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    num_steps: int = 0
    progress: Progress | None = None  # told the tokens of every round

    def __post_init__(self) -> None:
        if self.progress is not None:
            self.progress.start(sum(r.target_tokens for r in self.requests))

    @property
    def num_rounds(self) -> int:
        return len(self.accepted)

    @property
    def timeline_open(self) -> bool:
        return self.num_steps < self.timeline_rounds

    def round(self, request, strategy, t_s, context_len, drafted, accepted, steps, layers=None):
        self.request.append(request)
        self.strategy.append(strategy)
        self.t_s.append(t_s)
        self.context_len.append(context_len)
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.steps.append(steps)
        self.layers.append(layers)
        if self.progress is not None:
            self.progress.advance(accepted + 1)

    def span(self, lane: str, name: str, start_s: float, dur_s: float, args=None) -> None:
        if dur_s > 0:
            self.spans.append(Span(lane, name, start_s, dur_s, args))

    def trace_rounds(self):
        """The rounds as trace records (``perfmodel.trace.make_round``), in simulation order."""
        for i in range(self.num_rounds):
            lay = self.layers[i]
            g, c, h = lay if lay is not None else (None, None, None)
            yield make_round(
                i,
                self.request[i],
                self.strategy[i],
                self.context_len[i],
                self.drafted[i],
                self.accepted[i],
                dict(zip(self.step_names, self.steps[i], strict=True)),
                t_s=self.t_s[i],
                group_overlap=g,
                layer_overlap=c,
                predict_hit=h,
            )
