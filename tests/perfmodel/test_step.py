import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import ModelSpec, get_model
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.sparse_work import SparseShape, sparse_call_work
from ssvkit.perfmodel.step import build_columns, predict_columns, product_columns
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy, Workload

TINY = ModelSpec(
    name="tiny",
    family="llama",
    num_layers=2,
    hidden_size=64,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=100,
)
GPU = dataclasses.replace(
    get_gpu("h100-sxm", measured=False),
    hbm_bytes_per_s=1e12,
    bf16_flops_per_s=1e15,
    fp32_flops_per_s=1e14,
    launch_overhead_s=1e-6,
)


def run(model, points, drafter=None):
    c = build_columns(model, points)
    return c, predict_columns(model, c, RooflinePredictor(GPU, tp=c.tp), drafter)


def test_ar_step_hand_computed():
    _, p = run(TINY, [(Strategy.from_name("ar_dense"), Workload(context_len=1000))])
    qkv = p.ops["verify.qkv_proj"]
    # M = 1, N = (4 + 2 * 2) * 16 = 128, K = 64, two layers
    assert qkv.flops[0] == 2 * 2 * 128 * 64
    assert qkv.bytes[0] == 2 * (128 * 64 * 2 + (64 + 128) * 2)
    attn = p.ops["verify.attention"]
    kv = 1001 * 2 * 2 * 16 * 2  # T + 1 tokens, K and V, 2 KV heads, d_h 16, bf16
    qo = 2 * 4 * 16 * 2 + 4 * 4
    assert attn.bytes[0] == 2 * (kv + qo)
    # the G x t = 2 packed rows of a KV head run in a 16-row tile: 8x the rows' FLOPs
    assert attn.flops[0] == 2 * 1001 * 4 * 4 * 16 * 8
    assert p.op_seconds["verify.attention"][0] == pytest.approx(2 * (kv + qo) / 1e12 + 4e-6)
    assert p.tokens_per_s[0] == pytest.approx(1 / p.round_s[0])
    assert p.draft_s[0] == 0


def test_speculative_tokens_per_second_counts_expected_tokens():
    s = Strategy.from_name("sd_dense", tree="chain:4")
    c, p = run(TINY, [(s, Workload(context_len=1000, acceptance=0.8, batch=3))])
    assert c.rows[0] == 5 and p.tokens_per_round[0] == pytest.approx(3.3616)
    assert p.tokens_per_s[0] == pytest.approx(3 * 3.3616 / p.round_s[0])
    assert p.round_s[0] == pytest.approx(p.draft_s[0] + p.verify_s[0] + p.loop_s[0])
    assert p.draft_s[0] > 0


def _sparse(mode, c, **kw):
    return Strategy(
        name=f"{mode}{c}",
        tree="chain:15",
        attention="sparse",
        mode=mode,
        group_size=c,
        top_n=8,
        block_size=16,
        window=64,
        **kw,
    )


GROUPINGS = [("per_query", 1), ("union", 1), ("union", 4), ("shared", 4)]


def test_grouping_only_changes_selected_bytes():
    w = Workload(context_len=4096, overlap=0.75)
    _, p = run(TINY, [(_sparse(m, c, metadata="mean"), w) for m, c in GROUPINGS])
    sel = p.branch_bytes["selected"]
    assert sel[0] == sel[1]
    # 16 queries, C = 4, gamma = .75: 4 groups x 8 (1 + 3 * .25) blocks vs 16 x 8
    assert sel[2] / sel[0] == pytest.approx(4 * 8 * 1.75 / (16 * 8))
    assert sel[3] / sel[0] == pytest.approx(4 * 8 / (16 * 8))
    # Block-metadata selection verifies with kernels.sparse_verify, one op per kernel path (a
    # union of one query runs the per_query launch) and grid regime (32 lists: few_lists).
    assert np.asarray(p.ops["verify.sparse_attention"].calls).tolist() == [0] * 4
    per_query, union = (
        p.ops["verify.sparse_verify_per_query_few_lists"],
        p.ops["verify.sparse_verify_union_few_lists"],
    )
    assert (
        per_query.kernel == "sparse_verify/per_query/few_lists"
        and union.kernel == "sparse_verify/union/few_lists"
    )
    layers = TINY.num_layers
    assert np.asarray(per_query.calls).tolist() == [layers, layers, 0, 0]
    assert np.asarray(union.calls).tolist() == [0, 0, layers, 0]
    assert per_query.bytes[0] == per_query.bytes[1]
    # C = 4: fewer bytes; its 8 lists split into more parts than per_query's 32, so no program
    # walks more tiles in series than per_query's
    assert union.bytes[2] < per_query.bytes[1] and union.depth[2] <= per_query.depth[1]


