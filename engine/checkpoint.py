"""Model sources: Hugging Face checkpoints (config.json + safetensors, sharded too), random
weights for any registry geometry, and the trained tiny pair shipped with the engine.

``--model`` accepts ``tiny`` (``engine/checkpoints/tiny-target``), ``random:NAME`` (a perfmodel
registry model with random weights, e.g. ``random:llama-3.1-8b``) or a checkpoint folder.
``resolve_source`` checks the config and the weight files without reading any weights, so a bad
``--model`` fails before any GPU work.

Example::

    src = resolve_source("random:llama-3.1-8b")
    model = build_model(src, max_positions=33_000, device="cuda", dtype=torch.bfloat16)
    save_checkpoint(model, "out/tiny-target")
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.model import CausalLM
from ssvkit.engine.rope import rope_tables
from ssvkit.perfmodel.models import get_model, load_config

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
TINY_TARGET = CHECKPOINT_DIR / "tiny-target"
TINY_DRAFT = CHECKPOINT_DIR / "tiny-draft"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's weights come from: ``path`` (a checkpoint folder) or ``random``."""

    name: str
    config: ModelConfig
    path: Path | None
    seed: int = 0

    @property
    def is_random(self) -> bool:
        return self.path is None

    @property
    def config_path(self) -> str:
        """What perfmodel's ``get_model`` reads for this model (registry name or config path)."""
        return str(self.path / "config.json") if self.path else self.name.split(":", 1)[1]


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: not a safetensors index ({e})") from None
        files = sorted({folder / f for f in weight_map.values()})
    elif (folder / SINGLE_FILE).is_file():
        files = [folder / SINGLE_FILE]
    else:
        raise ValueError(f"checkpoint {str(folder)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"checkpoint {str(folder)!r} lacks weight file {missing[0]!r}")
    return files


def resolve_source(spec: str, seed: int = 0) -> ModelSource:
    """Parse ``tiny``, ``tiny-draft``, ``random:NAME`` or a checkpoint folder; no weights read."""
    if spec.startswith("random:"):
        name = spec.split(":", 1)[1]
        return ModelSource(spec, ModelConfig.from_spec(get_model(name)), None, seed)
    if spec in ("tiny", "tiny-draft"):
        folder = TINY_TARGET if spec == "tiny" else TINY_DRAFT
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"the trained tiny pair is not at {folder} (train it with `ssvkit train-tiny` "
                "on a GPU, or pass --model random:NAME or a checkpoint folder)"
            )
    else:
        folder = Path(spec)
        if not folder.exists():
            raise ValueError(f"model checkpoint {spec!r} does not exist")
        if folder.is_file():
            folder = folder.parent
    cfg = ModelConfig.from_hf(load_config(folder / "config.json"), str(folder))
    _weight_files(folder)
    return ModelSource(spec, cfg, folder, seed)


