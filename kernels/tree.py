"""Draft-tree helpers: parent arrays, ancestor bitmasks and traversal orders.

A draft tree of ``t`` nodes is given by a parent array ``parents[i]`` in ``[-1, i)``: ``-1``
attaches node ``i`` directly to the committed prefix. Node indices are the tail positions in the
KV cache. Verification kernels consume the ancestor bitmask (bit ``j`` of row ``i`` set when ``j``
is ``i`` or one of its ancestors), which limits ``t`` to 64.
"""

from __future__ import annotations

import torch
from ssvkit.perfmodel.strategy import MAX_TREE_NODES


def check_parents(parents: torch.Tensor, name: str = "parents") -> None:
    """Raise ``ValueError`` unless ``parents`` is a valid ``[B, t]`` parent array (host check)."""
    if parents.dim() != 2:
        raise ValueError(f"{name} must be [B, t], got shape {tuple(parents.shape)}")
    t = parents.shape[1]
    if not 1 <= t <= MAX_TREE_NODES:
        raise ValueError(f"{name} has t={t} nodes; 1..{MAX_TREE_NODES} are supported")
    idx = torch.arange(t, device=parents.device)
    if bool(((parents < -1) | (parents >= idx)).any()):
        raise ValueError(f"{name} must satisfy -1 <= parents[b, i] < i")


def ancestor_bitmask(parents: torch.Tensor) -> torch.Tensor:
    """``[B, t]`` parent array -> ``[B, t]`` int64 ancestor-or-self bitmask, on the same device.

    Runs ``depth`` gathers with no host synchronisation (``t`` iterations at most), so it can be
    captured in a CUDA graph. Bit 63 is the int64 sign bit; it is set for node 63 as any other.
    """
    b, t = parents.shape
    idx = torch.arange(t, device=parents.device, dtype=torch.int64)
    one = torch.ones((), dtype=torch.int64, device=parents.device)
    mask = torch.bitwise_left_shift(one, idx).expand(b, t).clone()  # self bits
    cur = parents.to(torch.int64)
    for _ in range(t):
        has = cur >= 0
        bit = torch.bitwise_left_shift(one, cur.clamp(min=0))
        mask |= torch.where(has, bit, torch.zeros_like(bit))
        cur = torch.where(has, torch.gather(parents.to(torch.int64), 1, cur.clamp(min=0)), cur)
    return mask


def batch_parents(
    parents: list[int], batch: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[B, t]`` int32: the parent array ``parents`` (``perfmodel.acceptance``'s
    ``chain_parents``, ``full_tree_parents``...) for every sequence of a batch."""
    p = torch.tensor(parents, dtype=torch.int32, device=device)
    return p.expand(batch, len(parents)).contiguous()


def traversal_order(parents: list[int], order: str) -> list[int]:
    """Permutation of node ids in ``order``: ``bfs``, ``dfs`` or ``position`` (sorted by depth,
    then by the DFS position of the node, which places siblings and cousins next to each other).
    """
    t = len(parents)
    children: list[list[int]] = [[] for _ in range(t)]
    roots = []
    for i, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(i)
    depth = [0] * t
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    dfs: list[int] = []
    stack = list(reversed(roots))
    while stack:
        n = stack.pop()
        dfs.append(n)
        stack.extend(reversed(children[n]))
    if order == "dfs":
        return dfs
    if order == "bfs":
        return sorted(range(t), key=lambda i: (depth[i], i))
    if order == "position":
        pos = {n: k for k, n in enumerate(dfs)}
        return sorted(range(t), key=lambda i: (depth[i], pos[i]))
    raise ValueError(f"order must be one of bfs, dfs, position; got {order!r}")
