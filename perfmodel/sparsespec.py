"""SparseSpec (seed 003): self-speculation with a sparse-attention draft, delayed verification,
and KV-cache offload traffic.

The seed's theoretical-speedup formula was lost in text extraction; it is re-derived here from
the mechanism the seed describes: the same model drafts k tokens with attention over a fraction
s of the KV cache (PillarAttn's top-K) and verifies them with one full-attention pass.
"""

from __future__ import annotations

import numpy as np

from perfmodel.acceptance import expected_tokens_per_round


def _check_fraction(name, x):
    a = np.asarray(x, dtype=float)
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")


def attention_reduction(num_draft_steps, sparsity_ratio):
    """KV bytes that AR decoding loads for k + 1 tokens over what one SparseSpec round loads:
    ``(k + 1) / (k s + 1)`` -- k sparse draft steps read s T each, one verification reads T
    once for all k + 1 queries. An upper bound: it assumes every draft is accepted."""
    _check_fraction("sparsity_ratio", sparsity_ratio)
    k = np.asarray(num_draft_steps, dtype=float)
    return (k + 1) / (k * np.asarray(sparsity_ratio) + 1)


def self_spec_speedup(num_draft_steps, sparsity_ratio, acceptance, attention_fraction):
    """Speedup of sparse self-speculation over AR decoding of the same model.

    With an AR step normalised to 1 and a fraction f of it spent loading the KV cache: a draft
    step costs ``f s + (1 - f)``, the verification of k + 1 tokens costs about one AR step
    (memory-bound: weights and KV read once). Speedup = ``E(alpha, k) / (k (f s + 1 - f) + 1)``.
    Ignores the verification's extra FLOPs and the scheduler's CPU time (see
    ``delayed_verification``). f = 1 and alpha = 1 recover ``attention_reduction``.
    """
    _check_fraction("attention_fraction", attention_fraction)
    _check_fraction("sparsity_ratio", sparsity_ratio)
    k = np.asarray(num_draft_steps, dtype=float)
    f, s = np.asarray(attention_fraction), np.asarray(sparsity_ratio)
    e = expected_tokens_per_round(acceptance, num_draft_steps)
    return e / (k * (f * s + 1 - f) + 1)


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


def new_kv_bytes_per_step(batch_size, kv_bytes_per_token_per_layer, num_layers):
    """KV bytes a decode step appends: ``B L kv_bytes_per_token`` (seed 003: 18 MB for
    Qwen3-8B at batch 128)."""
    return (
        np.asarray(batch_size, dtype=float) * kv_bytes_per_token_per_layer * np.asarray(num_layers)
    )


def offload_time_s(num_bytes, pcie_bytes_per_s):
    """Host-offload transfer time over PCIe (one direction)."""
    return np.asarray(num_bytes, dtype=float) / pcie_bytes_per_s


def offload_hidden(num_bytes, pcie_bytes_per_s, step_s):
    """True when the asynchronous offload of ``num_bytes`` finishes within one step, so it
    stays off the critical path (seed 003's dynamic KV manager offloads chunk-wise)."""
    return offload_time_s(num_bytes, pcie_bytes_per_s) <= np.asarray(step_s)
