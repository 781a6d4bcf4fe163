"""Merge the rows files of sweep shards into a GPU's profile folder.

    ssvkit calibrate --gpu h200 --merge OUT/s0 OUT/s1 OUT/s2 OUT/s3

Each source folder holds a shard's ``kernel_bench.jsonl`` and ``op_sweep.jsonl``
(``ssvkit calibrate --shard K/N --out DIR``). Every row is checked (schema and checksum,
``perfmodel.rows``) and must come from the GPU's device (``calibration.ceilings.DEVICE_NAMES``);
a last line cut short by a killed shard is left out and reported. Rows whose resume key
(``perfmodel.rows.row_key``) the folder's file already holds are skipped, unless ``replace`` or
``retire`` names their op (``merge``). The folder's files are rewritten atomically: their
existing lines verbatim, then the new rows in source order, so a merge without ``retire`` only
adds lines to the committed file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ssvkit.calibration import ceilings
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.rows import row_key, validate

ROWS_FILES = ("kernel_bench.jsonl", "op_sweep.jsonl")


def shard_lines(path: Path) -> tuple[list[str], bool]:
    """The complete lines of a shard's rows file, and whether a cut-short last line was left
    out."""
    text = path.read_text()
    lines = text.splitlines()
    cut = bool(lines) and not text.endswith("\n")
    return [ln for ln in (lines[:-1] if cut else lines) if ln.strip()], cut


def _key(line: str, where: str, devices: tuple[str, ...]) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    validate(row, where=where)
    if row["device_name"] not in devices:
        raise ValueError(f"{where}: a row measured on {row['device_name']!r}, not {devices[0]!r}")
    return row_key(row["op"], row["timing"], row["params"])


def merge(gpu: str, sources: list[Path], dest: Path | None = None, replace=(), retire=()) -> dict:
    """Merge the shard folders ``sources`` into ``dest`` (default ``profiles/<gpu>``); returns
    per rows file the counts of rows added, replaced, skipped and retired, and the cut lines
    left out. ``ValueError`` naming the first bad source or row; nothing is written then.

    A row whose key the folder's file already holds is skipped (the ceilings rows every shard
    writes, or a config two runs both measured) unless ``replace`` names its op: then the new
    row takes the old one's line (an op measured again after its kernels changed). ``retire``
    names ops measured again in full: their committed rows of a timing the sources hold for that
    op, whose key no source row has, are dropped -- rows of configs the sweep no longer makes (a
    kernel option whose default changed), measured with kernels that no longer exist."""
    if gpu not in ceilings.DEVICE_NAMES:
        raise ValueError(f"no measured device name is known for GPU {gpu!r}")
    devices = ceilings.DEVICE_NAMES[gpu]
    dest = dest or ceilings.PROFILES / gpu
    for src in sources:
        if not Path(src).is_dir():
            raise ValueError(f"--merge {str(src)!r} is not a folder")
    if not any((Path(src) / name).is_file() for src in sources for name in ROWS_FILES):
        raise ValueError(f"no {' or '.join(ROWS_FILES)} in the merged folders")
    writes, report = [], {}
    for name in ROWS_FILES:
        target = dest / name
        old = target.read_text().splitlines() if target.exists() else []
        old = [ln for ln in old if ln.strip()]
        index = {_key(ln, f"{target}:{i}", devices): i for i, ln in enumerate(old, 1)}
        lines = list(old)
        count = Counter()
        taken: set[str] = set()  # keys whose line came from a source: the first copy stays
        for src in sources:
            path = Path(src) / name
            if not path.is_file():
                continue
            new, cut = shard_lines(path)
            count["cut"] += cut
            for i, ln in enumerate(new, 1):
                key = _key(ln, f"{path}:{i}", devices)
                op = key.split("|", 1)[0]
                if key not in index:
                    lines.append(ln)
                    index[key] = len(lines)
                    count["added"] += 1
                elif op in replace and key not in taken:
                    lines[index[key] - 1] = ln
                    count["replaced"] += 1
                else:
                    count["skipped"] += 1
                taken.add(key)
        lines, count["retired"] = _retired(lines, index, taken, set(retire))
        if count["added"] or count["replaced"] or count["retired"]:
            writes.append((target, "\n".join(lines) + "\n"))
        report[name] = {k: count[k] for k in ("added", "replaced", "skipped", "retired", "cut")}
    dest.mkdir(parents=True, exist_ok=True)
    for target, text in writes:
        atomic_write(target, text)
    return report


def _retired(lines: list[str], index: dict[str, int], taken: set[str], retire: set[str]):
    """``lines`` without the rows ``retire`` drops (``merge``), and their count;
    ``index`` maps each line's row key to its 1-based line number."""
    # Row keys read op|timing|params: an op's timings the sources measured.
    measured = {tuple(k.split("|", 2)[:2]) for k in taken}
    dropped = {
        i
        for key, i in index.items()
        if key.split("|", 1)[0] in retire
        and key not in taken
        and tuple(key.split("|", 2)[:2]) in measured
    }
    return [ln for i, ln in enumerate(lines, 1) if i not in dropped], len(dropped)