def test_metadata_sparse_verify_is_priced_on_its_launch_plans_work():
    """The step model's sparse_verify op carries, per layer, the work ``perfmodel.sparse_work``
    counts for the call the engine launches (16 rows, C = 4, 2 KV heads on 132 SMs, each row's
    8 scored blocks and the 5 blocks of its 64-token local window)."""
    w = Workload(context_len=4096, overlap=0.75)
    _, p = run(TINY, [(_sparse("union", 4, metadata="mean"), w)])
    shape = SparseShape(
        1,
        16,
        4,
        2,
        16,
        4096,
        "union",
        group_size=4,
        top_n=8,
        block_size=16,
        overlap=0.75,
        local_blocks=5,
    )
    one = sparse_call_work(shape, num_sms=GPU.num_sms)
    op = p.ops["verify.sparse_verify_union_few_lists"]
    layers = TINY.num_layers
    assert op.bytes[0] == pytest.approx(layers * one.requested_bytes)
    assert op.dedup_bytes[0] == pytest.approx(layers * one.unique_bytes)
    assert op.depth[0] == pytest.approx(layers * one.chain_tiles)
    assert op.serial_steps[0] == pytest.approx(layers * one.merge_steps)
    assert one.num_splits > 1 and one.merge_launches + one.merge_steps == 0  # merged in-launch
    assert op.launches[0] == pytest.approx(layers * (1 + 1))  # the call and its union plan
    assert op.stage_counts[1][0] == pytest.approx(layers * one.row_waves)
    assert op.stage_counts[2][0] == pytest.approx(layers * one.sm_tiles)
    assert op.stage_counts[3][0] == pytest.approx(layers * one.plan_compares)  # refresh every layer
    assert p.op_seconds["verify.sparse_verify_union_few_lists"][0] > 0


def test_nsa_grouping_sets_the_row_tiles_each_loading_its_union():
    """NSA selects per row under every mode (no shared-index approximation): per_query loads
    every row's blocks (seed 000's naive baseline, its own op), union C each tile's union, shared
    the union of all 16 rows in one packed tile; the FLOPs do not change."""
    w = Workload(context_len=4096, overlap=0.75)
    _, p = run(TINY, [(_sparse(m, c), w) for m, c in GROUPINGS])
    sel = p.branch_bytes["selected"]
    assert sel[0] == sel[1] and sel[2] / sel[0] == pytest.approx(4 * 8 * 1.75 / (16 * 8))
    assert sel[3] / sel[0] == pytest.approx(8 * (1 + 15 * 0.25) / (16 * 8))
    # Refresh every layer: every layer is one refresh call (selection inside).
    one_row = p.ops["verify.sparse_attention_refresh_per_query"]
    tiles = p.ops["verify.sparse_attention_refresh"]
    assert np.asarray(one_row.calls).tolist() == [TINY.num_layers] * 2 + [0, 0]
    assert np.asarray(tiles.calls).tolist() == [0, 0] + [TINY.num_layers] * 2
    assert one_row.flops[0] == tiles.flops[2] == tiles.flops[3] > 0
    assert float(p.ops["verify.sparse_attention"].calls[0]) == 0.0
    t = p.op_seconds
    refresh = t["verify.sparse_attention_refresh"] + t["verify.sparse_attention_refresh_per_query"]
    assert refresh[0] > refresh[2] > refresh[3]


