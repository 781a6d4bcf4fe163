"""The engine's round trace in the ``ssvkit-trace`` format (``docs/trace-format.md``), written
with ``perfmodel.trace``'s record builders and validator.

Each round's records are appended, one line per sequence, to ``FILE.jsonl.partial`` as the run
goes (so a crashed run leaves its rounds behind); ``close`` writes the final file atomically:
the header (which names every strategy the controller used) and the rounds, validated as a
whole by ``perfmodel.trace.dumps_trace``, then removes the partial file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ssvkit.perfmodel.files import atomic_write, check_output
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.perfmodel.trace import dumps_trace, make_header, make_round


def strategy_doc(strategy: Strategy) -> dict:
    """The header description of a strategy (its fields, as the simulator writes them)."""
    d = dataclasses.asdict(strategy)
    d["drafter"] = {k: v for k, v in d["drafter"].items() if v is not None}
    return d


class TraceWriter:
    """Collects rounds for one trace file."""

    def __init__(self, path: str | Path, model: str, num_layers: int, **header_extra) -> None:
        self.path = check_output(path, "trace")
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.model, self.num_layers, self.extra = model, num_layers, header_extra
        self.strategies: dict[str, dict] = {}
        self.lines: list[str] = []
        self._fh = open(self.partial, "w")  # noqa: SIM115 - closed in close()

    def header(self) -> dict:
        return make_header("engine", self.model, self.num_layers, self.strategies, **self.extra)

    def strategy_id(self, strategy: Strategy) -> str:
        """The header id of ``strategy``: its name, or ``name#k`` when another strategy of the
        same name (different fields) is already in the header."""
        doc = strategy_doc(strategy)
        for k in range(len(self.strategies) + 1):
            sid = strategy.name if k == 0 else f"{strategy.name}#{k}"
            if self.strategies.setdefault(sid, doc) == doc:
                return sid
        raise AssertionError("unreachable")

    def add_round(self, strategy: Strategy, request: int, **fields) -> dict:
        """Append one round record (``perfmodel.trace.make_round`` fields) and return it."""
        sid = self.strategy_id(strategy)
        row = make_round(fields.pop("round_index"), request, sid, **fields)
        dumps_trace(self.header(), [row])  # validate before anything is written
        line = json.dumps(row, separators=(",", ":"), allow_nan=False)
        self.lines.append(line)
        self._fh.write(line + "\n")
        self._fh.flush()
        return row

    def close(self, **header_extra) -> Path:
        """Write the final trace (header updated with ``header_extra``) and drop the partial."""
        self.extra.update(header_extra)
        self._fh.close()
        rounds = [json.loads(line) for line in self.lines]
        if not self.strategies:
            raise ValueError("the trace has no rounds")
        atomic_write(self.path, dumps_trace(self.header(), rounds), "trace")
        os.unlink(self.partial)
        return self.path
