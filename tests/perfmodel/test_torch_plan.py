"""perfmodel.torch_plan: the serial steps of ATen's index_put_ kernel (128 threads x 4
elements per block) behind the engine's KV write, hand-computed."""

import numpy as np

from perfmodel.torch_plan import index_put_steps, kv_write_chain


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
