"""A Llama-family decoder in torch: RMSNorm, RoPE, GQA attention through a callback, SwiGLU.

The model does not own its attention algorithm or its cache layout: every layer projects
``q, k, v``, stores ``k, v`` through a ``KVSink`` and hands ``q`` to an ``attend`` callback
(``engine.attention``), which runs dense, sparse or NSA verification (or causal prefill) over the
cache. So one forward serves prefill, the draft-tree verify step and the drafters.

Two backends: ``torch`` runs every op in torch (the reference; training needs it for autograd),
``triton`` the element-wise ops as fused ``kernels.layer_ops`` / ``kernels.rope_kv_write``
launches and the linear layers through ``kernels.linear`` (``CausalLM.forward``). Parameters
are named like Hugging Face's ``LlamaForCausalLM`` except that q/k/v and gate/up are fused into
one projection each (one GEMM instead of three or two); ``engine.checkpoint`` maps the names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from ssvkit.engine.cache import KVTarget
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.rope import apply_rope, expand_angles, rope_tables
from ssvkit.kernels.layer_ops import add_rms_norm, embed, rms_norm, silu_mul
from ssvkit.kernels.linear import kernel_streams, linear, linear_add_norm
from ssvkit.kernels.rope_kv_write import rope_kv_write
from torch import nn

BACKENDS = ("torch", "triton")

# attend(layer, q [B, t, H, D]) -> o [B, t, H, D]; the layer's k, v are already in the cache.
Attend = Callable[[int, torch.Tensor], torch.Tensor]


class KVSink(Protocol):
    """Where each layer's keys and values go. The torch backend calls ``write``; the triton
    backend calls ``target`` and its rotary kernel stores k and v there (a sink that keeps no
    cache, like training's, serves the torch backend only)."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the layer's rotated ``k`` and ``v`` ``[B, t, Hkv, D]``."""

    def target(self, layer: int) -> KVTarget:
        """The layer's cache views and the rows' slots (no allocation, no host read)."""


def project(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` through ``kernels.linear`` (the weight-streaming kernel at decode row
    counts): the triton backend's linear layers. Like its other kernels it records no autograd
    graph; training runs the torch backend."""
    return linear(x, layer.weight, layer.bias)


class WeightOps(NamedTuple):
    """How a backend applies its weights: ``project(layer, x)`` a linear layer, ``head(x,
    weight)`` the LM head (a bare weight: it may be the tied embedding), ``embed(ids, table)``
    the token embedding."""

    project: Callable[[nn.Linear, torch.Tensor], torch.Tensor]
    head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def weight_ops(backend: str) -> WeightOps:
    """The ``WeightOps`` of ``backend``: torch's modules and functions, or the triton
    backend's kernels (``kernels.linear``, ``kernels.layer_ops.embed``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton":
        return WeightOps(project, linear, embed)
    return WeightOps(lambda layer, x: layer(x), F.linear, F.embedding)


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
        self.num_q_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.interleaved = cfg.rope_interleaved
        self.rotary_dim = cfg.rotary_dim
        qkv_out = (cfg.num_q_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, qkv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_q_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, kv: KVSink, attend: Attend, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        h, hkv, d = self.num_q_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        qk = qkv[..., : (h + hkv) * d].view(b, t, h + hkv, d)
        v = qkv[..., (h + hkv) * d :].view(b, t, hkv, d)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])), dim=2)
        qk = apply_rope(qk, cos, sin, interleaved=self.interleaved)  # q and k in one pass
        q, k = qk[:, :, :h].contiguous(), qk[:, :, h:]
        kv.write(layer, k, v)
        o = attend(layer, q)  # [B, t, H, D]
        return self.o_proj(o.reshape(b, t, h * d))

    def forward_fused(self, x, positions, cos_table, sin_table, kv: KVSink, attend, layer: int):
        """``forward`` with the q/k norm, rotary and the KV store in one Triton launch."""
        o = self.attend_fused(x, positions, cos_table, sin_table, kv, attend, layer)
        return project(self.o_proj, o)

    def attend_fused(
        self, x, positions, cos_table, sin_table, kv: KVSink, attend, layer: int, pending=None
    ) -> torch.Tensor:
        """``forward_fused`` up to the output projection: the attention output ``[B, t, H *
        D]``. ``pending`` is the input's RMSNorm still to apply (``kernels.linear.PendingNorm``:
        ``x`` holds the input times the norm's weight)."""
        b, t, _ = x.shape
        qkv = linear(x, self.qkv_proj.weight, self.qkv_proj.bias, pending=pending)
        q = self.rope_store(qkv, positions, cos_table, sin_table, kv.target(layer))
        o = attend(layer, q)  # [B, t, H, D]
        return o.reshape(b, t, self.num_q_heads * self.head_dim)

    def rope_store(self, qkv, positions, cos_table, sin_table, target: KVTarget) -> torch.Tensor:
        """``kernels.rope_kv_write`` of the projection ``qkv``: k and v stored at ``target``,
        the rotated q ``[B, t, H, D]`` returned."""
        return rope_kv_write(
            qkv,
            cos_table,
            sin_table,
            positions,
            target.k_cache,
            target.v_cache,
            target.slots,
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rotary_dim=self.rotary_dim,
            interleaved=self.interleaved,
            q_norm_weight=None if self.q_norm is None else self.q_norm.weight,
            k_norm_weight=None if self.k_norm is None else self.k_norm.weight,
            eps=None if self.q_norm is None else self.q_norm.eps,
            validate=False,
        )


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        return project(self.down_proj, silu_mul(project(self.gate_up_proj, x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv, attend, layer) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, attend, layer)
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
        kv: KVSink,
        attend: Attend,
        *,
        backend: str = "torch",
        return_hidden: bool = False,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``tokens`` ``[B, t]`` at RoPE ``positions`` ``[B, t]`` (int64, device).

        ``kv`` stores each layer's ``[B, t, Hkv, D]`` keys/values in the cache; ``attend(layer,
        q)`` returns the attention output. ``backend`` picks torch ops or the fused Triton
        kernels: ``triton`` runs the element-wise ops as ``kernels.layer_ops`` /
        ``kernels.rope_kv_write`` launches, each residual add fused with the RMSNorm after it
        (the MLP's add with the next layer's input norm, the last one with the final norm),
        rotary and the KV store one launch that gathers the rope tables at the positions itself,
        ``silu(gate) * up`` one more, the token embedding one gather, and the linear layers
        ``kernels.linear``; where every projection streams its weight on that kernel
        (``chains_norms``), the residual adds, the norms inside the layers and ``silu(gate) *
        up`` run in the projections' launches instead. ``last_only`` computes the logits (and
        hidden states) of the last row only (prefill). No host synchronisation.
        """
        ops = weight_ops(backend)
        x = ops.embed(tokens, self.model.embed_tokens.weight)
        if backend == "triton":
            hidden = self._fused_layers(x, positions, kv, attend, last_only)
        else:
            cos, sin = expand_angles(
                self.rope_cos[positions],
                self.rope_sin[positions],
                interleaved=self.config.rope_interleaved,
            )  # [B, t, 1, R]
            for i, layer in enumerate(self.model.layers):
                x = layer(x, cos, sin, kv, attend, i)
            hidden = self.model.norm(x[:, -1:] if last_only else x)
        head = self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight
        logits = ops.head(hidden, head).float()
        return logits, (hidden if return_hidden else None)

    def _fused_layers(self, x, positions, kv: KVSink, attend: Attend, last_only: bool):
        """The layers and the final norm on the Triton kernels: ``h`` is the normed input of the
        next block, ``x`` the residual stream, and each ``add_rms_norm`` is a residual add with
        the norm that reads its sum. Returns the final normed hidden states."""
        layers = self.model.layers
        first = layers[0].input_layernorm
        h = rms_norm(x, first.weight, first.eps)
        if self.chains_norms(x.shape[0] * x.shape[1], x.device):
            return self._chained_layers(x, h, positions, kv, attend, last_only)
        next_norms = [layer.input_layernorm for layer in layers[1:]] + [self.model.norm]
        for i, layer in enumerate(layers):
            a = layer.self_attn.forward_fused(
                h, positions, self.rope_cos, self.rope_sin, kv, attend, i
            )
            post = layer.post_attention_layernorm
            x, h = add_rms_norm(x, a, post.weight, post.eps)
            m = layer.mlp.forward_fused(h)
            if last_only and i == len(layers) - 1:
                x, m = x[:, -1:], m[:, -1:]
            norm = next_norms[i]
            x, h = add_rms_norm(x, m, norm.weight, norm.eps)
        return h

    def chains_norms(self, rows: int, device: torch.device) -> bool:
        """Whether a triton-backend forward of ``rows`` rows runs its norms and SwiGLU in its
        projections' launches (``_chained_layers``): where every projection of the layers
        runs the weight-streaming kernel (``kernels.linear.kernel_streams``)."""
        layer = self.model.layers[0]
        weights = (
            layer.self_attn.qkv_proj.weight,
            layer.self_attn.o_proj.weight,
            layer.mlp.gate_up_proj.weight,
            layer.mlp.down_proj.weight,
        )
        return all(kernel_streams(rows, w, device) for w in weights)

    def _chained_layers(self, x, h, positions, kv: KVSink, attend: Attend, last_only: bool):
        """``_fused_layers`` with each residual add and the norm after it in the projection
        before it (``kernels.linear.linear_add_norm``: the sum, the sum times the norm's weight
        and its squares) and the norm's row scale in the projection after it, and
        ``silu(gate) * up`` in the gate/up projection: per layer four projections, the rotary
        launch and attention. The last layer's MLP output meets the final norm as in
        ``_fused_layers``."""
        layers = self.model.layers
        pending = None
        for i, layer in enumerate(layers):
            sa, mlp, post = layer.self_attn, layer.mlp, layer.post_attention_layernorm
            o = sa.attend_fused(
                h, positions, self.rope_cos, self.rope_sin, kv, attend, i, pending=pending
            )
            out = sa.o_proj
            x, g, post_norm = linear_add_norm(o, out.weight, x, post.weight, post.eps, out.bias)
            gate_up = mlp.gate_up_proj
            act = linear(g, gate_up.weight, gate_up.bias, pending=post_norm, swiglu=True)
            down = mlp.down_proj
            if i + 1 < len(layers):
                nxt = layers[i + 1].input_layernorm
                x, h, pending = linear_add_norm(act, down.weight, x, nxt.weight, nxt.eps, down.bias)
                continue
            m = linear(act, down.weight, down.bias)
            if last_only:
                x, m = x[:, -1:], m[:, -1:]
            norm = self.model.norm
            x, h = add_rms_norm(x, m, norm.weight, norm.eps)
        return h
