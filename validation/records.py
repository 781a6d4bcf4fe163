"""The measurements of record and the names they use for files and models.

The documents the GPU campaigns produced (the end-to-end campaign, the planner evaluation and
its ranking, the engine's and the kernels' H200 measurements) ship as package data under
``validation/data/``, indexed with the command and commit behind each in
``validation/data/INDEX.md``; ``record_path`` finds them through package resources, so an
installed package reads the same files as a clone. Committed data names files and models
relative to the project (``model_label``), never by a path of the machine that measured them,
and ``local_model`` finds such a name on this machine.

A measured run of an NSA strategy records the row schedule the engine ran it with
(``NSA_SCHEDULE``, draft rows per row tile: ``run_schedule``), and a run is priced with the
schedule it was measured with (``measured_strategy``, which says how a document without the
field is priced).
"""

from __future__ import annotations

import argparse
import dataclasses
from importlib.resources import files
from pathlib import Path

from ssvkit.perfmodel.strategy import PACKED_ROWS, Strategy, with_nsa_rows_per_tile
from ssvkit.planner.rank import strategy_from_json

DATA = "data"
# A measured run's NSA row schedule: draft rows per row tile (0: packed).
NSA_SCHEDULE = "nsa_rows_per_tile"
# Where the engine's checkpoints (the trained tiny pair) live, relative to the project.
CHECKPOINTS = "engine/checkpoints"


def add_pair_args(p: argparse.ArgumentParser, *, contexts: bool = True) -> None:
    """The target and draft models the GPU campaigns decode with (the trained tiny pair by
    default) and, with ``contexts``, one context per regime."""
    p.add_argument("--model", default="tiny", help="target: tiny | checkpoint folder")
    p.add_argument("--draft-model", default="tiny-draft", help="draft checkpoint")
    if contexts:
        p.add_argument(
            "--contexts",
            default="3584,7680,15360,30720",
            help="one context per regime, with room in it for the new tokens",
        )


def data_dir() -> Path:
    """The folder of the measurements of record (``validation/data``)."""
    return Path(str(files("ssvkit.validation"))) / DATA


def record_path(name: str) -> Path:
    """A measurement of record by file name; ``ValueError`` in one line when it is missing."""
    path = data_dir() / name
    if not path.is_file():
        raise ValueError(f"no measurement of record {name!r} in {data_dir()}")
    return path


def project_label(path: str | Path) -> str:
    """``path`` as the project names it: relative to the installed packages' root when it lies
    under one of them (``validation/data/planner.json``), else as given."""
    p = Path(path).resolve()
    for pkg in ("validation", "calibration", "engine"):
        root = Path(str(files(f"ssvkit.{pkg}"))).resolve()
        if p == root or root in p.parents:
            return str(Path(pkg) / p.relative_to(root))
    return str(path)


def file_label(path: str | Path) -> str:
    """A file as committed data names it: an absolute path by ``project_label``, or by its name
    alone when it lies outside the project (an output folder of the machine that wrote it); a
    relative path as given."""
    if not Path(path).is_absolute():
        return str(path)
    label = project_label(path)
    return Path(path).name if Path(label).is_absolute() else label


def command_line(module: str, argv: list[str]) -> str:
    """The command that wrote a document, as its provenance records it: ``python -m module``
    and its arguments, each path among them by ``file_label``."""

    def arg(a: str) -> str:
        if a.startswith("--") and "=" in a:
            flag, value = a.split("=", 1)
            return f"{flag}={file_label(value)}"
        return file_label(a)

    return " ".join([f"python -m {module}", *map(arg, argv)])


def _checkpoint_dir() -> Path:
    return Path(str(files("ssvkit.engine"))) / "checkpoints"


def model_label(path: str | Path | None) -> str | None:
    """A model's name in committed data: ``engine/checkpoints/<name>`` for a checkpoint of the
    engine's folder, else the path as given (a registry name stays a name)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_absolute() and p.resolve().parent == _checkpoint_dir().resolve():
        return f"{CHECKPOINTS}/{p.name}"
    return str(path)


def local_model(label: str | None) -> str | None:
    """The model a committed label names, on this machine: ``engine/checkpoints/<name>``
    resolves to the engine's checkpoint folder, as does a checkpoint path recorded on another
    machine whose folder this checkout has; registry names, random-weight geometries
    (``random:NAME`` or ``random:CONFIG``) and existing paths pass through."""
    if not label or "/" not in label or label.startswith("random:"):
        return label
    local = _checkpoint_dir() / Path(label).name
    if not label.startswith(f"{CHECKPOINTS}/") and Path(label).exists():
        return label
    if local.exists():
        return str(local)
    raise ValueError(f"model {label!r} is not in this checkout ({CHECKPOINTS})")


def local_strategy(d: dict) -> Strategy:
    """A committed strategy document with its draft model found on this machine
    (``local_model``)."""
    s = strategy_from_json(d)
    if s.drafter.model:
        drafter = dataclasses.replace(s.drafter, model=local_model(s.drafter.model))
        s = dataclasses.replace(s, drafter=drafter)
    return s


def run_schedule(s: Strategy) -> dict:
    """What a measured run of ``s`` records of its NSA row schedule (``NSA_SCHEDULE``), merged
    into the run's document; nothing for a strategy without NSA."""
    if not (s.is_sparse and s.metadata == "nsa"):
        return {}
    return {NSA_SCHEDULE: s.nsa_rows_per_tile}


def measured_strategy(run: dict) -> Strategy:
    """The strategy of a measured run (``local_strategy`` of ``run["strategy"]``) with the NSA
    row schedule and compressed-branch tiles it was measured with: the ones to price it, or
    re-time it, by. A run without ``NSA_SCHEDULE`` was measured when the engine packed every
    NSA strategy's rows into as many as a tile holds, whatever its mode: it is priced with the
    packed schedule. Likewise a run whose strategy has no ``nsa_context_tiles`` ran NSA's
    compressed branch on the schedule's own row tiles (``per_tile``)."""
    s = local_strategy(run["strategy"])
    if "nsa_context_tiles" not in run["strategy"]:
        s = dataclasses.replace(s, nsa_context_tiles="per_tile")
    return with_nsa_rows_per_tile(s, run.get(NSA_SCHEDULE, PACKED_ROWS))
