"""Rotary position embedding: inverse frequencies (incl. Llama-3 scaling) and its application.

``inv_freq[i] = theta^(-2i / R)`` for the ``R = rotary_dim`` rotated dimensions. Llama-3's
``rope_scaling`` (``rope_type = llama3``) divides the low frequencies by ``factor`` and blends
the band between ``low_freq_factor`` and ``high_freq_factor`` (Meta's reference code, as in HF
``_compute_llama3_parameters``); ``linear`` divides every frequency by ``factor``.

Two pairings: Llama/Qwen rotate ``(x_i, x_{i + R/2})`` ("rotate half"); GLM rotates adjacent
pairs ``(x_{2i}, x_{2i+1})``. Dimensions past ``R`` (partial rotary) pass through unchanged.
"""

from __future__ import annotations

import math

import torch
from ssvkit.engine.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """``[R / 2]`` float64 inverse frequencies after the config's rope scaling."""
    r = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    scaling = dict(cfg.rope_scaling or ())
    kind = cfg.rope_type
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind != "llama3":
        return inv
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rope_tables(
    cfg: ModelConfig, num_positions: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[num_positions, R / 2]`` float32 for positions ``0..num_positions-1``
    (angles computed in float64, so long contexts keep their precision)."""
    pos = torch.arange(num_positions, dtype=torch.float64)
    ang = pos[:, None] * inv_frequencies(cfg)[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def expand_angles(
    cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, t, R/2]`` angles -> ``[B, t, 1, R]`` factors for ``apply_rope``: each frequency
    repeated for its pair (adjacent for GLM, halves for Llama). Done once per forward."""
    if interleaved:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    else:
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return cos[:, :, None, :], sin[:, :, None, :]


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool
) -> torch.Tensor:
    """Rotate ``x`` ``[B, t, heads, D]`` by ``expand_angles``' factors ``[B, t, 1, R]``:
    ``x * cos + rotate(x) * sin`` on the first ``R`` dims, in float32, returned in ``x.dtype``
    (a handful of element-wise kernels: the verify step runs it once for q and k together)."""
    r = cos.shape[-1]
    xf = x.float()
    rot = xf[..., :r]
    if interleaved:
        turned = torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)
    else:
        turned = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    out = torch.addcmul(rot * cos, turned, sin)
    if r < x.shape[-1]:
        out = torch.cat((out, xf[..., r:]), dim=-1)
    return out.to(x.dtype)
