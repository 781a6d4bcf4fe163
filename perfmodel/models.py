"""Model registry: a ``ModelSpec`` read from a Hugging Face ``config.json``.

Supported families: Llama, Qwen2/Qwen3 and GLM-4 (dense, GQA); Qwen3-MoE and DeepSeek-V3/R1
(MoE; DeepSeek's multi-head latent attention, MLA, is counted with its compressed KV cache).
Configs for the registry's named models ship in ``perfmodel/data/models``; any other model is
read with ``--model path/to/config.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from ssvkit.perfmodel.files import read_json
from ssvkit.perfmodel.hardware import suggest

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Geometry of a decoder-only transformer, as far as cost accounting needs it."""

    name: str = field(metadata={"help": "registry key or config path"})
    family: str = field(metadata={"help": "llama | qwen2 | qwen3 | glm | qwen3_moe | deepseek_v3"})
    num_layers: int = field(metadata={"help": "decoder layers L"})
    hidden_size: int = field(metadata={"help": "model width d"})
    num_q_heads: int = field(metadata={"help": "query heads H"})
    num_kv_heads: int = field(metadata={"help": "key/value heads Hkv (GQA)"})
    head_dim: int = field(metadata={"help": "per-head dimension d_h (MLA: v_head_dim)"})
    intermediate_size: int = field(metadata={"help": "dense FFN width d_f"})
    vocab_size: int = field(metadata={"help": "vocabulary V"})
    weight_bytes: int = field(default=2, metadata={"help": "bytes per weight element"})
    tie_word_embeddings: bool = field(default=False, metadata={"help": "LM head shares embeddings"})
    qkv_bias: bool = field(default=False, metadata={"help": "attention projections carry a bias"})
    rope_theta: float = field(default=10000.0, metadata={"help": "RoPE base"})
    rope_scaling: dict | None = field(default=None, metadata={"help": "HF rope_scaling dict"})
    partial_rotary_factor: float = field(default=1.0, metadata={"help": "rotated share of d_h"})
    rms_norm_eps: float = field(default=1e-6, metadata={"help": "RMSNorm epsilon"})
    max_position_embeddings: int = field(default=0, metadata={"help": "trained context"})
    num_experts: int = field(default=0, metadata={"help": "routed experts E (0 = dense)"})
    experts_per_token: int = field(default=0, metadata={"help": "active routed experts k"})
    expert_intermediate_size: int = field(default=0, metadata={"help": "expert FFN width d_e"})
    num_shared_experts: int = field(default=0, metadata={"help": "always-active shared experts"})
    moe_layers: tuple[bool, ...] = field(default=(), metadata={"help": "per layer: MoE FFN?"})
    kv_lora_rank: int = field(default=0, metadata={"help": "MLA latent KV rank (0 = no MLA)"})
    q_lora_rank: int = field(default=0, metadata={"help": "MLA latent query rank"})
    qk_nope_head_dim: int = field(default=0, metadata={"help": "MLA non-rotary q/k dim"})
    qk_rope_head_dim: int = field(default=0, metadata={"help": "MLA rotary q/k dim"})

    def __post_init__(self) -> None:
        for f in (
            "num_layers",
            "hidden_size",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "weight_bytes",
        ):
            v = getattr(self, f)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name}: num_q_heads={self.num_q_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts):
            raise ValueError(
                f"model {self.name}: experts_per_token={self.experts_per_token} must be in "
                f"1..num_experts={self.num_experts}"
            )
        if self.moe_layers and len(self.moe_layers) != self.num_layers:
            raise ValueError(f"model {self.name}: moe_layers must have num_layers entries")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head, G."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    def kv_bytes_per_token(self, kv_bytes: int = 2) -> int:
        """KV-cache bytes one token adds to one layer.

        GQA: ``2 * Hkv * d_h * kv_bytes`` (K and V). MLA (DeepSeek-V3): the compressed latent
        plus the decoupled rotary key, ``(kv_lora_rank + qk_rope_head_dim) * kv_bytes``, shared by
        every head (DeepSeek-V2 paper, Sec. 2.1).
        """
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_bytes
        return 2 * self.num_kv_heads * self.head_dim * kv_bytes

    def attention_weight_params(self) -> dict[str, int]:
        """Per-layer attention weights by projection (elements)."""
        d, h = self.hidden_size, self.num_q_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = d * self.q_lora_rank + self.q_lora_rank * h * qk if self.q_lora_rank else d * h * qk
            kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * h * (
                self.qk_nope_head_dim + self.head_dim
            )
            return {"qkv": q + kv, "o": h * self.head_dim * d}
        qkv = d * (h + 2 * self.num_kv_heads) * self.head_dim
        return {"qkv": qkv, "o": h * self.head_dim * d}

    def ffn_weight_params(self, layer: int) -> int:
        """Per-layer FFN weights (elements): gated MLP ``3 d d_f``; MoE layers count every
        routed expert, the shared experts and the router."""
        d = self.hidden_size
        if self.is_moe and self.moe_layers[layer]:
            experts = (self.num_experts + self.num_shared_experts) * 3 * d
            return experts * self.expert_intermediate_size + d * self.num_experts
        return 3 * d * self.intermediate_size

    def num_params(self) -> int:
        """Total weight elements (embeddings and LM head included)."""
        attn = sum(self.attention_weight_params().values())
        ffn = sum(self.ffn_weight_params(i) for i in range(self.num_layers))
        emb = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.num_layers * attn + ffn + emb + norms

    def num_active_params(self) -> int:
        """Weight elements one token touches (MoE: k routed + shared experts)."""
        if not self.is_moe:
            return self.num_params()
        d = self.hidden_size
        per_moe = (self.experts_per_token + self.num_shared_experts) * 3 * d
        active = self.num_params()
        for i in range(self.num_layers):
            if self.moe_layers[i]:
                active -= self.ffn_weight_params(i)
                active += per_moe * self.expert_intermediate_size + d * self.num_experts
        return active


