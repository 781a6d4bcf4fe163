"""Where the engine's linear layers stream their weight, and what that lets a layer fuse.

``kernels.linear`` runs its weight-streaming kernel for few rows against a weight large enough
that its bytes, not a launch's latency, bound the layer; beyond these bounds a GEMM library's
kernels are as fast or faster on the H200 (``calibration/profiles/h200/op_sweep.jsonl``'s gemm
rows time whichever ``linear`` runs). Where every projection of a dense layer streams its
weight, the engine's fused forward runs the residual adds, the norms inside the layers and
``silu(gate) * up`` in the projections' launches (``engine.model.CausalLM.chains_norms``):
``chained_norms`` says where, per point, for the step model.
"""

from __future__ import annotations

import numpy as np

MAX_ROWS = 32
MIN_WEIGHT_BYTES = 16 * 2**20


def chained_norms(model, m, tp, fused):
    """1 where a fused forward of ``m`` rows at tensor parallelism ``tp`` chains its norms into
    its projections (every projection weight of a dense layer, on one rank, at least
    ``MIN_WEIGHT_BYTES``, at most ``MAX_ROWS`` rows), else 0; ``fused`` 1 marks the fused
    element-wise path. MoE and MLA layers do not chain."""
    m = np.asarray(m, dtype=float)
    if model.is_moe or model.is_mla:
        return np.zeros_like(m)
    d, dh = model.hidden_size, model.head_dim
    hq = np.ceil(model.num_q_heads / tp)
    hkv = np.ceil(model.num_kv_heads / tp)
    f = model.intermediate_size / tp
    params = (d * (hq + 2 * hkv) * dh, hq * dh * d, 2 * f * d, f * d)
    streams = np.ones_like(m)
    for p in params:
        streams = streams * (p * model.weight_bytes >= MIN_WEIGHT_BYTES)
    return np.asarray(fused, dtype=float) * (m <= MAX_ROWS) * streams
