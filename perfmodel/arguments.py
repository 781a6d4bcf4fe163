"""The argument parser of every command line (``ssvkit`` and the ``python -m`` entry points of
the packages): a usage error is one line on stderr naming what was wrong, exit code 2, no usage
block and no traceback."""

from __future__ import annotations

import argparse
import dataclasses


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


def dataclass_from_pairs(cls, text: str, flag: str):
    """``cls()``, a dataclass, with the fields named in ``text``'s ``name=value`` pairs
    (comma-separated) set, each value read as its field default's type
    (a bool from 1/0, true/false or yes/no). ``ValueError`` in one line, naming ``flag``,
    for a field ``cls`` lacks or a value that is not of its type; the dataclass's own checks
    run as it is built."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(
                f"{flag} {item!r}: expected name=value with a name of {', '.join(fields)}"
            )
        default = fields[name].default
        if isinstance(default, bool):
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError(f"{flag} {item!r}: {value!r} is no bool (true or false)")
            kw[name] = value.lower() in _TRUE
            continue
        try:
            kw[name] = type(default)(value)
        except ValueError:
            raise ValueError(f"{flag} {item!r}: {value!r} is no {type(default).__name__}") from None
    return cls(**kw)
