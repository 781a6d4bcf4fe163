"""Engine tests: tiny random models on the CPU (torch path), the real Triton kernels under the
CPU interpreter (``tests/conftest.py`` selects it), and GPU-only tests marked ``gpu`` (skipped
without CUDA). Helpers live in ``engine_helpers.py`` (a unique module name: several test
folders have a ``conftest``).
"""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
