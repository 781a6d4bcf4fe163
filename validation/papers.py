"""The five seeds' headline figures beside ssvkit's, with the settings and a status per figure.

``validation/data/papers.json`` holds each figure as its paper states it (value, unit, the
table, figure or section it comes from) and the settings it was measured under, each marked
inferred where the seed does not state it. ``reproduce`` computes ssvkit's value on those
settings (``validation.paper_figures``) and gives each figure one status:

- ``reproduced``: ssvkit's value is within 15% of the paper's;
- ``differs``: it is not; the reason is the assumption the paper makes that ssvkit models
  differently, with ssvkit's value at the alternative setting the data names;
- ``not modelled``: what it would take to model it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssvkit.calibration.error_table import markdown_header, markdown_row
from ssvkit.validation.paper_figures import ANALYTIC, KINDS, SIMULATED, mean_length
from ssvkit.validation.records import record_path

TOLERANCE = 0.15
STATUSES = ("reproduced", "differs", "not modelled")
SEEDS = ("000", "001", "002", "003", "004")
PAPERS_FILE = "papers.json"


def load_papers(path: Path | None = None) -> dict:
    """The paper figures, checked: every figure names a known seed, kind and setting group, and
    every input it reads exists."""
    doc = json.loads((path or record_path(PAPERS_FILE)).read_text())
    inputs = {x["id"] for x in doc["inputs"]}
    for f in doc["figures"]:
        c = f["compute"]
        if f["seed"] not in doc["seeds"]:
            raise ValueError(f"figure {f['id']}: unknown seed {f['seed']!r}")
        if c["kind"] not in KINDS:
            raise ValueError(f"figure {f['id']}: unknown kind {c['kind']!r}")
        if "settings" in c and c["settings"] not in doc["settings"]:
            raise ValueError(f"figure {f['id']}: unknown settings {c['settings']!r}")
        if "input" in c and c["input"] not in inputs:
            raise ValueError(f"figure {f['id']}: unknown input {c['input']!r}")
    return doc


def check_seed(seed: str | None) -> str | None:
    """``seed`` when it is one of the five (``ValueError`` naming it otherwise)."""
    if seed is not None and seed not in SEEDS:
        raise ValueError(f"unknown seed {seed!r} (one of {', '.join(SEEDS)})")
    return seed


# Keys of a compute entry that describe the computation; every other key is a setting (for a
# simulated figure, an override of the paper's group).
STRUCTURAL = {
    "kind", "settings", "strategy", "over", "stage", "group", "scenario", "figure", "scale",
    "notes", "input", "reference_base_len", "would_take",
}  # fmt: skip


def settings_of(doc: dict, c: dict, extra: dict | None = None) -> dict:
    """The settings a figure is computed on: ``{name: {value, inferred, note}}``, the paper's
    group with the figure's own settings (inferred where their note says so) and ``extra``."""
    out = {k: dict(v) for k, v in doc["settings"].get(c.get("settings"), {}).items()}
    notes = c.get("notes", {})
    for k, v in c.items():
        if k in STRUCTURAL:
            continue
        out[k] = {"value": v, "inferred": notes.get(k, "").startswith("inferred")}
        if k in notes:
            out[k]["note"] = notes[k]
    if c["kind"] in ANALYTIC:
        inputs = {x["id"]: x for x in doc["inputs"]}
        length = mean_length(inputs[c["input"]]["value"], c["reference_base_len"], c["sparsity"])
        out["seq_len"] = {
            "value": round(length),
            "inferred": True,
            "note": f"the dataset's mean length, solved with eq. 6 from {c['input']}",
        }
    for k, v in (extra or {}).items():
        out[k] = {"value": v, "inferred": True, "note": "alternative setting"}
    return out


def _values(settings: dict) -> dict:
    return {k: v["value"] for k, v in settings.items()}


def compute(doc: dict, f: dict, extra: dict | None = None) -> tuple[float, str, dict]:
    """ssvkit's value of figure ``f`` (with ``extra`` settings on top), its provenance and the
    settings used."""
    c = f["compute"]
    settings = settings_of(doc, c, extra)
    if c["kind"] in ANALYTIC:
        inputs = {x["id"]: x for x in doc["inputs"]}
        value, prov = ANALYTIC[c["kind"]](c, inputs)
    else:
        value, prov = SIMULATED[c["kind"]](c, _values(settings))
    return float(value), prov, settings


def _status(ratio: float) -> str:
    return "reproduced" if abs(ratio - 1.0) <= TOLERANCE else "differs"


