"""Shared helpers of the engine tests: tiny random models and prompts."""

from __future__ import annotations

import torch
from ssvkit.engine.checkpoint import ModelSource, build_model
from ssvkit.engine.config import ModelConfig

HAS_CUDA = torch.cuda.is_available()
TINY = ModelConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
)


def tiny_model(
    cfg: ModelConfig = TINY,
    seed: int = 0,
    *,
    max_positions: int = 512,
    noise=0.0,
    device="cpu",
    dtype=torch.float32,
):
    """A random model; ``noise`` > 0 perturbs every weight by that share of its std (a draft
    that agrees with the target part of the time)."""
    m = build_model(
        ModelSource("tiny", cfg, None, seed),
        max_positions=max_positions,
        device=device,
        dtype=torch.float32,
    )
    if noise:
        g = torch.Generator(device=device).manual_seed(seed + 1000)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(noise * p.std() * torch.randn(p.shape, generator=g, device=device))
    return m.to(dtype)


def random_prompts(lengths, vocab=256, seed=1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
