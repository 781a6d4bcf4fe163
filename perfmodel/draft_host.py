"""The host time of a round's draft step: the n-gram drafter's lookups, which run in Python on
the host while the GPU waits (``engine.ngram``: the round starts after the last round's host
read, so the GPU is idle until the drafted tokens are copied over, and the CUDA-event ``draft``
step times the host work), and a draft model's host work per tree level between its GPU
forwards (the level's graph launch and the host-side selection of the next level's tokens),
which the GPU waits for the same way. The draft model's GPU work is priced by
``perfmodel.draft_ops``.

The host time is linear in four physical features (``draft_host_features``), with
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

DRAFT_HOST_TERMS = ("round", "sequence", "sequence_node", "model_level")
DRAFT_MODEL_CODE = 1  # ``perfmodel.columns.DRAFTER_CODES["draft_model"]``
NGRAM_CODE = 2  # ``perfmodel.columns.DRAFTER_CODES["ngram"]``


def draft_host_features(drafter, batch, num_draft, depth) -> np.ndarray:
    """``[N, 4]`` features of ``DRAFT_HOST_TERMS`` per point (arrays of drafter codes, batch
    sizes, draft nodes and tree depths): 1, the batch and batch x nodes for a drafting n-gram
    point; the tree's levels for a drafting draft-model point; 0 otherwise.

    Per round of an n-gram strategy the engine indexes nothing new (``observe`` did), builds
    each sequence's tree with O(max_n) dictionary look-ups per node
    (``NgramIndex.tree_tokens``), makes one tensor of the batch's rows and copies it to the
    device: so 1 per round (the tensor and its copy), one per sequence (its history slice and
    call) and one per sequence and tree node (the look-ups). A draft model drafts a level per
    forward: one host turn per level, whatever the batch and the level's width."""
    drafting = np.asarray(num_draft) > 0
    on = (np.asarray(drafter) == NGRAM_CODE) & drafting
    dm = (np.asarray(drafter) == DRAFT_MODEL_CODE) & drafting
    b = np.asarray(batch, dtype=float)
    k = np.asarray(num_draft, dtype=float)
    levels = dm * np.asarray(depth, dtype=float)
    return np.stack(np.broadcast_arrays(on * 1.0, on * b, on * b * k, levels), axis=-1)


def check_terms(where: str, table: dict, terms: tuple[str, ...]) -> dict[str, float]:
    """Coefficients of a host fit read from a file: each of ``terms``, a finite number >= 0
    (seconds per unit), and nothing else; ``ValueError`` names the bad entry."""
    bad = [k for k in table if k not in terms]
    if bad:
        raise ValueError(f"{where}.{bad[0]} is not one of {', '.join(terms)}")
    out = {}
    for term in terms:
        v = table.get(term)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0:
            raise ValueError(f"{where}.{term} must be a finite number >= 0, got {v!r}")
        out[term] = float(v)
    return out


def check_coefficients(where: str, table: dict) -> dict[str, float]:
    """The draft step's coefficients read from a file (``check_terms`` of
    ``DRAFT_HOST_TERMS``)."""
    return check_terms(where, table, DRAFT_HOST_TERMS)


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


def draft_host_s(coefficients: dict[str, float], drafter, batch, num_draft, depth) -> np.ndarray:
    """Host seconds of the draft step per point (``draft_host_features`` x coefficients)."""
    w = np.array([coefficients.get(t, 0.0) for t in DRAFT_HOST_TERMS])
    return draft_host_features(drafter, batch, num_draft, depth) @ w