# Geometry fields of a config lie in 1..MAX_DIM (a bound past every real model that keeps the
# cost model's integer products within int64).
MAX_DIM = 1 << 24
_MISSING = object()


def _int_field(cfg: dict, key: str, source: str, default=_MISSING, minimum: int = 1) -> int:
    """``cfg[key]`` as an integer in ``[minimum, MAX_DIM]``; a missing or null field takes
    ``default`` (HF's own default for optional fields), or is an error without one."""
    v = cfg.get(key)
    if v is None:
        if default is _MISSING:
            state = "is null" if key in cfg else "is missing"
            raise ValueError(f"{source}: config.json field {key!r} {state}")
        return default
    whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not whole:
        raise ValueError(f"{source}: config.json field {key!r} must be an integer, got {v!r}")
    if not minimum <= v <= MAX_DIM:
        raise ValueError(
            f"{source}: config.json field {key!r} must lie in {minimum}..{MAX_DIM}, got {v!r}"
        )
    return int(v)


def _float_field(
    cfg: dict, key: str, source: str, default: float, low: float = 0.0, high: float = float("inf")
) -> float:
    """``cfg[key]`` as a finite float in ``(low, high]`` (missing or null: ``default``)."""
    v = cfg.get(key)
    if v is None:
        return default
    number = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if not number or not low < v <= high:
        bound = f"in ({low:g}, {high:g}]" if high != float("inf") else f"> {low:g}"
        raise ValueError(f"{source}: config.json field {key!r} must be a number {bound}, got {v!r}")
    return float(v)


def _layer_list(cfg: dict, key: str, source: str, num_layers: int) -> set[int]:
    """A list of layer indices (``mlp_only_layers``); missing or null: empty."""
    v = cfg.get(key)
    if v is None:
        return set()
    if not isinstance(v, list) or any(
        isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < num_layers for x in v
    ):
        raise ValueError(
            f"{source}: config.json field {key!r} must be a list of layer indices in "
            f"0..{num_layers - 1}, got {v!r}"
        )
    return set(v)


