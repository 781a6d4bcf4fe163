"""Calibration tests import the sweeps, which import ``kernels.timing`` and so triton: without
CUDA, ``TRITON_INTERPRET`` is set here, before triton is first imported, as the kernel and
engine tests collected after these need it (``triton.jit`` reads it when a kernel is decorated).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
