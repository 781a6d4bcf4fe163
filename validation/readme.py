"""Regenerate the generated blocks of the README and the results pages from the measurements
of record.

python -m ssvkit.validation.readme          # rewrites the blocks between their markers in DOCUMENTS
python -m ssvkit.validation.readme --check  # exit 1 naming each stale block; nothing written

``BLOCKS`` maps each block's name (the name of its ``<!-- name:begin -->`` and
``<!-- name:end -->`` markers) to what fills it: the calibration's accuracy and transfer sets
(``ssvkit validate --markdown``), the committed profiles' prediction intervals, the planner
evaluations, the seeds' headline figures (``ssvkit papers --markdown``), the scale campaigns'
tokens/s, the sparse path's kernels and the engine's linear layers against their floors, the NSA
stages and launches and the engine's verify step, each read from its measurements under
``validation/data/`` or ``calibration/profiles/``; the text around each block names its data
file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ssvkit.calibration.ceilings import PROFILES
from ssvkit.calibration.error_table import markdown_header, markdown_row
from ssvkit.calibration.interval_coverage import intervals_markdown
from ssvkit.calibration.kernel_summary import summarise
from ssvkit.calibration.transfer_markdown import transfer_markdown
from ssvkit.calibration.transfer_sets import TRANSFER_SETS, transfer_report
from ssvkit.calibration.validate import committed_report, summary_markdown
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write, read_json
from ssvkit.perfmodel.numbers import count_label
from ssvkit.perfmodel.rows import load_rows
from ssvkit.validation.engine_verify_table import current_predictions, verify_markdown
from ssvkit.validation.nsa_launches_table import launches_markdown
from ssvkit.validation.nsa_stages_table import calls_markdown, pdl_markdown
from ssvkit.validation.papers import markdown as papers_markdown
from ssvkit.validation.papers import reproduce
from ssvkit.validation.prompts import OFF_DISTRIBUTION
from ssvkit.validation.records import project_label, record_path
from ssvkit.validation.report import planner_section
from ssvkit.validation.stats import set_resolution

# The checkout's documents that embed generated blocks (the docs are the checkout's, not data).
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = (
    README,
    ROOT / "docs" / "results" / "calibration.md",
    ROOT / "docs" / "results" / "planner.md",
    ROOT / "docs" / "results" / "papers.md",
    ROOT / "docs" / "results" / "engine.md",
    ROOT / "docs" / "results" / "kernels.md",
)


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)


def validate_block(gpu: str = "h100-sxm") -> str:
    """The calibrated profile's accuracy (``ssvkit validate --markdown``'s output)."""
    profile, _, rep = committed_report(gpu)
    return summary_markdown(rep, profile.profile_id) + "\n"


def transfer_block(gpu: str = "h100-sxm") -> str:
    """The transfer test sets (``ssvkit validate --markdown --sets head,group,context,gpu``)."""
    return transfer_markdown(transfer_report(gpu, TRANSFER_SETS))


def unseen_block(gpu: str = "h200") -> str:
    """The test design's calls predicted by the committed profile (``ssvkit validate --markdown
    --sets unseen``)."""
    return transfer_markdown(transfer_report(gpu, ("unseen",)))


def intervals_block(gpu: str = "h100-sxm") -> str:
    """The prediction intervals' residuals and coverage checks."""
    profile, annotated, _ = committed_report(gpu)
    return intervals_markdown(gpu, profile, annotated)


def _signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _strategy_names(doc: dict) -> dict[str, str]:
    """Strategy ids by name (drafter and tree): the oracle's strategies and the measured ones
    carry them."""
    names = {
        x["id"]: x["describe"].split(" | ")[0]
        for v in doc["adaptive"]["prompt_sets"].values()
        for x in (v.get("oracle") or {}).get("strategies", [])
    }
    names.update(
        {
            x["id"]: x["describe"].split(" | ")[0]
            for v in doc["regimes"].values()
            for x in v["strategies"]
        }
    )
    return names


