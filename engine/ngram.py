"""N-gram / prompt-lookup drafting on the host (``kind = ngram``).

Every committed token updates, for ``n = 1..max_n``, a count of which token followed each
n-gram in the sequence so far. A tree node's children are the most frequent continuations of
the longest n-gram ending at the node (its path below the root included), ranked by count (ties:
most recent first); missing candidates repeat the last one. Drafts are deterministic
(``Draft.probs`` None), so acceptance treats them as one-hot proposals.

Building the draft costs O(t * max_n) dictionary look-ups per sequence; the index update
O(max_n) per committed token. Nothing runs on the device except one copy of the draft tokens.

**Shadow acceptance.** With ``shadow_chain = K > 0`` the drafter also scores, for every newly
committed position ``p``, the chain of ``K`` tokens it would have proposed there (from the index
of ``history[:p]``) against the tokens actually committed at ``p, p + 1, ...``: the number ``m``
of leading matches. It does so whether or not it drafts (a warm drafter: the engine keeps its
index up to date every round), so a controller sees what n-gram drafting would accept on this
very sequence while another drafter, or none, decodes it.

Why the leading matches estimate the acceptance without bias: the proposals are deterministic
(one-hot), and lossless rejection sampling accepts a one-hot proposal ``x`` with probability
``min(1, p_target(x) / 1) = p_target(x)``; the committed token at that position was drawn from
``p_target`` (whatever strategy decoded it, losslessly), so it equals ``x`` with the same
probability ``p_target(x)``. Position by position, ``P(m >= k)`` is the probability that a
chain drafted at ``p`` has its first ``k`` drafts accepted, and ``E[min(m, K')]`` the expected
accepted drafts of a chain of ``K' <= K`` drafted at a position picked at random.

**Per round, a walk.** A real chain run does not draft at random positions: it drafts where
its own last round left it, ``p + min(m_p, K') + 1`` after a round at ``p``, so it crosses a
stretch of matching positions in a few rounds and spends a round on each position of a
stretch that does not match. The average over every position weights the matching stretches
by their length instead: on the H100's run 23 (``docs/notes/planner.md``, session 12) it put
n-gram chain:7 at 2.56 tokens per round on code and 1.81 on repetitive text, where the chain
run measured 2.08 and 1.27. So the shadow also walks each chain length ``K' <= K`` over the
resolved positions as that chain's run would have (``rounds`` and ``drafts`` of
``ShadowAcceptance``): accepted drafts per round = drafts / rounds, the chain's own figure on
this text -- exact under greedy decoding, where the text is the same whatever decodes it.

Cost: per new position, one look-up per n-gram ending there (the first draft and the index
update share them: one table holds each n-gram's continuations and its best one), then up to
``max_n`` per further draft while they match; the whole chain only for positions within ``K``
of the end that still match. Index update plus shadow at ``K = 8`` on a 15K-token index
(development CPU, median per round, ``sync`` + ``take_shadow``;
``tests/engine/test_engine_warm_shadow.py`` bounds it): random bytes, 1 committed token
~4.5 us, 8 tokens ~20 us; 1-5 tokens of code per round ~11 us, ~38 us with 32 MiB written
between rounds as the rest of a round evicts the CPU caches (``benchmarks/controller_cost.py``).
"""

from __future__ import annotations

import torch

from engine.acceptance import Acceptance
from engine.controller import ShadowAcceptance
from engine.drafter import Draft
from engine.tree import DraftTree

# The longest chain the shadow scores: the planner's space drafts chains of up to 7.
SHADOW_MAX_CHAIN = 8


