"""``engine_ops.attention_launches`` and the lines ``engine_verify`` prints from a row: a sparse
step's refresh layer launches its block scoring, top-n pick and attention, a reuse layer only
its attention (GPU); the printed row lists each attention op's launches (CPU); a sparse step's
least read counts each listed block once (CPU)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.validation.engine_ops import attention_launches, selection_stats
from ssvkit.validation.engine_verify_table import row_lines

from tests.validation_layer.test_scale_campaign import CONFIG


def test_a_printed_row_lists_each_attention_ops_launches():
    launch = lambda name, us: {"kernel": name, "side_stream": False, "median_s": us * 1e-6}  # noqa: E731
    op = {"median_s": 40e-6, "count": 8, "over_floor": 3.0}
    row = dict(
        strategy="ssv", metadata="mean", context=131072, t=16, graph_s=5.5e-3, eager_s=18e-3,
        ops_sum_s=5.4e-3, graph_over_ops_sum=1.02, floor_s=3.6e-3, graph_over_floor=1.53,
        achieved_bytes_per_s=2.7e12, predicted_verify_s=5.4e-3, selection=None,
        ops={
            "attention": {**op, "launches": [launch("scores", 8.2), launch("sv", 21.8)]},
            "attention_reuse": {**op, "launches": [launch("sv", 22.2)]},
            "o_proj": {"median_s": 13e-6, "count": 32, "over_floor": 1.7},
        },
    )  # fmt: skip
    lines = row_lines(row)
    assert lines[0].startswith("ssv (mean)       T= 131072 t= 16  graph   5.500 ms")
    assert "    attention launches (us): scores 8.2, sv 21.8" in lines
    assert "    attention_reuse launches (us): sv 22.2" in lines
    assert not any("o_proj launches" in line for line in lines)


def test_a_sparse_steps_least_read_counts_its_window_once(tmp_path):
    """Block-sparse attention's lists hold the sink and the window's blocks next to the
    picks: the layer's least read is its distinct listed blocks and the draft tail, K and V."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "head_dim": 64, "num_hidden_layers": 2}))
    ctx, t = 3000, 4
    model = build_model(resolve_source(f"random:{path}"), max_positions=ctx + 16)
    runner = ModelRunner(model, batch=1, t_max=ctx + 16, backend="torch", use_graphs=False)
    runner.cache.kv.normal_()
    runner.cache.set_lens(torch.tensor([ctx], dtype=torch.int32))
    strategy = dataclasses.replace(Strategy.from_name("ssv"), metadata="mean")
    attn = AttentionConfig.from_strategy(strategy)
    runner.prepare(attn)
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    tokens = torch.randint(0, CONFIG["vocab_size"], (1, t), generator=torch.Generator())
    with torch.no_grad():
        queries = runner.tree_forward(tokens, tree, attn, record=True)[2]
        sel = selection_stats(runner, attn, tree, queries)
    window_blocks = attn.window // attn.block_size
    assert sel["unique_blocks"] >= attn.top_n + window_blocks  # picks, sink and window
    cfg = model.config
    elem = next(model.parameters()).element_size()
    tokens_read = sel["unique_blocks"] * attn.block_size + t
    assert sel["layer_bytes"] == int(2 * cfg.num_kv_heads * tokens_read * cfg.head_dim * elem)


@pytest.mark.gpu
def test_gpu_refresh_and_reuse_layers_launch_what_they_run(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "head_dim": 64, "num_hidden_layers": 4}))
    ctx, t = 3000, 4
    src = resolve_source(f"random:{path}")
    model = build_model(src, max_positions=ctx + 16, device="cuda", dtype=torch.bfloat16)
    runner = ModelRunner(model, batch=1, t_max=ctx + 16, backend="triton", use_graphs=False)
    runner.cache.kv.normal_()
    runner.cache.set_lens(torch.tensor([ctx], dtype=torch.int32))
    strategy = dataclasses.replace(Strategy.from_name("ssv"), metadata="mean", refresh_every=2)
    attn = AttentionConfig.from_strategy(strategy)
    runner.prepare(attn)
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    tokens = torch.randint(0, CONFIG["vocab_size"], (1, t), device="cuda")
    with torch.no_grad():
        got = attention_launches(runner, attn, tree, tokens)
    refresh = [x["kernel"] for x in got["attention"]]
    reuse = [x["kernel"] for x in got["attention_reuse"]]
    assert "block_scores_kernel" in refresh and "sparse_verify_kernel" in refresh
    assert "sparse_verify_kernel" in reuse and "block_scores_kernel" not in reuse
    assert len(reuse) < len(refresh)
    assert all(x["median_s"] > 0 for x in got["attention"] + got["attention_reuse"])
    dense = AttentionConfig.from_strategy(Strategy.from_name("sd_dense"))
    runner.prepare(dense)
    with torch.no_grad():
        assert attention_launches(runner, dense, tree, tokens) == {}


