"""fp32 torch reference of :func:`kernels.nsa_verify.nsa_verify`: one masked softmax per branch.

Written from the semantics in :mod:`kernels.nsa_verify` without sharing code with the kernel
path (the block selection uses python loops), so the tests compare two independent readings.
"""

from __future__ import annotations

import math

import torch
from ssvkit.kernels.nsa_compress import num_compressed
from ssvkit.kernels.tree import MAX_TREE_NODES


def _masked_attention(q, k, v, mask, scale):
    """fp32 softmax attention with a boolean mask; an all-masked row gives 0 output and 0
    probabilities. Keys no row may see are zeroed first, so whatever they hold (NaN in the
    tests) cannot leak through ``0 * x``. Returns ``(o, p)``."""
    seen = mask.any(-2).unsqueeze(-1)  # [..., N, 1]
    k = torch.where(seen, k, 0.0)
    v = torch.where(seen, v, 0.0)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    denom = e.sum(-1, keepdim=True)
    p = torch.where(denom > 0, e / torch.where(denom > 0, denom, 1.0), 0.0)
    return p @ v, p


def _reference_select(
    p_c,
    prefix_lens,
    *,
    num_kv_heads,
    nb_max,
    top_n,
    block_size,
    comp_block,
    comp_stride,
    num_sink,
    num_local,
) -> torch.Tensor:
    """NSA block selection written independently of the kernel path (python loops)."""
    b, h, t, nc_max = p_c.shape
    per_tok = p_c.view(b, num_kv_heads, h // num_kv_heads, t, nc_max).sum(2)  # [B, Hkv, t, NC]
    start = torch.arange(nc_max, device=p_c.device) * comp_stride
    j = torch.arange(nb_max, device=p_c.device)
    overlap = (start[:, None] < (j + 1) * block_size) & (
        start[:, None] + comp_block > j * block_size
    )
    imp = (per_tok @ overlap.float()).cpu()  # [B, Hkv, t, NB]
    out = torch.full((b, num_kv_heads, t, top_n), -1, dtype=torch.int32)
    for bi, length in enumerate(prefix_lens.tolist()):
        nb = -(-length // block_size)
        forced = set(range(min(num_sink, nb))) | set(range(max(nb - num_local, 0), nb))
        for hi in range(num_kv_heads):
            for ti in range(t):
                order = torch.argsort(imp[bi, hi, ti, :nb], descending=True, stable=True)
                rest = [x for x in order.tolist() if x not in forced]
                chosen = sorted(forced | set(rest[: top_n - len(forced)]))
                out[bi, hi, ti, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out.to(p_c.device)


def reference_nsa_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    comp_k: torch.Tensor,
    comp_v: torch.Tensor,
    gates: torch.Tensor,
    *,
    block_idx: torch.Tensor | None = None,
    top_n: int,
    block_size: int,
    window: int,
    comp_block: int,
    comp_stride: int,
    num_sink: int = 1,
    num_local: int = 1,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 torch reference of :func:`nsa_verify`: one masked softmax per branch.

    Returns the fp32 output ``[B, t, H, D]`` and the block indices (given, or selected from the
    compressed-branch probabilities by NSA's overlap rule with python loops).
    """
    b, t, h, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    dev = q.device
    qf = q.float().transpose(1, 2)  # [B, H, t, D]
    k = k_cache.float().repeat_interleave(g, 1)  # [B, H, T_max, D]
    v = v_cache.float().repeat_interleave(g, 1)
    lens = prefix_lens.long().view(b, 1)
    pos = torch.arange(t_max, device=dev)

    nc_max = comp_k.shape[2]
    nc = num_compressed(prefix_lens, comp_block, comp_stride).long().view(b, 1, 1, 1)
    mask_c = (torch.arange(nc_max, device=dev) < nc).expand(b, h, t, nc_max)
    ck = comp_k.float().repeat_interleave(g, 1)
    cv = comp_v.float().repeat_interleave(g, 1)
    o_c, p_c = _masked_attention(qf, ck, cv, mask_c, scale)

    nb_max = -(-t_max // block_size)
    if block_idx is None:
        block_idx = _reference_select(
            p_c,
            prefix_lens,
            num_kv_heads=hkv,
            nb_max=nb_max,
            top_n=top_n,
            block_size=block_size,
            comp_block=comp_block,
            comp_stride=comp_stride,
            num_sink=num_sink,
            num_local=num_local,
        )
    chosen = torch.zeros(b, hkv, t, nb_max + 1, dtype=torch.bool, device=dev)
    chosen.scatter_(-1, torch.where(block_idx >= 0, block_idx.long(), nb_max), True)
    tok_sel = chosen[..., :nb_max].repeat_interleave(block_size, -1)[..., :t_max]
    tok_sel = tok_sel & (pos < lens.view(b, 1, 1, 1))  # [B, Hkv, t, T_max]
    o_s, _ = _masked_attention(qf, k, v, tok_sel.repeat_interleave(g, 1), scale)

    in_win = (pos >= (lens - window).clamp(min=0)) & (pos < lens)  # [B, T_max]
    j = (pos - lens).view(b, 1, t_max)  # tail index of each position
    bits = torch.bitwise_right_shift(tree_mask.view(b, t, 1), j.clamp(0, MAX_TREE_NODES - 1))
    in_tail = (j >= 0) & (j < t) & ((bits & 1) == 1)  # [B, t, T_max]
    mask_w = (in_win.view(b, 1, t_max) | in_tail).view(b, 1, t, t_max).expand(b, h, t, t_max)
    o_w, _ = _masked_attention(qf, k, v, mask_w, scale)

    gf = gates.float().transpose(1, 2)  # [B, H, t, 3]
    o = gf[..., 0:1] * o_c + gf[..., 1:2] * o_s + gf[..., 2:3] * o_w
    return o.transpose(1, 2).contiguous(), block_idx
