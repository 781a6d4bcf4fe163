"""The n-gram drafter's profile from walks over decoded texts instead of its own runs.

Each tree's own runs decode texts of their own, and at temperature 1 a text's draw moves a
tree's tokens per round by more than the trees differ: a tree ranked first on its own runs'
luck can measure last of the n-gram strategies. Walked over the same texts -- every dense
profile run of the regime, whatever decoded it, and one autoregressive run on each of a few
further prompts (``walk_texts``) -- every tree sees the same draws, so their order is the
texts' and not their luck. Unbiased for the same reason the engine's shadow is
(``engine.ngram``): every text is the target's own samples.
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel.strategy import Strategy, parse_tree
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens
from ssvkit.planner.space import SpaceSpec, strategy_id
from ssvkit.validation.bench import Bench, kept_texts, steady_run
from ssvkit.validation.prompts import batch_windows, code_prompts, prompt_crc32, walk_windows


def walk_texts(
    bench: Bench, space: SpaceSpec, ctx: int, prompts: int, regime: str
) -> list[tuple[list[int], list[int]]]:
    """(prompt, text) of autoregressive runs over the first ``prompts`` windows of
    ``walk_windows`` at ``ctx``, for ``walk_ngram``: one run per window at batch 1, at batch B
    as few runs of B as hold them all (``batch_windows``; seed: the run's first window)."""
    windows = walk_windows(ctx, prompts)
    if len(windows) < prompts:
        bench.log(
            f"profile {regime}: {len(windows)} of {prompts} walk prompts fit in the "
            f"corpus at {ctx} tokens"
        )
    ar = Strategy(name="walk", tree="chain:0", drafter=bench.drafter(space.drafters[0]))
    runs = -(-len(windows) // bench.batch)
    out = []
    for ws in batch_windows(windows, runs, bench.batch) if windows else ():
        batch = code_prompts(ctx, ws)
        fig = bench.run(
            f"walk|{ctx}|w{ws[0]}|{strategy_id(ar)}",
            steady_run,
            bench,
            ar,
            batch,
            seed=ws[0],
            keep_text=True,
        )
        for prompt, (crc, text) in zip(batch, kept_texts(fig), strict=True):
            same_prompt(crc, prompt, f"walk|{ctx}|w{ws[0]}")
            out.append((prompt, text))
    return out


def same_prompt(crc: int | None, prompt: list[int], where: str) -> None:
    """Raise when a kept text was decoded after another prompt than ``prompt`` (its CRC-32
    ``crc``: a run cache from a machine whose package sources, the code corpus, differ); runs
    cached before the check kept no CRC (None) and pass."""
    if crc is not None and crc != prompt_crc32(prompt):
        raise ValueError(
            f"run {where!r} decoded another prompt than this machine's corpus "
            "gives (its package sources differ): walk it where it ran"
        )


def _walk_sums(pairs, specs: tuple[str, ...], max_n: int) -> dict[bytes, dict[str, np.ndarray]]:
    """Per prompt and tree spec, [walked rounds, accepted drafts, texts] summed over the texts
    decoded after that prompt (``engine.ngram_shadow.walk_text``)."""
    from ssvkit.engine.ngram_shadow import walk_text

    by_prompt: dict[bytes, dict[str, np.ndarray]] = {}
    for prompt, text in pairs:
        sums = by_prompt.setdefault(bytes(prompt), {sp: np.zeros(3) for sp in specs})
        for sp, (r, d) in walk_text(prompt, text, specs, max_n).items():
            sums[sp] += (r, d, 1)
    return by_prompt


def walk_ngram(
    bench: Bench,
    regime: str,
    a: dict[str, float],
    runs: list[tuple[Strategy, dict]],
    prompts: list[list[list[int]]],
    own: dict[str, float],
    record: dict,
    extra: list[tuple[list[int], list[int]]] = (),
) -> None:
    """Set the n-gram drafter's acceptance on each of its trees in ``a`` (``ngram@<tree>``,
    chains and branching trees) from its walks over the texts of every dense profile run of
    the regime (``runs``, with their batches of ``prompts``: every sequence's text) and the
    (prompt, text) pairs of ``extra``
    (``walk_texts``): accepted drafts over rounds, summed over the texts of each prompt over
    their number, then over the prompts -- each prompt weighs alike, however many runs decoded
    it. The drafter's reference alpha ``a["ngram"]`` stays its own runs' (the ``best:N``
    trees were resolved at it, as the ranking resolves them). ``own``: each tree's own runs'
    tokens per round; ``record`` (per regime and key) gets both figures."""
    keys = [k for k in a if k.startswith("ngram@") and parse_tree(k.split("@", 1)[1])]
    specs = tuple(k.split("@", 1)[1] for k in keys)
    if not specs:
        return
    pairs = []
    for i, ((s, fig), batch) in enumerate(zip(runs, prompts, strict=True)):
        # sparse attention writes another distribution; old caches kept no text
        texts = kept_texts(fig) if s.attention == "dense" else []
        for prompt, (crc, text) in zip(batch, texts, strict=bool(texts)):
            same_prompt(crc, prompt, f"profile run {i} of {regime}")
            pairs.append((prompt, text))
    pairs += list(extra)
    if not pairs:
        return
    by_prompt = _walk_sums(pairs, specs, bench.decode().ngram_max_n)
    for k, sp in zip(keys, specs, strict=True):
        rounds = sum(v[sp][0] / v[sp][2] for v in by_prompt.values())
        drafts = sum(v[sp][1] / v[sp][2] for v in by_prompt.values())
        if not rounds:
            continue
        tpr = 1.0 + drafts / rounds
        a[k] = alpha_from_tokens(sp, tpr)
        entry = record.setdefault(regime, {}).setdefault(k, {"own": own.get(k)})
        entry.update(
            {
                "walked": tpr,
                "walked_texts": len(pairs),
                "walked_prompts": len(by_prompt),
                "used": tpr,
            }
        )
        bench.log(
            f"profile {regime} {k}: walked {tpr:.2f} tokens/round over {len(pairs)} texts "
            f"of {len(by_prompt)} prompts (own runs {own.get(k, float('nan')):.2f}), "
            f"alpha={a[k]:.3f}"
        )