def evaluate(doc: dict, f: dict) -> dict:
    """One figure's row: the paper's value, ssvkit's, the ratio, the status and its reason."""
    c = f["compute"]
    row = {
        "id": f["id"],
        "seed": f["seed"],
        "what": f["what"],
        "ref": f"seed {f['seed']}, {f['ref']}",
        "paper": {"value": f["value"], "unit": f["unit"]},
    }
    if c["kind"] == "not_modelled":
        row.update(
            ssvkit=None, ratio=None, status="not modelled", reason=c["would_take"],
            settings=settings_of(doc, c),
        )  # fmt: skip
        return row
    value, prov, settings = compute(doc, f)
    ratio = value / f["value"]
    row.update(
        ssvkit={"value": value, "unit": f["unit"], "provenance": prov},
        ratio=ratio,
        status=_status(ratio),
        settings=settings,
    )
    row["reason"] = _reason(doc, f) if row["status"] == "differs" else ""
    return row


def _reason(doc: dict, f: dict) -> str:
    """The recorded assumption, with ssvkit's value at the alternative setting it names."""
    d = f.get("differs")
    if not d:
        return "no reason recorded: the model moved away from the paper since the data was written"
    text = d["assumption"]
    if "alternative" in d:
        value, _, _ = compute(doc, f, d["alternative"])
        text += f"; ssvkit gives {_fmt(value, f['unit'])} {d['alternative_note']}"
    return text


def reproduce(seed: str | None = None, path: Path | None = None) -> dict:
    """Every figure of ``seed`` (all seeds when None) evaluated; the document ``--json`` prints."""
    doc = load_papers(path)
    check_seed(seed)
    rows = [evaluate(doc, f) for f in doc["figures"] if seed in (None, f["seed"])]
    return {
        "source": "validation/data/papers.json",
        "tolerance": TOLERANCE,
        "seeds": {k: v for k, v in doc["seeds"].items() if seed in (None, k)},
        "inputs": [x for x in doc["inputs"] if seed in (None, x["seed"])],
        "figures": rows,
        "counts": {s: sum(r["status"] == s for r in rows) for s in STATUSES},
    }


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "share":
        return f"{value:.2f}"
    return f"{value:.1f} {unit}"


def _inferred(row: dict) -> str:
    return ", ".join(k for k, v in row["settings"].items() if v.get("inferred")) or "none"


def text_table(rep: dict) -> str:
    """The terminal table: one line per figure, then each status's reason."""
    lines = [
        f"{'figure':26s} {'paper':>9s} {'ssvkit':>9s} {'ratio':>6s}  status",
        "-" * 66,
    ]
    for r in rep["figures"]:
        sv = r["ssvkit"]["value"] if r["ssvkit"] else None
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(
            f"{r['id']:26s} {_fmt(r['paper']['value'], r['paper']['unit']):>9s} "
            f"{_fmt(sv, r['paper']['unit']):>9s} {ratio:>6s}  {r['status']}"
        )
    lines.append("")
    for r in rep["figures"]:
        if r["reason"]:
            lines.append(f"{r['id']}: {r['reason']}")
    c = rep["counts"]
    lines.append(
        f"{c['reproduced']} reproduced (within {100 * rep['tolerance']:.0f}%), "
        f"{c['differs']} differ, {c['not modelled']} not modelled"
    )
    return "\n".join(lines)


PAPER_COLUMNS = (
    "figure",
    "paper",
    "ssvkit",
    "ratio",
    "status",
    "where",
    "inferred settings",
    "costs",
)


def markdown(rep: dict) -> str:
    """The docs page's table: per seed, each figure with its reference, settings and status."""
    out = []
    for seed, meta in rep["seeds"].items():
        out += [
            f"### {seed}: {meta['title']}",
            "",
            *markdown_header(PAPER_COLUMNS),
        ]
        notes = []
        for r in (x for x in rep["figures"] if x["seed"] == seed):
            sv = r["ssvkit"]["value"] if r["ssvkit"] else None
            prov = r["ssvkit"]["provenance"] if r["ssvkit"] else "-"
            ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
            unit = r["paper"]["unit"]
            cells = (f"{r['what']} (`{r['id']}`)", _fmt(r["paper"]["value"], unit), _fmt(sv, unit))
            cells += (ratio, r["status"], r["ref"], _inferred(r), prov.rpartition("costs:")[2])
            out.append(markdown_row(cells))
            if r["reason"]:
                notes.append(f"- `{r['id']}` ({r['status']}): {r['reason']}.")
        out += ["", *notes, ""] if notes else [""]
    c = rep["counts"]
    out.append(
        f"{c['reproduced']} reproduced (within {100 * rep['tolerance']:.0f}%), "
        f"{c['differs']} differ, {c['not modelled']} not modelled."
    )
    return "\n".join(out) + "\n"
