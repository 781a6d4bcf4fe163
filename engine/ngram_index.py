"""The n-gram index of n-gram / prompt-lookup drafting (``engine.ngram``): for ``n = 1..max_n``,
a count of which token followed each n-gram of one sequence so far, and the ranked continuations
a draft tree's nodes take.

Every committed token updates the counts of the n-grams ending before it: O(max_n) look-ups, one
table holding each n-gram's continuations and its first-ranked one (``_Hits``). A node's
children are the most frequent continuations of the longest n-gram ending at it, ranked by count
(ties: most recent first); the first few of each n-gram a tree asked for are kept ranked as the
counts grow (``_Hits.ranked``), so a lookup is a dictionary hit, not a partial sort. Building a
tree costs O(t * max_n) look-ups (``NgramIndex.tree_tokens``).

A prompt is indexed into an empty index at once (``NgramIndex._fill``, counted with numpy):
about a third of the token-by-token host time on 16K tokens of code, which a batch of 32
such prompts pays at every drafter start.
"""

from __future__ import annotations

import heapq

import numpy as np
from ssvkit.engine.tree import DraftTree

# planner's space has at most 4 children).
RANKED_KEPT = 4
# Tokens from which an empty index is filled at once (``NgramIndex._fill``) rather than token
# by token: a prompt's, not the few a round commits.
FILL_MIN_TOKENS = 256


class _Hits(dict):
    """The continuations of one n-gram, token -> [count, last position], and ``top``: the
    first-ranked one, kept as the counts grow (a chain drafts and the shadow scores with one
    look-up per node, not a sort of up to 256 continuations); ``ranked``: the first
    ``RANKED_KEPT`` (or all, when fewer), kept in order as the counts grow once a tree asked
    for them (None until then)."""

    __slots__ = ("top", "ranked")


