import pytest
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.validation import nsa_stages, nsa_tile_plans

# NSA's published geometry (``nsa_stages.KW``) scaled down for the CPU interpreter: a quarter of
# its selected blocks, half its block size, an eighth of its window. Every branch, the
# selection and the merge run as at the published geometry, on fewer keys a program.
SMALL_NSA = dict(nsa_stages.KW, top_n=4, block_size=32, window=64)


@pytest.fixture
def small_nsa(monkeypatch):
    """The NSA benchmarks' inputs on the CPU (fp32: the interpreter's bf16 dot is wrong) at the
    tiny pair's attention geometry and ``SMALL_NSA``."""
    monkeypatch.setattr(ki, "DEVICE", "cpu")
    monkeypatch.setattr(ki, "DTYPE", torch.float32)
    geometry = zip(("NUM_Q_HEADS", "NUM_KV_HEADS", "HEAD_DIM"), ki.GEOMETRIES["tiny"], strict=True)
    for name, value in geometry:
        monkeypatch.setattr(ki, name, value)
    for module in (nsa_stages, nsa_tile_plans):
        monkeypatch.setattr(module, "KW", SMALL_NSA)
