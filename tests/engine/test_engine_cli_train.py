"""``train-tiny``'s CPU-runnable parts (corpus pipeline, a few steps, HF save/load) and the
``ssvkit decode`` / ``ssvkit train-tiny`` commands on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import HAS_CUDA, TINY
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.corpus import (
    SEPARATOR,
    Document,
    collect_documents,
    corpus_sample,
    split_streams,
    validation_bytes,
)
from ssvkit.engine.settings import TrainConfig
from ssvkit.engine.train import lm_loss, train_tiny

from ssvkit.cli import main


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A fake site-packages: 24 packages of two modules each, and two loose modules."""
    root = tmp_path_factory.mktemp("site")
    for i in range(24):
        pkg = root / f"pkg{i:02d}"
        (pkg / "sub").mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"from pkg{i:02d}.sub.core import f{i}\n")
        (pkg / "sub" / "core.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 40)
    (root / "loose_a.py").write_text("A = 1\n")
    (root / "loose_b.py").write_text("B = 2\n")
    (root / "pkg00.dist-info").mkdir()
    return root


def test_corpus_keeps_packages_whole_and_splits_by_package(site):
    docs = collect_documents([site])
    assert len(docs) == 25  # 24 packages + the loose modules
    one = next(d for d in docs if d.name == "pkg03")
    text = one.data.decode()
    # The package's files are concatenated in order, each with its path.
    assert text.index("# file: pkg03/__init__.py") < text.index("# file: pkg03/sub/core.py")
    train, val = split_streams(docs)
    val_names = {d.name for d in docs if d.is_validation}
    assert 0 < len(val_names) < len(docs)
    assert all(b"f3(x)" not in val.tobytes() for _ in [0] if "pkg03" not in val_names)
    joined = sum(len(d.data) for d in docs) + (len(docs) - 2) * len(SEPARATOR)
    assert train.size + val.size == joined  # every byte once, a separator between packages
    assert Document("pkg03", b"").is_validation == ("pkg03" in val_names)  # by name alone
    assert collect_documents([site], max_bytes=1)[:1] == docs[:1]  # stops at the cap
    sample = corpus_sample(5000, [site])
    assert len(sample) == 5000 and max(sample) < 256
    # The validation stream's length: past it a sample repeats its start.
    size = validation_bytes(10**9, [site])
    assert size == val.size and validation_bytes(1, [site]) >= 1
    assert corpus_sample(2 * size, [site])[size:] == corpus_sample(size, [site])


def test_a_few_training_steps_learn_and_save_a_loadable_pair(site, tmp_path):
    tcfg = TINY.replace(num_kv_heads=1, max_position_embeddings=1024)  # GQA 4:1
    dcfg = TINY.replace(
        num_layers=1, hidden_size=32, num_q_heads=2, num_kv_heads=1, max_position_embeddings=1024
    )
    cfg = TrainConfig(
        context=128, batch=4, time_budget_s=60, max_steps=40, warmup_steps=4, val_windows=2
    )
    summary = train_tiny(
        cfg,
        out_dir=tmp_path,
        device="cpu",
        target_config=tcfg,
        draft_config=dcfg,
        roots=[site],
        log=lambda m: None,
    )
    assert summary["steps"] == 40
    assert summary["final_train_loss"]["target"] < 4.0  # ln 256 = 5.55 at the start
    assert 0 <= summary["greedy_agreement"] <= 1
    saved = json.loads((tmp_path / "train_summary.json").read_text())
    assert saved["params"]["target"] == tcfg.num_params()
    src = resolve_source(str(tmp_path / "tiny-target"))
    assert src.config.num_kv_heads == 1 and src.config.torch_dtype == "bfloat16"
    model = build_model(src, max_positions=256)
    window = torch.randint(0, 256, (1, 65))
    loss, _ = lm_loss(model, window)
    assert torch.isfinite(loss)


def test_decode_command_runs_on_the_cpu_and_reports(site, tmp_path, capsys):
    tcfg = TINY.replace(max_position_embeddings=4096)
    cfg = TrainConfig(context=64, batch=2, time_budget_s=30, max_steps=3, val_windows=1)
    train_tiny(
        cfg,
        out_dir=tmp_path,
        device="cpu",
        target_config=tcfg,
        draft_config=tcfg,
        roots=[site],
        log=lambda m: None,
    )
    prompt = tmp_path / "prompt.py"
    prompt.write_text("def f(x):\n    return x\n" * 20)
    trace = tmp_path / "t.jsonl"
    argv = [
        "decode",
        "--model",
        str(tmp_path / "tiny-target"),
        "--draft-model",
        str(tmp_path / "tiny-draft"),
        "--context",
        "300",
        "--prompt-file",
        str(prompt),
        "--strategy",
        "ssv",
        "--metadata",
        "mean",
        "--block-size",
        "16",
        "--window",
        "32",
        "--top-n",
        "4",
        "--max-new-tokens",
        "24",
        "--trace",
        str(trace),
        "--json",
    ]
    rc = main(argv)
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["new_tokens"] == 24 and out["strategy"]["drafter"]["kind"] == "draft_model"
    assert out["tokens_per_s"]["value"] > 0
    assert out["tokens_per_s"]["provenance"].startswith("measured:wall-clock")
    assert set(out["steps_s"]) == {"draft", "launch", "verify", "accept"}
    assert "tokens_per_s" in out["prediction"] or "error" in out["prediction"]
    assert out["selection"]["group_overlap"] is not None
    assert trace.exists() and out["note"].startswith("drafter: draft_model")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/no/such/checkpoint"], "does not exist"),
        (["--model", "random:llama-3.1-8b", "--context", "200K"], "exceed the model"),
        (["--model", "random:llama-3.1-8b", "--drafter-kind", "eagle"], "EAGLE"),
        (["--model", "random:qwen3-30b-a3b"], "Llama-family"),
        (["--model", "random:llama-3.1-8b", "--strategy", "sd_fast"], "unknown strategy"),
        (["--model", "random:llama-3.1-8b", "--tree", "full:5x5"], "at most 64"),
        (
            ["--model", "random:llama-3.1-8b", "--context", "32K", "--batch", "100000"],
            "batch 100000 at context 32768 needs ",
        ),
        (["--model", "random:llama-3.1-8b", "--device", "cuda"], "no CUDA"),
        (["--model", "random:llama-3.1-8b", "--ranking", "/no/such.json"], "does not exist"),
        (["--ranking", "r.json", "--strategy", "ssv"], "--ranking chooses the strategy"),
        (["--ranking", "r.json", "--tree", "chain:3"], "--ranking chooses the strategy"),
    ],
)
def test_decode_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    if HAS_CUDA and "cuda" in argv:
        pytest.skip("CUDA is present")
    rc = main(["decode", *argv, "--device", "cpu"] if "--device" not in argv else ["decode", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is present")
def test_train_tiny_needs_a_gpu(capsys):
    assert main(["train-tiny", "--out", "/tmp/never"]) == 2
    assert "CUDA" in capsys.readouterr().err
