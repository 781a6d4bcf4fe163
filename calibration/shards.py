"""Split a sweep between N processes, one per GPU: ``--shard K/N`` runs shard K of N.

Two rules, both deterministic functions of the configs alone (never of what is done or measured),
so a shard rerun on another call runs the same configs:

- ``assign``: units of estimated seconds (the kernel sweep's specialisation families, whose
  compile time is paid once per process) go, longest first, each to the shard with the least
  estimated time so far (the LPT rule: the longest shard is within 4/3 of the best split);
- ``Shard.owns``: a config belongs to shard ``sha1(key) mod N`` (the op sweep, whose configs
  take alike times, so equal counts are equal times).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (``--shard index/count``)."""

    index: int = field(metadata={"help": "this process's shard, 0 <= index < count"})
    count: int = field(metadata={"help": "number of shards (processes, one per GPU)"})

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"shard count must be >= 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index must be in [0, {self.count}), got {self.index}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"K/N"`` -> ``Shard(K, N)``; ``ValueError`` naming a malformed value."""
        k, sep, n = text.partition("/")
        if not sep or not k.strip().isdigit() or not n.strip().isdigit():
            raise ValueError(f"--shard must be K/N with integers 0 <= K < N, got {text!r}")
        return cls(int(k), int(n))

    def owns(self, key: str) -> bool:
        """Whether the config of resume key ``key`` is this shard's (hash rule)."""
        return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def assign(costs: Sequence[tuple[str, float]], count: int) -> dict[str, int]:
    """Unit name -> shard index: units by decreasing cost (ties by name), each to the shard
    with the least total so far (ties to the lowest index)."""
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    names = [name for name, _ in costs]
    if len(set(names)) != len(names):
        raise ValueError("unit names must be distinct")
    load = [0.0] * count
    out: dict[str, int] = {}
    for name, cost in sorted(costs, key=lambda u: (-u[1], u[0])):
        k = min(range(count), key=lambda i: (load[i], i))
        out[name] = k
        load[k] += cost
    return out
