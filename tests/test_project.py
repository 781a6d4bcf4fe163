"""Project-level invariants: the base install stays torch-free, README and CI agree, the README's
sample output is current and the layer pictures match the import contract."""

import ast
import os
import platform
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_perfmodel_never_imports_torch():
    """perfmodel, the CLI's entry point and what ``ssvkit report`` and ``ssvkit papers`` run
    import neither torch nor Triton: the base install has neither."""
    code = (
        "import sys, ssvkit.perfmodel, ssvkit.perfmodel.step, ssvkit.perfmodel.baselines, "
        "ssvkit.perfmodel.saguaro, ssvkit.perfmodel.prr, ssvkit.perfmodel.sparsespec, "
        "ssvkit.perfmodel.refresh, ssvkit.perfmodel.seed_formulas, ssvkit.cli, "
        "ssvkit.cli.papers_cmd, ssvkit.validation.report, "
        "ssvkit.validation.report_markdown, ssvkit.validation.readme, "
        "ssvkit.validation.papers; "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_command_line_starts_without_the_simulator():
    """``ssvkit.cli`` imports every command module at start; the simulator (and simpy) load only
    when a command simulates, so ``ssvkit decode`` runs where simpy is absent."""
    code = "import sys, ssvkit.cli; assert 'simpy' not in sys.modules, 'simpy imported'"
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
    that names a package (``name/``, ``ssvkit/cli/`` for ``cli``)."""
    text = path.read_text()
    block = re.search(rf"{re.escape(heading)}\n.*?```\n(.*?)```", text, flags=re.S).group(1)
    rows = [
        {m.split("/")[-1] for m in re.findall(r"\b([\w/]+)/", line)} for line in block.splitlines()
    ]
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


PACKAGES = (
    "perfmodel",
    "sim",
    "kernels",
    "calibration",
    "engine",
    "planner",
    "sweep",
    "validation",
)
SOURCE_FOLDERS = ("ssvkit", *PACKAGES, "tests", "benchmarks")


def test_every_package_folder_installs_under_ssvkit():
    """pip installs one import package: each top-level folder maps to ``ssvkit.<folder>`` and
    every folder with an ``__init__.py`` under them is listed (none left out of a wheel)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg["package-dir"]
    assert dirs == {"ssvkit": "ssvkit", **{f"ssvkit.{p}": p for p in PACKAGES}}
    found = {
        ".".join((name, *init.parent.relative_to(ROOT / folder).parts))
        for name, folder in dirs.items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert found == set(cfg["packages"])


def test_every_module_imports():
    """Every module of every installed package imports (a command of record such as
    ``python -m ssvkit.validation.<name>`` must not fail on a name another module moved)."""
    import importlib
    import pkgutil

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    failed = {}
    for pkg in packages["packages"]:
        for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__, pkg + "."):
            if (
                info.ispkg
                or info.name.endswith(".__main__")
                or info.name.startswith("ssvkit.ssvkit")
            ):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as e:  # noqa: BLE001 - every failure is reported together
                failed[info.name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


def _top_level_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_code_imports_the_packages_only_through_ssvkit():
    """``import perfmodel`` would load a second copy of a module beside ``ssvkit.perfmodel``
    in a checkout (and fail when installed)."""
    bad = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder in SOURCE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in _top_level_imports(path)
        if name.split(".")[0] in PACKAGES
    ]
    assert not bad, bad


def _openblas_corename() -> str | None:
    """The kernels numpy's bundled OpenBLAS runs (``scipy_openblas_get_corename64_``), or None
    where this numpy build bundles no such library."""
    import ctypes

    import numpy

    libs = sorted((Path(numpy.__file__).parent.parent / "numpy.libs").glob("*openblas*"))
    if not libs:
        return None
    fn = getattr(ctypes.CDLL(str(libs[0])), "scipy_openblas_get_corename64_", None)
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")
def test_importing_ssvkit_first_pins_openblas_kernels():
    """The calibration fits' figures depend on OpenBLAS's kernels (ssvkit/__init__.py): a process
    that imports ssvkit before numpy runs the Haswell kernels, whatever the CPU, unless its
    environment names others. tests/conftest.py imports ssvkit before torch, so the test
    processes run them too."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    code = "import os, ssvkit, numpy; print(os.environ.get('OPENBLAS_CORETYPE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "Haswell", out.stderr
    chosen = subprocess.run(
        [sys.executable, "-c", code], env={**env, "OPENBLAS_CORETYPE": "Zen"}, capture_output=True
    )
    assert chosen.stdout.decode().strip() == "Zen"
    corename = _openblas_corename()
    if corename is not None:
        assert corename == "Haswell"