def test_refresh_reuse_cuts_selection_and_launches():
    w = Workload(context_len=4096)
    base = _sparse("union", 4, metadata="mean")
    reuse = dataclasses.replace(base, refresh_every=2, fusion="refresh_reuse")
    _, p = run(TINY, [(base, w), (reuse, w)])
    assert p.op_seconds["verify.selection"][1] == pytest.approx(
        p.op_seconds["verify.selection"][0] / 2
    )
    # Block-metadata attention runs kernels.sparse_verify whatever the fusion, its union plan
    # in refresh layers only (half of them); the NSA kernels fuse their branches.
    meta = p.ops["verify.sparse_verify_union_few_lists"].launches
    assert meta[1] == meta[0] - TINY.num_layers / 2 > 0
    nsa = [dataclasses.replace(s, metadata="nsa") for s in (base, reuse)]
    _, p = run(TINY, [(s, w) for s in nsa])
    ops = p.ops
    unfused = (
        ops["verify.sparse_attention"].launches + ops["verify.sparse_attention_refresh"].launches
    )
    fused = (
        ops["verify.sparse_attention_fused"].launches
        + ops["verify.sparse_attention_fused_refresh"].launches
    )
    assert fused[0] == 0 == unfused[1] and 0 < fused[1] < unfused[0]


def test_sampling_walks_the_vocabulary_shard():
    """Sampling's depth per call is the vocabulary one rank samples over (its rows' walk)."""
    w = Workload(context_len=4096)
    ar = Strategy(name="ar")
    _, p = run(TINY, [(ar, w), (ar, dataclasses.replace(w, tp=2))])
    op = p.ops["verify.sampling"]
    np.testing.assert_allclose(op.depth / op.calls, [100, 50])


def test_selection_carries_its_topn_stage_counts():
    """Mean-key selection, per query: each call's top-n stage scans B x t x Hkv score rows of
    the context's and draft rows' blocks and sorts top_n keys per row (perfmodel.torch_plan);
    shared selection scores one row per group."""
    w = Workload(context_len=4096)
    pq, shared = _sparse("per_query", 1, metadata="mean"), _sparse("shared", 4, metadata="mean")
    _, p = run(TINY, [(pq, w), (shared, w)])
    op = p.ops["verify.selection"]
    per_call = [np.asarray(x) / op.calls for x in op.stage_counts]
    rows = np.array([16 * 2, 4 * 2])  # chain:15 -> 16 rows (4 groups) x 2 KV heads, batch 1
    nb = np.ceil((4096 + 16) / 16)
    np.testing.assert_allclose(per_call[0], rows * nb)
    np.testing.assert_allclose(per_call[1], rows * 8)
    np.testing.assert_allclose(per_call[2], [8, 8])
    # Bytes as the measured class counts them: fp32 mean keys (2 heads x 256 blocks x 16),
    # the scored query rows (bf16, 4 heads x 16) and the int32 ids, plus the metadata update
    # of the 16 appended rows (b t Hkv D x 2 B x (1 + 2 v), the step model's count).
    meta, q, ids = 2 * 256 * 16 * 4, np.array([16, 4]) * 4 * 16 * 2, rows * 8 * 4
    update = 16 * 2 * 16 * 2 * 3
    np.testing.assert_allclose(op.bytes / op.calls, meta + q + ids + update)


def test_nsa_refresh_layers_select_inside_their_own_calls():
    """NSA metadata: the refresh calls select (no separate selection op); reuse layers take
    the reuse class; half the layers refresh at refresh_every = 2."""
    w = Workload(context_len=4096)
    nsa = dataclasses.replace(_sparse("union", 4), refresh_every=2, fusion="refresh_reuse")
    _, p = run(TINY, [(nsa, w)])
    layers = TINY.num_layers
    assert float(p.op_seconds["verify.selection"][0]) == 0.0
    assert float(p.ops["verify.sparse_attention_fused_refresh"].calls[0]) == layers / 2
    assert float(p.ops["verify.sparse_attention_fused"].calls[0]) == layers / 2
    assert float(p.ops["verify.sparse_attention_refresh"].calls[0]) == 0.0


def test_single_row_ops_take_their_own_classes():
    """kv_write, silu_mul and rotary run another torch path for one row: AR points use the
    /m1 classes, verify points of several rows the general ones."""
    w = Workload(context_len=4096, elementwise="torch")
    ar, sd = Strategy(name="ar"), Strategy(name="sd", tree="chain:3")
    _, p = run(TINY, [(ar, w), (sd, w)])
    for general, row in (
        ("verify.kv_write", "verify.kv_write_row"),
        ("verify.ffn_act", "verify.ffn_act_row"),
        ("verify.rope", "verify.rope_row"),
    ):
        assert p.ops[row].kernel.removesuffix("@l2").endswith("/m1")
        assert float(p.ops[row].calls[0]) > 0 == float(p.ops[row].calls[1])
        assert float(p.ops[general].calls[1]) > 0 == float(p.ops[general].calls[0])


