"""The planner evaluation's prompts: the context of each regime, four prompt sets and the
corpus windows each phase reads.

Code prompts are windows of the validation split of the built-in corpus
(``engine.corpus``), one window per prompt, in prompt lengths: the profile reads
``PROFILE_OFFSETS``, the measured strategies ``MEASURE_OFFSETS``, the n-gram walks
``WALK_OFFSETS`` and the adaptive phase window 2, so no phase decodes a prompt another phase
measured. Prose and repetitive prompts come from the installed packages' long descriptions
(the training corpus skips them), random prompts are seeded bytes.

At batch B > 1 a run decodes B prompts together, every window of a phase before any twice
(``batch_windows``). The corpus rarely holds B windows per run of every phase (at 16K a run of
32 needs 0.5 MB of code): a window then serves several sequences of the phase, each drawing its
own samples, and the phase says so (``reuse_line``; the adaptive phase: ``set_prompts``).
"""

from __future__ import annotations

import functools
import glob
import math
import site
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.planner.profile import REGIMES, regime_of
from ssvkit.planner.space import MAX_KERNEL_ROWS

PROMPT_SETS = ("code", "prose", "repetitive", "random")
OFF_DISTRIBUTION = ("prose", "repetitive", "random")

# Ten profile windows: with five, the sampling error of n-gram acceptance over the prompts
# (~0.3 tokens per round between runs at 8K) is as large as the gaps between the trees.
PROFILE_OFFSETS = (0, 3, 4, 5, 6, 11, 12, 13, 14, 15)
# Up to twenty measured windows: the strategies at the top of a regime are predicted within
# 1-7% of each other, and on ten windows the ratio of two of them still has a standard error
# of 2-4%, close to what a 5% regret target allows.
MEASURE_OFFSETS = (1, 7, 8, 9, 10, *range(16, 31))
# Windows past every measured one whose autoregressive texts only the n-gram walks read: the
# walks' error is the prompts' more than the texts' (n-gram acceptance moves with the prompt).
WALK_OFFSETS = tuple(range(31, 71))


def regime_contexts(text: str, flag: str, new_tokens: int) -> dict[str, int]:
    """One context per regime from ``text`` (``"3584,15K"``), in regime order. A context whose
    run (plus its new tokens and a full tree) would decode past its regime's bound is refused:
    the run would be judged against the next regime's profile."""
    contexts: dict[str, int] = {}
    for c in parse_count_list(text, flag):
        r = regime_of(c)
        if r in contexts:
            raise ValueError(f"{flag} {text}: two contexts fall in regime {r}")
        if r != "64K+" and c + new_tokens + MAX_KERNEL_ROWS > REGIMES[r]:
            raise ValueError(
                f"{flag}: {c} + {new_tokens} new tokens + a tree would grow past regime {r} "
                f"(<= {REGIMES[r]}) while decoding; measure at a smaller context"
            )
        contexts[r] = c
    return {r: contexts[r] for r in REGIMES if r in contexts}


@functools.lru_cache(maxsize=1)
def prose_stream() -> bytes:
    """English prose from the installed packages' ``.dist-info/METADATA`` long descriptions
    (their bodies, after the header block), read once per process. The training corpus skips
    ``.dist-info``, so the tiny pair never saw these bytes."""
    roots = list(dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()] + sys.path))
    files = sorted({f for r in roots for f in glob.glob(f"{r}/*.dist-info/METADATA")})
    parts = []
    for f in files:
        try:
            text = Path(f).read_bytes()
        except OSError:
            continue
        _, sep, body = text.partition(b"\n\n")
        if sep and len(body.strip()) > 200:
            parts.append(body.strip())
    if not parts:
        raise ValueError("no package METADATA with a long description found for prose prompts")
    return b"\n\n".join(parts)


