"""Engine tests: tiny random models on the CPU (torch path), the real Triton kernels under the
CPU interpreter, and GPU-only tests marked ``gpu`` (skipped without CUDA).

``TRITON_INTERPRET`` must be set before triton is first imported, so it is set here, before any
engine module (which imports the kernels) is imported by a test module. Helpers live in
``engine_helpers.py`` (a unique module name: several test folders have a ``conftest``).
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