def test_kv_write_carries_its_store_chain():
    """The KV write's depth per call is its two index_put_ stores' serial steps at the point's
    rows (perfmodel.torch_plan): TINY's 2 KV heads x 16 dims, 4 draft rows + 1 -> 160 elements,
    2 steps per store; one AR row (32 elements) -> 1 step."""
    w = Workload(context_len=4096, elementwise="torch")
    ar, sd = Strategy(name="ar"), Strategy(name="sd", tree="chain:4")
    _, p = run(TINY, [(ar, w), (sd, w)])
    for name, point, steps in (("verify.kv_write_row", 0, 2), ("verify.kv_write", 1, 4)):
        op = p.ops[name]
        assert float(op.depth[point] / op.calls[point]) == steps


def test_ops_of_models_whose_weights_fit_in_l2_are_named_resident():
    """TINY's weights fit in the H100's L2: its GEMM and element-wise ops (and a draft model's
    that fits) are named ``@l2``, attention never; an 8B model's stay cold."""
    w = Workload(context_len=4096)
    from ssvkit.engine.checkpoint import TINY_DRAFT  # the trained draft model's config: 2.6 MB

    big = get_model("llama-3.1-8b")
    drafter = DrafterSpec(kind="draft_model", model=str(TINY_DRAFT))
    sd = Strategy(name="sd", tree="chain:3", drafter=drafter)
    _, tiny = run(TINY, [(sd, w)], drafter)
    _, large = run(big, [(sd, w)], drafter)
    for p, resident in ((tiny, True), (large, False)):
        for k, op in p.ops.items():
            if not op.kernel:
                continue
            marked = op.kernel.endswith("@l2")
            if op.kind not in ("gemm", "elementwise"):
                assert not marked, k
            elif k.startswith("draft.model."):
                assert marked, k  # the tiny draft model's weights fit
            else:
                assert marked == resident, k
    assert tiny.ops["verify.qkv_proj"].kernel == "gemm@l2"
    assert large.ops["verify.qkv_proj"].kernel == "gemm"


def test_dense_attention_grows_with_context_and_tp_splits_weights():
    m = get_model("llama-3.1-8b")
    pts = [(Strategy.from_name("ar_dense"), Workload(context_len=T)) for T in (8192, 65536)]
    _, p = run(m, pts)
    assert p.op_seconds["verify.attention"][1] > 4 * p.op_seconds["verify.attention"][0]
    _, p2 = run(m, [(Strategy.from_name("ar_dense"), Workload(tp=2))])
    _, p1 = run(m, [(Strategy.from_name("ar_dense"), Workload(tp=1))])
    assert p2.ops["verify.ffn_down"].bytes[0] < 0.51 * p1.ops["verify.ffn_down"].bytes[0]
    assert p2.op_seconds["verify.allreduce"][0] > 0 == p1.op_seconds["verify.allreduce"][0]


def test_dense_verify_attention_follows_the_kernels_row_tiles():
    # Llama-3.1-8B (G = 4) at batch 16: 16 draft nodes verify t = 17 rows, 68 packed rows a KV
    # head, which run in the 128-row tile of t = 32; t = 16 packs 64 rows into a 64-row tile.
    m = get_model("llama-3.1-8b")
    w = Workload(context_len=32768, batch=16)
    pts = [(Strategy.from_name("sd_dense", tree=f"chain:{k}"), w) for k in (15, 16, 31)]
    _, p = run(m, pts)
    flops = p.ops["verify.attention"].flops
    assert flops[1] == pytest.approx(flops[2] * (32768 + 17) / (32768 + 32))
    assert flops[1] > 1.8 * flops[0]


