"""Command-line plumbing shared by every subcommand: options generated from config
dataclasses (so help and defaults cannot drift from the configs), argparse types that refuse
non-finite numbers, single counts, provenance-carrying figures and the one-line usage error.
Numbers and files themselves are parsed and written by ``perfmodel.numbers`` and
``perfmodel.files``."""

from __future__ import annotations

import argparse
import dataclasses

from ssvkit.perfmodel.hardware import GpuSpec, get_gpu
from ssvkit.perfmodel.intervals import COVERAGE
from ssvkit.perfmodel.numbers import finite_float, interval_text, parse_count

INTERVALS_NOTE = (
    "from the leave-out residuals of each op's kernel family, combined per "
    "perfmodel.intervals (docs/cli.md, 'Intervals'); null: no residuals price the figure "
    "(the datasheet roofline, a transfer across architectures)"
)


def add_dataclass_options(parser, cls, names, defaults=None, prefix="") -> None:
    """Add ``--field-name`` options for ``names`` of dataclass ``cls``.

    Help text is the field's ``metadata["help"]``; the default shown is the field's default (or
    the attribute of ``defaults``). The option's value is None when not given, so callers can
    tell an explicit choice from the default.
    """
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        f = by_name[name]
        default = getattr(defaults, name) if defaults is not None else f.default
        kind = type(default) if default is not None else str
        parser.add_argument(
            f"--{prefix}{name.replace('_', '-')}",
            dest=f"{prefix.replace('-', '_')}{name}",
            type={int: int, float: finite}.get(kind, str),
            default=None,
            metavar=name.upper() if kind is str else kind.__name__.upper(),
            help=f"{f.metadata.get('help', '')} (default: {default})",
        )


def add_pricing_options(p) -> None:
    """``--roofline`` and ``--transfer-across-architectures``: how ``--gpu`` is priced (its own
    profile, else one transferred from its architecture, else refused)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--roofline",
        action="store_true",
        help="the bare datasheet roofline, ignoring measured ceilings and profiles",
    )
    g.add_argument(
        "--transfer-across-architectures",
        dest="any_architecture",
        action="store_true",
        help="a GPU without a profile of its architecture borrows the nearest other one",
    )


def pricing_gpu(args, name: str) -> GpuSpec:
    """The GPU ``name`` priced as ``add_pricing_options``' flags ask."""
    return get_gpu(name, measured=not args.roofline, any_architecture=args.any_architecture)


def intervals_doc(note: str | None = None) -> dict:
    """The JSON outputs' note on the intervals: their coverage and where they come from, or
    (``note``) why there are none."""
    return (
        {"coverage": None, "note": note} if note else {"coverage": COVERAGE, "note": INTERVALS_NOTE}
    )


def interval_legend(has_interval, no_interval_note: str) -> list[str]:
    """The text outputs' line on the intervals: what ``[low, high]`` is where shown
    (``has_interval``: any figure shown has one), and ``no_interval_note`` where one lacks it."""
    lines = []
    if any(has_interval):
        lines.append(
            f"[low, high]: {100 * COVERAGE:.0f}% intervals from the leave-out residuals of each "
            "op's kernel family (docs/cli.md, 'Intervals')"
        )
    if not all(has_interval):
        lines.append(f"no intervals: {no_interval_note}")
    return lines


def bounded_parts(value: float, iv, fmt: str, suffix: str = "") -> tuple[str, str]:
    """``value`` and, when there is one, its interval, as two texts: ``327.4``,
    ``[309.3, 340.3]``."""
    return f"{value:{fmt}}{suffix}", interval_text(iv, fmt)


def bounded_text(value: float, iv, fmt: str, suffix: str = "") -> str:
    """``327.4 [309.3, 340.3]``, or ``327.4`` without an interval."""
    return " ".join(x for x in bounded_parts(value, iv, fmt, suffix) if x)


def given(args, names, prefix="") -> dict:
    """The subset of ``names`` the user set on the command line."""
    out = {}
    for n in names:
        v = getattr(args, f"{prefix}{n}", None)
        if v is not None:
            out[n] = v
    return out


def parse_one(text: str, what: str) -> int:
    """One count (``16K``); a list is refused rather than cut to its first item."""
    if "," in str(text):
        raise ValueError(f"{what} takes one value, got {text!r}")
    return parse_count(text, what)


def finite(text: str) -> float:
    """argparse ``type`` of a float option: ``nan`` and ``inf`` are refused."""
    try:
        return finite_float(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number") from None


def check_drafter_model(drafter_kw: dict, strategies) -> None:
    """``--drafter-model`` is read by the draft_model drafter only: refuse it when no strategy
    drafts with one (it would be dropped silently)."""
    if "model" in drafter_kw and not any(s.drafter.kind == "draft_model" for s in strategies):
        raise ValueError(
            f"--drafter-model {drafter_kw['model']!r} is read by --drafter-kind draft_model only"
        )
