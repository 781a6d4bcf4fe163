"""ssvkit.perfmodel.dense_work: a dense verification call's work follows its launch plan
(hand-computed at Llama-3.1-8B's heads on a 132-SM Hopper), and the calibrated class fitted on
it prices that plan: a second, nearly empty wave of programs costs a whole wave."""

import numpy as np
import pytest
from ssvkit.perfmodel.attention_plan import dense_verify_plan
from ssvkit.perfmodel.dense_work import (
    EXP_FLOPS,
    dense_call_work,
    dense_work_arrays,
    key_tile_weight,
)
from ssvkit.perfmodel.profiles import shipped_profile

SMS, SMEM = 132, 228 * 1024
LLAMA = (32, 8, 128)  # query heads, KV heads, head dim


def test_one_wave_of_128_row_tiles_at_batch_16():
    """t = 17 packs 68 rows a KV head into one 128-row tile: 128 programs, no split (they fill
    most of the 132 SMs), one an SM (a 128-row program's pipeline takes 128 KiB), each walking
    the 32785 positions' 513 tiles."""
    w = dense_call_work(16, 17, 32768, *LLAMA, SMS, SMEM)
    assert w.chain_tiles == 513
    assert w.sm_rows == 64  # one program of 128 wgmma rows, half a row each
    assert (w.merge_steps, w.splits) == (0, 0)
    kv = 16 * 8 * 32785 * 2 * 128 * 2
    qo = 2 * 16 * 17 * 32 * 128 * 2
    assert w.requested_bytes == w.unique_bytes == kv + qo
    mma = 16 * 8 * 513 * 64 * 128 * 128 * 4
    assert w.flops == pytest.approx(mma * (128 + EXP_FLOPS / 4) / 128)


def test_four_programs_more_split_rather_than_run_a_second_wave():
    """Batch 17: 136 programs of 128 rows over 132 SMs that hold one each; unsplit, four
    whole walks would run in a second wave (measured at 32K before the split rule cut them:
    616 us at batch 16, 1085 us at batch 17). The plan splits the prefix in five: 680
    programs in six waves of a fifth of the walk each, and their merge; the shipped H200 class
    prices the split call well under twice batch 16's."""
    w16, w17 = (dense_call_work(b, 17, 32768, *LLAMA, SMS, SMEM) for b in (16, 17))
    assert (w17.splits, w17.merge_steps) == (1, 1)
    assert w17.chain_tiles == 6 * 103 < 1.25 * w16.chain_tiles  # ceil(ceil(32785 / 5) / 64)
    assert w17.sm_rows == w16.sm_rows == 64
    profile = shipped_profile("h200")
    cls = profile.classes["dense_verify"]
    assert cls.slot_plan

    def price(w):
        return cls.call_time_s(
            w.requested_bytes,
            w.flops,
            profile.copy_bytes_per_s,
            profile.gemm_flops_per_s,
            w.unique_bytes,
            w.chain_tiles,
            w.merge_steps,
            w.sm_rows,
            (w.splits, w.tail_bytes),
        )

    assert price(w17) < 1.4 * price(w16)


def test_the_busiest_sms_stream_a_tail_past_the_even_share():
    """t = 16 at G = 4: one 64-row tile a KV head. Batch 16's 128 programs leave 4 SMs idle and
    no tail beyond their share; batch 17's 136 put two on 4 SMs, nearly a whole walk past the
    share on those; batch 33's 264 fill every SM twice, none."""
    walk = (65536 + 16) * 2 * 128 * 2
    w16, w17, w33 = (dense_call_work(b, 16, 65536, *LLAMA, SMS, SMEM) for b in (16, 17, 33))
    assert w16.splits == w17.splits == w33.splits == 0
    assert w16.tail_bytes == pytest.approx((1 - 128 / 132) * walk)
    assert w17.tail_bytes == pytest.approx((2 - 136 / 132) * walk)
    assert w33.tail_bytes == 0


def test_row_tiles_of_one_kv_head_request_its_keys_again():
    """t = 64 at G = 4: 256 rows a KV head in two 128-row tiles, each streaming the prefix; the
    distinct bytes read the prefix once."""
    w = dense_call_work(1, 64, 16384, *LLAMA, SMS, SMEM)
    plan = dense_verify_plan(1, 64, *LLAMA, 16384 + 64, SMS)
    assert plan.num_m_tiles == 2 and plan.num_splits > 1
    s = plan.num_splits
    kv = 8 * (16384 + 64) * 2 * 128 * 2
    qo = 2 * 64 * 32 * 128 * 2
    partials = 2 * 64 * 32 * s * 129 * 4
    assert w.unique_bytes == kv + qo + partials
    assert w.requested_bytes == 2 * kv + qo + partials
    assert w.merge_steps == -(-s // 16) and w.splits == 1


def test_a_key_tile_weighs_its_mmas_and_exponentials():
    assert key_tile_weight(128) == 1.0
    assert key_tile_weight(64) == pytest.approx(2 / 3)  # (64 + 64) / (128 + 64)
    # 8 q / 2 KV heads, D = 64, t = 16: one 64-row tile a KV head, four programs an SM fit in
    # shared memory but 8 programs over 132 SMs hold one each
    w = dense_call_work(1, 16, 8192, 8, 2, 64, SMS, SMEM)
    assert w.sm_rows == pytest.approx(32 * 2 / 3)


def test_arrays_match_the_call_and_count_nothing_without_rows():
    shape = {
        "batch": np.array([16, 17, 0, 1]),
        "t": np.array([17, 16.5, 4, 64]),
        "context_len": np.array([32768, 32768, 8192, 16384]),
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
    }
    w = dense_work_arrays(shape, num_sms=SMS, smem_per_sm_bytes=SMEM)
    for i, point in enumerate([(16, 17, 32768), (17, 17, 32768), None, (1, 64, 16384)]):
        if point is None:
            assert all(w[f][i] == 0 for f in w)
            continue
        one = dense_call_work(*point, *LLAMA, SMS, SMEM)
        assert w["chain_tiles"][i] == one.chain_tiles and w["flops"][i] == one.flops


def test_bad_heads_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads"):
        dense_call_work(1, 4, 1024, 32, 0, 128, SMS, SMEM)
    with pytest.raises(ValueError, match="num_q_heads"):
        dense_call_work(1, 4, 1024, 4, 8, 128, SMS, SMEM)
    with pytest.raises(ValueError, match="batch"):
        dense_call_work(0, 4, 1024, *LLAMA, SMS, SMEM)
    # a tensor-parallel split of 32 / 8 heads over 3 ranks: 11 / 3 a rank, packed 3 a KV head
    assert dense_call_work(1, 1, 512, 11, 3, 128, SMS, SMEM).chain_tiles > 0
