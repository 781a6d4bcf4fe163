"""The files a user hands the toolkit and the files it writes, with one-line errors that name
the file as the user gave it.

``read_text`` / ``read_json`` raise a ``ValueError`` naming the file for a missing path, a
folder, an unreadable or non-UTF-8 (binary) file, invalid JSON, JSON's non-finite constants
and a top-level value of the wrong type; ``check_output`` refuses an output path before
anything is written; ``write_files`` writes every output whole or none of them; ``malformed``
reports a document that lacks a field or holds one of the wrong type as one ``ValueError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path


def _named(path: str | Path) -> str:
    return repr(str(path))


def check_input(path: str | Path, what: str) -> Path:
    """``path`` as a ``Path`` when it is an existing file (for readers that open it
    themselves, such as Parquet's); ``ValueError`` naming it otherwise."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{what} {_named(path)} does not exist")
    if p.is_dir():
        raise ValueError(f"{what} {_named(path)} is a folder, not a file")
    return p


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of ``path``; ``ValueError`` naming ``what`` and the path otherwise."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{what} {_named(path)} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {_named(path)} is a folder, not a file") from None
    except OSError as e:
        raise ValueError(f"{what} {_named(path)} cannot be read: {e.strerror or e}") from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; ``ValueError`` for a missing, unreadable or binary file."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{what} {_named(path)} is not UTF-8 text (byte {e.start}: a binary file?)"
        ) from None


def loads_json(text: str, what: str, source: str | Path, kind: type | None = dict):
    """Parse ``text`` (from ``source``) as JSON without non-finite constants (``NaN``,
    ``Infinity``, which Python's json accepts and no config means); with ``kind``, the
    top-level value must be of that type."""

    def non_finite(name: str):
        raise ValueError(f"{what} {_named(source)} holds {name}, not a finite number")

    try:
        value = json.loads(text, parse_constant=non_finite)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{what} {_named(source)} is not valid JSON: {e.msg} at line {e.lineno}"
        ) from None
    if kind is not None and not isinstance(value, kind):
        want = {dict: "an object", list: "a list"}.get(kind, kind.__name__)
        raise ValueError(
            f"{what} {_named(source)} must hold {want} at its top level, not {_json_type(value)}"
        )
    return value


@contextlib.contextmanager
def malformed(what: str):
    """A document that lacks a field or holds one of the wrong type, as one ``ValueError``
    naming the documents (their structure is checked by reading it)."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{what} is malformed ({type(e).__name__}: {e})") from None


def read_json(path: str | Path, what: str, kind: type | None = dict):
    """``loads_json`` of the file ``path``."""
    return loads_json(read_text(path, what), what, path, kind)


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def check_output(path: str | Path, what: str, suffixes: Sequence[str] = ()) -> Path:
    """``path`` as a ``Path`` when a file can be written there; ``ValueError`` naming it when
    it is a folder, its folder is missing or read-only, or its extension is not among
    ``suffixes`` (lower case, with the dot; empty: any)."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise ValueError(f"{what} {_named(path)} must end in {' or '.join(suffixes)}")
    if p.is_dir():
        raise ValueError(f"{what} {_named(path)} is a folder; give a file name")
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {_named(path)} is not a regular file (a device or a pipe?)")
    folder = p.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {_named(path)}: folder {_named(folder)} does not exist")
    _probe(folder, f"{what} {_named(path)}: folder {_named(folder)}")
    return p


def _probe(folder: Path, where: str) -> None:
    """Create and remove a file in ``folder``: the one reliable test that a file can be made
    there (permissions, read-only mounts, pseudo file systems such as /proc)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ssvkit-probe.")
    except OSError as e:
        raise ValueError(f"{where} is not writable ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def check_folder(path: str | Path, what: str) -> Path:
    """``path`` as a ``Path`` when it is an existing, writable folder."""
    p = Path(path)
    if not p.is_dir():
        state = "is a file, not a folder" if p.exists() else "does not exist"
        raise ValueError(f"{what} {_named(path)} {state}")
    _probe(p, f"{what} {_named(path)}")
    return p


def write_files(items: Iterable[tuple], what: str = "output") -> None:
    """Write every ``(path, data)`` or ``(path, data, what)`` whole, or none of them: each path
    checked, each written to a hidden temporary file in its folder, then all renamed into
    place: a failure before the renames leaves no output, no failure leaves a temporary
    file, and the error names the path given, not the temporary one. ``what`` names the
    output in errors (an option such as ``--csv``)."""
    items = [(Path(it[0]), it[1], it[2] if len(it) > 2 else what) for it in items]
    seen = set()
    for p, _, name in items:
        check_output(p, name)
        key = os.path.realpath(p)
        if key in seen:
            raise ValueError(f"two outputs go to {_named(p)}")
        seen.add(key)
    temps: list[tuple[str, Path, str]] = []
    try:
        for p, data, name in items:
            temps.append((_write_temp(p, data, name), p, name))
        for tmp, p, name in temps:
            try:
                os.replace(tmp, p)
            except OSError as e:
                raise ValueError(f"{name} {_named(p)} cannot be written: {e.strerror}") from None
    finally:
        for tmp, _, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def atomic_write(path: str | Path, data: bytes | str, what: str = "output") -> None:
    """Write one file whole or not at all (``write_files`` of one item)."""
    write_files([(path, data)], what)


def _write_temp(path: Path, data: bytes | str, what: str) -> str:
    """A temporary file beside ``path`` holding ``data``, with the mode a plain ``open`` gives."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ValueError(f"{what} {_named(path)} cannot be written: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except OSError as e:
        os.unlink(tmp)
        raise ValueError(f"{what} {_named(path)} cannot be written: {e.strerror}") from None
    return tmp