def _weight_bytes(cfg: dict) -> int:
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") == "fp8":
        return 1
    return DTYPE_BYTES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), 2)


def spec_from_config(cfg: dict, name: str) -> ModelSpec:
    """Build a ``ModelSpec`` from a parsed HF ``config.json``; ``ValueError`` names the field."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: config.json must hold a JSON object")
    mtype = cfg.get("model_type")
    common = _common_fields(cfg, name)
    if mtype == "chatglm":  # THUDM's original GLM-4 format
        return _chatglm_spec(cfg, name, common)
    if mtype not in ("llama", "qwen2", "qwen3", "glm", "qwen3_moe", "deepseek_v3"):
        raise ValueError(
            f"{name}: model_type {mtype!r} is not supported "
            "(llama, qwen2, qwen3, glm, chatglm, qwen3_moe, deepseek_v3)"
        )
    kw = _geometry_fields(cfg, name, mtype)
    if mtype == "qwen3_moe":
        kw.update(_qwen3_moe_fields(cfg, name, kw["num_layers"]))
    if mtype == "deepseek_v3":
        kw.update(_deepseek_v3_fields(cfg, name, kw["num_layers"], kw["num_q_heads"]))
    return ModelSpec(**kw, **common)


def _common_fields(cfg: dict, name: str) -> dict:
    """The fields every family reads alike: weight width, embeddings, RoPE, norm, context."""
    return dict(
        name=name,
        weight_bytes=_weight_bytes(cfg),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=_float_field(cfg, "rope_theta", name, 10000.0),
        rope_scaling=_rope_scaling(cfg, name),
        rms_norm_eps=_float_field(cfg, "rms_norm_eps", name, 1e-6),
        max_position_embeddings=_int_field(cfg, "max_position_embeddings", name, 0, minimum=0),
    )


def _chatglm_spec(cfg: dict, name: str, common: dict) -> ModelSpec:
    """GLM-4 in THUDM's original format: its own field names, half the head dim rotated."""
    return ModelSpec(
        family="glm",
        num_layers=_int_field(cfg, "num_layers", name),
        hidden_size=_int_field(cfg, "hidden_size", name),
        num_q_heads=_int_field(cfg, "num_attention_heads", name),
        num_kv_heads=_int_field(cfg, "multi_query_group_num", name),
        head_dim=_int_field(cfg, "kv_channels", name),
        intermediate_size=_int_field(cfg, "ffn_hidden_size", name),
        vocab_size=_int_field(cfg, "padded_vocab_size", name),
        qkv_bias=bool(cfg.get("add_qkv_bias", True)),
        partial_rotary_factor=0.5,
        **{**common, "max_position_embeddings": _int_field(cfg, "seq_length", name, 0, 0)},
    )


