"""The oracle drafter: the target's own continuation, corrupted to a chosen acceptance profile.

Random-weight models have the real geometry and step costs but no draft model that agrees
with them. The oracle stands in for one. Each round, every token on the tree's spine (the
rank-0 child at each level) is the target's own next token, replaced, independently with
probability ``1 - alpha_k`` at depth ``k``, by a different token drawn from a seeded generator;
every other node holds a token that differs from the target's at its depth. Verification is the
target's own, so the output is the target's whatever the drafts, and the accepted length
follows the profile: ``P(accepted >= k) = alpha_1 ... alpha_k``. Its acceptance is synthetic
and is labelled so wherever it is reported.

The target's next tokens are those of the decode itself, not of a separate pass: the
autoregressive ``reference`` is only the first guess, which untimed probes of the round's own
verify correct before each round (``OracleDrafter.anchor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from ssvkit.engine.acceptance import AcceptedPath, accept
from ssvkit.engine.drafter import Draft
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree

# What a probe returns per sequence: the tokens the target emits from a draft (its accepted
# drafts, then the bonus token), as the round's verify and acceptance would emit them.
Probe = Callable[[torch.Tensor], list[list[int]]]


class OracleDrafter:
    """Drafts of the target's own continuation with acceptance ``alpha`` per depth
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
        self.diverged: set[int] = set()  # sequences whose verify left their last probe
        self.off_plan = 0  # (sequence, round) pairs whose last probe left the drawn plan
        self._rng = np.random.default_rng(self.seed)
        self._spines: dict[DraftTree, np.ndarray] = {}
        # The round ``anchor`` probed: its draft and, per sequence still generating, the
        # tokens generated before it and the tokens it plans to emit.
        self._anchored: torch.Tensor | None = None
        self._plan: dict[int, tuple[int, int]] = {}

    def load(self, prompts: list[list[int]], reference: list[list[int]]) -> None:
        """The first guess of each prompt's continuation (its first token the first root),
        before a decode of ``prompts``; the corruption draws restart from the seed."""
        if len(reference) != len(prompts):
            raise ValueError(f"{len(reference)} reference rows for {len(prompts)} prompts")
        self._prompt_lens = [len(p) for p in prompts]
        self._reference = [list(r) for r in reference]
        self.diverged = set()
        self.off_plan = 0
        self._rng = np.random.default_rng(self.seed)
        self._anchored, self._plan = None, {}

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

    def anchor(
        self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]], probe: Probe
    ) -> int:
        """Draw this round's corruption and probe its draft until the target emits what the
        draft plans: the accepted spine up to the first corrupted depth ``k``, then the bonus.
        ``history`` holds each sequence's committed tokens, the root last. Returns the probes
        run: at most ``max_depth + 2`` (each failed one fixes at least one more spine level
        where a row's outcome depends on its own tokens alone; where it does not, the round
        takes the last probe's draft, and each sequence it left off its plan counts in
        ``off_plan``).

        The target's next tokens are those of the decode itself, not of a separate pass: a
        token's logits depend on the forward that computes them (GEMMs of another row count
        round differently, NSA's compressed tokens are refreshed at commits, a ``shared`` group
        attends its representative's blocks), so an autoregressive continuation leaves the
        decode at near-tied logits. The reference (``load``: the autoregressive continuation,
        ``Engine.generate``, with the run's sampling settings and position uniforms) is only
        the first guess. Before each round, untimed, the engine *probes* the draft: it runs the
        round's own verify forward and acceptance on it, committing nothing (``probe``,
        ``round_probe``), and the oracle compares what the target emits there with what the
        draft was built to make it emit. Where they differ, the emitted tokens replace the
        reference and the draft is built and probed again; a probe that goes as planned is the
        round's draft, so the real verify, on the same tokens from the same state, accepts
        exactly as planned. One probe per round when the reference holds, one more per spine
        level it had to correct, where a row's outcome depends on its own tokens and prefix
        alone. Where it also depends on the other rows' tokens, correcting a deeper level can
        move a shallower one: a grouped schedule (``union``, NSA's row tiles) splits the union
        of the rows' blocks over programs, so a row's rounding follows the other rows'
        selections, and near-tied bf16 logits flip. After ``max_depth + 2`` probes the round
        takes its last probe's draft anyway: the real verify emits what that probe emitted,
        and ``off_plan`` counts the (sequence, round) pairs whose emission left the drawn plan,
        so the measured acceptance there is the verify's, not the profile's. ``diverged``
        counts the sequences whose verify did not reproduce their last probe (it stays empty
        where the verify is deterministic).
        """
        depth = tree.max_depth
        alpha = np.array(self.config.oracle_profile(depth))
        b = len(history)
        keep = self._rng.random((b, depth)) < alpha  # [B, D]
        shift = self._rng.integers(1, self.vocab_size, size=(b, depth))  # a different token
        first = np.where(keep.all(1), depth + 1, keep.argmin(1) + 1)  # [B] first corrupted
        generated = [len(h) - n for h, n in zip(history, self._prompt_lens, strict=True)]
        active = [s for s in range(b) if generated[s] < self.config.max_new_tokens]
        spine = np.flatnonzero(self._spine(tree))  # spine labels, root first (one per depth)
        probes = 0
        while True:
            below = self._below(tree, history, generated, keep, shift)  # [B, t - 1]
            tokens = torch.cat([roots[:, None], torch.from_numpy(below).to(roots.device)], 1)
            emitted = probe(tokens)
            probes += 1
            on_plan = {}
            for s in active:
                k, e = int(first[s]), emitted[s]
                on_plan[s] = len(e) == k and e[: k - 1] == below[s, spine[1:k] - 1].tolist()
                self._write(s, generated[s], e)
            if all(on_plan.values()) or probes == depth + 2:
                break
        self._anchored = tokens
        self.off_plan += sum(not ok for ok in on_plan.values())
        self._plan = {s: (generated[s], len(emitted[s])) for s in active}
        return probes

    def _below(self, tree, history, generated, keep, shift) -> np.ndarray:
        """``[B, t - 1]`` the draft below the roots from the reference: the spine's tokens
        (corrupted where ``keep`` is false), others differing from the reference."""
        depth, v = tree.max_depth, self.vocab_size
        ref = np.zeros((len(history), depth + 1), dtype=np.int64)  # [B, D + 1] by depth
        for s, (hist, g) in enumerate(zip(history, generated, strict=True)):
            ref[s, 0] = hist[-1]  # the root (a finished sequence's is stale: it keeps nothing)
            ahead = self._reference[s][g : g + depth]
            ref[s, 1 : 1 + len(ahead)] = ahead
        spine_tok = np.where(keep, ref[:, 1:], (ref[:, 1:] + shift) % v)
        node_depth, node_rank = np.array(tree.depth), np.array(tree.rank)
        tokens = (ref[:, node_depth] + 1 + node_rank) % v  # off the spine: not the reference
        spine = self._spine(tree)
        tokens[:, spine] = np.concatenate([ref[:, :1], spine_tok], axis=1)[:, node_depth[spine]]
        return tokens[:, 1:]

    def _write(self, s: int, at: int, tokens: list[int]) -> None:
        """The target's tokens from generated position ``at`` on into sequence ``s``'s
        reference (growing it where a probe saw past its end)."""
        ref = self._reference[s]
        ref.extend([0] * (at + len(tokens) - len(ref)))
        ref[at : at + len(tokens)] = tokens

    def draft(self, roots: torch.Tensor, tree: DraftTree, history: list[list[int]]) -> Draft:
        """The draft ``anchor`` probed last (``ValueError`` when none is waiting)."""
        if self._anchored is None:
            raise ValueError("the oracle drafts what anchor() probed; anchor the round first")
        tokens, self._anchored = self._anchored, None
        return Draft(tokens, None)

    def commit(self, acc: AcceptedPath, tokens: torch.Tensor) -> None:
        """Nothing on the device."""

    def observe(self, history: list[list[int]], counts: list[int]) -> None:
        """Marks the sequences whose round did not emit what their last probe did: the
        reference's tokens from their position, as many as that probe emitted (fewer where
        ``max_new_tokens`` cut the round short)."""
        for s, (g, k) in self._plan.items():
            start = self._prompt_lens[s] + g
            want = self._reference[s][g : g + min(k, self.config.max_new_tokens - g)]
            if counts[s] != len(want) or history[s][start : start + len(want)] != want:
                self.diverged.add(s)
        self._plan = {}


