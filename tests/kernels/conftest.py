"""Kernel tests run on the GPU when there is one, else under Triton's CPU interpreter (which
``tests/conftest.py`` selects). Tests marked ``gpu`` are skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA, assert_close


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