class NgramIndex:
    """Continuation counts of every n-gram (n <= ``max_n``) of one token sequence."""

    def __init__(self, max_n: int) -> None:
        if max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {max_n}")
        self.max_n = max_n
        self.tokens: list[int] = []
        # n-gram -> its continuations: one table, so that indexing a token costs one look-up
        # per n-gram, its best continuation included
        self.table: dict[tuple[int, ...], _Hits] = {}

    def extend(self, tokens: list[int]) -> None:
        if not self.tokens and len(tokens) >= FILL_MIN_TOKENS and self._fill(tokens):
            return
        table = self.table
        for tok in tokens:
            key = tuple(self.tokens[-self.max_n :])
            self.push(tok, key, [table.get(key[s:]) for s in range(len(key))])

    def _fill(self, tokens: list[int]) -> bool:
        """Index ``tokens`` into this empty index at once: the table ``push`` builds token by
        token (each continuation's count and last position; its first-ranked continuation the
        one of largest (count, last position), where ``push`` leaves it), counted with numpy
        per n-gram length -- a prompt's index in a fraction of ``push``'s host time (a batch of
        32 prompts of 16K tokens indexes 512K tokens per decode). False, with nothing done,
        when the n-grams' codes would not fit 62 bits (a vocabulary past ~2^15 at
        ``max_n = 3``)."""
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.min() < 0:
            return False
        v = int(arr.max()) + 1
        if v ** (self.max_n + 1) >= 2**62:
            return False
        table, size = self.table, len(arr)
        for n in range(1, min(self.max_n, size - 1) + 1):
            m = size - n  # positions n .. size - 1, each after the n tokens before it
            code = arr[:m].copy()
            for i in range(1, n):
                code = code * v + arr[i : i + m]
            pair = code * v + arr[n:]
            order = np.argsort(pair, kind="stable")  # positions ascend within a pair
            sorted_pair = pair[order]
            starts = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
            ends = np.r_[starts[1:], m]
            counts = (ends - starts).tolist()
            last = (order[ends - 1] + n).tolist()
            keys, conts = np.divmod(sorted_pair[starts], v)
            conts = conts.tolist()
            first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            bounds = np.r_[first, len(keys)].tolist()
            digits = np.stack([(keys[first] // v ** (n - 1 - i)) % v for i in range(n)], 1)
            for j, key in enumerate(map(tuple, digits.tolist())):
                h = table[key] = _Hits()
                top, best = None, (-1, -1)
                for i in range(bounds[j], bounds[j + 1]):
                    h[conts[i]] = [counts[i], last[i]]
                    if (counts[i], last[i]) > best:
                        top, best = conts[i], (counts[i], last[i])
                h.top = top
                h.ranked = None
        self.tokens.extend(arr.tolist())
        return True

    def push(self, tok: int, key: tuple[int, ...], hits: list[_Hits | None]) -> None:
        """Append ``tok``: ``key`` is the sequence's last ``max_n`` tokens (all of them when
        fewer), ``hits[s]`` the continuations of ``key[s:]`` (None: never followed)."""
        pos = len(self.tokens)
        for s, h in enumerate(hits):
            if h is None:
                h = self.table[key[s:]] = _Hits()
                h[tok] = [1, pos]
                h.top = tok
                h.ranked = None
                continue
            slot = h.get(tok)
            if slot is None:
                h[tok] = slot = [1, pos]
            else:
                slot[0] += 1
                slot[1] = pos
            # ``tok`` is now the most recent continuation: first-ranked unless another one is
            # strictly more frequent
            top = h.top
            if top != tok and slot[0] >= h[top][0]:
                h.top = tok
            ranked = h.ranked
            if ranked is not None:  # kept ranked: ``tok`` moves up to its place
                if tok in ranked:
                    ranked.remove(tok)
                c, i = slot[0], 0
                while i < len(ranked) and h[ranked[i]][0] > c:
                    i += 1
                ranked.insert(i, tok)
                if len(ranked) > RANKED_KEPT:
                    ranked.pop()
        self.tokens.append(tok)

    def candidates(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` continuations of the longest indexed n-gram ending ``context``."""
        if k == 1:
            top = self.top(context)
            return [] if top is None else [top]
        return self._ranked(tuple(context[-self.max_n :]), k)

    def _ranked(self, key: tuple[int, ...], k: int) -> list[int]:
        """``candidates`` of ``key``, the context's last ``max_n`` tokens (or all of them)."""
        table = self.table
        for s in range(len(key)):
            hits = table.get(key[s:])
            if hits:
                if k == 1:
                    return [hits.top]
                ranked = hits.ranked
                if ranked is None or k > RANKED_KEPT:
                    # (count, last position) orders the continuations totally: no two share
                    # a last position. ``nlargest``: the sort's first few, in linear time;
                    # the first ``RANKED_KEPT`` are kept ranked as the counts grow (``push``:
                    # the shadow's trees ask the same n-grams again and again).
                    top = heapq.nlargest(
                        max(k, RANKED_KEPT), hits.items(), key=lambda kv: (kv[1][0], kv[1][1])
                    )
                    ranked = [tok for tok, _ in top]
                    if k <= RANKED_KEPT:
                        hits.ranked = ranked
                return ranked[:k]
        return []

    def tree_tokens(
        self,
        tail: list[int],
        tree: DraftTree,
        children: tuple[tuple[int, ...], ...] | None = None,
        first: int | None = None,
    ) -> list[int]:
        """The token of every node of ``tree`` drafted after ``tail`` (the sequence's last
        ``max_n`` tokens or more, the root last): the root's, then each node's children the
        ranked continuations of the longest indexed n-gram ending at it (its path below the
        root included); missing candidates repeat the last one, none at all the node's own
        token. What ``NgramDrafter.draft`` drafts, and the tree shadow scores. ``children``:
        ``tree.children``, when the caller holds them. With ``first`` (the token committed
        after ``tail``), only the subtrees of the root's children that hold it are drafted
        (the others' tokens are left 0): a shadow walk needs no more, and on text where the
        first draft mostly misses, that saves all but the root's look-up."""
        m = self.max_n
        children = children or tree.children
        toks = [tail[-1]] + [0] * tree.num_drafts
        # nodes to draft below, each with its last ``m`` tokens (its path below the root
        # included); a node's children depend on that alone, so the order does not matter
        todo = [(0, tuple(tail[-m:]))]
        while todo:
            node, ctx = todo.pop()
            kids = children[node]
            cand = self._ranked(ctx, len(kids)) or [toks[node]]
            cand += [cand[-1]] * (len(kids) - len(cand))
            for c, tok in zip(kids, cand, strict=False):
                toks[c] = tok
                if children[c] and (node or first is None or tok == first):
                    todo.append((c, (ctx + (tok,))[-m:]))
        return toks

    def top(self, context) -> int | None:
        """The first-ranked continuation of the longest indexed n-gram ending ``context`` (a
        list or tuple)."""
        key, table = tuple(context[-self.max_n :]), self.table
        for s in range(len(key)):
            h = table.get(key[s:])
            if h is not None:
                return h.top
        return None
