"""Model geometry of a Llama-family decoder, read from or written to a Hugging Face config.json.

Covers Llama (incl. Llama-3 rope scaling), Qwen2 (qkv bias), Qwen3 (per-head q/k RMSNorm) and
GLM-4 in the ``glm`` format (qkv bias, interleaved partial rotary, fused gate/up). MoE and MLA
models (Qwen3-MoE, DeepSeek) are not Llama-family and are refused with a one-line error.

Example::

    cfg = ModelConfig.from_hf(json.load(open("config.json")))
    cfg = ModelConfig.from_spec(get_model("llama-3.1-8b"))   # registry geometry, for random weights
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ssvkit.perfmodel.models import ModelSpec, spec_from_config

FAMILIES = ("llama", "qwen2", "qwen3", "glm")
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the engine's decoder needs; names follow HF's LlamaConfig."""

    vocab_size: int = field(metadata={"help": "vocabulary V"})
    hidden_size: int = field(metadata={"help": "model width d"})
    intermediate_size: int = field(metadata={"help": "SwiGLU width d_f"})
    num_layers: int = field(metadata={"help": "decoder layers L"})
    num_q_heads: int = field(metadata={"help": "query heads H"})
    num_kv_heads: int = field(metadata={"help": "key/value heads Hkv (GQA)"})
    head_dim: int = field(metadata={"help": "per-head dimension D"})
    model_type: str = field(default="llama", metadata={"help": "llama | qwen2 | qwen3 | glm"})
    rms_norm_eps: float = field(default=1e-5, metadata={"help": "RMSNorm epsilon"})
    rope_theta: float = field(default=10000.0, metadata={"help": "RoPE base"})
    rope_scaling: tuple[tuple[str, object], ...] | None = field(
        default=None, metadata={"help": "HF rope_scaling items (llama3 or linear)"}
    )
    partial_rotary_factor: float = field(default=1.0, metadata={"help": "rotated share of D"})
    qkv_bias: bool = field(default=False, metadata={"help": "q/k/v projections carry a bias"})
    tie_word_embeddings: bool = field(default=False, metadata={"help": "LM head = embeddings"})
    max_position_embeddings: int = field(default=8192, metadata={"help": "trained context"})
    torch_dtype: str = field(default="bfloat16", metadata={"help": "checkpoint dtype"})

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
        ):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"model config: {name} must be a positive integer, got {v!r}")
        if self.model_type not in FAMILIES:
            raise ValueError(
                f"model config: model_type {self.model_type!r} is not one the engine runs "
                f"({', '.join(FAMILIES)})"
            )
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"model config: num_q_heads={self.num_q_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2 or self.rotary_dim % 2 or self.rotary_dim < 2:
            raise ValueError(
                f"model config: head_dim={self.head_dim} x partial_rotary_factor="
                f"{self.partial_rotary_factor} must give an even rotary dimension >= 2"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"model config: rope_scaling type {self.rope_type!r} is not supported "
                f"({', '.join(ROPE_TYPES)})"
            )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rope_interleaved(self) -> bool:
        """GLM rotates adjacent pairs (x0, x1), (x2, x3)...; Llama rotates (x_i, x_{i+D/2})."""
        return self.model_type == "glm"

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises each head of q and k (RMSNorm over D) before RoPE."""
        return self.model_type == "qwen3"

    @property
    def rope_type(self) -> str:
        d = dict(self.rope_scaling or ())
        return str(d.get("rope_type", d.get("type", "default")) or "default")

    @property
    def gqa_group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def num_params(self) -> int:
        """Weight elements, embeddings and LM head included."""
        d, h, hkv, dh = self.hidden_size, self.num_q_heads, self.num_kv_heads, self.head_dim
        attn = d * (h + 2 * hkv) * dh + h * dh * d + (h + 2 * hkv) * dh * self.qkv_bias
        attn += 2 * dh * self.qk_norm
        layer = attn + 3 * d * self.intermediate_size + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + d

    @classmethod
    def from_hf(cls, cfg: dict, name: str = "config.json") -> ModelConfig:
        """Parse a HF ``config.json`` dict; ``ValueError`` names the field or the family."""
        spec = spec_from_config(cfg, name)  # shared field checks and the family list
        return cls.from_spec(spec, torch_dtype=str(cfg.get("torch_dtype") or "bfloat16"))

    @classmethod
    def from_spec(cls, spec: ModelSpec, torch_dtype: str = "bfloat16") -> ModelConfig:
        """The engine geometry of a perfmodel ``ModelSpec`` (a registry model, for random
        weights); MoE and MLA specs are refused."""
        if spec.is_moe or spec.is_mla:
            raise ValueError(
                f"model {spec.name}: the engine runs dense Llama-family decoders; "
                f"{spec.family} ({'MoE' if spec.is_moe else 'MLA'}) is not one"
            )
        family = spec.family
        if family not in FAMILIES:
            raise ValueError(f"model {spec.name}: family {family!r} is not one the engine runs")
        scaling = spec.rope_scaling
        return cls(
            vocab_size=spec.vocab_size,
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_layers=spec.num_layers,
            num_q_heads=spec.num_q_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            model_type=family,
            rms_norm_eps=spec.rms_norm_eps,
            rope_theta=spec.rope_theta,
            rope_scaling=tuple(sorted(scaling.items())) if scaling else None,
            partial_rotary_factor=spec.partial_rotary_factor,
            qkv_bias=spec.qkv_bias,
            tie_word_embeddings=spec.tie_word_embeddings,
            max_position_embeddings=spec.max_position_embeddings or 8192,
            torch_dtype=torch_dtype,
        )

    def to_hf(self) -> dict:
        """A ``config.json`` dict that ``from_hf`` (and HF transformers) read back."""
        arch = {
            "llama": "LlamaForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "glm": "GlmForCausalLM",
        }[self.model_type]
        out = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_q_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "partial_rotary_factor": self.partial_rotary_factor,
            "attention_bias": self.qkv_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.torch_dtype,
        }
        return out

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
