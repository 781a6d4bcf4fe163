"""Kernel tests run on the GPU when there is one, else under Triton's CPU interpreter (which
``tests/conftest.py`` selects, as it skips the tests marked ``gpu`` without CUDA).
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA, assert_close


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def close():
    return assert_close
