"""The drafter interface and the tree expansion shared by the model-based drafters.

A drafter fills the strategy's tree (``engine.tree.DraftTree``) below the root with tokens:
sibling rank ``r`` of a node gets its ``r``-th candidate (top-k when drafting greedily; a
Gumbel top-k draw without replacement from ``softmax(logits / temperature)`` otherwise, whose
distribution it also returns for ``engine.acceptance``). Model drafters expand the tree level by
level in ``level_order`` (nodes up to depth ``l`` are a prefix of the labels): level ``l`` runs
one forward over those nodes (recomputing the shallower ones is nearly free in a weight-bound
decode step, and keeps every forward a plain tree verify), then draws the children of its
depth-``l`` nodes.

Round protocol (``engine.loop``): ``draft`` -> target verify -> ``commit`` (device-only, after the
target's acceptance) -> host read -> ``observe`` (host bookkeeping with the committed tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from ssvkit.engine.acceptance import AcceptedPath
from ssvkit.engine.tree import DraftTree


@dataclass(slots=True)
class Draft:
    """One round's drafts in verify labels: ``tokens`` ``[B, t]`` int64 (column 0 the root) and
    ``probs`` ``[B, t, V]`` (row ``i``: the distribution node ``i``'s children were drawn from),
    or None for deterministic drafts."""

    tokens: torch.Tensor
    probs: torch.Tensor | None


class Drafter(Protocol):
    kind: str
    # True when ``draft`` reads device state alone and ``observe`` only keeps books, so the
    # loop may issue a round before the host has read the one before (``engine.pipeline``).
    # A drafter without the attribute is taken to read the host's tokens.
    device_resident: bool

    def start(self, prompts: list[list[int]]) -> None:
        """Prefill / index the prompts (the target's prefill has run)."""

    def resume(self, history: list[list[int]]) -> None:
        """Catch up with ``history`` (each sequence's committed tokens, the root last) after
        rounds it did not draft in, running only what it lacks (a warm drafter's switch)."""

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        """Tokens for ``tree`` below ``roots`` ``[B]`` (device); ``history`` holds each
        sequence's committed tokens, the root last."""

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Device-side bookkeeping after the target kept ``acc``'s path (no host reads)."""

    def observe(self, history: list[list[int]], counts: list[int]) -> None:
        """Host-side bookkeeping once the round's kept counts are known."""


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Tree expansion in level order: which rows a level's forward runs and where its
    children go. ``dtree`` is the tree relabelled in level order; ``to_verify[k]`` the verify
    label of level-order node ``k``."""

    dtree: DraftTree
    to_verify: tuple[int, ...]
    upto: tuple[int, ...]  # nodes of depth <= l, for l = 0..max_depth

    @classmethod
    def build(cls, tree: DraftTree) -> LevelPlan:
        order = tree.level_order
        dtree = tree.relabel(order)
        upto = tuple(dtree.upto_depth(d) for d in range(dtree.max_depth + 1))
        return cls(dtree, order, upto)

    def level_tree(self, level: int) -> DraftTree:
        """The subtree of nodes of depth <= ``level`` (a prefix of the level-order labels)."""
        n = self.upto[level]
        return DraftTree(self.dtree.parents[:n], self.dtree.depth[:n], self.dtree.rank[:n])

    def children_index(self, level: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """For the nodes of depth ``level + 1``: the row of their parent among the depth-``level``
        rows, and their sibling rank (``[n]`` int64 each)."""
        lo = self.upto[level - 1] if level > 0 else 0
        hi, end = self.upto[level], self.upto[level + 1]
        kids = range(hi, end)
        parent_row = [self.dtree.parents[c] - lo for c in kids]
        rank = [self.dtree.rank[c] for c in kids]
        return (
            torch.tensor(parent_row, dtype=torch.int64, device=device),
            torch.tensor(rank, dtype=torch.int64, device=device),
        )


def draw_children(
    logits: torch.Tensor, num: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` candidate tokens per row of ``logits`` ``[B, n, V]`` in rank order: top-k when
    ``temperature == 0`` (probs None), else a Gumbel top-k draw without replacement from
    ``softmax(logits / temperature)`` (returned as float32 probs ``[B, n, V]``)."""
    if temperature == 0:
        return logits.topk(num, dim=-1).indices, None
    scaled = logits.float() / temperature
    u = torch.rand_like(scaled).clamp(min=1e-20, max=1.0 - 1e-7)
    gumbel = -torch.log(-torch.log(u))
    return (scaled + gumbel).topk(num, dim=-1).indices, torch.softmax(scaled, dim=-1)


def to_verify_labels(plan: LevelPlan, tokens_d: torch.Tensor, probs_d: torch.Tensor | None):
    """Permute level-order ``tokens`` ``[B, t]`` (and ``probs`` ``[B, t, V]``) to verify labels."""
    inv = [0] * len(plan.to_verify)
    for k, v in enumerate(plan.to_verify):
        inv[v] = k
    idx = torch.tensor(inv, dtype=torch.int64, device=tokens_d.device)
    tokens = tokens_d.index_select(1, idx)
    probs = probs_d.index_select(1, idx) if probs_d is not None else None
    return tokens, probs