def _geometry_fields(cfg: dict, name: str, mtype: str) -> dict:
    """The dense geometry of a Hugging Face transformers config (every family but chatglm)."""
    layers = _int_field(cfg, "num_hidden_layers", name)
    hidden = _int_field(cfg, "hidden_size", name)
    heads = _int_field(cfg, "num_attention_heads", name)
    return dict(
        family=mtype,
        num_layers=layers,
        hidden_size=hidden,
        num_q_heads=heads,
        num_kv_heads=_int_field(cfg, "num_key_value_heads", name, heads),
        head_dim=_int_field(cfg, "head_dim", name, max(hidden // heads, 1)),
        intermediate_size=_int_field(cfg, "intermediate_size", name),
        vocab_size=_int_field(cfg, "vocab_size", name),
        qkv_bias=bool(cfg.get("attention_bias", mtype == "qwen2")),
        partial_rotary_factor=_float_field(cfg, "partial_rotary_factor", name, 1.0, 0.0, 1.0),
    )


def _qwen3_moe_fields(cfg: dict, name: str, layers: int) -> dict:
    """Qwen3-MoE's experts; every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``
    is a MoE layer."""
    step = _int_field(cfg, "decoder_sparse_step", name, 1)
    only_mlp = _layer_list(cfg, "mlp_only_layers", name, layers)
    return dict(
        num_experts=_int_field(cfg, "num_experts", name),
        experts_per_token=_int_field(cfg, "num_experts_per_tok", name),
        expert_intermediate_size=_int_field(cfg, "moe_intermediate_size", name),
        moe_layers=tuple(i not in only_mlp and (i + 1) % step == 0 for i in range(layers)),
    )


def _deepseek_v3_fields(cfg: dict, name: str, layers: int, heads: int) -> dict:
    """DeepSeek-V3's experts (MoE layers from ``first_k_dense_replace`` on, every
    ``moe_layer_freq``-th) and MLA's latent ranks and head dims."""
    first_dense = _int_field(cfg, "first_k_dense_replace", name, 0, minimum=0)
    freq = _int_field(cfg, "moe_layer_freq", name, 1)
    return dict(
        num_kv_heads=heads,  # MLA: every query head has its own decompressed K/V
        head_dim=_int_field(cfg, "v_head_dim", name),
        num_experts=_int_field(cfg, "n_routed_experts", name),
        experts_per_token=_int_field(cfg, "num_experts_per_tok", name),
        expert_intermediate_size=_int_field(cfg, "moe_intermediate_size", name),
        num_shared_experts=_int_field(cfg, "n_shared_experts", name, 0, minimum=0),
        moe_layers=tuple(i >= first_dense and i % freq == 0 for i in range(layers)),
        kv_lora_rank=_int_field(cfg, "kv_lora_rank", name),
        q_lora_rank=_int_field(cfg, "q_lora_rank", name, 0, minimum=0),
        qk_nope_head_dim=_int_field(cfg, "qk_nope_head_dim", name),
        qk_rope_head_dim=_int_field(cfg, "qk_rope_head_dim", name),
    )


def _rope_scaling(cfg: dict, source: str) -> dict | None:
    v = cfg.get("rope_scaling")
    if v is not None and not isinstance(v, dict):
        raise ValueError(f"{source}: config.json field 'rope_scaling' must be an object or null")
    return v


def _registry_dir() -> Path:
    return Path(str(files("ssvkit.perfmodel"))) / "data" / "models"


def model_names() -> list[str]:
    """Names of the shipped configs."""
    return sorted(p.stem for p in _registry_dir().glob("*.json"))


def load_config(path: str | Path) -> dict:
    """Parse a config.json, turning I/O and JSON errors into one-line ``ValueError``s."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    return read_json(p, "model config")


def _in_project(path: Path) -> Path:
    """A relative path that does not exist from the working directory, looked up relative to
    the installed packages' root instead: committed data names a checkpoint relative to the
    project (``engine/checkpoints/tiny-draft``), and the package folders keep the project's
    layout, in a clone and in site-packages alike."""
    if path.is_absolute() or path.exists():
        return path
    inside = Path(str(files("ssvkit.perfmodel"))).parent / path
    return inside if inside.exists() else path


def get_model(name_or_path: str) -> ModelSpec:
    """A registry name (``llama-3.1-8b``) or a path to a ``config.json`` (or its folder); a
    relative path may also be relative to the project (``_in_project``). The spec is named as
    given."""
    key = name_or_path.lower()
    if key in model_names():
        return spec_from_config(load_config(_registry_dir() / f"{key}.json"), key)
    p = _in_project(Path(name_or_path))
    if p.suffix == ".json" or p.is_dir() or p.exists():
        return spec_from_config(load_config(p), str(name_or_path))
    raise ValueError(f"unknown model {name_or_path!r}{suggest(name_or_path, model_names())}")


def with_overrides(spec: ModelSpec, **changes) -> ModelSpec:
    """A derived copy (``dataclasses.replace``); the spec itself is never mutated."""
    return dataclasses.replace(spec, **changes)
