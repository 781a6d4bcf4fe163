"""The campaign at scale's JSON document, for one shard or the whole campaign, the merge of
shard documents into the campaign's, and the join of shard run caches into one.

A document holds its ``settings`` (the axes and everything the cells depend on), its shard
(``index`` of ``count``, and the groups it ran), the slots of every cell of the whole campaign
in its canonical order (``cells``), its rows in that order, ``complete`` and the provenance.
``merge`` refuses, in one line, documents of another benchmark, version, settings, shard count,
commit, device or versions, a file given twice and a cell with different rows in two documents;
documents of one shard from successive calls (each holds the cells its call decoded) merge like
shards. It writes the rows in the campaign's order, ``complete`` only when every cell of the
campaign has its row. ``join_caches``
writes the cells of several run caches of the same settings (``validation.bench.RunCache``; a
line cut short by a kill at the end of one dropped) as one, for every shard of a later call to
resume from.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ssvkit.perfmodel.files import atomic_write, malformed, read_json
from ssvkit.validation.bench import read_runs
from ssvkit.validation.records import command_line, file_label
from ssvkit.validation.scale_cells import BENCHMARK, CAMPAIGN_VERSION, Cell

# Provenance every shard of a campaign shares.
SHARED_PROVENANCE = ("git_commit", "device_name", "torch_version", "triton_version")
MODULE = "ssvkit.validation.scale_campaign"


def settings(st, args) -> dict:
    """What a campaign's cells depend on: merged documents must agree on all of it."""
    return {
        "models": st.models,
        "contexts": st.contexts,
        "batches": st.batches,
        "acceptances": st.acceptances,
        "baselines": st.baselines,
        "new_tokens": args.new_tokens,
        "planner": file_label(args.planner),
        "gpu": args.gpu,
        "device": st.device,
        "dtype": str(st.dtype).removeprefix("torch."),
        "max_batch_limit": args.max_batch_limit,
        "available_bytes": st.available_bytes,
    }


def document(st, args, argv, cells, shard, rows, complete, cache, t0: float) -> dict:
    """One call's document: ``cells`` the whole campaign's, ``shard`` (index, count, the shard's
    cells), ``rows`` the shard's finished rows in canonical order."""
    import time

    from ssvkit.kernels.timing import provenance

    index, count, mine = shard
    return {
        "benchmark": BENCHMARK,
        "version": CAMPAIGN_VERSION,
        "complete": complete,
        "settings": settings(st, args),
        "shard": {
            "index": index,
            "count": count,
            "groups": [list(g) for g in dict.fromkeys(c.group for c in mine)],
        },
        "cells": [c.slot for c in cells],
        "provenance": {
            **provenance(),
            "command": command_line(MODULE, argv),
            "wall_s": time.perf_counter() - t0,
            "runs_from_cache": cache.reused if cache else 0,
        },
        "gpu": args.gpu,
        "device": st.device,
        "dtype": str(st.dtype).removeprefix("torch."),
        "available_bytes": st.available_bytes,
        "new_tokens": args.new_tokens,
        "planner": file_label(args.planner),
        "acceptance": "synthetic:oracle",
        "prompt": "code, one corpus window per sequence",
        "rows": rows,
    }


def slot_of(row: dict) -> str:
    """A row's cell slot (``Cell.slot``)."""
    return Cell(**{f.name: row[f.name] for f in dataclasses.fields(Cell)}).slot


def _check(first: tuple[str, dict], other: tuple[str, dict]) -> None:
    """``ValueError`` naming the first field where ``other`` differs from ``first``."""
    (a_path, a), (b_path, b) = first, other
    pairs = [("benchmark", a["benchmark"], b["benchmark"]), ("version", a["version"], b["version"])]
    pairs += [(k, a["settings"].get(k), b["settings"].get(k)) for k in a["settings"]]
    pairs += [(k, a["provenance"].get(k), b["provenance"].get(k)) for k in SHARED_PROVENANCE]
    pairs += [("shard count", a["shard"]["count"], b["shard"]["count"])]
    pairs += [("cells", len(a["cells"]), len(b["cells"]) if a["cells"] == b["cells"] else -1)]
    for name, x, y in pairs:
        if x != y:
            raise ValueError(f"{b_path} differs from {a_path} in {name}: {y!r} vs {x!r}")


