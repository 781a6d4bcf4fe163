"""The decode loop's host time per round that no timed step holds: the host work before the
round's first step reaches the GPU and after its last (the one host read of the accepted
tokens, the kept tokens appended to each sequence's history and handed to the drafter), and
the GPU's wait while the host launches the verify graph (the engine's ``launch`` step).

The engine measures it directly: a round's host wall time minus its CUDA-event ``draft``,
``verify`` and ``accept`` steps (the steps the step model prices). It is linear in three
physical features (``loop_host_features``), with coefficients fitted per GPU host by
``calibration.loop_host_fit`` on committed engine runs and shipped as
``calibration/profiles/<gpu>/loop_host.json``; ``perfmodel.step`` adds the priced seconds to
every round as the op ``loop.host`` (kind ``host``), so ``predict``, ``sweep``, ``sim``,
``decode``, ``rank`` and ``report`` price the loop from this one source.

Where the engine pipelines its rounds (``engine.pipeline``: no drafter, or the self-sparse
drafter, which drafts from the target's cache alone), round r + 1's GPU work is issued before
the host reads round r, so the host's time per round runs beside the GPU's and a round lasts
the longer of the two: the op then holds only the host time the GPU's round does not hide,
max(0, host - GPU) (``exposed_s``). The fit's rows are serial runs, whose wall time less the
GPU steps is the host's whole time per round.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
from ssvkit.perfmodel import hardware
from ssvkit.perfmodel.draft_host import check_terms
from ssvkit.perfmodel.intervals import Residuals

LOOP_HOST_TERMS = ("round", "sequence", "ngram_token")
# The engine's CUDA-event steps the step model prices (``engine.results.STEPS`` less
# ``launch``, the GPU's wait for the verify graph's launch, which is the loop's).
PRICED_STEPS = ("draft", "verify", "accept")


def measured_loop_host_s(round_wall_s: float, steps_s: dict[str, float]) -> float:
    """A round's measured loop host time: its host wall time less its ``PRICED_STEPS``."""
    return round_wall_s - sum(steps_s[k] for k in PRICED_STEPS)


# How the engine runs its rounds (``Workload.loop``): ``pipelined`` where it can
# (``engine.pipeline``), or ``serial`` (an engine under an online controller or with
# ``DecodeConfig.pipeline`` off, and every engine run recorded before the pipeline existed).
LOOPS = ("pipelined", "serial")


def pipelining(loop: str) -> float:
    """1.0 for a loop that pipelines the rounds it can, 0.0 for a serial one (``LOOPS``)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    return float(loop == "pipelined")


NGRAM_CODE = 2  # ``perfmodel.columns.DRAFTER_CODES["ngram"]``
SELF_SPARSE_CODE = 3  # ``perfmodel.columns.DRAFTER_CODES["self_sparse"]``


def pipelined(loop, drafter, num_draft) -> np.ndarray:
    """Per point (arrays of ``pipelining`` values, drafter codes and draft nodes): whether
    the engine pipelines its rounds (``engine.pipeline.blocker`` for a fixed strategy: a
    pipelining loop, with nothing drafting or the self-sparse drafter)."""
    drafts = (np.asarray(num_draft) == 0) | (np.asarray(drafter) == SELF_SPARSE_CODE)
    return (np.asarray(loop) > 0) & drafts


def exposed_s(host_s, gpu_s, pipelined_points) -> np.ndarray:
    """The loop's host seconds a round adds to its GPU seconds ``gpu_s``: all of ``host_s``
    in a serial loop, the part the GPU's round does not hide in a pipelined one."""
    hidden = np.maximum(np.asarray(host_s) - np.asarray(gpu_s), 0.0)
    return np.where(pipelined_points, hidden, host_s)


def loop_host_features(drafter, batch, num_draft, tokens_per_round) -> np.ndarray:
    """``[N, 3]`` features of ``LOOP_HOST_TERMS`` per point (arrays of drafter codes, batch
    sizes, draft nodes and expected tokens per sequence and round): 1, the batch, and for a
    drafting n-gram point the batch x tokens kept per sequence.

    Per round the loop reads the packed accepted rows back once and walks them in Python: one
    fixed cost, one per sequence (its row, its history's append); an n-gram drafter then
    indexes each kept token of each sequence (``NgramIndex.observe``), which its tree's
    look-ups in the next draft step (``perfmodel.draft_host``) do not count."""
    b = np.asarray(batch, dtype=float)
    ngram = (np.asarray(drafter) == NGRAM_CODE) & (np.asarray(num_draft) > 0)
    tokens = np.asarray(tokens_per_round, dtype=float)
    return np.stack(np.broadcast_arrays(np.ones_like(b), b, ngram * b * tokens), axis=-1)


def check_coefficients(where: str, table: dict) -> dict[str, float]:
    """The loop's coefficients read from a file (``draft_host.check_terms`` of
    ``LOOP_HOST_TERMS``)."""
    return check_terms(where, table, LOOP_HOST_TERMS)


def check_batches(where: str, value) -> tuple[int, int]:
    """The fit's batch range read from a file: two integers 1 <= low <= high."""
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        and 1 <= value[0] <= value[1]
    )
    if not ok:
        raise ValueError(
            f"{where} must be [low, high] batch sizes, 1 <= low <= high, got {value!r}"
        )
    return int(value[0]), int(value[1])


@dataclasses.dataclass(frozen=True, slots=True)
class LoopHostFit:
    """A GPU host's shipped fit: its coefficients, the batch range it was fitted on, its
    provenance label and the log residuals ln(measured / priced) of the loop host time on its
    fit and test runs (``calibration.loop_host_fit``; None in a file without them), which give
    the term its interval (``perfmodel.intervals.HOST``)."""

    coefficients: dict[str, float]
    batches: tuple[int, int]
    label: str
    residuals: Residuals | None


@functools.cache
def _read(path: str) -> LoopHostFit:
    """One file's checked fit, read once per path."""
    doc = json.loads(Path(path).read_text())
    name = Path(path).name
    fit = doc.get("fit", {})
    coef = check_coefficients(f"{name}: coefficients", doc.get("coefficients", {}))
    batches = check_batches(f"{name}: fit.batches", fit.get("batches"))
    res = doc.get("residuals")
    try:
        residuals = None if res is None else Residuals(res["source"], **_numbers(res))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{name}: residuals must be source, n, low, median, high ({e})") from e
    return LoopHostFit(coef, batches, f"fit:{name}@{fit.get('commit', 'unknown')}", residuals)


def _numbers(res: dict) -> dict:
    return {k: res[k] for k in ("n", "low", "median", "high")}


def shipped(gpu: str) -> LoopHostFit | None:
    """The fit shipped for ``gpu``; None when none ships (a round is then priced without loop
    host time)."""
    root = hardware.profiles_dir()
    path = None if root is None else root / gpu / "loop_host.json"
    if path is None or not path.is_file():
        return None
    return _read(str(path))


def loop_host_s(coefficients: dict[str, float], drafter, batch, num_draft, tokens) -> np.ndarray:
    """Host seconds of a round per point (``loop_host_features`` x coefficients)."""
    w = np.array([coefficients.get(t, 0.0) for t in LOOP_HOST_TERMS])
    return loop_host_features(drafter, batch, num_draft, tokens) @ w