def reference(runner, prompts, attn, config: DecodeConfig, decode) -> list[list[int]]:
    """The oracle's reference: ``decode()``, the autoregressive continuation of ``prompts``
    (``config.max_new_tokens`` tokens) with attention ``attn`` on ``runner``
    (``engine.loop.Engine._reference``), or its first tokens from an earlier one.

    The continuation is a function of the prefill, the attention and the settings alone, and an
    autoregressive decode's first n tokens do not depend on how many follow (each round emits
    one token per sequence and computes the same thing whatever the count still to go). So
    it is kept in the runner's memo of that prefill (``ModelRunner.prefill_memo``: dropped with
    the prefill), keyed by the attention and every other setting, and a later run that needs
    at most as many tokens takes them from it; a longer one decodes and replaces it."""
    n = config.max_new_tokens
    key = ("oracle_reference", attn, dataclasses.replace(config, max_new_tokens=1))
    memo = runner.prefill_memo(prompts)
    kept = memo.get(key) if memo is not None else None
    if kept is not None and len(kept[0]) >= n:
        return [t[:n] for t in kept]
    tokens = decode()
    memo = runner.prefill_memo(prompts)  # the decode ran (or reused) the prefill
    if memo is not None:
        memo[key] = [list(t) for t in tokens]
    return tokens


