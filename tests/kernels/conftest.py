"""Kernel tests run on the GPU when there is one, else under Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before triton is first imported (``triton.jit`` reads it when a
kernel is decorated), so this runs before any test module imports ``kernels.*``. Tests marked
``gpu`` are skipped without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch
from kernel_helpers import HAS_CUDA, assert_close

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def close():
    return assert_close