def test_dense_verify_attention_carries_its_launch_plan():
    """The dense attention op carries the kernel's launch-plan counts on the GPU's SMs
    (``perfmodel.dense_work``), per layer: Llama-3.1-8B at 32K, t = 17 packs 68 rows a KV head
    into one 128-row tile; 128 programs at batch 16 run in one wave of 513-tile walks, 136 at
    batch 17 split five ways, six waves of 103-tile walks. The calibrated H200 class, fitted on
    those counts, prices the split call above batch 16's and well under twice it (measured per
    call: 616 us at batch 16, 766 us at batch 17); an MLA model's attention, which the kernel
    does not run, carries none."""
    m = get_model("llama-3.1-8b")
    pts = [
        (Strategy.from_name("sd_dense", tree="chain:16"), Workload(context_len=32768, batch=b))
        for b in (16, 17)
    ]
    _, p = run(m, pts)
    plan = p.ops["verify.attention"].slot_plan
    np.testing.assert_array_equal(plan.depth / m.num_layers, [513, 6 * 103])
    np.testing.assert_array_equal(plan.calls, [m.num_layers] * 2)
    h200 = get_gpu("h200")
    c = build_columns(m, pts)
    secs = predict_columns(m, c, make_predictor(h200, tp=c.tp)).op_seconds["verify.attention"]
    assert secs[0] < secs[1] < 1.4 * secs[0]
    ds = get_model("deepseek-r1")
    _, q = run(ds, [(Strategy.from_name("sd_dense", tree="chain:4"), Workload(context_len=4096))])
    assert q.ops["verify.attention"].slot_plan is None


def test_moe_touches_k_experts_for_one_token():
    m = get_model("qwen3-30b-a3b")
    _, p = run(m, [(Strategy.from_name("ar_dense"), Workload(context_len=1024))])
    per_expert = 3 * m.hidden_size * m.expert_intermediate_size * m.weight_bytes
    experts_bytes = p.ops["verify.moe_experts"].bytes[0] / m.num_moe_layers
    assert experts_bytes == pytest.approx(8 * per_expert, rel=0.01)


def test_drafters():
    w = Workload(context_len=2048)
    eagle = Strategy.from_name("sd_dense", tree="chain:4")
    ngram = dataclasses.replace(eagle, drafter=DrafterSpec(kind="ngram"))
    selfs = dataclasses.replace(eagle, drafter=DrafterSpec(kind="self_sparse"))
    _, p = run(TINY, [(eagle, w), (ngram, w), (selfs, w)])
    assert p.draft_s[1] < p.draft_s[0]
    assert p.draft_s[2] > 0
    small = DrafterSpec(kind="draft_model", model="qwen3-8b")
    m = get_model("qwen3-32b")
    _, p = run(m, [(dataclasses.replace(eagle, drafter=small), w)], small)
    assert p.draft_s[0] > 0
    with pytest.raises(ValueError, match="draft model"):
        run(m, [(dataclasses.replace(eagle, drafter=small), w)])


def test_product_columns_equals_explicit_points():
    m = get_model("llama-3.1-8b")
    strategies = [BASELINES[n] for n in BASELINES]
    contexts, accs = [8192, 32768], [0.6, 0.8]
    cp = product_columns(m, strategies, context_len=contexts, acceptance=accs)
    pts = [
        (s, Workload(context_len=T, acceptance=a))
        for s in strategies
        for T in contexts
        for a in accs
    ]
    cb = build_columns(m, pts)
    pred = RooflinePredictor(GPU, tp=cp.tp)
    a = predict_columns(m, cp, pred).tokens_per_s
    b = predict_columns(m, cb, RooflinePredictor(GPU, tp=cb.tp)).tokens_per_s
    np.testing.assert_allclose(a, b)


def test_infeasible_strategy_is_rejected():
    with pytest.raises(ValueError, match="exceeds context_len"):
        build_columns(TINY, [(Strategy.from_name("ssv", top_n=64), Workload(context_len=1024))])


def test_predict_groups_every_attention_op_refresh_included():
    from ssvkit.perfmodel.baselines import compare, grouped_seconds, op_group
    from ssvkit.perfmodel.step import ATTENTION_OPS

    assert all(op_group(f"verify.{name}") == "attention" for name in ATTENTION_OPS)
    strategies = [Strategy.from_name(n) for n in ("ar_sparse", "ssv")]
    rows = compare(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), strategies, [32768], Workload())
    for row in rows:
        attention = sum(
            v
            for k, v in row["op_s"].items()
            if k.startswith("verify.") and k.split(".", 1)[1] in ATTENTION_OPS
        )
        assert attention > 0 and grouped_seconds(row)["attention"] == pytest.approx(attention)
        assert any("refresh" in k for k in row["op_s"])  # the refresh layers are counted there
