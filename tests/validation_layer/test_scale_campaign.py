"""The campaign at scale, end to end on the CPU: a tiny random geometry (a config.json of its
own), context 256, batches 1 and 2, two baselines. Checks the rows' schema (measured figures,
synthetic acceptance, overlap, prediction, rounds' trace, provenance, memory arithmetic), a
cell that cannot fit recorded as skipped, and that a second call reuses every finished cell."""

from __future__ import annotations

import json

import pytest
from ssvkit.validation import scale_campaign

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture
def geometry(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return f"random:{path}"


def _argv(model, tmp_path, batches="1,2"):
    return [
        "--models",
        model,
        "--contexts",
        "256",
        "--batches",
        batches,
        "--baselines",
        "ar_dense,sd_sparse_naive",
        "--acceptances",
        "0.8",
        "--new-tokens",
        "6",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "campaign.json"),
        "--resume",
        str(tmp_path / "cells.jsonl"),
    ]


def test_the_campaign_runs_records_and_resumes(geometry, tmp_path, capsys, monkeypatch):
    assert scale_campaign.main(_argv(geometry, tmp_path)) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    rows = doc["rows"]
    assert [(r["batch"], r["baseline"], r["acceptance"]) for r in rows] == [
        (1, "ar_dense", None),
        (1, "sd_sparse_naive", 0.8),
        (2, "ar_dense", None),
        (2, "sd_sparse_naive", 0.8),
    ]
    for r in rows:
        assert r["status"] == "measured" and r["memory"]["fits"]
        m = r["measured"]
        assert m["tokens_per_s"] > 0 and set(m["steps_s"]) >= {"draft", "verify", "accept"}
        assert len(m["accepted_per_sequence"][0]) == r["batch"]
        assert all(len(x) == 3 for x in m["rounds_trace"])
        assert r["provenance"]["git_commit"] and r["provenance"]["torch_version"]
        assert "tokens_per_s" in r["prediction"] or "error" in r["prediction"]
    sparse = rows[1]
    assert sparse["measured_acceptance"]["source"] == "synthetic:oracle"
    assert sparse["measured_acceptance"]["oracle"] == [0.8]
    assert sparse["selection"]["group_overlap"] is not None
    assert rows[0]["measured_acceptance"]["source"] == "measured"
    assert doc["provenance"]["runs_from_cache"] == 0 and doc["complete"]
    # A second call decodes nothing: every cell comes from the run cache.
    monkeypatch.setattr(scale_campaign, "measure_cell", _never)
    assert scale_campaign.main(_argv(geometry, tmp_path)) == 0
    again = json.loads((tmp_path / "campaign.json").read_text())
    assert again["provenance"]["runs_from_cache"] == 4
    assert again["rows"] == rows


def test_stop_after_writes_the_cells_so_far_and_a_later_call_goes_on(geometry, tmp_path):
    assert scale_campaign.main([*_argv(geometry, tmp_path), "--stop-after", "0"]) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert doc["rows"] == [] and not doc["complete"]
    assert scale_campaign.main(_argv(geometry, tmp_path, batches="1")) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert len(doc["rows"]) == 2 and doc["complete"]


def _never(*args, **kwargs):
    raise AssertionError("a finished cell was decoded again")


def test_a_cell_that_cannot_fit_is_skipped_with_the_arithmetic(geometry, tmp_path, monkeypatch):
    monkeypatch.setattr(
        scale_campaign, "setup", _with_memory(scale_campaign.setup, available_bytes=1 << 20)
    )
    monkeypatch.setattr(scale_campaign, "measure_cell", _never)
    assert scale_campaign.main(_argv(geometry, tmp_path, batches="2")) == 0
    rows = json.loads((tmp_path / "campaign.json").read_text())["rows"]
    assert all(r["status"] == "skipped" for r in rows)
    assert rows[0]["reason"].startswith("batch 2 at context 256 needs ")
    assert rows[0]["memory"]["need_bytes"] > rows[0]["memory"]["available_bytes"] == 1 << 20


def _with_memory(real, available_bytes):
    def setup(args):
        st = real(args)
        st.available_bytes = available_bytes
        return st

    return setup


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--models", "tiny"], "random:NAME"),
        (["--baselines", "ar_fast"], "unknown baseline 'ar_fast'"),
        (["--acceptances", "1.5"], "(0, 1]"),
        (["--new-tokens", "0"], "--new-tokens must be >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(geometry, tmp_path, capsys, change, message):
    argv = _argv(geometry, tmp_path)
    i = argv.index(change[0])
    argv[i + 1] = change[1]
    assert scale_campaign.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "campaign.json").exists()
