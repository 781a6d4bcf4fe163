"""Byte-level text corpus from the Python sources installed on the machine.

Each importable package (a folder on ``sys.path`` with Python files) becomes one *document*:
its ``.py`` files in sorted order, each preceded by a ``# file: <path>`` line, concatenated, so
a model trained on it sees the long-range structure of a code base (imports at the top, uses
further down, a package's modules side by side). Top-level single-file modules of a folder are
one document per folder. Documents split into train and validation by a hash of their name, so
no package is in both. Token ids are bytes (vocabulary 256): ``split_streams(collect_documents())``
gives the train and validation streams as uint8 numpy arrays.

``corpus_sample(n)`` is ``ssvkit decode``'s built-in prompt: ``n`` bytes of validation
documents, deterministic for a given machine's installed packages.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_SIZE = 256
SEPARATOR = b"\n\n# ---- package boundary ----\n\n"
VAL_SHARE = 1 / 16


@dataclass(frozen=True, slots=True)
class Document:
    """One package's concatenated sources."""

    name: str
    data: bytes

    @property
    def is_validation(self) -> bool:
        h = int(hashlib.sha256(self.name.encode()).hexdigest()[:8], 16)
        return h / 0xFFFFFFFF < VAL_SHARE


def default_roots() -> list[Path]:
    """The folders of ``sys.path`` (stdlib, site-packages, ...), deduplicated, in order."""
    seen, out = set(), []
    for p in sys.path:
        path = Path(p or ".").resolve()
        if path.is_dir() and path not in seen and not str(path).endswith(".zip"):
            seen.add(path)
            out.append(path)
    return out


def _package_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if p.is_file())


def iter_packages(roots: list[Path], keep=None):
    """``(name, files)`` for every package folder and every root's loose modules, in a
    deterministic order; a folder reachable from two roots is taken once. ``keep(name)``
    filters before any folder is listed."""
    seen: set[Path] = set()
    for root in roots:
        try:
            entries = sorted(root.iterdir())
        except OSError:
            continue
        loose = [p for p in entries if p.suffix == ".py" and p.is_file()]
        if loose and (keep is None or keep(f"{root.name}:modules")):
            yield f"{root.name}:modules", loose
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith((".", "__pycache__")):
                continue
            real = entry.resolve()
            if real in seen or entry.name.endswith((".dist-info", ".egg-info")):
                continue
            seen.add(real)
            if keep is not None and not keep(entry.name):
                continue
            files = _package_files(entry)
            if files:
                yield entry.name, files


def read_document(name: str, files: list[Path], base: Path | None = None) -> Document:
    parts = []
    for f in files:
        try:
            body = f.read_bytes()
        except OSError:
            continue
        rel = f.relative_to(base) if base is not None and f.is_relative_to(base) else f.name
        parts.append(f"# file: {rel}\n".encode() + body)
    return Document(name, b"\n".join(parts))


def collect_documents(
    roots: list[Path] | None = None, *, max_bytes: int = 256 << 20, split: str | None = None
) -> list[Document]:
    """Documents of the installed packages (``roots`` default: ``sys.path``), until
    ``max_bytes`` in total; ``split`` = ``train`` / ``validation`` keeps only that split
    (decided from the name, before any file is read)."""

    def keep(name: str) -> bool:
        return split is None or Document(name, b"").is_validation == (split == "validation")

    docs, total = [], 0
    for name, files in iter_packages(roots if roots is not None else default_roots(), keep):
        doc = read_document(name, files, files[0].parent.parent if files else None)
        if not doc.data:
            continue
        docs.append(doc)
        total += len(doc.data)
        if total >= max_bytes:
            break
    return docs


def to_stream(docs: list[Document], seed: int = 0) -> np.ndarray:
    """Documents in a seeded order, joined by ``SEPARATOR``, as a uint8 array."""
    order = sorted(docs, key=lambda d: zlib.crc32(f"{seed}:{d.name}".encode()))
    return np.frombuffer(SEPARATOR.join(d.data for d in order), dtype=np.uint8).copy()


def split_streams(docs: list[Document], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(train, validation)`` byte streams; raises when either would be empty."""
    train = [d for d in docs if not d.is_validation]
    val = [d for d in docs if d.is_validation]
    if not train or not val:
        raise ValueError(
            f"the corpus needs packages on both sides of the split, got {len(train)} train and "
            f"{len(val)} validation documents"
        )
    return to_stream(train, seed), to_stream(val, seed)


def validation_bytes(limit: int, roots: list[Path] | None = None) -> int:
    """Bytes of the validation stream ``corpus_sample`` draws from, counted up to ``limit``
    (a window ending past it would repeat the stream's start)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    docs = collect_documents(roots, max_bytes=limit, split="validation")
    return len(to_stream(docs)) if docs else 0


def corpus_sample(num_tokens: int, roots: list[Path] | None = None) -> list[int]:
    """``num_tokens`` bytes of validation documents (repeated when the split is shorter)."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    docs = collect_documents(roots, max_bytes=num_tokens, split="validation")
    if not docs:
        docs = collect_documents(roots, max_bytes=num_tokens)
    if not docs:
        raise ValueError("no Python sources found for the built-in corpus sample")
    stream = to_stream(docs)
    reps = -(-num_tokens // len(stream))
    return np.tile(stream, reps)[:num_tokens].tolist()


def encode(text: str | bytes) -> list[int]:
    """Byte-level token ids."""
    return list(text.encode("utf-8") if isinstance(text, str) else text)


def decode(tokens: list[int]) -> str:
    return bytes(t % VOCAB_SIZE for t in tokens).decode("utf-8", errors="replace")
