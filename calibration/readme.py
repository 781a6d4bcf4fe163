"""Regenerate the README's generated blocks from committed data.

python -m calibration.readme          # rewrites the blocks between their markers

- ``validate``: the calibration's accuracy, ``ssvkit validate --markdown``;
- ``planner``: the planner evaluation installed in ``docs/validation/planner.json`` (issue #7):
  ranking quality per regime and adaptive gain per prompt set, with what the measurement
  resolves (``calibration.report.planner_section``, as the report derives it).
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)


def current_block() -> str:
    from ssvkit.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        main(["validate", "--markdown"])
    return buf.getvalue()


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def planner_block(path: Path | None = None) -> str:
    """The planner evaluation's figures as README markdown (tables, targets, provenance)."""
    from calibration.report import ROOT, load_json, planner_section
    from planner.evaluate import OFF_DISTRIBUTION

    path = path or ROOT / "docs" / "validation" / "planner.json"
    doc = load_json(path, "planner evaluation")
    pl = planner_section(doc)
    prov, t = pl["provenance"], pl["targets"]
    lines = [
        f"Evaluation `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` "
        f"(commit {str(prov.get('git_commit'))[:7]}, {str(prov.get('timestamp'))[:10]}, "
        f"{prov.get('device_name')}): the trained tiny pair, {doc['measure_texts']} held-out "
        f"code windows per measured strategy, {doc['repeats']} seeds per prompt set.",
        "",
        "| regime | context | strategies measured | Kendall tau | regret | measured pair s.e. |",
        "|---|---|---|---|---|---|",
    ]
    for r, v in doc["regimes"].items():
        m = pl["measurement"].get(r)
        se = f"{100 * m['pair_ratio_se']:.1f}%" if m else "n/a"
        lines.append(
            f"| {r} | {v['context_len']} | {v['n']} | {pl['kendall_tau'][r]:.2f} | "
            f"{100 * pl['regret'][r]:.1f}% | {se} |"
        )
    a = doc["adaptive"]
    # The offline best by name: the oracle's strategies and the measured ones carry it.
    names = {
        x["id"]: x["describe"].split(" | ")[0]
        for v in a["prompt_sets"].values()
        for x in (v.get("oracle") or {}).get("strategies", [])
    }
    names.update(
        {
            x["id"]: x["describe"].split(" | ")[0]
            for v in doc["regimes"].values()
            for x in v["strategies"]
        }
    )
    lines += [
        "",
        f"Adaptive at {a['context_len']} tokens ({a['regime']}), against the fixed offline best:",
        "",
        "| prompt set | offline best | its tokens/s | adaptive gain | 90% interval "
        "| best fixed alternative | fastest per seed, in hindsight |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, v in a["prompt_sets"].items():
        m = pl["adaptive_resolution"].get(k) or {}
        band = f"{_pct(m['gain_p05'])} to {_pct(m['gain_p95'])}" if m else "n/a"
        c, h = m.get("challenger"), m.get("hindsight")
        alt = f"{_pct(c['gain'])} ({c['describe'].split(' | ')[0]})" if c else "n/a"
        off = " (off distribution)" if k in OFF_DISTRIBUTION else ""
        lines.append(
            f"| {k}{off} | {names.get(v['offline_best']['id'], v['offline_best']['id'])} "
            f"| {v['offline_best']['tokens_per_s']:.0f} | {_pct(v['adaptive_gain'])} "
            f"| {band} | {alt} | {_pct(h['gain']) if h else 'n/a'} |"
        )
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


# Each block's markers and what fills them.
BLOCKS = {"validate": current_block, "planner": planner_block}


def render(text: str) -> str:
    for name, fill in BLOCKS.items():
        text = _block(name).sub(lambda m, fill=fill: m.group(1) + fill() + m.group(2), text)
    return text


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
