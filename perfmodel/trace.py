"""The round trace: versioned JSONL written by the simulator and the GPU engine.

Line 1 is a header object, every further line one verification round. The format is specified
in ``docs/trace-format.md``; this module is its reference reader, writer and validator. It
lives in the bottom layer (pure Python and numpy, like the rest of perfmodel) because the
engine writes traces and the simulator replays them, and neither may import the other.
Writing is deterministic: keys in a fixed order, floats as Python's shortest repr, no spaces.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.files import loads_json, read_text

FORMAT = "ssvkit-trace"
VERSION = 1
HEADER_REQUIRED = ("format", "version", "source", "model", "num_layers", "strategies")
ROUND_REQUIRED = ("round", "request", "strategy", "context_len", "drafted", "accepted", "step_s")
LAYER_FIELDS = ("group_overlap", "layer_overlap", "predict_hit", "reuse_hit")
ROUND_KEYS = (*ROUND_REQUIRED[:6], "t_s", *LAYER_FIELDS, "step_s")


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


@dataclass(slots=True)
class Trace:
    """A parsed, validated trace: the header and the rounds in file order."""

    header: dict
    rounds: list[dict] = field(default_factory=list)

    def column(self, name: str) -> np.ndarray:
        """One scalar field over all rounds (``drafted``, ``accepted``, ``context_len``...)."""
        return np.array([r[name] for r in self.rounds])

    def layer_column(self, name: str) -> np.ndarray | None:
        """``[rounds, num_layers]`` of a per-layer field, NaN where a round has none; None when
        no round carries it."""
        if not any(r.get(name) is not None for r in self.rounds):
            return None
        L = self.header["num_layers"]
        out = np.full((len(self.rounds), L), np.nan)
        for i, r in enumerate(self.rounds):
            if r.get(name) is not None:
                out[i] = r[name]
        return out


def make_header(source: str, model: str, num_layers: int, strategies: dict, **extra) -> dict:
    """A header dict; ``extra`` keys (gpu, seed, provenance, ...) are kept as given."""
    head = {
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "model": model,
        "num_layers": num_layers,
        "strategies": strategies,
    }
    head.update(extra)
    return head


def make_round(
    round_index: int,
    request: int,
    strategy: str,
    context_len: int,
    drafted: int,
    accepted: int,
    step_s: dict[str, float],
    t_s: float | None = None,
    group_overlap=None,
    layer_overlap=None,
    predict_hit=None,
    reuse_hit=None,
) -> dict:
    """One round record with the keys in the canonical order (absent optionals are omitted)."""
    row = {
        "round": int(round_index),
        "request": int(request),
        "strategy": strategy,
        "context_len": int(context_len),
        "drafted": int(drafted),
        "accepted": int(accepted),
    }
    if t_s is not None:
        row["t_s"] = float(t_s)
    layers = (group_overlap, layer_overlap, predict_hit, reuse_hit)
    for name, v in zip(LAYER_FIELDS, layers, strict=True):
        if v is not None:
            row[name] = [float(x) for x in v]
    row["step_s"] = {k: float(v) for k, v in step_s.items()}
    return row


def dumps_trace(header: dict, rounds) -> str:
    """The whole trace as text (validated first: an invalid trace is never written)."""
    rounds = list(rounds)
    _check_header(header, "header")
    for i, r in enumerate(rounds):
        _check_round(r, header, f"round {i}")
    return "".join(_dumps(x) + "\n" for x in [header, *rounds])


def _fail(where: str, msg: str):
    raise ValueError(f"{where}: {msg}")


def _check_header(h, where: str) -> None:
    if not isinstance(h, dict):
        _fail(where, "the header must be a JSON object")
    for k in HEADER_REQUIRED:
        if k not in h:
            _fail(where, f"header lacks {k!r}")
    if h["format"] != FORMAT:
        _fail(where, f"format is {h['format']!r}, expected {FORMAT!r}")
    if h["version"] != VERSION:
        _fail(where, f"version {h['version']!r} is not supported (this reader reads {VERSION})")
    if not (isinstance(h["num_layers"], int) and h["num_layers"] >= 1):
        _fail(where, f"num_layers must be a positive integer, got {h['num_layers']!r}")
    if not (isinstance(h["strategies"], dict) and h["strategies"]):
        _fail(where, "strategies must be a non-empty object of strategy id -> description")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_round(r, header: dict, where: str) -> None:
    if not isinstance(r, dict):
        _fail(where, "a round must be a JSON object")
    for k in ROUND_REQUIRED:
        if k not in r:
            _fail(where, f"round lacks {k!r}")
    unknown = set(r) - set(ROUND_KEYS)
    if unknown:
        _fail(where, f"unknown round keys {sorted(unknown)}")
    for k, lo in (
        ("round", 0),
        ("request", 0),
        ("context_len", 1),
        ("drafted", 0),
        ("accepted", 0),
    ):
        if not (_is_int(r[k]) and r[k] >= lo):
            _fail(where, f"{k} must be an integer >= {lo}, got {r[k]!r}")
    if r["accepted"] > r["drafted"]:
        _fail(where, f"accepted={r['accepted']} exceeds drafted={r['drafted']}")
    if r["strategy"] not in header["strategies"]:
        _fail(where, f"strategy {r['strategy']!r} is not in the header's strategies")
    if "t_s" in r and not (_is_num(r["t_s"]) and r["t_s"] >= 0):
        _fail(where, f"t_s must be a number >= 0, got {r['t_s']!r}")
    L = header["num_layers"]
    for k in LAYER_FIELDS:
        v = r.get(k)
        if v is None:
            continue
        if not (isinstance(v, list) and len(v) == L):
            _fail(where, f"{k} must be a list of num_layers={L} numbers")
        if not all(_is_num(x) and 0.0 <= x <= 1.0 for x in v):
            _fail(where, f"{k} entries must lie in [0, 1]")
    st = r["step_s"]
    if not (isinstance(st, dict) and st):
        _fail(where, "step_s must be a non-empty object of op -> seconds")
    for k, v in st.items():
        if not (_is_num(v) and v >= 0):
            _fail(where, f"step_s[{k!r}] must be a number >= 0, got {v!r}")


def loads_trace(text: str, name: str = "trace") -> Trace:
    """Parse and validate trace text; errors name the line."""
    lines = text.splitlines()
    if not lines:
        raise ValueError(f"{name}: empty trace")
    parsed = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parsed.append((i, loads_json(line, "trace line", f"{name}:{i}", kind=None)))
    (i0, header), rest = parsed[0], parsed[1:]
    _check_header(header, f"{name}:{i0}")
    rounds = []
    for i, r in rest:
        _check_round(r, header, f"{name}:{i}")
        rounds.append(r)
    return Trace(header, rounds)


def read_trace(path: str | Path) -> Trace:
    """Read and validate a trace file."""
    return loads_trace(read_text(path, "trace"), str(path))
