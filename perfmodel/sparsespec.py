"""SparseSpec (seed 003): delayed verification, the step and round times the simulator's
unified batch uses, and the host-offload transfer time. The seed's closed-form speedup and
whether an offload hides behind a step are in
``perfmodel.seed_formulas`` (off the cost path).
"""

from __future__ import annotations

import numpy as np


def delayed_verification(gpu_step_s, cpu_step_s, num_draft_steps):
    """Step time and per-request round latency with and without delayed verification.

    Synchronous: the CPU waits for verification results before preparing the next step, so a
    step costs ``T_gpu + T_cpu``. Delayed: the CPU prepares step i+1 while the GPU runs step i,
    a step costs ``max(T_gpu, T_cpu)``, and requests in their verification bucket (1/(k+1) of
    the batch) stall one step. Returns a dict of seconds: ``sync_step_s``, ``delayed_step_s``,
    ``sync_round_s`` = (k+1) sync steps, ``delayed_round_s`` = (k+2) delayed steps.
    """
    g, c = np.asarray(gpu_step_s, dtype=float), np.asarray(cpu_step_s, dtype=float)
    k = np.asarray(num_draft_steps, dtype=float)
    sync, delayed = g + c, np.maximum(g, c)
    return {
        "sync_step_s": sync,
        "delayed_step_s": delayed,
        "sync_round_s": (k + 1) * sync,
        "delayed_round_s": (k + 2) * delayed,
    }


def offload_time_s(num_bytes, pcie_bytes_per_s):
    """Host-offload transfer time over PCIe (one direction)."""
    return np.asarray(num_bytes, dtype=float) / pcie_bytes_per_s
