"""``ModelRunner``: one model, its KV cache and its CUDA graphs (nano-vllm's ModelRunner).

- ``prefill(prompts)``: each prompt through the model in chunked causal forwards of a bounded
  token budget (``engine.prefill``, ``engine.memory``); returns the last position's logits. A
  prefill of the prompts whose KV the cache still holds intact is reused (``KVCache.intact``).
- ``tree_forward(tokens, tree, attn)``: one forward of the flattened tree tail ``[B, t]`` at
  positions ``lens + depth``, writing its KV at ``lens + i``, attending through
  ``engine.attention.TreeAttention``. Eager; callers run it inside ``graphs``.
- ``commit(path, count)``: ``KVCache.commit`` (accepted path kept, the rest rolled back).
- ``extend(tails)`` / ``append(tails)``: the committed tokens a drafter lacks, through
  prefill's chunked forward or graph-captured chain forwards (a warm drafter's catch-up).

Static shapes and no host reads in ``tree_forward`` and ``commit``, so ``graphs`` can capture
them (``use_graphs`` needs CUDA and the Triton backend).
"""

from __future__ import annotations

import torch
from ssvkit.engine.attention import AttentionConfig, TreeAttention
from ssvkit.engine.cache import KVCache
from ssvkit.engine.graphs import GraphRunner
from ssvkit.engine.memory import free_memory, prefill_token_budget
from ssvkit.engine.model import CausalLM
from ssvkit.engine.prefill import (
    SavedPrefill,
    chunked_forward,
    mark,
    prompt_tokens,
    weights_key,
)
from ssvkit.engine.tree import DraftTree, TreeTensors
from ssvkit.kernels.tree import MAX_TREE_NODES

# Chunk lengths of ``append``: each chunk is a chain tree of one of these lengths (the shortest
# that holds the longest remaining tail, at most ``MAX_TREE_NODES``, the tree kernels' limit),
# so a catch-up of any length replays one of four graphs.
APPEND_CHUNKS = (8, 16, 32, MAX_TREE_NODES)


