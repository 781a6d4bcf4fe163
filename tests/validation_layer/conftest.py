import pytest
from ssvkit.validation import nsa_stages, nsa_tile_plans

# NSA's published geometry (``nsa_stages.KW``) scaled down for the CPU interpreter: a quarter of
# its selected blocks, half its block size, an eighth of its window. Every branch, the
# selection and the merge run as at the published geometry, on fewer keys a program.
SMALL_NSA = dict(nsa_stages.KW, top_n=4, block_size=32, window=64)


@pytest.fixture
def small_nsa(tiny_cpu, monkeypatch):
    """The NSA benchmarks' inputs on the CPU interpreter (``tiny_cpu``) at ``SMALL_NSA``."""
    for module in (nsa_stages, nsa_tile_plans):
        monkeypatch.setattr(module, "KW", SMALL_NSA)