def prompt_tokens(kind: str, n: int, *, offset: int = 0, seed: int = 0) -> list[int]:
    """``n`` byte tokens of prompt set ``kind``; ``offset`` selects a different window of the
    same source (code and prose), so a profile prompt and a measured prompt differ."""
    if n < 1:
        raise ValueError(f"prompt length must be >= 1, got {n}")
    if kind == "code":
        return list(_code(n, offset))
    if kind in ("prose", "repetitive"):
        data = prose_stream()
        if kind == "repetitive":  # one paragraph, over and over
            start = offset % max(len(data) - 256, 1)
            data = data[start : start + 256]
        else:
            data = data[offset % len(data) :] + data[: offset % len(data)]
        reps = -(-n // len(data))
        return list((data * reps)[:n])
    if kind == "random":
        return np.random.default_rng(seed + offset).integers(0, 256, n).tolist()
    raise ValueError(f"unknown prompt set {kind!r}; expected one of {', '.join(PROMPT_SETS)}")


@functools.lru_cache(maxsize=128)
def _code(n: int, offset: int) -> tuple[int, ...]:
    """``n`` bytes of the code corpus from ``offset``, read once per process: a batch's
    sequences and every strategy of a phase decode the same windows."""
    from ssvkit.engine.corpus import corpus_sample

    return tuple(corpus_sample(offset + n)[offset:])


def batch_windows(windows: tuple[int, ...], runs: int, batch: int) -> list[tuple[int, ...]]:
    """The windows of ``runs`` runs of ``batch`` sequences each: sequence j of run i decodes
    ``windows[(i * batch + j) % len(windows)]``, every window before any twice (at batch 1, run
    i the i-th window, cyclically)."""
    if not windows:
        raise ValueError("no prompt window to decode")
    if runs < 0 or batch < 1:
        raise ValueError(f"runs must be >= 0 and batch >= 1, got {runs} and {batch}")
    n = len(windows)
    return [tuple(windows[(i * batch + j) % n] for j in range(batch)) for i in range(runs)]


def reuse_line(what: str, windows: tuple[int, ...], runs: int, batch: int, ctx: int) -> str | None:
    """The line a phase logs when its ``runs`` runs of ``batch`` sequences decode some of its
    ``windows`` more than once (None when they do not)."""
    n = runs * batch
    if n <= len(windows):
        return None
    return (
        f"{what}: {n} sequences over {len(windows)} prompt windows of {ctx} tokens (a window "
        f"decoded by up to {math.ceil(n / len(windows))} sequences, each drawing its own samples)"
    )


def code_prompts(ctx: int, windows: tuple[int, ...]) -> list[list[int]]:
    """The code prompt of ``ctx`` tokens of each of ``windows`` (a run's batch)."""
    return [prompt_tokens("code", ctx, offset=o * ctx) for o in windows]


def set_prompts(kind: str, ctx: int, batch: int, code_windows: tuple[int, ...]) -> list[list[int]]:
    """The adaptive phase's batch of prompt set ``kind``: code from ``code_windows`` in turn
    (``adaptive_windows``), any other set sequence j from window ``2 + j`` of its own source
    (at batch 1, window 2 either way)."""
    if kind == "code":
        return code_prompts(ctx, batch_windows(code_windows, 1, batch)[0])
    return [prompt_tokens(kind, ctx, offset=(2 + j) * ctx) for j in range(batch)]


def adaptive_windows(ctx: int, batch: int, walk_prompts: int, available=None) -> tuple[int, ...]:
    """The code windows of the adaptive phase: window 2, and at batch > 1 the walk windows the
    walks leave (past their first ``walk_prompts``) that fit in the corpus (``available`` as in
    ``measure_windows``), for the batch's other sequences."""
    rest = WALK_OFFSETS[walk_prompts:]
    if batch == 1 or not rest:
        return (2,)
    return (2, *_in_corpus(rest, ctx, available)[0])


def prompt_crc32(prompt: list[int]) -> int:
    """CRC-32 of a byte-token prompt."""
    return zlib.crc32(bytes(prompt))


def log_wrapped(log: Callable[[str], None], what: str, offsets, ctx: int) -> None:
    """Log the windows of ``offsets`` whose prompt of ``ctx`` tokens runs past the code
    corpus's end (and so repeats its start)."""
    from ssvkit.engine.corpus import validation_bytes

    size = validation_bytes((max(offsets) + 1) * ctx)
    wrapped = [o for o in offsets if (o + 1) * ctx > size]
    if wrapped:
        log(
            f"{what}: prompt windows {wrapped} run past the code corpus ({size} bytes) "
            "and repeat its start"
        )


def measure_windows(ctx: int, texts: int, available=None) -> tuple[int, ...]:
    """The first ``texts`` windows of ``MEASURE_OFFSETS`` whose prompt of ``ctx`` tokens ends
    inside the code corpus (``available(limit)``: its bytes up to ``limit``, default
    ``engine.corpus.validation_bytes``): a window past its end would repeat the corpus's start,
    where the profile's prompts are."""
    if not 1 <= texts <= len(MEASURE_OFFSETS):
        raise ValueError(f"measured texts must lie in 1..{len(MEASURE_OFFSETS)}, got {texts}")
    fit, size = _in_corpus(MEASURE_OFFSETS, ctx, available)
    if not fit:
        raise ValueError(
            f"no measured prompt window of {ctx} tokens fits in the code corpus ({size} bytes)"
        )
    return fit[:texts]


def walk_windows(ctx: int, prompts: int, available=None) -> tuple[int, ...]:
    """The first ``prompts`` windows of ``WALK_OFFSETS`` whose prompt of ``ctx`` tokens ends
    inside the code corpus (``available`` as in ``measure_windows``); fewer, or none, where the
    corpus is shorter."""
    if not 0 <= prompts <= len(WALK_OFFSETS):
        raise ValueError(f"walk prompts must lie in 0..{len(WALK_OFFSETS)}, got {prompts}")
    if not prompts:
        return ()
    return _in_corpus(WALK_OFFSETS, ctx, available)[0][:prompts]


def _in_corpus(offsets: tuple[int, ...], ctx: int, available) -> tuple[tuple[int, ...], int]:
    """The windows of ``offsets`` whose prompt of ``ctx`` tokens ends inside the code corpus,
    and the corpus's size (up to the last window's end)."""
    if available is None:
        from ssvkit.engine.corpus import validation_bytes as available
    size = available((max(offsets) + 1) * ctx)
    return tuple(o for o in offsets if (o + 1) * ctx <= size), size
