"""Project-level invariants: the base install stays torch-free, README and CI agree, the README's
sample output is current and the layer pictures match the import contract."""

import re
import shlex
import subprocess
import sys
import tomllib
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


def test_readme_samples_are_the_current_output(capsys):
    """Every ```text block of the README that starts with ``$ ssvkit ...`` shows what that command
    prints now: a change to the cost model or the profile that moves a figure fails here."""
    from ssvkit.cli import main

    text = (ROOT / "README.md").read_text()
    samples = re.findall(r"```text\n\$ (ssvkit [^\n]*)\n(.*?)```", text, flags=re.S)
    assert samples, "the README shows no command output"
    for command, shown in samples:
        assert main(shlex.split(command)[1:]) == 0
        assert capsys.readouterr().out == shown, (
            f"the README's sample of `{command}` is stale: run it and paste its output"
        )


def _picture_rows(path: Path, heading: str) -> list[set[str]]:
    """The packages of each row of the first code block under ``heading``: one row per line
    that names a package (``name/``)."""
    text = path.read_text()
    block = re.search(rf"{re.escape(heading)}\n.*?```\n(.*?)```", text, flags=re.S).group(1)
    rows = [set(re.findall(r"\b(\w+)/", line)) for line in block.splitlines()]
    return [r for r in rows if r]


def test_layer_pictures_match_the_import_contract():
    """The pictures of docs/architecture.md and the README draw the layers of the import-linter
    contract, top to bottom, with independent packages side by side."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    layers = [set(x.split(" | ")) for x in contract["layers"]]
    assert _picture_rows(ROOT / "docs" / "architecture.md", "## Layers and their imports") == (
        layers
    )
    assert _picture_rows(ROOT / "README.md", "## Layers") == layers
