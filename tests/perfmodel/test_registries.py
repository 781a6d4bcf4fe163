import dataclasses
import json

import pytest
from ssvkit.perfmodel import hardware
from ssvkit.perfmodel.hardware import LABEL_FIELDS, get_gpu, gpu_names
from ssvkit.perfmodel.models import get_model, model_names, spec_from_config


def test_every_gpu_number_has_a_source():
    assert set(gpu_names()) == {"h100-sxm", "h100-pcie", "h200", "a100-80g", "b200", "mi300x"}
    for name in gpu_names():
        g = get_gpu(name, measured=False)
        assert g.provenance == "datasheet"
        for f in dataclasses.fields(g):
            if f.name not in LABEL_FIELDS:
                assert g.sources[f.name], (name, f.name)
    assert {get_gpu(n).architecture for n in ("h100-sxm", "h100-pcie", "h200")} == {"hopper"}
    assert get_gpu("a100-80g").architecture == "ampere"


def test_unknown_gpu_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean: .*h100-sxm"):
        get_gpu("h100")


def test_measured_overlay_replaces_ceilings(tmp_path, monkeypatch):
    overlay = {
        "gpu": "h100-sxm",
        "profile_id": "test-1",
        "ceilings": {"hbm_bytes_per_s": 2.9e12, "launch_overhead_s": 2e-6},
    }
    p = tmp_path / "ceilings.json"
    p.write_text(json.dumps(overlay))
    monkeypatch.setattr(hardware, "measured_overlay_path", lambda name: p)
    g = get_gpu("h100-sxm")
    assert g.hbm_bytes_per_s == 2.9e12 and g.provenance == "calibrated:test-1"
    assert "measured" in g.sources["hbm_bytes_per_s"]
    assert get_gpu("h100-sxm", measured=False).provenance == "datasheet"
    overlay["gpu"] = "h200"
    p.write_text(json.dumps(overlay))
    with pytest.raises(ValueError, match="not 'h100-sxm'"):
        get_gpu("h100-sxm")


@pytest.mark.parametrize(
    "name,params_b,active_b",
    [
        ("llama-3.1-8b", 8.03, 8.03),
        ("llama-3.1-70b", 70.55, 70.55),
        ("qwen3-8b", 8.19, 8.19),
        ("qwen3-30b-a3b", 30.5, 3.35),
        ("deepseek-r1", 671.0, 37.5),
    ],
)
def test_model_parameter_counts(name, params_b, active_b):
    m = get_model(name)
    assert m.num_params() / 1e9 == pytest.approx(params_b, rel=0.01)
    assert m.num_active_params() / 1e9 == pytest.approx(active_b, rel=0.02)


def test_model_registry_and_mla():
    assert len(model_names()) == 8
    r1 = get_model("deepseek-r1")
    assert r1.is_mla and r1.kv_bytes_per_token(2) == (512 + 64) * 2
    assert r1.num_moe_layers == 58 and r1.weight_bytes == 1
    assert get_model("llama-3.1-8b").kv_bytes_per_token(2) == 2 * 8 * 128 * 2
    assert get_model("glm-4-9b").gqa_group == 16


def test_model_from_path_and_errors(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "chatglm",
                "num_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "multi_query_group_num": 2,
                "kv_channels": 16,
                "ffn_hidden_size": 128,
                "padded_vocab_size": 100,
            }
        )
    )
    m = get_model(str(cfg))
    assert (m.family, m.num_kv_heads, m.head_dim) == ("glm", 2, 16)
    assert get_model(str(tmp_path)).num_layers == 2  # a folder holding config.json
    with pytest.raises(ValueError, match="did you mean: llama-3.1-8b"):
        get_model("llama-3.1-8")
    with pytest.raises(ValueError, match="field 'num_hidden_layers' is missing"):
        spec_from_config({"model_type": "llama", "hidden_size": 8}, "x")
    with pytest.raises(ValueError, match="must be an integer, got 'two'"):
        spec_from_config({"model_type": "qwen3", "num_hidden_layers": "two"}, "x")
    with pytest.raises(ValueError, match="model_type 'bert'"):
        spec_from_config({"model_type": "bert"}, "x")
    with pytest.raises(ValueError, match="not a multiple"):
        spec_from_config(
            {
                "model_type": "llama",
                "num_hidden_layers": 1,
                "hidden_size": 12,
                "num_attention_heads": 3,
                "num_key_value_heads": 2,
                "intermediate_size": 8,
                "vocab_size": 10,
            },
            "x",
        )
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        get_model(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        get_model(str(tmp_path / "missing.json"))
