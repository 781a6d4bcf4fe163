"""N-gram / prompt-lookup drafting on the host (``kind = ngram``).

Every committed token updates, for ``n = 1..max_n``, a count of which token followed each
n-gram in the sequence so far. A tree node's children are the most frequent continuations of
the longest n-gram ending at the node (its path below the root included), ranked by count (ties:
most recent first); missing candidates repeat the last one. Drafts are deterministic
(``Draft.probs`` None), so acceptance treats them as one-hot proposals.

Building the draft costs O(t * max_n) dictionary look-ups per sequence; the index update
O(max_n) per committed token. Nothing runs on the device except one copy of the draft tokens.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from engine.acceptance import Acceptance
from engine.drafter import Draft
from engine.tree import DraftTree


class NgramIndex:
    """Continuation counts of every n-gram (n <= ``max_n``) of one token sequence."""

    def __init__(self, max_n: int) -> None:
        if max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {max_n}")
        self.max_n = max_n
        self.tokens: list[int] = []
        # n-gram -> {next token: (count, last position)}
        self.table: dict[tuple[int, ...], dict[int, list[int]]] = defaultdict(dict)

    def extend(self, tokens: list[int]) -> None:
        for tok in tokens:
            pos = len(self.tokens)
            for n in range(1, self.max_n + 1):
                if pos >= n:
                    slot = self.table[tuple(self.tokens[pos - n : pos])].setdefault(tok, [0, 0])
                    slot[0] += 1
                    slot[1] = pos
            self.tokens.append(tok)

    def candidates(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` continuations of the longest indexed n-gram ending ``context``."""
        for n in range(min(self.max_n, len(context)), 0, -1):
            hits = self.table.get(tuple(context[-n:]))
            if hits:
                ranked = sorted(hits.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
                return [tok for tok, _ in ranked[:k]]
        return []


class NgramDrafter:
    """Prompt lookup over each sequence's own history."""

    kind = "ngram"

    def __init__(self, device, max_n: int = 3) -> None:
        self.device = torch.device(device)
        self.max_n = max_n
        self.indexes: list[NgramIndex] = []

    def start(self, prompts: list[list[int]]) -> None:
        self.indexes = []
        for p in prompts:
            idx = NgramIndex(self.max_n)
            idx.extend(p)
            self.indexes.append(idx)

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        rows = []
        for b, hist in enumerate(history):
            idx = self.indexes[b]
            if len(idx.tokens) < len(hist):
                idx.extend(hist[len(idx.tokens) :])
            toks = [hist[-1]] + [0] * tree.num_drafts
            for node in range(tree.num_nodes):  # parents precede children
                kids = tree.children[node]
                if not kids:
                    continue
                ctx = hist[-self.max_n :] + _path_tokens(tree, toks, node)
                cand = idx.candidates(ctx, len(kids)) or [toks[node]]
                cand += [cand[-1]] * (len(kids) - len(cand))
                for c, tok in zip(kids, cand, strict=False):
                    toks[c] = tok
            rows.append(toks)
        tokens = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        return Draft(tokens, None)

    def commit(self, acc: Acceptance, tokens: torch.Tensor) -> None:
        """Nothing on the device."""

    def observe(self, history: list[list[int]], counts: list[int]) -> None:
        for idx, hist in zip(self.indexes, history, strict=True):
            idx.extend(hist[len(idx.tokens) :])


def _path_tokens(tree: DraftTree, toks: list[int], node: int) -> list[int]:
    """Tokens of the path below the root down to ``node`` (root excluded)."""
    out = []
    while node > 0:
        out.append(toks[node])
        node = tree.parents[node]
    return out[::-1]
