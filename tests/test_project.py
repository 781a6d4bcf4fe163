"""Project-level invariants: the base install stays torch-free, README and CI agree."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_perfmodel_never_imports_torch():
    """perfmodel, the CLI's entry point and what ``ssvkit report`` and ``ssvkit papers`` run
    import neither torch nor Triton: the base install has neither."""
    code = (
        "import sys, perfmodel, perfmodel.step, perfmodel.baselines, perfmodel.saguaro, "
        "perfmodel.prr, perfmodel.sparsespec, perfmodel.refresh, perfmodel.seed_formulas, "
        "ssvkit.cli, ssvkit.papers_cmd, validation.report, validation.report_markdown, "
        "validation.readme, validation.papers; "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks[:1] for line in b.strip().splitlines()]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "ssvkit predict" in cmds[0]
    assert "pytest" in cmds[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmds[1] in ci
