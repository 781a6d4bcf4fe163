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
of leading matches. It does so whether or not it drafts (a warm drafter: the engine calls
``sync`` every round), so a controller sees what n-gram drafting would accept on this very
sequence while another drafter, or none, decodes it. The shadow runs on an index of its own,
which only ``sync`` advances: the drafter's own calls update the drafting index alone, so the
shadow's host time stays behind the GPU work even while this drafter drafts (``sync``).

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
by their length instead: on the H100 it put n-gram chain:7 at 2.56 tokens per round on code and
1.81 on repetitive text, where the chain run measured 2.08 and 1.27. So the shadow also walks
each chain length ``K' <= K`` over the resolved positions as that chain's run would have
(``rounds`` and ``drafts`` of ``ShadowAcceptance``): accepted drafts per round = drafts /
rounds, the chain's own figure on this text -- exact under greedy decoding, where the text is
the same whatever decodes it.

**Branching trees, walked too.** With ``shadow_trees`` the shadow also walks each of those
trees as its own run would: at the position its walk drafts at next it builds the tree
from the index as it stands there (``NgramIndex.tree_tokens``, what ``draft`` builds), and the
round accepts the longest root path whose tokens the committed ones match -- the chain's
argument per sibling: lossless multi-draft verification of one-hot drafts accepts some child
with the summed target probability of the distinct children, and the committed token is one of
them with that same probability. The next round drafts after the bonus token. On prose on the
H100 the n-gram tree(n=8,d=4) accepts 1.74-1.75 tokens per round where chain:7 accepts
1.49-1.58, which shifting the tree by the chain's shadow cannot show. A walked round drafts
the root's children, and the subtrees below only those of them the next committed token
matches (``tree_tokens(first=...)``: the others cannot be accepted); a round in progress
costs one comparison per matched node and token. The first
continuations of each n-gram a tree asked for are kept ranked as the counts grow
(``_Hits.ranked``), so a lookup is a dictionary hit, not a partial sort. The three n-gram trees
of the 16K regime add ~35 us a round to the shadow on a development CPU with its caches hot,
~50 us with 32 MiB written between rounds (``python -m ssvkit.validation.controller_cost``).