class ModelRunner:
    """Runs ``model`` for a batch of ``batch`` sequences of up to ``t_max`` positions."""

    def __init__(
        self,
        model: CausalLM,
        *,
        batch: int,
        t_max: int,
        backend: str,
        use_graphs: bool = False,
    ) -> None:
        device = model.rope_cos.device
        if use_graphs and (device.type != "cuda" or backend != "triton"):
            raise ValueError("CUDA graphs need a CUDA device and the triton backend")
        if t_max > model.max_positions:
            raise ValueError(f"t_max={t_max} exceeds the model's {model.max_positions} positions")
        self.model = model
        self.config = model.config
        self.backend = backend
        self.device = device
        dtype = next(model.parameters()).dtype
        self.cache = KVCache(
            model.config, batch, t_max, dtype=dtype, device=device, use_triton=backend == "triton"
        )
        self.graphs = GraphRunner(use_graphs)
        self._trees: dict[DraftTree, TreeTensors] = {}
        # Device tensors that captured graphs read by address (e.g. a drafter's level plans):
        # they live as long as the runner and its graphs, not as long as whoever built them,
        # so a graph replayed for a later Engine or drafter never reads freed memory.
        self.graph_constants: dict = {}
        self._prefill: SavedPrefill | None = None
        self.prefills = 0  # prefills run (not reused)
        self.prefill_reused = False  # whether the last ``prefill`` call reused one

    @property
    def batch(self) -> int:
        return self.cache.batch

    def tree_tensors(self, tree: DraftTree) -> TreeTensors:
        if tree not in self._trees:
            self._trees[tree] = tree.tensors(self.batch, self.device)
        return self._trees[tree]

    def prepare(self, attn: AttentionConfig) -> None:
        """Build the cache summaries ``attn`` reads (block metadata, compressed tokens)."""
        before = (id(self.cache.meta), id(self.cache.comp))
        if attn.kind == "sparse":
            self.cache.require_blocks(attn.block_size, (attn.metadata,))
        elif attn.kind == "nsa":
            self.cache.require_compressed(attn.comp_block, attn.comp_stride)
        if (id(self.cache.meta), id(self.cache.comp)) != before:
            self.graphs.clear()  # captured graphs read the old summary tensors

    def retain(self, attns) -> None:
        """Drop the cache summaries none of ``attns`` reads: every commit refreshes the
        summaries that exist, for every layer, so block metadata or compressed tokens left by
        an earlier sparse strategy would tax each round of a dense one (on the H100, tiny pair
        at 16K: 89 more kernels and ~110 us per round). A later
        ``prepare`` rebuilds what it needs from the committed prefix."""
        kinds = {a.kind for a in attns}
        drop_meta = self.cache.meta is not None and "sparse" not in kinds
        drop_comp = self.cache.comp is not None and "nsa" not in kinds
        if drop_meta or drop_comp:
            self.cache.drop_summaries(meta=drop_meta, comp=drop_comp)
            self.graphs.clear()  # the captured commits refresh the dropped summaries

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(
        self, prompts: list[list[int]], token_budget: int | None = None, *, reuse: bool = True
    ) -> torch.Tensor:
        """Write every prompt's KV and return the last position's logits ``[B, V]`` float32.

        Prompts of equal length run together, in chunked causal forwards of at most
        ``token_budget`` tokens (rows x chunk; default ``prefill_budget``), so the activations
        of a forward are bounded whatever the batch and the context: the budget is sized from
        the model's width and the free memory (``engine.memory``). With ``reuse``, the prefill
        the cache holds intact (``KVCache.intact``: nothing wrote below its lengths since) for
        the same prompts, weights and explicit budget is reused instead: the lengths are set
        back, which rebuilds the summaries from the prefix, and the saved logits returned. The
        KV and the logits are functions of the prompts, the weights and the chunking alone (no
        strategy enters a prefill), so this is bitwise what running it again with the same
        chunks gives (a budget sized from free memory may chunk another run otherwise).
        ``prefill_reused`` says which happened; ``prefill_seconds`` is the measured time of the
        prefill the cache holds."""
        cache = self.cache
        if len(prompts) != cache.batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {cache.batch}")
        lens = [len(p) for p in prompts]
        for b, n in enumerate(lens):
            if not 1 <= n < cache.t_max:
                raise ValueError(f"prompt {b} has {n} tokens; the cache holds {cache.t_max}")
        tokens = prompt_tokens(prompts)
        held = self._held(tokens, lens)
        if reuse and held is not None and held.token_budget == token_budget:
            cache.set_lens(torch.tensor(lens, dtype=torch.int32))
            self.prefill_reused = True
            return held.logits.clone()
        self._prefill, cache.intact = None, None
        weights = weights_key(self.model)
        budget = self._budget(token_budget)
        start = mark(self.device)
        by_len: dict[int, list[int]] = {}
        for b, n in enumerate(lens):
            by_len.setdefault(n, []).append(b)
        last = torch.empty(
            (cache.batch, self.config.vocab_size), dtype=torch.float32, device=self.device
        )
        for rows in by_len.values():
            last[torch.tensor(rows, device=self.device)] = self._forward(
                [prompts[b] for b in rows], rows, 0, budget
            )
        cache.set_lens(torch.tensor(lens, dtype=torch.int32))
        cache.intact = lens
        span = (start, mark(self.device))
        self._prefill = SavedPrefill(tokens, lens, token_budget, weights, last.clone(), span)
        self.prefills += 1
        self.prefill_reused = False
        return last

    def prefill_memo(self, prompts: list[list[int]]) -> dict | None:
        """A dict that lives as long as the cache holds the prefill of ``prompts`` intact
        (None when it does not), for results that are functions of that prefill and of their
        own key alone."""
        held = self._held(prompt_tokens(prompts), [len(p) for p in prompts])
        return held.memo if held is not None else None

    def prefill_seconds(self) -> float | None:
        """Seconds of the prefill the cache holds, measured when it ran (CUDA events on the
        GPU, wall clock on the CPU); None when it holds none."""
        return self._prefill.seconds() if self._prefill is not None else None

    def _held(self, tokens: torch.Tensor, lens: list[int]) -> SavedPrefill | None:
        """The saved prefill when it is of these prompts and weights and the cache still holds
        its KV intact."""
        p = self._prefill
        if (
            p is None
            or self.cache.intact != lens
            or not p.matches(tokens, lens, weights_key(self.model))
        ):
            return None
        return p

    def _forward(self, tokens: list[list[int]], rows: list[int], start: int, budget: int):
        return chunked_forward(self.model, self.cache, tokens, rows, start, budget, self.backend)

    @torch.no_grad()
    def extend(self, tails: list[list[int]], token_budget: int | None = None) -> int:
        """Append ``tails[b]`` to sequence ``b``'s committed prefix: its KV written at positions
        ``lens[b], lens[b] + 1, ...`` by chunked causal forwards (prefill's, started at the
        committed length, so the prefix is not run again), then the lengths and summaries.
        Reads ``lens`` on the host once. Returns the tokens appended."""
        cache = self.cache
        if len(tails) != cache.batch:
            raise ValueError(f"{len(tails)} tails for a batch of {cache.batch}")
        budget = self._budget(token_budget)
        starts = cache.lens.tolist()
        groups: dict[tuple[int, int], list[int]] = {}
        for b, tail in enumerate(tails):
            if starts[b] + len(tail) >= cache.t_max:
                raise ValueError(
                    f"sequence {b}: {starts[b]} + {len(tail)} tokens exceed the cache's "
                    f"{cache.t_max}"
                )
            if tail:
                groups.setdefault((starts[b], len(tail)), []).append(b)
        for (start, _), rows in groups.items():
            self._forward([tails[b] for b in rows], rows, start, budget)
        if groups:
            new = [s + len(t) for s, t in zip(starts, tails, strict=True)]
            cache.set_lens(torch.tensor(new, dtype=torch.int32))
        return sum(map(len, tails))

    def prefill_budget(self) -> int:
        """Tokens per prefill forward that the memory free now allows
        (``engine.memory.prefill_token_budget``; on the CPU SDPA materialises the scores over
        up to ``t_max`` keys, which counts too)."""
        elem = self.cache.kv.element_size()
        scores = self.cache.t_max if self.device.type != "cuda" else 0
        return prefill_token_budget(self.config, elem, free_memory(self.device), scores)

    def _budget(self, token_budget: int | None) -> int:
        if token_budget is None:
            return self.prefill_budget()
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        return token_budget

    @torch.no_grad()
    def append(self, tails: list[list[int]]) -> int:
        """Append ``tails[b]`` to sequence ``b``'s committed prefix, as ``extend`` does, through
        the decode path: chunks of a chain tree (each token sees the prefix and the chunk's
        tokens before it, dense), each forward followed by a commit of the first ``count[b]``
        nodes of row ``b`` -- its own chunk of its tail, the rest padding that no real token
        sees and the commit drops. Under graphs each chunk length of ``APPEND_CHUNKS`` is one
        captured graph (forward and commit) replayed for every chunk of that length. Falls back
        to ``extend`` when a chunk's tail would not fit the cache. Reads ``lens`` on the host
        once. Returns the tokens appended.

        This is how a warm drafter that sat out some rounds catches up with the tokens committed
        meanwhile: ``extend`` runs eagerly, some 80 launches and a masked SDPA whose shape is new
        every time, against a few graph replays here."""
        cache = self.cache
        if len(tails) != cache.batch:
            raise ValueError(f"{len(tails)} tails for a batch of {cache.batch}")
        longest = max(map(len, tails), default=0)
        if longest == 0:
            return 0
        starts = cache.lens.tolist()
        for b, tail in enumerate(tails):
            if starts[b] + len(tail) >= cache.t_max:
                raise ValueError(
                    f"sequence {b}: {starts[b]} + {len(tail)} tokens exceed the cache's "
                    f"{cache.t_max}"
                )
        plan, done = [], 0
        while done < longest:
            n = min(longest - done, APPEND_CHUNKS[-1])
            size = next(c for c in APPEND_CHUNKS if c >= n)
            if max(starts[b] + min(done, len(t)) for b, t in enumerate(tails)) + size > cache.t_max:
                return self.extend(tails)  # the padded chunk's tail would not fit
            plan.append((done, size))
            done += n
        for offset, size in plan:
            rows = [t[offset : offset + size] for t in tails]
            count = torch.tensor([len(r) for r in rows], dtype=torch.int32)
            tokens = torch.tensor([r + [0] * (size - len(r)) for r in rows], dtype=torch.int64)
            self.graphs(
                ("append", size),
                self._append_fn(size),
                (tokens.to(self.device), count.to(self.device)),
                neutral=lambda size=size: (
                    torch.zeros((cache.batch, size), dtype=torch.int64, device=self.device),
                    torch.zeros(cache.batch, dtype=torch.int32, device=self.device),
                ),
            )
        return sum(map(len, tails))

    @torch.no_grad()
    def prepare_append(self) -> int:
        """Capture ``append``'s graphs now (each chunk length whose tail fits the cache), with
        a commit of nothing: a drafter that will be caught up calls it when it starts, so that
        no switch pays for a capture (or the dense kernel's first compilation for that tail
        length: 0.86 s inside one switch on the H100). Returns the graphs captured;
        0 without graphs."""
        if not self.graphs.enabled:
            return 0
        cache, done = self.cache, 0
        room = cache.t_max - int(cache.lens.max())
        for size in APPEND_CHUNKS:
            if ("append", size) in self.graphs or size > room:
                continue
            nothing = (
                torch.zeros((cache.batch, size), dtype=torch.int64, device=self.device),
                torch.zeros(cache.batch, dtype=torch.int32, device=self.device),
            )
            self.graphs(("append", size), self._append_fn(size), nothing, neutral=nothing)
            done += 1
        return done

    def _append_fn(self, size: int):
        """The graph body of one ``append`` chunk of ``size`` tokens: the chain's forward and
        the commit of ``count[b]`` of its nodes (the path constant is kept on the runner, as
        the graph reads it by address)."""
        key = ("append_path", size)
        if key not in self.graph_constants:
            self.graph_constants[key] = (
                DraftTree.from_parents(list(range(-1, size - 1))),
                torch.arange(size, device=self.device).expand(self.batch, size).contiguous(),
            )
        chain, path = self.graph_constants[key]
        dense = AttentionConfig()

        def fn(tokens: torch.Tensor, count: torch.Tensor) -> None:
            self.tree_forward(tokens, chain, dense)
            self.cache.commit(path, count)

        return fn

    def tree_forward(
        self,
        tokens: torch.Tensor,
        tree: DraftTree,
        attn: AttentionConfig,
        *,
        record: bool = False,
        return_hidden: bool = False,
    ):
        """Logits ``[B, t, V]`` of the tail ``tokens`` ``[B, t]`` (plus hidden states and the
        per-layer ``q`` when asked). Writes the tail KV; reads ``lens`` on the device only."""
        tt = self.tree_tensors(tree)
        cache = self.cache
        t = tokens.shape[1]
        positions = cache.lens.long()[:, None] + tt.depth
        attend = TreeAttention(attn, cache, tt, positions, backend=self.backend, record=record)
        logits, hidden = self.model(
            tokens,
            positions,
            cache.tail_writer(t),
            attend,
            backend=self.backend,
            return_hidden=return_hidden,
        )
        return logits, hidden, attend.recorded

    def commit(self, path: torch.Tensor, count: torch.Tensor) -> None:
        """Keep the accepted ``path`` (``[B, P]`` tail labels) of ``count`` nodes, via a graph."""
        p = path.shape[1]
        self.graphs(
            ("commit", p),
            self.cache.commit,
            (path, count),
            neutral=lambda: (torch.zeros_like(path), torch.zeros_like(count)),
        )