def merge(docs: list[tuple[str, dict]], argv=None) -> dict:
    """The campaign's document from its shards' (``(path, document)`` pairs; module
    docstring)."""
    from ssvkit.kernels.timing import provenance

    if not docs:
        raise ValueError("--merge needs at least one document")
    paths = [p for p, _ in docs]
    twice = next((p for i, p in enumerate(paths) if p in paths[:i]), None)
    if twice is not None:
        raise ValueError(f"{twice} is given twice")
    seen: set[int] = set()
    rows: dict[str, dict] = {}
    source: dict[str, str] = {}
    for path, doc in docs:
        with malformed(f"scale campaign {path!r}"):
            if doc.get("benchmark") != BENCHMARK or doc.get("version") != CAMPAIGN_VERSION:
                raise ValueError(
                    f"{path} is not a scale campaign document of version {CAMPAIGN_VERSION}"
                )
            _check(docs[0], (path, doc))
            seen.add(doc["shard"]["index"])
            for r in doc["rows"]:
                slot = slot_of(r)
                if slot in rows and rows[slot] != r:
                    raise ValueError(f"cell {slot} has other rows in {source[slot]} and {path}")
                rows[slot], source[slot] = r, path
    first = docs[0][1]
    order = first["cells"]
    unknown = sorted(set(rows) - set(order))
    if unknown:
        raise ValueError(f"a row of cell {unknown[0]!r} is not a cell of the campaign")
    shared = {k: first["provenance"].get(k) for k in SHARED_PROVENANCE}
    now = provenance()
    return {
        **first,
        "complete": all(s in rows for s in order),
        "shard": {"index": None, "count": first["shard"]["count"], "merged": sorted(seen)},
        "provenance": {
            **shared,
            "timestamp": now["timestamp"],
            "command": command_line(MODULE, sys.argv[1:] if argv is None else argv),
            "shards": [
                {
                    "index": d["shard"]["index"],
                    "file": Path(p).name,
                    "complete": d["complete"],
                    **{
                        k: d["provenance"].get(k)
                        for k in ("timestamp", "command", "wall_s", "runs_from_cache")
                    },
                }
                for p, d in sorted(docs, key=lambda x: x[1]["shard"]["index"])
            ],
        },
        "rows": [rows[s] for s in order if s in rows],
    }


def merge_files(paths: list[str], out: str, argv=None) -> str:
    """Merge the shard documents at ``paths`` into ``out``; one line saying what it wrote."""
    docs = [(p, read_json(p, f"scale campaign {p!r}")) for p in paths]
    doc = merge(docs, argv)
    atomic_write(out, json.dumps(doc) + "\n")
    missing = len(doc["cells"]) - len(doc["rows"])
    state = "complete" if doc["complete"] else f"INCOMPLETE: {missing} cells missing"
    return (
        f"{len(doc['rows'])} of {len(doc['cells'])} cells from shards "
        f"{doc['shard']['merged']} of {doc['shard']['count']} -> {out} ({state})"
    )


def join_caches(paths: list[str], out: str) -> str:
    """Write the runs of the run caches at ``paths`` (one settings line, refused in one line
    when they differ) as one cache at ``out``; one line saying what it wrote."""
    head, runs = None, {}
    for p in paths:
        try:
            lines = Path(p).read_text().splitlines()
            first = json.loads(lines[0])
        except (OSError, IndexError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read run cache {p}: {e}") from None
        if head is None:
            head = first
        elif first != head:
            raise ValueError(f"run cache {p} was written for other settings than {paths[0]}")
        runs.update(read_runs(lines, p))
    rows = [json.dumps(head)] + [json.dumps({"key": k, "value": v}) for k, v in runs.items()]
    atomic_write(out, "\n".join(rows) + "\n")
    return f"{len(runs)} cells from {len(paths)} run caches -> {out}"