REGIME_COLUMNS = (
    "regime",
    "context",
    "strategies measured",
    "Kendall tau",
    "regret",
    "measured pair s.e.",
)
ADAPTIVE_COLUMNS = (
    "prompt set",
    "offline best",
    "its tokens/s",
    "adaptive gain",
    "90% interval",
    "best fixed alternative",
    "fastest per seed, in hindsight",
)
ADAPTIVE_PHASE_COLUMNS = (
    "prompt set",
    "offline best tokens/s",
    "adaptive tokens/s",
    "switches",
    "adaptive gain",
    "90% interval",
    "best fixed strategy over the offline best",
    "shadow us/round",
    "verify us/round",
)


def _adaptive_rows(doc: dict, pl: dict) -> list[str]:
    """One table row per prompt set: the offline best, the gain and its interval, the best
    fixed alternative and the hindsight bound."""
    names = _strategy_names(doc)
    rows = []
    for k, v in doc["adaptive"]["prompt_sets"].items():
        m = pl["adaptive_resolution"].get(k) or {}
        band = f"{_signed_pct(m['gain_p05'])} to {_signed_pct(m['gain_p95'])}" if m else "n/a"
        c, h = m.get("challenger"), m.get("hindsight")
        alt = f"{_signed_pct(c['gain'])} ({c['describe'].split(' | ')[0]})" if c else "n/a"
        off = " (off distribution)" if k in OFF_DISTRIBUTION else ""
        best = v["offline_best"]
        hindsight = _signed_pct(h["gain"]) if h else "n/a"
        cells = (f"{k}{off}", names.get(best["id"], best["id"]), f"{best['tokens_per_s']:.0f}")
        rows.append(markdown_row((*cells, _signed_pct(v["adaptive_gain"]), band, alt, hindsight)))
    return rows


def _measured_runs(doc: dict) -> str:
    """What each measured strategy decodes: held-out code windows one at a time, or runs of a
    batch of them (``validation.prompts``)."""
    batch = int(doc.get("batch", 1))
    if batch == 1:
        return f"{doc['measure_texts']} held-out code windows"
    return f"{doc['measure_texts']} runs of {batch} sequences on held-out code windows"


def planner_block(path: Path | None = None) -> str:
    """The planner evaluation's figures as markdown (tables, targets, provenance): ranking
    quality per regime and adaptive gain per prompt set, with what the measurement resolves
    (``validation.report.planner_section``, as the report derives it)."""
    path = path or record_path("planner.json")
    doc = read_json(path, "planner evaluation")
    pl = planner_section(doc)
    prov, t = pl["provenance"], pl["targets"]
    lines = [
        f"Evaluation `{project_label(path)}` "
        f"(commit {str(prov.get('git_commit'))[:7]}, {str(prov.get('timestamp'))[:10]}, "
        f"{prov.get('device_name')}): the trained tiny pair, {_measured_runs(doc)} per "
        f"measured strategy, {doc['repeats']} seeds per prompt set.",
        "",
        *markdown_header(REGIME_COLUMNS),
    ]
    for r, v in doc["regimes"].items():
        m = pl["measurement"].get(r)
        se = f"{100 * m['pair_ratio_se']:.1f}%" if m else "n/a"
        cells = (r, str(v["context_len"]), str(v["n"]), f"{pl['kendall_tau'][r]:.2f}")
        lines.append(markdown_row((*cells, f"{100 * pl['regret'][r]:.1f}%", se)))
    a = doc["adaptive"]
    lines += [
        "",
        f"Adaptive at {a['context_len']} tokens ({a['regime']}), against the fixed offline best:",
        "",
        *markdown_header(ADAPTIVE_COLUMNS),
        *_adaptive_rows(doc, pl),
    ]
    met = pl["met"]
    lines += [
        "",
        f"Targets: Kendall tau >= {t['kendall_tau_min']} in every regime "
        f"({'met' if met['kendall_tau'] else 'not met'}), regret <= "
        f"{100 * t['regret_max']:.0f}% ({'met' if met['regret'] else 'not met'}), adaptive gain "
        f">= {100 * t['adaptive_gain_min']:.0f}% on every off-distribution set "
        f"({'met' if met['adaptive_gain_off_distribution'] else 'not met'}).",
    ]
    return "\n".join(lines) + "\n"


