"""The oracle drafter: the target's own continuation, corrupted to a chosen acceptance profile.

Random-weight models have the real geometry and step costs but no draft model that agrees
with them. The oracle stands in for one: before decoding, the decode loop runs the target
autoregressively on the same prompts with the same sampling settings (``Engine.generate``; at
temperature > 0 the same position uniforms, so the same tokens), and each round the oracle
proposes the next tokens of that reference continuation. Every proposed token on the tree's
spine (the rank-0 child at each level) is replaced, independently with probability
``1 - alpha_k`` at depth ``k``, by a different token drawn from a seeded generator; every other
node holds a token that differs from the reference at its depth. Verification is the target's
own, so the output is the target's whatever the drafts, and the accepted length follows the
profile: ``P(accepted >= k) = alpha_1 ... alpha_k``. Its acceptance is synthetic and is
labelled so wherever it is reported.

The reference is the decode's own output where the verify forward's result at a position is a
function of the prefix alone: dense attention, and sparse attention that selects per query from
block summaries. Where it also depends on the round's shape -- NSA's compressed tokens are
refreshed at commits, so a round's rows see those of its start; a ``shared`` group attends its
representative's blocks -- or where near-tied logits round differently in the two passes, a
sequence's tokens can leave the reference. The oracle then keeps proposing the reference's
tokens at its position, which the target rejects: ``diverged`` counts those sequences (the
decode report shows it), whose acceptance falls below the profile.
"""

from __future__ import annotations

import numpy as np
import torch
from ssvkit.engine.acceptance import AcceptedPath
from ssvkit.engine.drafter import Draft
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree


class OracleDrafter:
    """Drafts of the reference continuation with acceptance ``alpha`` per depth
    (``kind = oracle``)."""

    kind = "oracle"

    def __init__(self, device, vocab_size: int, config: DecodeConfig) -> None:
        if vocab_size < 3:
            raise ValueError(f"the oracle needs a vocabulary of >= 3 tokens, got {vocab_size}")
        if config.oracle_acceptance is None:
            raise ValueError("the oracle drafter needs an acceptance (oracle_acceptance)")
        self.device, self.vocab_size, self.config = device, vocab_size, config
        self.seed = config.seed
        self._prompt_lens: list[int] = []
        self._reference: list[list[int]] = []
        self._checked: list[int] = []  # generated tokens compared with the reference
        self.diverged: set[int] = set()  # sequences whose tokens left the reference
        self._rng = np.random.default_rng(self.seed)
        self._spines: dict[DraftTree, np.ndarray] = {}

    def load(self, prompts: list[list[int]], reference: list[list[int]]) -> None:
        """The reference continuation of each prompt (its first token the first root), before
        a decode of ``prompts``; the corruption draws restart from the seed."""
        if len(reference) != len(prompts):
            raise ValueError(f"{len(reference)} reference rows for {len(prompts)} prompts")
        self._prompt_lens = [len(p) for p in prompts]
        self._reference = [list(r) for r in reference]
        self._checked = [0] * len(prompts)
        self.diverged = set()
        self._rng = np.random.default_rng(self.seed)

    def start(self, prompts: list[list[int]]) -> None:
        """Nothing to prefill: the reference is ``load``'s."""
        if not self._reference:
            raise ValueError("the oracle drafter has no reference continuation (load it first)")

    def resume(self, history: list[list[int]]) -> None:
        """Nothing to catch up: the draft position comes from ``history``'s length."""

    def _spine(self, tree: DraftTree) -> np.ndarray:
        """``[t]`` bool: node ``i`` and every ancestor are rank-0 children (the root included)."""
        if tree not in self._spines:
            spine = [True] * tree.num_nodes
            for i in range(1, tree.num_nodes):
                spine[i] = tree.rank[i] == 0 and spine[tree.parents[i]]
            self._spines[tree] = np.array(spine)
        return self._spines[tree]

    def _check(self, history: list[list[int]]) -> list[int]:
        """Tokens generated per sequence (the root included); marks the diverged ones."""
        done = []
        for b, hist in enumerate(history):
            start = self._prompt_lens[b]
            gen = len(hist) - start
            c, ref = self._checked[b], self._reference[b]
            if b not in self.diverged and hist[start + c : start + gen] != ref[c:gen]:
                self.diverged.add(b)
            self._checked[b] = gen
            done.append(gen)
        return done

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        depth, v = tree.max_depth, self.vocab_size
        alpha = np.array(self.config.oracle_profile(depth))
        generated = self._check(history)
        b = len(history)
        oracle = np.zeros((b, depth + 1), dtype=np.int64)  # [B, D + 1]: the reference by depth
        for s, (hist, g) in enumerate(zip(history, generated, strict=True)):
            oracle[s, 0] = hist[-1]  # the root (a finished sequence's is stale: it keeps nothing)
            ahead = self._reference[s][g : g + depth]
            oracle[s, 1 : 1 + len(ahead)] = ahead
        keep = self._rng.random((b, depth)) < alpha  # [B, D]
        shift = self._rng.integers(1, v, size=(b, depth))  # a different token when corrupted
        spine_tok = np.where(keep, oracle[:, 1:], (oracle[:, 1:] + shift) % v)
        node_depth = np.array(tree.depth)
        node_rank = np.array(tree.rank)
        at = oracle[:, node_depth]  # [B, t] the reference token at each node's depth
        tokens = (at + 1 + node_rank) % v  # off the spine: differs from the reference
        spine = self._spine(tree)
        tokens[:, spine] = np.concatenate([oracle[:, :1], spine_tok], axis=1)[:, node_depth[spine]]
        below = torch.from_numpy(tokens[:, 1:]).to(self.device, non_blocking=True)
        return Draft(torch.cat([roots[:, None], below], dim=1), None)

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Nothing on the device."""

    def observe(self, history: list[list[int]], counts: list[int]) -> None:
        """Nothing: ``draft`` reads the position from the history."""


def acceptance_label(config: DecodeConfig) -> dict:
    """Trace header keys that mark a run's acceptance as the oracle's synthetic one (none for
    another drafter)."""
    acc = config.oracle_acceptance
    if acc is None:
        return {}
    return {"acceptance": "synthetic:oracle", "oracle_acceptance": list(acc)}
