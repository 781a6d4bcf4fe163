"""FLOPs of attention, FFN and MoE layers, dense and sparse (seed 001, Table 1).

Symbols as in the table: B batch, T sequence length, d hidden size, d_f FFN width, d_e expert
width, E experts, k active experts per token, s_a / s_f / s_e the sparsity of attention, of the
FFN down/up channels and of the active experts. Each formula counts one layer and treats a
multiply-add as two FLOPs. The attention rows count the Q, K and V projections as
6 B T d^2 (MHA, d_q = d_kv = d; the table leaves the output projection out) and score plus PV
over all T^2 pairs as 4 B T^2 d (no causal halving). The FFN rows are a gated MLP (gate,
up, down). The MoE router is 2 B T d E.
"""

from __future__ import annotations

import numpy as np


def _f(x):
    return np.asarray(x, dtype=float)


def _check_sparsity(name, s):
    a = _f(s)
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1], got {s!r}")


def full_attention_flops(B, T, d):
    """``6 B T d^2 + 4 B T^2 d``."""
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * d**2 + 4 * B * T**2 * d


def sparse_attention_flops(B, T, d, s_a):
    """``6 B T d^2 + 4 B (1 - s_a) T^2 d``: the projections stay dense."""
    _check_sparsity("s_a", s_a)
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * d**2 + 4 * B * (1 - _f(s_a)) * T**2 * d


def dense_ffn_flops(B, T, d, d_f):
    """``6 B T d d_f`` (gate, up and down projections)."""
    return 6 * _f(B) * _f(T) * _f(d) * _f(d_f)


def sparse_ffn_flops(B, T, d, d_f, s_f):
    """``2 B T d d_f (3 - 2 s_f)``: the gate stays dense, up and down skip the s_f inactive
    channels (seed 001 eqs. 12-14)."""
    _check_sparsity("s_f", s_f)
    return 2 * _f(B) * _f(T) * _f(d) * _f(d_f) * (3 - 2 * _f(s_f))


def moe_ffn_flops(B, T, d, d_e, k, E):
    """``6 B T k d d_e + 2 B T d E``: k experts of width d_e per token plus the router."""
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * _f(k) * d * _f(d_e) + 2 * B * T * d * _f(E)


def sparse_moe_flops(B, T, d, d_e, k, E, s_e):
    """``6 B T (1 - s_e) k d d_e + 2 B T d E``: s_e of the active experts are skipped
    (seed 001 eqs. 15-16); the router still scores every expert."""
    _check_sparsity("s_e", s_e)
    B, T, d = _f(B), _f(T), _f(d)
    return 6 * B * T * (1 - _f(s_e)) * _f(k) * d * _f(d_e) + 2 * B * T * d * _f(E)


def reduction(dense, sparse):
    """Fractional FLOPs saved, ``1 - sparse / dense``."""
    return 1.0 - _f(sparse) / _f(dense)