class _Hits(dict):
    """The continuations of one n-gram, token -> [count, last position], and ``top``: the
    first-ranked one, kept as the counts grow (a chain drafts and the shadow scores with one
    look-up per node, not a sort of up to 256 continuations)."""

    __slots__ = ("top",)


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
        table = self.table
        for tok in tokens:
            key = tuple(self.tokens[-self.max_n :])
            self.push(tok, key, [table.get(key[s:]) for s in range(len(key))])

    def push(self, tok: int, key: tuple[int, ...], hits: list[_Hits | None]) -> None:
        """Append ``tok``: ``key`` is the sequence's last ``max_n`` tokens (all of them when
        fewer), ``hits[s]`` the continuations of ``key[s:]`` (None: never followed)."""
        pos = len(self.tokens)
        for s, h in enumerate(hits):
            if h is None:
                h = self.table[key[s:]] = _Hits()
                h[tok] = [1, pos]
                h.top = tok
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
        self.tokens.append(tok)

    def candidates(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` continuations of the longest indexed n-gram ending ``context``."""
        if k == 1:
            top = self.top(context)
            return [] if top is None else [top]
        for n in range(min(self.max_n, len(context)), 0, -1):
            hits = self.table.get(tuple(context[-n:]))
            if hits:
                ranked = sorted(hits.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
                return [tok for tok, _ in ranked[:k]]
        return []

    def top(self, context) -> int | None:
        """The first-ranked continuation of the longest indexed n-gram ending ``context`` (a
        list or tuple)."""
        key, table = tuple(context[-self.max_n :]), self.table
        for s in range(len(key)):
            h = table.get(key[s:])
            if h is not None:
                return h.top
        return None


class ShadowChain:
    """The shadow acceptance of one sequence (see the module): chain proposals still waiting
    for committed tokens, and the leading-match counts of those resolved since the last
    ``take``."""

    def __init__(self, max_chain: int) -> None:
        if max_chain < 1:
            raise ValueError(f"max_chain must be >= 1, got {max_chain}")
        self.max_chain = max_chain
        # (proposal, tokens matched so far, its position)
        self.pending: list[tuple[list[int], int, int]] = []
        self.positions = 0
        self.matched = [0] * max_chain
        # The walks (module): resolved positions not yet passed by every walk (position ->
        # leading matches), per chain length the position its walk drafts at next, and the
        # rounds walked and drafts accepted since the last ``take``.
        self.resolved: dict[int, int] = {}
        self.walk_next: list[int] | None = None
        self.walk_rounds = [0] * max_chain
        self.walk_drafts = [0] * max_chain

    def advance(self, idx: NgramIndex, new: list[int]) -> None:
        """Index ``new`` (the tokens committed after ``idx.tokens``), scoring each position's
        proposal from the index as it stood before that position. A resolved proposal with
        ``m`` leading matches counts one position and adds 1 to ``matched[:m]``."""
        k_max, max_n, n_new = self.max_chain, idx.max_n, len(new)
        toks, table = idx.tokens, idx.table
        positions, matched, pending = self.positions, self.matched, self.pending
        resolved, base = self.resolved, len(toks)
        if self.walk_next is None:  # every walk starts after the first decoded token (the
            self.walk_next = [base + 1] * k_max  # first root, which the prefill samples)
        opened = []  # proposals compared with every token of ``new``: they wait for the next call
        for i, tok in enumerate(new):
            if pending:  # earlier proposals, every token before ``tok`` matched
                still = []
                for prop, m, at in pending:
                    if prop[m] == tok:
                        m += 1
                        if m < k_max:
                            still.append((prop, m, at))
                            continue
                    positions += 1
                    resolved[at] = m
                    for k in range(m):
                        matched[k] += 1
                pending = still
            # The n-grams ending before ``tok``, looked up once: the first draft is the
            # continuation of the longest one indexed (as the drafter does: the last token
            # when none is), and ``tok`` is indexed below them.
            key, hits, c = tuple(toks[-max_n:]), [], None
            for s in range(len(key)):
                h = table.get(key[s:])
                hits.append(h)
                if c is None and h is not None:
                    c = h.top
            if c is None:
                c = key[-1] if key else None  # nothing indexed: no proposal, nothing accepted
            if c != tok:  # the first draft missed (the common case): m = 0
                positions += 1
                resolved[base + i] = 0
                idx.push(tok, key, hits)
                continue
            prop, m, open_, ctx = [c], 1, False, (key + (c,))[-max_n:]
            for j in range(i + 1, i + k_max):  # ``j``: where draft ``c`` stands in ``new``
                c = ctx[-1]  # idx.top(ctx), inlined
                for s in range(len(ctx)):
                    h = table.get(ctx[s:])
                    if h is not None:
                        c = h.top
                        break
                prop.append(c)
                ctx = (ctx + (c,))[-max_n:]
                if not open_:
                    if j >= n_new:
                        open_ = True  # every committed token matched: the rest waits for more
                    elif new[j] != c:
                        break
                    else:
                        m += 1
            if open_:
                opened.append((prop, m, base + i))
            else:
                positions += 1
                resolved[base + i] = m
                for k in range(m):
                    matched[k] += 1
            idx.push(tok, key, hits)
        self.pending = pending + opened
        self.positions = positions
        self._walk()

    def _walk(self) -> None:
        """Advance every chain length's walk over the positions resolved so far: a round at
        ``p`` accepts ``min(m_p, k)`` drafts and the next one drafts after its bonus token."""
        resolved, nxt = self.resolved, self.walk_next
        rounds, drafts = self.walk_rounds, self.walk_drafts
        for k in range(self.max_chain):  # chain length k + 1
            p, r, d = nxt[k], 0, 0
            m = resolved.get(p)
            while m is not None:
                a = m if m <= k else k + 1
                r += 1
                d += a
                p += a + 1
                m = resolved.get(p)
            nxt[k] = p
            rounds[k] += r
            drafts[k] += d
        lo = min(nxt)
        for q in [q for q in resolved if q < lo]:
            del resolved[q]

    def take(self) -> tuple[int, list[int], list[int], list[int]]:
        """The counts resolved since the last call: positions, matches, and per chain length
        the rounds walked and the drafts they accepted (then reset)."""
        out = (self.positions, self.matched, self.walk_rounds, self.walk_drafts)
        k = self.max_chain
        self.positions, self.matched = 0, [0] * k
        self.walk_rounds, self.walk_drafts = [0] * k, [0] * k
        return out


class NgramDrafter:
    """Prompt lookup over each sequence's own history; with ``shadow_chain > 0`` it also scores
    the shadow acceptance of chains of up to that many drafts (see the module)."""

    kind = "ngram"

    def __init__(self, device, max_n: int = 3, shadow_chain: int = 0) -> None:
        if shadow_chain < 0:
            raise ValueError(f"shadow_chain must be >= 0, got {shadow_chain}")
        self.device = torch.device(device)
        self.max_n = max_n
        self.shadow_chain = shadow_chain
        self.indexes: list[NgramIndex] = []
        self.shadows: list[ShadowChain] = []

    def start(self, prompts: list[list[int]]) -> None:
        self.indexes = []
        for p in prompts:
            idx = NgramIndex(self.max_n)
            idx.extend(p)
            self.indexes.append(idx)
        # The shadow scores decoded positions only: the prompt is not what the target writes.
        self.shadows = [ShadowChain(self.shadow_chain) for _ in prompts if self.shadow_chain]

    def sync(self, history: list[list[int]]) -> None:
        """Index the committed tokens not indexed yet (scoring the shadow on the way)."""
        for b, hist in enumerate(history):
            idx = self.indexes[b]
            if len(idx.tokens) < len(hist):
                new = hist[len(idx.tokens) :]
                if self.shadows:
                    self.shadows[b].advance(idx, new)
                else:
                    idx.extend(new)

    def resume(self, history: list[list[int]]) -> None:
        """A warm drafter drafts again: its index only lacks the tokens committed since."""
        self.sync(history)

    def take_shadow(self) -> ShadowAcceptance | None:
        """The shadow counts resolved since the last call, summed over the batch (None without a
        shadow)."""
        if not self.shadows:
            return None
        positions, matched, rounds, drafts = self.shadows[0].take()
        for sh in self.shadows[1:]:
            n, m, r, d = sh.take()
            positions += n
            matched = [a + b for a, b in zip(matched, m, strict=True)]
            rounds = [a + b for a, b in zip(rounds, r, strict=True)]
            drafts = [a + b for a, b in zip(drafts, d, strict=True)]
        return ShadowAcceptance(positions, tuple(matched), tuple(rounds), tuple(drafts))

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        self.sync(history)
        rows = []
        for b, hist in enumerate(history):
            idx = self.indexes[b]
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
        self.sync(history)


def _path_tokens(tree: DraftTree, toks: list[int], node: int) -> list[int]:
    """Tokens of the path below the root down to ``node`` (root excluded)."""
    out = []
    while node > 0:
        out.append(toks[node])
        node = tree.parents[node]
    return out[::-1]
