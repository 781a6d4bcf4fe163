"""Acceptance processes: how many drafts a verification round accepts, round after round.

``iid``, ``positional`` and ``tree`` are independent across rounds: each draws the accepted
depth from the exact distribution of a draft tree under a (depth, rank) acceptance table
(``perfmodel.acceptance.TreeAcceptance``), so its mean is ``expected_tokens_tree - 1``.
``trace`` replays the accepted counts of a recorded trace of the same tree in order, wrapping
around (a batch's other sequences draw from its counts at random). Draws come in vectorised
chunks from one seeded generator (inverse CDF on uniforms), so the sequence depends on the seed
only, never on the chunk size.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.acceptance import TreeAcceptance, node_depths_ranks

CHUNK = 4096
NUM_RANKS = 4  # perfmodel's geometric sibling decay (TreeAcceptance.from_alpha default)


def outcome_distribution(parents, table: TreeAcceptance) -> np.ndarray:
    """P(the accepted path has depth d), d = 0..depth of the tree.

    A node is reached when its parent was and the target's token equals it, with probability
    ``table.p(depth - 1, rank)``; siblings are disjoint events. The walk stops at a node with
    probability ``reach(v) (1 - sum of its children's p)``; the root is reached with 1.
    """
    parents = list(parents)
    depth, rank = node_depths_ranks(parents)
    max_d = max(depth, default=0)
    reach = np.zeros(len(parents))
    child_p = np.zeros(len(parents) + 1)  # index 0 = the root, i + 1 = node i
    for i, p in enumerate(parents):
        pi = table.p(depth[i] - 1, rank[i])
        reach[i] = pi if p < 0 else reach[p] * pi
        child_p[p + 1] += pi
    out = np.zeros(max_d + 1)
    out[0] = 1.0 - child_p[0]
    for i in range(len(parents)):
        out[depth[i]] += reach[i] * (1.0 - child_p[i + 1])
    return np.clip(out, 0.0, None)


def parse_table(text: str, what: str) -> tuple[tuple[float, ...], ...]:
    """``"0.8,0.1;0.7"`` -> ((0.8, 0.1), (0.7,)): rows by ';', ranks by ','."""
    try:
        rows = tuple(
            tuple(float(x) for x in row.split(",") if x.strip())
            for row in text.split(";")
            if row.strip()
        )
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a list of numbers") from None
    if not rows or not all(rows):
        raise ValueError(f"{what} {text!r} is empty")
    return rows


class TableAcceptance:
    """Accepted depths drawn iid across rounds from a (depth, rank) acceptance table over one
    draft tree."""

    def __init__(self, name: str, parents, table: TreeAcceptance):
        self.name = name
        self.parents = tuple(parents)
        self.table = table
        self.probs = outcome_distribution(self.parents, table)
        self.cdf = np.cumsum(self.probs)
        self.cdf[-1] = 1.0

    @property
    def max_accepted(self) -> int:
        return len(self.probs) - 1

    def expected_tokens(self) -> float:
        """Mean tokens per round, bonus token included."""
        return 1.0 + float((np.arange(len(self.probs)) * self.probs).sum())

    def sampler(self, rng: np.random.Generator, index: int = 0, of: int = 1):
        """A callable returning the next round's accepted count (a Python int), for sequence
        ``index`` of a batch of ``of`` (the draws are the generator's alone)."""
        cdf = self.cdf

        def chunks():
            while True:
                yield from np.searchsorted(cdf, rng.random(CHUNK), side="right").tolist()

        return chunks().__next__

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self.cdf, rng.random(n), side="right")


class TraceAcceptance:
    """Replays a trace's accepted counts in order (wrapping); none may exceed the tree's
    depth ``max_accepted``."""

    name = "trace"

    def __init__(self, accepted, max_accepted: int):
        acc = np.asarray(accepted, dtype=int)
        if acc.size == 0:
            raise ValueError("the trace has no rounds to replay")
        if acc.max() > max_accepted:
            raise ValueError(f"the trace accepts up to {acc.max()} drafts, past {max_accepted}")
        self.accepted = acc
        self._max = max_accepted

    @property
    def max_accepted(self) -> int:
        return self._max

    def expected_tokens(self) -> float:
        return 1.0 + float(self.accepted.mean())

    def sampler(self, rng: np.random.Generator, index: int = 0, of: int = 1):
        """Sequence 0 of a batch replays the trace's counts in order; each other sequence draws
        its rounds' counts from them at random (with replacement, from its own generator), so
        a batch's sequences accept as independently as the trace's rounds do, not in unison."""
        acc = self.accepted
        if index > 0:

            def draws():
                while True:
                    yield from rng.choice(acc, CHUNK).tolist()

            return draws().__next__
        seq = acc.tolist()

        def cycle():
            while True:
                yield from seq

        return cycle().__next__

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.resize(self.accepted, n)


def build_acceptance(model: str, parents, alpha: float, table_text: str = "", trace=None):
    """The acceptance process named ``model`` for a draft tree ``parents``.

    iid: every node at rank r of its siblings is accepted with ``alpha (1 - alpha)^r`` (rank 0:
    alpha; perfmodel's convention, so a chain is plain iid alpha). positional: rank-0 children at
    depth d with ``a_d`` from the table (the last entry repeats). tree: the [depth][rank] table
    given, or the iid table when none is. trace: the trace's accepted counts.
    """
    if model == "trace":
        if trace is None:
            raise ValueError("acceptance trace needs a trace")
        depth = max(node_depths_ranks(list(parents))[0], default=0)
        drafted, accepted = trace.column("drafted"), trace.column("accepted")
        if drafted.size and (drafted.max() > len(parents) or accepted.max() > depth):
            raise ValueError(
                f"the trace drafts up to {drafted.max()} tokens a round and accepts up to "
                f"{accepted.max()}; the simulated tree drafts {len(parents)} at depth {depth}: "
                "replay it with the tree that recorded it (--tree)"
            )
        return TraceAcceptance(accepted, depth)
    if model == "iid" or (model == "tree" and not table_text):
        return TableAcceptance(model, parents, TreeAcceptance.from_alpha(alpha, NUM_RANKS))
    if model == "positional":
        rows = parse_table(table_text.replace(";", ","), "positional acceptance")
        return TableAcceptance(model, parents, TreeAcceptance(tuple((a,) for a in rows[0])))
    if model == "tree":
        return TableAcceptance(
            model, parents, TreeAcceptance(parse_table(table_text, "tree table"))
        )
    raise ValueError(f"unknown acceptance model {model!r}")
