"""N-gram / prompt-lookup drafting on the host (``kind = ngram``).

Every committed token updates, for ``n = 1..max_n``, a count of which token followed each
n-gram in the sequence so far. A tree node's children are the most frequent continuations of
the longest n-gram ending at the node (its path below the root included), ranked by count (ties:
most recent first); missing candidates repeat the last one. Drafts are deterministic
(``Draft.probs`` None), so acceptance treats them as one-hot proposals. Building the draft costs
O(t * max_n) dictionary look-ups per sequence, the index update O(max_n) per committed token;
nothing runs on the device except one copy of the draft tokens.

The index is ``engine.ngram_index``; the shadow acceptance a warm drafter scores, its chain
proposals and its walks, ``engine.ngram_shadow``. This module holds the drafter and which
sequences of a batch its shadow scores (``shadow_sample``): with ``shadow_sequences = S``, a
fixed sample of S, which bounds the shadow's host time per round whatever the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from ssvkit.engine.acceptance import AcceptedPath
from ssvkit.engine.controller import SequenceWalks, ShadowAcceptance
from ssvkit.engine.drafter import Draft
from ssvkit.engine.ngram_index import NgramIndex
from ssvkit.engine.ngram_shadow import ShadowChain, walked_trees
from ssvkit.engine.tree import DraftTree

# The longest chain the shadow scores: the planner's space drafts chains of up to 7.
SHADOW_MAX_CHAIN = 8


def shadow_sample(batch: int, bound: int) -> tuple[int, ...]:
    """The sequences of a batch of ``batch`` the shadow scores: all of them when ``bound`` is 0
    or at least the batch, else ``bound`` of them spread evenly over it -- sequence
    ``(2 j + 1) * batch // (2 * bound)``, the middle of the j-th of ``bound`` equal slices (a
    batch's order follows its prompts, ``validation.prompts``, which the slices spread over)."""
    if batch < 1 or bound < 0:
        raise ValueError(f"batch must be >= 1 and bound >= 0, got {batch} and {bound}")
    if not bound or bound >= batch:
        return tuple(range(batch))
    return tuple((2 * j + 1) * batch // (2 * bound) for j in range(bound))


class NgramDrafter:
    """Prompt lookup over each sequence's own history; with ``shadow_chain > 0`` it also scores
    the shadow acceptance of chains of up to that many drafts (``engine.ngram_shadow``).

    The shadow's work is per sequence: every committed token of every sequence costs an index
    update, a chain proposal and a step of each walk. With ``shadow_sequences = S`` the shadow
    scores only a fixed sample of S sequences spread over the batch (``shadow_sample``; its
    indexes only theirs), each one's walks reported beside the sum
    (``ShadowAcceptance.by_sequence``) so that a controller can measure how far the sequences
    differ; the tokens it reads per round (``shadow_tokens``) are then at most S times a
    round's longest commit, whatever the batch. A sampled sequence that finishes leaves the
    sample smaller; one that never advances again counts 0 tokens.
    """

    kind = "ngram"

    def __init__(
        self,
        device,
        max_n: int = 3,
        shadow_chain: int = 0,
        shadow_trees: tuple[str, ...] | Callable[[int], tuple[str, ...]] = (),
        shadow_sequences: int = 0,
    ) -> None:
        """``shadow_trees``: tree specs (``perfmodel.strategy.parse_tree``) whose walks the
        shadow scores too, with ``shadow_chain > 0`` (chains among them are left out: the
        chain walks score those); or a callable giving them for a context length, called at
        ``start`` with the longest prompt's (a controller's trees for that context's
        regime). ``shadow_sequences``: the most sequences of a batch the shadow scores
        (``shadow_sample``; 0: all of them)."""
        if shadow_chain < 0:
            raise ValueError(f"shadow_chain must be >= 0, got {shadow_chain}")
        if shadow_trees and not shadow_chain:
            raise ValueError("shadow_trees need shadow_chain > 0")
        if shadow_sequences < 0:
            raise ValueError(f"shadow_sequences must be >= 0, got {shadow_sequences}")
        self.device = torch.device(device)
        self.max_n = max_n
        self.shadow_chain = shadow_chain
        self.shadow_sequences = shadow_sequences
        self._trees_for = shadow_trees
        self.shadow_trees: tuple[tuple[str, DraftTree], ...] = ()
        if not callable(shadow_trees):
            self.shadow_trees = walked_trees(shadow_trees)
        self.indexes: list[NgramIndex] = []
        # The sampled sequences (``shadow_sample``), their shadows and the shadows' indexes;
        # the committed tokens the shadow has read since ``start`` (its work: each costs an
        # index update, a chain proposal and a step of every walk).
        self.sampled: tuple[int, ...] = ()
        self.shadow_tokens = 0
        self.shadows: list[ShadowChain] = []
        self.shadow_indexes: list[NgramIndex] = []

    def start(self, prompts: list[list[int]]) -> None:
        self.indexes = [self._indexed(p) for p in prompts]
        if callable(self._trees_for) and self.shadow_chain:
            self.shadow_trees = walked_trees(self._trees_for(max(map(len, prompts))))
        # The shadow scores decoded positions only: the prompt is not what the target writes.
        if self.shadow_chain:
            self.sampled = shadow_sample(len(prompts), self.shadow_sequences)
        self.shadows = [ShadowChain(self.shadow_chain, self.shadow_trees) for _ in self.sampled]
        # ... on an index of its own (see ``sync``).
        self.shadow_indexes = [self._indexed(prompts[b]) for b in self.sampled]
        self.shadow_tokens = 0

    def _indexed(self, prompt: list[int]) -> NgramIndex:
        idx = NgramIndex(self.max_n)
        idx.extend(prompt)
        return idx

    def sync(self, history: list[list[int]]) -> None:
        """With a shadow, score it on the committed tokens its index lacks; without one, index
        them for drafting.

        The shadow keeps an index of its own: the drafter's own calls (``draft``, ``observe``,
        ``resume``) update only the drafting index (``_index``), so the shadow's walks, which
        must run as each token is indexed, stay out of the host time between a round's
        synchronisation and the next round's launch while this drafter drafts; the decode
        loop calls ``sync`` behind the next round's GPU work (``engine.hand_over``). On
        the H100 the walks of the 16K regime's three n-gram trees cost 4.2% of a round there. A
        warm drafter's drafting index waits for ``resume``, as a draft model's catch-up does."""
        if not self.shadows:
            self._index(history)
            return
        for sh, idx, b in zip(self.shadows, self.shadow_indexes, self.sampled, strict=True):
            hist = history[b]
            if len(idx.tokens) < len(hist):
                new = hist[len(idx.tokens) :]
                self.shadow_tokens += len(new)
                sh.advance(idx, new)

    def _index(self, history: list[list[int]]) -> None:
        """Index the committed tokens the drafting index lacks."""
        for b, hist in enumerate(history):
            idx = self.indexes[b]
            if len(idx.tokens) < len(hist):
                idx.extend(hist[len(idx.tokens) :])

    def resume(self, history: list[list[int]]) -> None:
        """A warm drafter drafts again: its index only lacks the tokens committed since."""
        self._index(history)

    def take_shadow(self) -> ShadowAcceptance | None:
        """The shadow counts resolved since the last call, summed over the batch -- over the
        sampled sequences, each one's walks beside, when the shadow scores a sample (None
        without a shadow)."""
        if not self.shadows:
            return None
        takes = [sh.take() for sh in self.shadows]
        trees = tuple(
            (spec, *(sum(t[4][j][i] for t in takes) for i in (1, 2, 3)))
            for j, spec in enumerate(w[0] for w in takes[0][4])
        )
        sequences, by_sequence = None, ()
        if len(self.sampled) < len(self.indexes):
            sequences = sum(1 for t in takes if t[5])
            by_sequence = tuple(
                SequenceWalks(t[5], (*t[2], *(w[1] for w in t[4])), (*t[3], *(w[2] for w in t[4])))
                for t in takes
            )
        return ShadowAcceptance(
            sum(t[0] for t in takes),
            tuple(map(sum, zip(*(t[1] for t in takes), strict=True))),
            tuple(map(sum, zip(*(t[2] for t in takes), strict=True))),
            tuple(map(sum, zip(*(t[3] for t in takes), strict=True))),
            trees,
            sequences,
            by_sequence,
        )

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        self._index(history)
        rows = [
            self.indexes[b].tree_tokens(hist[-self.max_n :], tree) for b, hist in enumerate(history)
        ]
        tokens = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        return Draft(tokens, None)

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Nothing on the device."""

    def observe(self, history: list[list[int]], counts: list[int]) -> None:
        self._index(history)
