"""ssvkit.perfmodel.torch_plan: the serial steps of ATen's index_put_ kernel (128 threads x 4
elements per block) behind the engine's KV write and the counts of block selection's top-n stage,
hand-computed."""

import numpy as np
from ssvkit.perfmodel.torch_plan import index_put_steps, kv_write_chain, topn_counts


def test_index_put_steps_grow_to_four_then_stay():
    # One thread per 128 elements walks ceil(n / 128) of them, at most 4 (then more blocks).
    np.testing.assert_array_equal(
        index_put_steps([0, 1, 128, 129, 256, 384, 512, 513, 4096, 2**20]),
        [0, 1, 1, 2, 2, 3, 4, 4, 4, 4],
    )


def test_kv_write_chain_counts_both_stores():
    # Tiny pair's heads (2 x 64): 2 rows -> 256 elements per store, 2 steps each, K then V.
    assert kv_write_chain(2, 2, 64) == 4
    assert kv_write_chain(1, 2, 64) == 2
    assert kv_write_chain(3, 2, 64) == 6
    # 8 KV heads x 128: one row is 1024 elements, already at the 4-step cap.
    np.testing.assert_array_equal(kv_write_chain(np.array([1, 512]), 8, 128), [8, 8])


def test_topn_counts_hand_computed():
    # 4 sequences x 2 KV heads x 16 rows = 128 score rows over 257 blocks, top 64.
    scanned, sorted_keys, length = topn_counts(128, 257, 64)
    assert (scanned, sorted_keys, length) == (128 * 257, 128 * 64, 64)
    # The sort length is per row: it does not grow with the rows, the other two do.
    s, k, n = topn_counts(np.array([32, 2048]), 129, 16)
    np.testing.assert_array_equal(s, [32 * 129, 2048 * 129])
    np.testing.assert_array_equal(k, [512, 32768])
    np.testing.assert_array_equal(n, [16, 16])