@pytest.mark.gpu
def test_gpu_engine_verify_times_a_regrouped_strategy_as_labelled(tmp_path):
    """``engine_verify --grouping shared:4`` on a small random model: the sparse row ran its
    attention with that grouping, the table names it and the prediction was made for it."""
    from ssvkit.validation import engine_verify
    from ssvkit.validation.engine_verify_table import row_strategy, strategy_label

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "head_dim": 64, "num_hidden_layers": 4}))
    argv = ["--model", f"random:{path}", "--context", "3000", "--strategy", "sd_dense,ssv"]
    argv += ["--t", "8", "--metadata", "mean", "--grouping", "shared:4", "--gpu", "h200"]
    doc = engine_verify.main([*argv, "--out", str(tmp_path / "ev.json")])
    dense, ssv = doc["rows"]
    assert dense["attention"]["kind"] == "dense"
    assert (ssv["attention"]["mode"], ssv["attention"]["group_size"]) == ("shared", 4)
    assert strategy_label(ssv) == "ssv (mean, shared C=4)"
    assert row_strategy(ssv).mode == "shared" and ssv["graph_s"] > 0


@pytest.mark.parametrize("chained", [False, True])
def test_layer_ops_are_the_ops_the_forward_runs(tmp_path, monkeypatch, chained):
    """``layer_ops`` lists the ops of the forward as the triton backend runs it: with its norms
    chained into its projections (every projection on the weight-streaming kernel) there is no
    ``post_norm``, ``input_norm`` or ``silu_mul``, the last layer's down projection stands
    apart, and each op runs; each op's floor exists and moves the chained bytes."""
    from ssvkit.kernels import linear as linear_kernel
    from ssvkit.validation.engine_ops import layer_ops, op_floors

    if chained:
        monkeypatch.setattr(linear_kernel, "MIN_WEIGHT_BYTES", 0)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    ctx, t = 100, 4
    model = build_model(resolve_source(f"random:{path}"), max_positions=ctx + 16)
    runner = ModelRunner(model, batch=1, t_max=ctx + 16, backend="triton", use_graphs=False)
    runner.cache.kv.normal_()
    runner.cache.set_lens(torch.tensor([ctx], dtype=torch.int32))
    attn = AttentionConfig()
    runner.prepare(attn)
    tree = DraftTree.from_spec(f"chain:{t - 1}", "position")
    tokens = torch.randint(0, CONFIG["vocab_size"], (1, t), generator=torch.Generator())
    assert model.chains_norms(t, torch.device("cpu")) == chained
    with torch.no_grad():
        ops = layer_ops(runner, attn, tree, tokens)
        for fn, _ in ops.values():
            fn(1)
    num_l = CONFIG["num_hidden_layers"]
    counts = {name: count for name, (_, count) in ops.items()}
    unchained = {"post_norm": num_l, "silu_mul": num_l, "input_norm": num_l - 1}
    if chained:
        assert not unchained.keys() & counts.keys()
        assert counts["down_proj"] == num_l - 1 and counts["down_proj_last"] == 1
    else:
        assert unchained.items() <= counts.items() and "down_proj_last" not in counts
    ceilings = {"copy_bytes_per_s": 1e9, "gemm_flops_per_s": 1e18, "graph_launch_s": 0.0}
    floors = op_floors(model, t, 0, ceilings, chained)
    assert set(counts) - {"attention"} <= set(floors)
    plain = op_floors(model, t, 0, ceilings)
    moved = 2 * CONFIG["hidden_size"] * t * next(model.parameters()).element_size() / 1e9
    if chained:
        assert floors["o_proj"] == pytest.approx(plain["o_proj"] + moved)
