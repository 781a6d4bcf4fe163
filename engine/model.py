"""A Llama-family decoder in torch: RMSNorm, RoPE, GQA attention through a callback, SwiGLU.

The model does not own its attention algorithm or its cache layout: every layer projects
``q, k, v``, writes ``k, v`` into the cache at the given slots and hands ``q`` to an ``attend``
callback (``engine.attention``), which runs dense, sparse or NSA verification (or causal
prefill) over the cache. So one forward serves prefill, the draft-tree verify step and the
drafters, on the Triton kernels or their torch references.

Parameters are named like Hugging Face's ``LlamaForCausalLM`` except that q/k/v and gate/up are
fused into one projection each (one GEMM instead of three or two); ``engine.checkpoint`` maps the
names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.rope import apply_rope, expand_angles, rope_tables

# attend(layer, q [B, t, H, D]) -> o [B, t, H, D]; the layer's k, v are already in the cache.
Attend = Callable[[int, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel on CUDA (fp32 accumulation inside).
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.interleaved = cfg.rope_interleaved
        qkv_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, qkv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, write_kv, attend: Attend, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        qk = qkv[..., : (h + hkv) * d].view(b, t, h + hkv, d)
        v = qkv[..., (h + hkv) * d :].view(b, t, hkv, d)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])), dim=2)
        qk = apply_rope(qk, cos, sin, interleaved=self.interleaved)  # q and k in one pass
        q, k = qk[:, :, :h].contiguous(), qk[:, :, h:]
        write_kv(layer, k, v)
        o = attend(layer, q)  # [B, t, H, D]
        return self.o_proj(o.reshape(b, t, h * d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, write_kv, attend, layer) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, write_kv, attend, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder plus LM head. ``forward`` returns float32 logits ``[B, t, V]`` and, on request,
    the final (normed) hidden states ``[B, t, d]``."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = (
            None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, False)
        )
        # The tables follow the parameters' device (``with torch.device(...)`` construction).
        cos, sin = rope_tables(cfg, max_positions, device=self.model.embed_tokens.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def max_positions(self) -> int:
        return self.rope_cos.shape[0]

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write_kv: Callable[[int, torch.Tensor, torch.Tensor], None],
        attend: Attend,
        *,
        return_hidden: bool = False,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``tokens`` ``[B, t]`` at RoPE ``positions`` ``[B, t]`` (int64, device).

        ``write_kv(layer, k, v)`` stores the layer's ``[B, t, Hkv, D]`` keys/values in the
        cache; ``attend(layer, q)`` returns the attention output. ``last_only`` computes the
        logits (and hidden states) of the last row only (prefill). No host synchronisation.
        """
        cos, sin = expand_angles(
            self.rope_cos[positions],
            self.rope_sin[positions],
            interleaved=self.config.rope_interleaved,
        )  # [B, t, 1, R]
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, write_kv, attend, i)
        hidden = self.model.norm(x[:, -1:] if last_only else x)
        head = self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight
        logits = F.linear(hidden, head).float()
        return logits, (hidden if return_hidden else None)