def _hf_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """Engine parameter name -> the HF tensor names it is the concatenation of (dim 0)."""
    out = {"model.embed_tokens.weight": ["model.embed_tokens.weight"]}
    out["model.norm.weight"] = ["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ["lm_head.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[a + "qkv_proj.weight"] = [a + f"{x}_proj.weight" for x in "qkv"]
        if cfg.qkv_bias:
            out[a + "qkv_proj.bias"] = [a + f"{x}_proj.bias" for x in "qkv"]
        out[a + "o_proj.weight"] = [a + "o_proj.weight"]
        if cfg.qk_norm:
            out[a + "q_norm.weight"] = [a + "q_norm.weight"]
            out[a + "k_norm.weight"] = [a + "k_norm.weight"]
        fused = cfg.model_type == "glm"
        out[p + "mlp.gate_up_proj.weight"] = (
            [p + "mlp.gate_up_proj.weight"]
            if fused
            else [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        )
        out[p + "mlp.down_proj.weight"] = [p + "mlp.down_proj.weight"]
        out[p + "input_layernorm.weight"] = [p + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = [p + "post_attention_layernorm.weight"]
    return out


def init_random_(model: CausalLM, seed: int) -> None:
    """Random weights: linear layers N(0, 1/fan_in) (unit-scale activations, logits of O(1)),
    embeddings N(0, 1), biases N(0, 0.02), norms 1."""
    # The generator must live where the parameters do (CUDA parameters need a CUDA generator).
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)


def build_model(
    src: ModelSource,
    *,
    max_positions: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CausalLM:
    """Instantiate ``src`` on ``device`` in ``dtype`` (random or loaded weights), in eval mode."""
    with torch.device(device):
        model = CausalLM(src.config, max_positions)
    if src.is_random:
        init_random_(model, src.seed)
    else:
        load_weights_(model, src.path)
    model = model.to(device=device, dtype=dtype)
    # .to(dtype) also casts the rotary tables; keep them float32 (they index long positions).
    cos, sin = rope_tables(src.config, max_positions, device=device)
    model.rope_cos, model.rope_sin = cos, sin
    return model.eval().requires_grad_(False)


def load_weights_(model: CausalLM, folder: Path) -> None:
    """Copy the safetensors weights of ``folder`` (single file or sharded) into ``model``."""
    from safetensors import safe_open

    names = _hf_names(model.config)
    where: dict[str, Path] = {}
    for f in _weight_files(folder):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for k in fh.keys():
                where[k] = f
    needed: dict[Path, list[str]] = {}
    for theirs in names.values():
        for k in theirs:
            if k not in where:
                raise ValueError(f"checkpoint {str(folder)!r} lacks tensor {k!r}")
            needed.setdefault(where[k], []).append(k)
    tensors: dict[str, torch.Tensor] = {}
    for f, keys in needed.items():
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for k in keys:
                tensors[k] = fh.get_tensor(k)
    params = dict(model.named_parameters())
    for ours, theirs in names.items():
        parts = [tensors.pop(k) for k in theirs]
        value = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        p = params[ours]
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"checkpoint {str(folder)!r}: {theirs[0]} has shape {tuple(value.shape)}, "
                f"the config implies {tuple(p.shape)}"
            )
        with torch.no_grad():
            p.copy_(value)


def hf_state_dict(model: CausalLM, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The model's tensors under HF names (fused projections split back), contiguous on CPU."""
    params = dict(model.named_parameters())
    out = {}
    for ours, theirs in _hf_names(model.config).items():
        value = params[ours].detach().to("cpu", dtype or params[ours].dtype)
        if len(theirs) == 1:
            out[theirs[0]] = value.contiguous()
            continue
        cfg = model.config
        if "qkv" in ours:
            sizes = [cfg.num_q_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        else:
            sizes = [cfg.intermediate_size] * 2
        for name, part in zip(theirs, value.split(sizes, dim=0), strict=True):
            out[name] = part.contiguous()
    return out


MAX_SHARD_BYTES = 15_000_000  # files the GPU machine returns are capped at 16 MiB each


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors grouped, in name order, into shards of at most ``max_bytes`` (a tensor larger
    than that gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        n = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += n
    return shards


def save_checkpoint(
    model: CausalLM,
    folder: str | Path,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write ``config.json`` and the weights (HF names) into ``folder``: ``model.safetensors``,
    or ``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json`` when the
    weights exceed ``max_shard_bytes``. Each file is written to a temporary name first and
    renamed, so a crash leaves no half-written file."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(model, dtype)
    cfg = model.config
    if dtype is not None:
        cfg = cfg.replace(torch_dtype=str(dtype).removeprefix("torch."))
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for stale in [
        *folder.glob("model-*-of-*.safetensors"),
        folder / SINGLE_FILE,
        folder / INDEX_FILE,
    ]:
        if stale.name not in names and stale.is_file():
            stale.unlink()
    for name, shard in zip(names, shards, strict=True):
        tmp = folder / f".{name}.tmp"
        save_file(shard, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / name)
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t: n for n, shard in zip(names, shards, strict=True) for t in shard},
        }
        tmp = folder / f".{INDEX_FILE}.tmp"
        tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, folder / INDEX_FILE)
    tmp = folder / ".config.json.tmp"
    tmp.write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
    os.replace(tmp, folder / "config.json")
    return folder