def adaptive_phase_block(path: Path) -> str:
    """An adaptive-phase document (``planner_eval --adaptive-from``) as markdown: per prompt
    set the offline best, the adaptive run, its gain with the 90% interval, and the shadow's
    and the verify step's time per round."""
    doc = read_json(path, "adaptive phase")
    a, prov = doc["adaptive"], doc["provenance"]
    lines = [
        f"Adaptive phase `{project_label(path)}` (commit {str(prov.get('git_commit'))[:7]}, "
        f"{str(prov.get('timestamp'))[:10]}, {prov.get('device_name')}), on the profile of "
        f"`{doc['from']}`: batch {doc['batch']}, {a['context_len']} tokens ({a['regime']}), "
        f"the n-gram shadow scoring {a['controller']['shadow_sequences']} sequences.",
        "",
        *markdown_header(ADAPTIVE_PHASE_COLUMNS),
    ]
    for k, v in a["prompt_sets"].items():
        m, run = set_resolution(v) or {}, v["adaptive"]
        band = f"{_signed_pct(m['gain_p05'])} to {_signed_pct(m['gain_p95'])}" if m else "n/a"
        off = " (off distribution)" if k in OFF_DISTRIBUTION else ""
        o = v.get("oracle")
        ceiling = f"{_signed_pct(o['ceiling'])} ({o['describe'].split(' | ')[0]})" if o else "n/a"
        tokens = (f"{v['offline_best']['tokens_per_s']:.0f}", f"{run['tokens_per_s']:.0f}")
        gain = (str(len(run["switches"])), _signed_pct(v["adaptive_gain"]), band, ceiling)
        steps = (f"{run['steps_s'][s] * 1e6:.0f}" for s in ("shadow", "verify"))
        lines.append(markdown_row((f"{k}{off}", *tokens, *gain, *steps)))
    return "\n".join(lines) + "\n"


def campaign_table_block(path: Path) -> str:
    """A scale campaign's measured tokens/s over its whole runs, one row per (context, batch)
    and one column per baseline, a speculative baseline's cell its acceptances from high to
    low ("0.8 / 0.6"); contexts as asked (``count_label``)."""
    doc = read_json(path, "scale campaign")
    baselines = doc["settings"]["baselines"]
    cells: dict[tuple[int, int], dict[str, dict]] = {}
    for r in doc["rows"]:
        if r["status"] != "measured":
            continue
        by_baseline = cells.setdefault((r["context_asked"], r["batch"]), {})
        by_baseline.setdefault(r["baseline"], {})[r["acceptance"]] = r["measured"]["tokens_per_s"]
    lines = markdown_header(("context", "batch", *baselines))
    for (context, batch), row in sorted(cells.items()):
        values = [
            " / ".join(f"{v:.0f}" for _, v in sorted(row[b].items(), key=_acceptance_desc))
            if b in row
            else "n/a"
            for b in baselines
        ]
        lines.append(markdown_row((count_label(context), str(batch), *values)))
    return "\n".join(lines) + "\n"


def _acceptance_desc(item: tuple) -> float:
    acceptance = item[0]
    return 0.0 if acceptance is None else -acceptance


def floor_targets_block(gpu: str, batches: tuple[int, ...]) -> str:
    """Per sparse-path op and batch in ``batches``, the committed graph-timed rows of ``gpu``
    within the floor target, and their median and worst time over the floor
    (``calibration.kernel_summary``)."""
    targets = summarise(load_rows(PROFILES / gpu / "kernel_bench.jsonl"))["floor targets"]
    lines = markdown_header(("op", "batch", "rows", "met", "median x floor", "worst x floor"))
    for t in targets:
        if t["B"] in batches:
            ratios = (_ratio(t[k]) for k in ("median_x", "worst_x"))
            lines.append(
                markdown_row((t["op"], str(t["B"]), str(t["rows"]), str(t["met"]), *ratios))
            )
    return "\n".join(lines) + "\n"