Cost: per new position, one look-up per n-gram ending there (the first draft and the index
update share them: one table holds each n-gram's continuations and its best one), then up to
``max_n`` per further draft while they match; the whole chain only for positions within ``K``
of the end that still match. Index update plus shadow at ``K = 8`` on a 15K-token index
(development CPU, median per round, ``sync`` + ``take_shadow``; the tests count its
look-ups per token, which stay flat in the index's size): random bytes, 1 committed token
~4.5 us, 8 tokens ~20 us; 1-5 tokens of code per round ~11 us, ~38 us with 32 MiB written
between rounds as the rest of a round evicts the CPU caches (``validation.controller_cost``).
A prompt is indexed into an empty index at once (``NgramIndex._fill``, counted with numpy):
about a third of the token-by-token host time on 16K tokens of code, which a batch of 32
such prompts pays at every drafter start.

**A sample of the batch.** The shadow's work is per sequence: every committed token of every
sequence costs an index update, a chain proposal and a step of each walk, ~25-30 us per
sequence and round with the 32K regime's three trees (one token each, autoregressive), so a
batch of 32 cost ~1 ms a round on the H200's host -- twice the verify step it runs behind.
With ``shadow_sequences = S`` the shadow scores only a fixed sample of S sequences spread over
the batch (``shadow_sample``; its indexes only theirs), each one's walks reported beside the
sum (``ShadowAcceptance.by_sequence``) so that a controller can measure how far the sequences
differ; the tokens it reads per round (``shadow_tokens``) are then at most S times a round's
longest commit, whatever the batch. A sampled sequence that finishes leaves the sample
smaller; one that never advances again counts 0 tokens.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import torch
from ssvkit.engine.acceptance import AcceptedPath
from ssvkit.engine.controller import SequenceWalks, ShadowAcceptance
from ssvkit.engine.drafter import Draft
from ssvkit.engine.tree import DraftTree

# The longest chain the shadow scores: the planner's space drafts chains of up to 7.
SHADOW_MAX_CHAIN = 8
# Continuations an n-gram keeps ranked between changes of its counts (a tree node of the
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


class _TreeWalk:
    """One branching tree's walk (see the module): where its next round drafts, the round in
    progress (its nodes' tokens, the nodes whose paths match every token committed since, and
    their depth; None between rounds), and the rounds, accepted drafts and their squares
    since the last ``take``."""

    __slots__ = (
        "spec",
        "tree",
        "children",
        "next",
        "toks",
        "alive",
        "depth",
        "start",
        "rounds",
        "drafts",
        "squares",
    )

    def __init__(self, spec: str, tree: DraftTree) -> None:
        self.spec, self.tree, self.children = spec, tree, tree.children
        self.next: int | None = None
        self.toks: list[int] | None = None
        self.alive: list[int] = []
        self.depth = self.start = 0
        self.rounds = self.drafts = self.squares = 0

    def feed(self, idx: NgramIndex, pos: int, tok: int) -> None:
        """The token committed at ``pos``, the index holding the tokens before it: draft the
        tree there if its walk drafts there next, then match ``tok`` below the matched
        nodes; a round ends when none of their children holds it (or none has children)."""
        if self.toks is None:
            if pos != self.next:
                return
            self.toks = idx.tree_tokens(idx.tokens, self.tree, self.children, tok)
            self.alive, self.depth, self.start = [0], 0, pos
        toks, children = self.toks, self.children
        alive = [c for n in self.alive for c in children[n] if toks[c] == tok]
        if alive:
            self.depth += 1
            if any(children[c] for c in alive):
                self.alive = alive
                return
        a = self.depth  # accepted drafts: the longest root path the committed tokens match
        self.rounds += 1
        self.drafts += a
        self.squares += a * a
        self.next = self.start + a + 1  # the next round drafts after this one's bonus token
        self.toks = None


class ShadowChain:
    """The shadow acceptance of one sequence (see the module): chain proposals still waiting
    for committed tokens, and the leading-match counts of those resolved since the last
    ``take``; with ``trees`` ((spec, tree) pairs), those branching trees' walks too."""

    def __init__(self, max_chain: int, trees: tuple[tuple[str, DraftTree], ...] = ()) -> None:
        if max_chain < 1:
            raise ValueError(f"max_chain must be >= 1, got {max_chain}")
        self.max_chain = max_chain
        self.trees = [_TreeWalk(spec, tree) for spec, tree in trees]
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
        self.tokens = 0  # committed tokens read since the last ``take``

    def advance(self, idx: NgramIndex, new: list[int]) -> None:
        """Index ``new`` (the tokens committed after ``idx.tokens``), scoring each position's
        proposal from the index as it stood before that position. A resolved proposal with
        ``m`` leading matches counts one position and adds 1 to ``matched[:m]``."""
        k_max, max_n, n_new = self.max_chain, idx.max_n, len(new)
        self.tokens += n_new
        toks, table = idx.tokens, idx.table
        positions, matched, pending = self.positions, self.matched, self.pending
        resolved, base = self.resolved, len(toks)
        trees = self.trees
        if self.walk_next is None:  # every walk starts after the first decoded token (the
            self.walk_next = [base + 1] * k_max  # first root, which the prefill samples)
            for w in trees:
                w.next = base + 1
        opened = []  # proposals compared with every token of ``new``: they wait for the next call
        for i, tok in enumerate(new):
            for w in trees:  # before ``tok`` is indexed: a tree drafted here sees what precedes
                w.feed(idx, base + i, tok)
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

    def take(
        self,
    ) -> tuple[int, list[int], list[int], list[int], list[tuple[str, int, int, int]], int]:
        """The counts resolved since the last call: positions, matches, per chain length the
        rounds walked and the drafts they accepted, per tree its (spec, rounds, accepted
        drafts, their squares), and the committed tokens read (then reset)."""
        walks = [(w.spec, w.rounds, w.drafts, w.squares) for w in self.trees]
        for w in self.trees:
            w.rounds = w.drafts = w.squares = 0
        out = (self.positions, self.matched, self.walk_rounds, self.walk_drafts, walks, self.tokens)
        k = self.max_chain
        self.positions, self.matched = 0, [0] * k
        self.walk_rounds, self.walk_drafts = [0] * k, [0] * k
        self.tokens = 0
        return out


def walk_text(
    prompt: list[int], text: list[int], specs: tuple[str, ...], max_n: int = 3
) -> dict[str, tuple[int, int]]:
    """The shadow's walks (see the module) of n-gram drafting with each tree of ``specs``
    (chains and branching trees) over one decoded ``text`` after its ``prompt``: per spec, the
    rounds its own run would have taken over that text and the drafts they accepted (a round
    still open at the text's end is left out). Unbiased for a run of that tree on any text the
    target wrote losslessly, whichever strategy decoded it: so every tree can be scored on the
    same texts (``validation.walks``)."""
    chains = {s: t.num_drafts for s in specs if (t := DraftTree.from_spec(s)).max_children <= 1}
    trees = NgramDrafter._walked(specs)
    idx = NgramIndex(max_n)
    idx.extend(prompt)
    sh = ShadowChain(max(chains.values(), default=1), trees)
    sh.advance(idx, list(text))
    _, _, rounds, drafts, walks, _ = sh.take()
    out = {s: (rounds[k - 1], drafts[k - 1]) for s, k in chains.items() if k}
    out.update({spec: (r, d) for spec, r, d, _ in walks})
    return out


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
    the shadow acceptance of chains of up to that many drafts (see the module)."""

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
            self.shadow_trees = self._walked(shadow_trees)
        self.indexes: list[NgramIndex] = []
        # The sampled sequences (``shadow_sample``), their shadows and the shadows' indexes;
        # the committed tokens the shadow has read since ``start`` (its work: each costs an
        # index update, a chain proposal and a step of every walk).
        self.sampled: tuple[int, ...] = ()
        self.shadow_tokens = 0
        self.shadows: list[ShadowChain] = []
        self.shadow_indexes: list[NgramIndex] = []

    @staticmethod
    def _walked(specs) -> tuple[tuple[str, DraftTree], ...]:
        """(spec, tree) of each branching tree among ``specs``."""
        trees = {}
        for spec in specs:
            tree = DraftTree.from_spec(spec)
            if tree.max_children > 1:
                trees[spec] = tree
        return tuple(trees.items())

    def start(self, prompts: list[list[int]]) -> None:
        self.indexes = [self._indexed(p) for p in prompts]
        if callable(self._trees_for) and self.shadow_chain:
            self.shadow_trees = self._walked(self._trees_for(max(map(len, prompts))))
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
        loop calls ``sync`` behind the next round's GPU work (``engine.loop``, overlap). On
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
