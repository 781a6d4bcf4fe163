"""The step model's op builders on their own (``perfmodel.ops``, ``perfmodel.sparse_ops``,
``perfmodel.draft_ops``): hand-computed counts on tiny points."""

import dataclasses

import numpy as np
from ssvkit.perfmodel.columns import build_columns
from ssvkit.perfmodel.draft_ops import draft_ops
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.ops import OpSum, elementwise, gemm, linear_ops
from ssvkit.perfmodel.sparse_ops import branches
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload

LLAMA = get_model("llama-3.1-8b")


def test_op_sum_adds_ops_of_one_name_in_insertion_order():
    acc = OpSum()
    acc.add("b", gemm(np.array([2.0]), 3, 4, 2))
    acc.add("a", elementwise(np.array([10.0]), np.array([5.0]), 1))
    acc.add("b", gemm(np.array([2.0]), 3, 4, 2))
    assert list(acc) == ["b", "a"]
    assert acc["b"].flops.tolist() == [2 * (2 * 2 * 3 * 4)]
    assert acc["b"].bytes.tolist() == [2 * (3 * 4 * 2 + (2 * 4 + 2 * 3) * 2)]


def test_branches_read_the_compressed_keys_and_window_once_per_group():
    s = dataclasses.replace(
        Strategy.from_name("ssv"), metadata="mean", mode="union", group_size=4, tree="chain:4"
    )
    per_query = dataclasses.replace(s, mode="per_query", group_size=1)
    c = build_columns(
        LLAMA, [(s, Workload(context_len=8192)), (per_query, Workload(context_len=8192))]
    )
    br = branches(c)
    t = 5  # the last accepted token and four drafts
    assert br.groups.tolist() == [2, t]  # ceil(5 / 4) groups, one per query
    assert br.comp.tolist() == [8192 // s.comp_stride] * 2
    assert br.sel.tolist() == [s.top_n * s.block_size] * 2
    assert br.loaded["compressed"].tolist() == [2 * 512, t * 512]
    assert br.loaded["window"].tolist() == [2 * (s.window + t), t * (s.window + t)]
    # per-query kernels load every query's blocks; a union group shares the overlap
    assert br.loaded["selected"][0] < br.loaded["selected"][1] == t * s.top_n * s.block_size


def test_linear_ops_put_moe_layers_in_proportion():
    qwen_moe, deepseek = get_model("qwen3-30b-a3b"), get_model("deepseek-r1")
    m = np.array([1.0])
    dense, moe, mixed = OpSum(), OpSum(), OpSum()
    linear_ops(dense, LLAMA, m, 1, 1.0, "", 1.0, 1.0)
    linear_ops(moe, qwen_moe, m, 1, 1.0, "", 1.0, 1.0)
    linear_ops(mixed, deepseek, m, 1, 1.0, "", 1.0, 1.0)
    assert "ffn_down" in dense and "moe_experts" not in dense
    assert "ffn_down" not in moe and "moe_experts" in moe and "moe_shared" not in moe
    assert {"ffn_down", "moe_experts", "moe_shared"} <= set(mixed)
    # 3 of deepseek's 61 layers are dense: their FFN counted at that share of a layer
    f = deepseek.intermediate_size
    gate_up = 2 * 1 * (2 * f) * deepseek.hidden_size
    assert np.isclose(mixed["ffn_gate_up"].flops[0], gate_up * 3 / 61)


def test_draft_ops_per_drafter_kind():
    points = [
        (Strategy.from_name("sd_dense"), Workload(context_len=4096)),
        (
            dataclasses.replace(
                Strategy.from_name("sd_dense"), drafter=DrafterSpec("ngram"), tree="chain:3"
            ),
            Workload(context_len=4096),
        ),
        (Strategy.from_name("ar_dense"), Workload(context_len=4096)),
    ]
    c = build_columns(LLAMA, points)
    acc = OpSum()
    draft_ops(acc, LLAMA, None, c, 32000, 132)
    # eagle's levels at its point only; the n-gram scan reads the context's int32 ids once
    assert acc["draft.fc"].flops[0] > 0 and acc["draft.fc"].flops[1:].tolist() == [0, 0]
    assert acc["draft.ngram"].bytes.tolist() == [0, 4096 * 4.0, 0]
    assert all(op.flops[2] == 0 for op in acc.values())  # autoregressive decoding drafts nothing
