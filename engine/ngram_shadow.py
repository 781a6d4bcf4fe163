"""The shadow acceptance of n-gram drafting (``engine.ngram``): what chains and trees drafted
from a sequence's n-gram index (``engine.ngram_index``) would have accepted on the tokens
actually committed, scored as they are committed.

For every newly committed position ``p`` the shadow compares the chain of ``K`` tokens it would
have proposed there with the tokens committed at ``p, p + 1, ...``: ``m`` leading matches. The
proposals are one-hot and the committed tokens were drawn from the target, so ``P(m >= k)`` is,
without bias, the probability that a chain drafted at ``p`` has its first ``k`` drafts accepted.
Each chain length ``K' <= K`` and each branching tree (``shadow_trees``) is also *walked* over
the resolved positions as its own run would have drafted, which gives its accepted drafts per
round on this text (the average over positions overstates it on bursty text). The shadow runs
on an index of its own, which only ``NgramDrafter.sync`` advances, so its host time stays
behind the GPU work even while this drafter drafts. ``ShadowChain`` gives the argument in full.
"""

from __future__ import annotations

from ssvkit.engine.ngram_index import NgramIndex
from ssvkit.engine.tree import DraftTree


class _TreeWalk:
    """One branching tree's walk (see ``ShadowChain``): where its next round drafts, the round in
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
    """The shadow acceptance of one sequence: chain proposals still waiting for committed
    tokens, and the leading-match counts of those resolved since the last ``take``; with
    ``trees`` ((spec, tree) pairs), those branching trees' walks too.

    **Shadow acceptance.** For every newly committed position ``p``, the chain of ``K =
    max_chain`` tokens proposed there (from the index of ``history[:p]``) is scored against the
    tokens actually committed at ``p, p + 1, ...``: the number ``m`` of leading matches. The
    engine does so whether or not the n-gram drafter drafts (a warm drafter:
    ``NgramDrafter.sync`` every round), so a controller sees what n-gram drafting would accept
    on this very sequence while another drafter, or none, decodes it. Why the leading matches
    estimate the acceptance without bias: the proposals are deterministic (one-hot), and
    lossless rejection sampling accepts a one-hot proposal ``x`` with probability
    ``min(1, p_target(x) / 1) = p_target(x)``; the committed token at that position was drawn
    from ``p_target`` (whatever strategy decoded it, losslessly), so it equals ``x`` with the
    same probability ``p_target(x)``. Position by position, ``P(m >= k)`` is the probability
    that a chain drafted at ``p`` has its first ``k`` drafts accepted, and ``E[min(m, K')]``
    the expected accepted drafts of a chain of ``K' <= K`` drafted at a position picked at
    random.

    **Per round, a walk.** A real chain run does not draft at random positions: it drafts where
    its own last round left it, ``p + min(m_p, K') + 1`` after a round at ``p``, so it crosses
    a stretch of matching positions in a few rounds and spends a round on each position of a
    stretch that does not match. The average over every position weights the matching
    stretches by their length instead. So each chain length ``K' <= K`` is also walked over the
    resolved positions as that chain's run would have (``rounds`` and ``drafts`` of
    ``ShadowAcceptance``): accepted drafts per round = drafts / rounds, the chain's own figure
    on this text -- exact under greedy decoding, where the text is the same whatever decodes
    it.

    **Branching trees, walked too.** Each tree of ``trees`` is walked as its own run would be:
    at the position its walk drafts at next it builds the tree from the index as it stands
    there (``NgramIndex.tree_tokens``, what ``NgramDrafter.draft`` builds), and the round
    accepts the longest root path whose tokens the committed ones match -- the chain's argument
    per sibling: lossless multi-draft verification of one-hot drafts accepts some child with
    the summed target probability of the distinct children, and the committed token is one of
    them with that same probability. The next round drafts after the bonus token. A walked
    round drafts the root's children, and the subtrees below only those of them the next
    committed token matches (``tree_tokens(first=...)``: the others cannot be accepted); a
    round in progress costs one comparison per matched node and token. The first continuations
    of each n-gram a tree asked for are kept ranked as the counts grow (``engine.ngram_index``),
    so a lookup is a dictionary hit, not a partial sort.

    **Cost.** Per new position, one look-up per n-gram ending there (the first draft and the
    index update share them: one table holds each n-gram's continuations and its best one),
    then up to ``max_n`` per further draft while they match; the whole chain only for positions
    within ``K`` of the end that still match. The tests count its look-ups per token, which
    stay flat in the index's size.
    """

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
        k_max, max_n = self.max_chain, idx.max_n
        self.tokens += len(new)
        toks, table, base, trees = idx.tokens, idx.table, len(idx.tokens), self.trees
        if self.walk_next is None:  # every walk starts after the first decoded token (the
            self.walk_next = [base + 1] * k_max  # first root, which the prefill samples)
            for w in trees:
                w.next = base + 1
        opened = []  # proposals compared with every token of ``new``: they wait for the next call
        for i, tok in enumerate(new):
            for w in trees:  # before ``tok`` is indexed: a tree drafted here sees what precedes
                w.feed(idx, base + i, tok)
            if self.pending:  # earlier proposals, every token before ``tok`` matched
                self.pending = self._match_pending(tok)
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
                self._resolve(base + i, 0)
                idx.push(tok, key, hits)
                continue
            prop, m, open_ = _chain(table, max_n, key, c, new, i, k_max)
            if open_:
                opened.append((prop, m, base + i))
            else:
                self._resolve(base + i, m)
            idx.push(tok, key, hits)
        self.pending = self.pending + opened
        self._walk()

    def _match_pending(self, tok: int) -> list[tuple[list[int], int, int]]:
        """Compare ``tok`` with the next draft of every pending proposal: those it matches wait
        for the next token while they have drafts left; the others are resolved."""
        still = []
        for prop, m, at in self.pending:
            if prop[m] == tok:
                m += 1
                if m < self.max_chain:
                    still.append((prop, m, at))
                    continue
            self._resolve(at, m)
        return still

    def _resolve(self, at: int, m: int) -> None:
        """Resolve the proposal at position ``at`` with ``m`` leading matches (``advance``),
        its ``m`` kept in ``resolved`` for the walks."""
        self.positions += 1
        self.resolved[at] = m
        matched = self.matched
        for k in range(m):
            matched[k] += 1

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


def _chain(table, max_n: int, key: tuple[int, ...], first: int, new: list[int], i: int, k_max: int):
    """The chain of up to ``k_max`` drafts proposed at ``new[i]``, whose first draft ``first``
    (the continuation of ``key``, the n-grams before it) matched: its drafts up to the first
    one a committed token misses (all of them where ``new`` runs out first), how many of them
    the committed tokens match, and whether ``new`` ran out with every token matched (the rest
    of the chain waits for more)."""
    prop, m, open_, ctx = [first], 1, False, (key + (first,))[-max_n:]
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
            if j >= len(new):
                open_ = True  # every committed token matched: the rest waits for more
            elif new[j] != c:
                break
            else:
                m += 1
    return prop, m, open_


def walked_trees(specs) -> tuple[tuple[str, DraftTree], ...]:
    """(spec, tree) of each branching tree among ``specs``: the trees the shadow walks (its
    chain walks score the chains)."""
    trees = {}
    for spec in specs:
        tree = DraftTree.from_spec(spec)
        if tree.max_children > 1:
            trees[spec] = tree
    return tuple(trees.items())


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
    trees = walked_trees(specs)
    idx = NgramIndex(max_n)
    idx.extend(prompt)
    sh = ShadowChain(max(chains.values(), default=1), trees)
    sh.advance(idx, list(text))
    _, _, rounds, drafts, walks, _ = sh.take()
    out = {s: (rounds[k - 1], drafts[k - 1]) for s, k in chains.items() if k}
    out.update({spec: (r, d) for spec, r, d, _ in walks})
    return out
