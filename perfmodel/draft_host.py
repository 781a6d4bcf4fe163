"""The host time of a round's draft step: the n-gram drafter's lookups, which run in Python on
the host while the GPU waits (``engine.ngram``: the round starts after the last round's host
read, so the GPU is idle until the drafted tokens are copied over, and the CUDA-event ``draft``
step times the host work). The draft model's draft step is GPU work (one graph a round),
priced by ``perfmodel.draft_ops``.

The host time is linear in three physical features (``draft_host_features``), with
coefficients fitted per GPU host by ``calibration.draft_host_fit`` on committed engine runs and
shipped as ``calibration/profiles/<gpu>/draft_host.json``; ``perfmodel.step`` adds the priced
seconds to the draft step as the op ``draft.host`` (kind ``host``).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
from ssvkit.perfmodel import hardware

DRAFT_HOST_TERMS = ("round", "sequence", "sequence_node")
NGRAM_CODE = 2  # ``perfmodel.columns.DRAFTER_CODES["ngram"]``


def draft_host_features(drafter, batch, num_draft) -> np.ndarray:
    """``[N, 3]`` features of ``DRAFT_HOST_TERMS`` per point (arrays of drafter codes, batch
    sizes and draft nodes): 1, the batch and batch x nodes for a drafting n-gram point, 0
    otherwise.

    Per round of an n-gram strategy the engine indexes nothing new (``observe`` did), builds
    each sequence's tree with O(max_n) dictionary look-ups per node
    (``NgramIndex.tree_tokens``), makes one tensor of the batch's rows and copies it to the
    device: so 1 per round (the tensor and its copy), one per sequence (its history slice and
    call) and one per sequence and tree node (the look-ups)."""
    on = (np.asarray(drafter) == NGRAM_CODE) & (np.asarray(num_draft) > 0)
    b = np.asarray(batch, dtype=float)
    k = np.asarray(num_draft, dtype=float)
    return np.stack([on * 1.0, on * b, on * b * k], axis=-1)


def check_coefficients(where: str, table: dict) -> dict[str, float]:
    """Coefficients read from a file: each of ``DRAFT_HOST_TERMS``, a finite number >= 0
    (seconds per unit); ``ValueError`` names the bad entry."""
    out = {}
    for term in DRAFT_HOST_TERMS:
        v = table.get(term)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0:
            raise ValueError(f"{where}.{term} must be a finite number >= 0, got {v!r}")
        out[term] = float(v)
    bad = [k for k in table if k not in DRAFT_HOST_TERMS]
    if bad:
        raise ValueError(f"{where}.{bad[0]} is not one of {', '.join(DRAFT_HOST_TERMS)}")
    return out


def shipped_coefficients(gpu: str) -> tuple[dict[str, float], str] | None:
    """The coefficients shipped for ``gpu`` and their provenance label, or None when none
    ship (the draft step is then priced without host time)."""
    root = hardware.profiles_dir()
    path = None if root is None else root / gpu / "draft_host.json"
    if path is None or not path.is_file():
        return None
    return _read_coefficients(str(path))


@functools.cache
def _read_coefficients(path: str) -> tuple[dict[str, float], str]:
    """One file's checked coefficients and label, read once per path."""
    doc = json.loads(Path(path).read_text())
    name = Path(path).name
    coef = check_coefficients(f"{name}: coefficients", doc.get("coefficients", {}))
    return coef, f"fit:{name}@{doc.get('fit', {}).get('commit', 'unknown')}"


def draft_host_s(coefficients: dict[str, float], drafter, batch, num_draft) -> np.ndarray:
    """Host seconds of the draft step per point (``draft_host_features`` x coefficients)."""
    w = np.array([coefficients.get(t, 0.0) for t in DRAFT_HOST_TERMS])
    return draft_host_features(drafter, batch, num_draft) @ w
