"""The static shape of one round's verify tail: the root plus the draft tree, flattened.

Node 0 is the *root*: the last committed token, whose KV is not cached yet (the bonus token of
the previous round, or the first token after prefill). Nodes ``1..K`` are the draft tokens of
the strategy's tree (``chain:K``, ``full:BxD``, ``best:N[:D]``; ``perfmodel.strategy.parse_tree``)
hanging below it. The nodes are relabelled in the strategy's traversal order (``bfs``, ``dfs``
or ``position``; ``kernels.tree.traversal_order``), which is topological, so node ``i``'s tail
entry is ``lens + i`` and its parent has a smaller index: the verify kernels take the tail as is,
and query groups of ``sparse_verify`` are runs of consecutive nodes.

Sibling ``rank`` is the order in which a drafter fills siblings (rank 0 = its top candidate).
Drafters expand the tree level by level, so they work in ``level_order`` (nodes sorted by
depth), where the nodes up to any depth form a prefix of the labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ssvkit.kernels.tree import MAX_TREE_NODES, ancestor_bitmask, traversal_order
from ssvkit.perfmodel.strategy import parse_tree


@dataclass(frozen=True, slots=True)
class DraftTree:
    """Parents (``-1`` for the root), depths and sibling ranks of the ``t`` tail nodes."""

    parents: tuple[int, ...]
    depth: tuple[int, ...]
    rank: tuple[int, ...]

    def __post_init__(self) -> None:
        t = len(self.parents)
        if not 1 <= t <= MAX_TREE_NODES:
            raise ValueError(f"a verify tail has 1..{MAX_TREE_NODES} nodes, got {t}")
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents[1:], 1)):
            raise ValueError("tree: node 0 must be the root and parents[i] must lie in [0, i)")

    @classmethod
    def from_parents(cls, parents) -> DraftTree:
        """From a root-first parent array (``parents[0] == -1``, ``parents[i] < i``)."""
        parents = tuple(int(p) for p in parents)
        if (
            not parents
            or parents[0] != -1
            or any(not 0 <= p < i for i, p in enumerate(parents[1:], 1))
        ):
            raise ValueError("tree: node 0 must be the root and parents[i] must lie in [0, i)")
        depth, rank, seen = [], [], {}
        for p in parents:
            depth.append(0 if p < 0 else depth[p] + 1)
            rank.append(seen.get(p, 0))
            seen[p] = rank[-1] + 1
        return cls(parents, tuple(depth), tuple(rank))

    @classmethod
    def from_spec(cls, spec: str, traversal: str = "position", acceptance: float = 0.7):
        """The tail of a strategy tree spec (drafts below a root), in ``traversal`` order."""
        drafts = parse_tree(spec, acceptance)
        if len(drafts) + 1 > MAX_TREE_NODES:
            raise ValueError(
                f"tree {spec!r}: {len(drafts)} drafts + the root exceed {MAX_TREE_NODES} rows"
            )
        tree = cls.from_parents([-1] + [p + 1 for p in drafts])
        return tree.relabel(traversal_order(list(tree.parents), traversal))

    def relabel(self, order) -> DraftTree:
        """The same tree with node ``order[k]`` renamed ``k`` (``order`` topological)."""
        new = {old: k for k, old in enumerate(order)}
        parents = [-1 if self.parents[old] < 0 else new[self.parents[old]] for old in order]
        tree = DraftTree.from_parents(parents)
        # Sibling ranks follow the original ranks, not the new labels.
        return DraftTree(tree.parents, tree.depth, tuple(self.rank[old] for old in order))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def num_drafts(self) -> int:
        return len(self.parents) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of each node, by sibling rank."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        return tuple(tuple(sorted(k, key=lambda c: self.rank[c])) for k in kids)

    @property
    def is_chain(self) -> bool:
        """Whether node ``i`` sits at depth ``i`` (a chain in label order): every kept path
        is then ``0, 1, 2, ...``."""
        return all(d == i for i, d in enumerate(self.depth))

    @property
    def max_children(self) -> int:
        return max(len(c) for c in self.children)

    @property
    def level_order(self) -> tuple[int, ...]:
        """Labels sorted by depth (stable): the order drafters expand the tree in."""
        return tuple(sorted(range(self.num_nodes), key=lambda i: (self.depth[i], i)))

    def upto_depth(self, depth: int) -> int:
        """Nodes of depth <= ``depth`` (a prefix of ``level_order``)."""
        return sum(1 for d in self.depth if d <= depth)

    def tensors(self, batch: int, device) -> TreeTensors:
        return TreeTensors.build(self, batch, torch.device(device))


@dataclass(frozen=True, slots=True)
class TreeTensors:
    """Device copies of a ``DraftTree`` for a batch (no host reads on the hot path).

    ``mask`` is the ``[B, t]`` int64 ancestor-or-self bitmask of ``kernels.tree``; ``children``
    ``[t, max_children]`` int64 (``-1`` pads); ``depth`` ``[t]`` int64.
    """

    tree: DraftTree
    mask: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    children: torch.Tensor

    @classmethod
    def build(cls, tree: DraftTree, batch: int, device: torch.device) -> TreeTensors:
        parents = torch.tensor(tree.parents, dtype=torch.int32, device=device)
        mask = ancestor_bitmask(parents.expand(batch, -1).contiguous())
        width = max(1, tree.max_children)
        kids = [list(c) + [-1] * (width - len(c)) for c in tree.children]
        return cls(
            tree=tree,
            mask=mask.contiguous(),
            parents=parents.long(),
            depth=torch.tensor(tree.depth, dtype=torch.int64, device=device),
            children=torch.tensor(kids, dtype=torch.int64, device=device),
        )
