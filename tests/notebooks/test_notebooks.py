"""The notebooks under notebooks/ run top to bottom on the CPU and are committed without
outputs (they are regenerated here, never stored)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

# A hang guard for the kernel's start and each cell, not a speed check.
HANG_S = 900
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
# What each notebook must print: evidence that its main steps ran, not just that nothing raised.
EXPECT = {
    "01_capacity_planning.ipynb": ("189 points", "gpus_needed", "image/png"),
    "02_calibration_report.ipynb": ("Targets: heldout_median_ape", "heldout_p90_ape", "image/png"),
    "03_seed_figures.ipynb": ("'AR NSA': 1.0", "planned tuple: ssv", "image/png"),
}


def test_the_three_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == sorted(EXPECT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_clean(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit without outputs"
    client = nbclient.NotebookClient(
        nb,
        timeout=HANG_S,
        startup_timeout=HANG_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first failure
    text = []
    for c in code:
        for o in c.outputs:
            text.append(o.get("text", ""))
            for kind, value in o.get("data", {}).items():
                text.append(kind if kind == "image/png" else str(value))
    blob = "\n".join(text)
    for needle in EXPECT[path.name]:
        assert needle in blob, (path.name, needle)