def round_probe(runner, tree: DraftTree, acceptor, temperature: float, verify) -> Probe:
    """The probe of a round of ``tree`` on ``runner``: the tokens each sequence would emit
    from draft ``tokens`` ``[B, t]`` this round (its accepted drafts, then the bonus; uncapped
    by ``max_new_tokens``), through the round's own verify graph (``verify(tokens)`` -> logits,
    recorded) and acceptance (``acceptor``'s uniforms), committing nothing. It changes no
    state that outlives the round: the forward writes only the verify tail past each committed
    length, which the round's verify writes again before anything reads it; the lengths, block
    metadata, compressed tokens, ``remaining`` and every generator are untouched."""

    def probe(tokens: torch.Tensor) -> list[list[int]]:
        logits, _ = verify(tokens)
        uniforms = acceptor.uniforms(tree)
        acc = accept(
            runner.tree_tensors(tree),
            tokens,
            logits,
            None,
            temperature,
            backend=runner.backend,
            uniforms=uniforms() if uniforms is not None else None,
        )
        packed = torch.cat(
            [acc.count[:, None].long(), acc.bonus[:, None], tokens.gather(1, acc.path)], dim=1
        )
        return [row[3 : 2 + row[0]] + [row[1]] for row in packed.cpu().tolist()]

    return probe


def acceptance_label(config: DecodeConfig, rounds=()) -> dict:
    """Trace header keys that mark a run's acceptance as the oracle's synthetic one, with what
    its probes cost over ``rounds`` (``engine.results.RoundRecord``: verify forwards and host
    seconds, in no round's times); none for another drafter."""
    acc = config.oracle_acceptance
    if acc is None:
        return {}
    return {
        "acceptance": "synthetic:oracle",
        "oracle_acceptance": list(acc),
        "oracle_probes": sum(r.oracle_probes for r in rounds),
        "oracle_probe_s": sum(r.oracle_s for r in rounds),
    }