def linear_floor_block(gpu: str, model: str, rows: tuple[int, ...]) -> str:
    """The linear layers of ``model`` at ``rows`` rows on ``gpu``: each committed graph-timed
    gemm row's time (``kernels.linear``, as the engine runs it) and its ratio to its floor, the
    bytes it moves over the copy bandwidth measured in the same run."""
    table: dict[tuple[int, int], dict[int, dict]] = {}
    names: dict[tuple[int, int], str] = {}
    for r in load_rows(PROFILES / gpu / "op_sweep.jsonl"):
        p = r["params"]
        layers = [u[len(model) + 1 :] for u in p.get("used_by", ()) if u.startswith(model + ".")]
        if r["op"] != "gemm" or r["timing"] != "graph" or p.get("l2") or not layers:
            continue
        shape = (p["n"], p["k"])
        names[shape] = ", ".join(layers)
        table.setdefault(shape, {})[p["m"]] = r
    heads = (f"{m} row{'s' * (m > 1)}: us (x floor)" for m in rows)
    lines = markdown_header(("layer", "N x K", *heads))
    for shape in sorted(table, key=lambda s: s[0] * s[1]):
        cells = []
        for m in rows:
            r = table[shape].get(m)
            floor = r["unique_bytes"] / r["copy_bytes_per_s"] if r else 0.0
            cells.append(f"{r['median_s'] * 1e6:.1f} ({r['median_s'] / floor:.2f})" if r else "")
        lines.append(markdown_row((names[shape], f"{shape[0]} x {shape[1]}", *cells)))
    return "\n".join(lines) + "\n"


def _ratio(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _stage_rows() -> list[dict]:
    return read_json(record_path("nsa-stages-h200.json"), "NSA stages")["rows"]


def papers_block() -> str:
    """The seeds' figures beside ssvkit's (``ssvkit papers --markdown``'s output)."""
    return papers_markdown(reproduce())


# Each block's markers and what fills them.
BLOCKS = {
    "validate": validate_block,
    "validate-h200": lambda: validate_block("h200"),
    "transfer": transfer_block,
    "unseen-h200": unseen_block,
    "intervals": intervals_block,
    "planner": planner_block,
    "planner-b32": lambda: planner_block(record_path("planner-b32-h200.json")),
    "adaptive-b32": lambda: adaptive_phase_block(record_path("planner-adaptive-b32-h200.json")),
    "papers": papers_block,
    "scale-llama": lambda: campaign_table_block(record_path("scale-campaign-h200.json")),
    "scale-glm": lambda: campaign_table_block(record_path("scale-campaign-glm-h200.json")),
    "scale-glm-large": lambda: campaign_table_block(
        record_path("scale-campaign-glm-large-h200.json")
    ),
    "floors-h100": lambda: floor_targets_block("h100-sxm", (1, 16, 64)),
    "floors-h200": lambda: floor_targets_block("h200", (1, 4, 16)),
    "linear-h200": lambda: linear_floor_block("h200", "llama-3.1-8b", (1, 16, 32, 64)),
    "nsa-stages": lambda: calls_markdown(_stage_rows()),
    "nsa-stages-pdl": lambda: pdl_markdown(_stage_rows()),
    "nsa-launches": lambda: launches_markdown(
        read_json(record_path("nsa-launches-h200.json"), "NSA launches")["rows"]
    ),
    "engine-verify": lambda: _engine_verify_block("engine-verify-h200.json", "h200"),
    "engine-verify-mean": lambda: _engine_verify_block("engine-verify-mean-h200.json", "h200"),
}


def _engine_verify_block(name: str, gpu: str) -> str:
    """The verify-step table of the ``engine_verify`` document ``name``, predicted with ``gpu``'s
    committed profile as it is now."""
    doc = read_json(record_path(name), "engine verify")
    return verify_markdown(doc, current_predictions(doc, gpu))


def render(text: str) -> str:
    """``text`` with every block between its markers regenerated."""
    for name, fill in BLOCKS.items():
        text = _block(name).sub(lambda m, fill=fill: m.group(1) + fill() + m.group(2), text)
    return text


def stale_blocks(text: str) -> list[str]:
    """The names of ``text``'s generated blocks whose content differs from what they render to
    now (a block is filled only where its markers are)."""
    return [
        name
        for name, fill in BLOCKS.items()
        if _block(name).sub(lambda m, fill=fill: m.group(1) + fill() + m.group(2), text) != text
    ]


def main(argv=None, documents=DOCUMENTS) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a document's generated block is stale, naming it; write nothing",
    )
    args = ap.parse_args(argv)
    if not args.check:
        for doc in documents:
            atomic_write(doc, render(doc.read_text()), "document")
        return 0
    stale = [(doc, name) for doc in documents for name in stale_blocks(doc.read_text())]
    for doc, name in stale:
        print(
            f"{doc.name}: block {name!r} is stale: python -m ssvkit.validation.readme",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
