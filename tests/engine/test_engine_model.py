"""The decoder against an independent fp32 reference written the way HF writes Llama, Qwen3 and
GLM; configs, RoPE scaling and the safetensors round trip (single file and sharded)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import TINY, tiny_model
from ssvkit.engine.checkpoint import (
    _hf_names,
    build_model,
    hf_state_dict,
    resolve_source,
    save_checkpoint,
)
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.model import weight_ops
from ssvkit.engine.rope import inv_frequencies
from ssvkit.engine.runner import ModelRunner
from ssvkit.perfmodel.models import get_model


def reference_logits(sd: dict[str, torch.Tensor], cfg: ModelConfig, ids: torch.Tensor):
    """Causal LM logits from HF-named weights: RMSNorm, RoPE (rotate-half, or GLM's
    interleaved pairs on the first ``partial_rotary_factor`` share), GQA by repeating K/V,
    softmax attention with a causal mask, SwiGLU."""
    w = {k: v.double() for k, v in sd.items()}
    n, h, hkv, dh = ids.numel(), cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim

    def rms(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    r = int(dh * cfg.partial_rotary_factor)
    inv = inv_frequencies(cfg).double()
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]  # [n, r/2]

    def rope(x):  # [n, heads, dh]
        rot, rest = x[..., :r], x[..., r:]
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
        if cfg.model_type == "glm":
            c2, s2 = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
            out = rot * c2 + rotated * s2
        else:
            c2, s2 = torch.cat([c, c], -1), torch.cat([s, s], -1)
            rotated = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), -1)
            out = rot * c2 + rotated * s2
        return torch.cat([out, rest], -1)

    x = w["model.embed_tokens.weight"][ids]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])

        def proj(name, a=a, p=p):
            y = a @ w[p + f"self_attn.{name}_proj.weight"].T
            return y + w[p + f"self_attn.{name}_proj.bias"] if cfg.qkv_bias else y

        q, k, v = proj("q").view(n, h, dh), proj("k").view(n, hkv, dh), proj("v").view(n, hkv, dh)
        if cfg.qk_norm:
            q, k = (
                rms(q, w[p + "self_attn.q_norm.weight"]),
                rms(k, w[p + "self_attn.k_norm.weight"]),
            )
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(dh)
        att = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        o = torch.einsum("hij,jhd->ihd", att, v).reshape(n, h * dh)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        if cfg.model_type == "glm":
            gate, up = (m @ w[p + "mlp.gate_up_proj.weight"].T).chunk(2, -1)
        else:
            gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


FAMILIES = {
    "llama3": TINY.replace(
        rope_theta=500000.0,
        rope_scaling=(
            ("factor", 8.0),
            ("high_freq_factor", 4.0),
            ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 64),
            ("rope_type", "llama3"),
        ),
    ),
    "qwen2": TINY.replace(model_type="qwen2", qkv_bias=True, tie_word_embeddings=True),
    "qwen3": TINY.replace(model_type="qwen3"),
    "glm": TINY.replace(model_type="glm", qkv_bias=True, partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("n", [1, 19, 70])
def test_prefill_and_tree_forward_match_reference(family, n):
    cfg = FAMILIES[family]
    model = tiny_model(cfg, seed=3)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
    expect = reference_logits(hf_state_dict(model), cfg, ids)
    runner = ModelRunner(model, batch=1, t_max=128, backend="torch")
    last = runner.prefill([ids.tolist()])
    torch.testing.assert_close(last[0].double(), expect[-1], atol=2e-4, rtol=2e-4)
    if n > 1:  # the same positions decoded one at a time through the verify path
        from ssvkit.engine.attention import AttentionConfig
        from ssvkit.engine.tree import DraftTree

        runner.prefill([ids[: n - 3].tolist()])
        one = DraftTree.from_parents([-1])
        for i in range(n - 3, n):
            logits = runner.tree_forward(ids[None, i : i + 1], one, AttentionConfig())[0]
            runner.commit(torch.zeros((1, 1), dtype=torch.int64), torch.ones(1, dtype=torch.int32))
            torch.testing.assert_close(logits[0, 0].double(), expect[i], atol=2e-4, rtol=2e-4)


def test_llama3_rope_scaling_matches_hand_values():
    cfg = get_model("llama-3.1-8b")
    from ssvkit.engine.config import ModelConfig as MC

    inv = inv_frequencies(MC.from_spec(cfg))
    base = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    wavelen = 2 * math.pi / base
    # High frequencies (wavelength < 8192 / 4) are kept, low ones (> 8192) divided by 8.
    assert torch.allclose(inv[wavelen < 2048], base[wavelen < 2048])
    assert torch.allclose(inv[wavelen > 8192], base[wavelen > 8192] / 8)
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    assert mid.any() and bool(((inv[mid] < base[mid]) & (inv[mid] > base[mid] / 8)).all())


def test_config_round_trips_hf_and_refuses_moe():
    for cfg in FAMILIES.values():
        assert ModelConfig.from_hf(cfg.to_hf()) == cfg
    glm = ModelConfig.from_spec(get_model("glm-4-9b"))
    assert glm.rope_interleaved and glm.rotary_dim == 64 and glm.qkv_bias
    assert ModelConfig.from_spec(get_model("llama-3.1-8b")).rope_type == "llama3"
    with pytest.raises(ValueError, match="MoE"):
        ModelConfig.from_spec(get_model("qwen3-30b-a3b"))
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        TINY.replace(rope_scaling=(("rope_type", "yarn"),))


@pytest.mark.parametrize("family", ["llama3", "glm"])
def test_safetensors_round_trip_single_and_sharded(tmp_path, family):
    from safetensors.torch import save_file

    cfg = FAMILIES[family]
    model = tiny_model(cfg, seed=5)
    save_checkpoint(model, tmp_path / "one")
    names = set(json.loads((tmp_path / "one" / "config.json").read_text()))
    assert {"model_type", "num_key_value_heads", "rope_scaling"} <= names
    # The same tensors split over two shards with an index, as HF writes large models.
    sd = hf_state_dict(model)
    keys = sorted(sd)
    shard = tmp_path / "sharded"
    shard.mkdir()
    weight_map = {}
    for i, part in enumerate((keys[::2], keys[1::2])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(shard / fname))
        weight_map.update({k: fname for k in part})
    (shard / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (shard / "config.json").write_text(json.dumps(cfg.to_hf()))
    ids = torch.arange(12)[None]
    expect = reference_logits(sd, cfg, ids[0])
    # save_checkpoint's own sharding: tiny shards force several files and an index.
    save_checkpoint(model, tmp_path / "own", max_shard_bytes=4096)
    own = sorted(p.name for p in (tmp_path / "own").glob("model-*.safetensors"))
    assert len(own) > 2 and (tmp_path / "own" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "own" / "model.safetensors").exists()
    for folder in ("one", "sharded", "own"):
        src = resolve_source(str(tmp_path / folder))
        loaded = build_model(src, max_positions=64)
        for name, p in loaded.named_parameters():
            assert torch.equal(p, dict(model.named_parameters())[name]), name
        runner = ModelRunner(loaded, batch=1, t_max=32, backend="torch")
        last = runner.prefill([ids[0].tolist()])
        torch.testing.assert_close(last[0].double(), expect[-1], atol=2e-4, rtol=2e-4)
    assert set(_hf_names(cfg)) == {n for n, _ in model.named_parameters()}


def test_bad_checkpoints_fail_with_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_source(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    with pytest.raises(ValueError, match="neither model.safetensors"):
        resolve_source(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        resolve_source(str(tmp_path))
    with pytest.raises(ValueError, match="unknown model"):
        resolve_source("random:llama-9")


def test_random_registry_geometry_config():
    src = resolve_source("random:llama-3.1-8b")
    assert src.is_random and src.config.num_layers == 32 and src.config.gqa_group == 4
    assert src.config_path == "llama-3.1-8b"
    assert src.config.num_params() == get_model("llama-3.1-8b").num_params()


def test_weight_ops_apply_the_torch_backends_weights_and_refuse_another_backend():
    """The torch backend's ``WeightOps`` are its modules and functions (the triton backend's
    kernels are checked against them through whole forwards: test_engine_triton_interpret)."""
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, generator=gen)
    table = torch.randn(10, 8, generator=gen)
    ids = torch.tensor([[3, 0, 9]])
    ops = weight_ops("torch")
    assert torch.equal(ops.project(layer, x), layer(x))
    assert torch.equal(ops.head(x, table), x @ table.T)
    assert torch.equal(ops.embed(ids, table), table[ids])
    with pytest.raises(ValueError, match="'cuda'"):
        weight_ops("cuda")
