"""Command-line plumbing shared by every subcommand: options generated from config
dataclasses (so help and defaults cannot drift from the configs), list parsing, atomic file
output and provenance-carrying figures."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path


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
            type=kind if kind in (int, float, str) else str,
            default=None,
            metavar=name.upper() if kind is str else kind.__name__.upper(),
            help=f"{f.metadata.get('help', '')} (default: {default})",
        )


def given(args, names, prefix="") -> dict:
    """The subset of ``names`` the user set on the command line."""
    out = {}
    for n in names:
        v = getattr(args, f"{prefix}{n}", None)
        if v is not None:
            out[n] = v
    return out


def parse_int_list(text: str, what: str) -> list[int]:
    """``8K,16K,32768`` -> [8192, 16384, 32768]; K and M are powers of two."""
    out = []
    for part in text.split(","):
        p = part.strip().upper()
        mult = {"K": 1024, "M": 1024 * 1024}.get(p[-1:], 1)
        digits = p[:-1] if mult > 1 else p
        try:
            v = int(float(digits) * mult)
        except ValueError:
            raise ValueError(
                f"{what} {part.strip()!r} is not an integer (K/M suffix allowed)"
            ) from None
        if v <= 0:
            raise ValueError(f"{what} must be positive, got {part.strip()}")
        out.append(v)
    if not out:
        raise ValueError(f"{what} needs at least one value")
    return out


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write a file whole or not at all (temporary file in the same folder, then rename)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise ValueError(f"output folder {str(path.parent)!r} does not exist")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def figure(value, unit: str, provenance: str) -> dict:
    """A number as the JSON outputs carry it: value, unit and where it came from."""
    return {"value": value, "unit": unit, "provenance": provenance}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")
