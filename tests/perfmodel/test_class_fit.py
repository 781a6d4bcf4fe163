"""ssvkit.perfmodel.class_fit.ClassFit: how the fitted latency terms combine (hand-computed on a
synthetic class with unit efficiencies, BW = 1e12 B/s, PEAK = 1e15 FLOP/s)."""

import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.class_fit import ClassFit

BW, PEAK = 1e12, 1e15
CF = ClassFit(
    name="x",
    t0_s=1e-6,
    bytes_knots=(3.0, 10.0),
    bytes_eff=(1.0, 1.0),
    flops_knots=(0.0, 13.0),
    flops_eff=(1.0, 1.0),
    l2_miss=None,
    t_depth_s=1e-9,
    t_step_s=2e-7,
    t_row_s=1e-8,
)


def test_reduction_chain_is_a_bound_beside_the_roofline():
    """A small GEMM waits on its K loop (t0 + t_k K); a large one streams its bytes and the
    same loop hides under them, so K no longer adds."""
    small = CF.call_time_s(1e3, 1.0, BW, PEAK, depth=2048)
    assert small == pytest.approx(1e-6 + 2048e-9)
    large = CF.call_time_s(1e8, 1.0, BW, PEAK, depth=np.array([0.0, 2048.0]))
    np.testing.assert_allclose(large, [1e-6 + 1e-4] * 2)
    # between the two regimes the larger bound wins
    mid = CF.call_time_s(3e3, 1.0, BW, PEAK, depth=2)
    assert mid == pytest.approx(1e-6 + 3e-9)


def test_serial_steps_and_row_tile_add_to_any_call():
    base = CF.call_time_s(np.array([1e3, 1e8]), 1.0, BW, PEAK)
    more = CF.call_time_s(np.array([1e3, 1e8]), 1.0, BW, PEAK, steps=64, rows=32)
    np.testing.assert_allclose(more - base, [64 * 2e-7 + 32 * 1e-8] * 2)


def test_l2_throughput_bounds_a_call_that_rereads_its_blocks():
    """G + h (U - G) bytes from HBM, but all U requested bytes cross L2 at r_p x PEAK: the call
    streams a heavily re-read selection no faster than U / (r_p PEAK); 0 (classes without the
    term) leaves the HBM term alone."""
    r_p = 2.0 * BW / PEAK  # the L2 path at twice the copy rate on this GPU
    cf = dataclasses.replace(CF, l2_miss=0.1, l2_bytes_per_flop=r_p, t0_s=0.0, t_depth_s=0.0)
    # U = 1 GB, G = 0.1 GB: HBM term 0.1 + 0.1 * 0.9 = 0.19 GB; L2 term 1 / 2 = 0.5 GB
    reread = cf.call_time_s(1e9, 1.0, BW, PEAK, dedup_bytes=1e8)
    assert reread == pytest.approx(0.5e9 / BW)
    # U = 1 GB, G = 0.8 GB: the HBM term (0.82 GB) binds
    distinct = cf.call_time_s(1e9, 1.0, BW, PEAK, dedup_bytes=8e8)
    assert distinct == pytest.approx(0.82e9 / BW)
    off = dataclasses.replace(cf, l2_bytes_per_flop=0.0)
    assert off.call_time_s(1e9, 1.0, BW, PEAK, dedup_bytes=1e8) == pytest.approx(0.19e9 / BW)


def test_the_l2_path_follows_the_gemm_rate_not_the_copy_rate():
    """On a GPU of the same chip with 0.7x the copy rate, the call bound by the L2 path keeps
    its time and the call bound by its HBM bytes takes 1 / 0.7 as long; with 0.9x the GEMM
    rate the L2-bound call takes 1 / 0.9 as long."""
    cf = dataclasses.replace(
        CF, l2_miss=0.1, l2_bytes_per_flop=2.0 * BW / PEAK, t0_s=0.0, t_depth_s=0.0
    )
    for dedup, slower_copy, slower_gemm in ((1e8, 1.0, 1 / 0.9), (8e8, 1 / 0.7, 1.0)):
        base = cf.call_time_s(1e9, 1.0, BW, PEAK, dedup_bytes=dedup)
        assert cf.call_time_s(1e9, 1.0, 0.7 * BW, PEAK, dedup_bytes=dedup) == pytest.approx(
            base * slower_copy
        )
        assert cf.call_time_s(1e9, 1.0, BW, 0.9 * PEAK, dedup_bytes=dedup) == pytest.approx(
            base * slower_gemm
        )


def test_memory_term_on_another_gpu_keeps_its_sm_side_share():
    """A class fitted at a quarter of the copy rate spends a quarter of its memory term on HBM
    bytes and three quarters on the SMs' side: on a GPU with 0.7x the copy rate only the first
    part slows (1 / 0.7 + 3 copy-rate times), with 0.9x the GEMM rate only the second
    (1 + 3 / 0.9). A class at the copy rate, or over it (L2-served bytes), follows the copy
    rate alone; on the GPU of the fit every class prices as without ``fit_ceilings``."""
    slow = dataclasses.replace(CF, bytes_eff=(0.25, 0.25), t0_s=0.0, t_depth_s=0.0)
    moved = dataclasses.replace(slow, fit_ceilings=(BW, PEAK))
    at_copy = 1e9 / BW
    nbytes = np.array([1e4, 1e9])
    assert np.array_equal(
        moved.call_time_s(nbytes, 1.0, BW, PEAK), slow.call_time_s(nbytes, 1.0, BW, PEAK)
    )
    assert moved.call_time_s(1e9, 1.0, 0.7 * BW, PEAK) == pytest.approx(at_copy * (1 / 0.7 + 3))
    assert moved.call_time_s(1e9, 1.0, BW, 0.9 * PEAK) == pytest.approx(at_copy * (1 + 3 / 0.9))
    for eff in (1.0, 2.0):
        fast = dataclasses.replace(moved, bytes_eff=(eff, eff))
        assert fast.call_time_s(1e9, 1.0, 0.7 * BW, 0.9 * PEAK) == pytest.approx(
            at_copy / (eff * 0.7)
        )
    assert ClassFit.from_json("x", slow.to_json(), (BW, PEAK)) == moved
    assert "fit_ceilings" not in moved.to_json()


def test_json_round_trip_and_older_profiles():
    again = ClassFit.from_json("x", CF.to_json())
    assert again == CF
    drop = ("t_step_s", "t_row_s", "l2_bytes_per_flop")
    old = {k: v for k, v in CF.to_json().items() if k not in drop}
    legacy = ClassFit.from_json("x", old)
    assert legacy.t_step_s == 0.0 == legacy.t_row_s == legacy.l2_bytes_per_flop
    # a profile that kept the L2 path as a ratio over its copy rate: converted with its BW / PEAK
    ratio = ClassFit.from_json("x", {**old, "l2_ratio": 2.0}, (BW, PEAK))
    assert ratio.l2_bytes_per_flop == pytest.approx(2.0 * BW / PEAK)
    with pytest.raises(ValueError, match="'x' keeps its L2 path as l2_ratio 2.0"):
        ClassFit.from_json("x", {**old, "l2_ratio": 2.0})


def test_stage_counts_add_at_their_own_rates():
    """Each stage count adds at its own rate, to small and large calls alike; a class without
    stage rates ignores counts, and JSON keeps the rates."""
    cf = ClassFit.from_json("x", {**CF.to_json(), "t_stage_s": [1e-10, 2e-9, 1e-7]})
    nbytes = np.array([1e3, 1e8])
    base = cf.call_time_s(nbytes, 1.0, BW, PEAK)
    more = cf.call_time_s(nbytes, 1.0, BW, PEAK, stages=(32 * 2049, 32 * 64, 64))
    np.testing.assert_allclose(more - base, [32 * 2049 * 1e-10 + 32 * 64 * 2e-9 + 64e-7] * 2)
    assert ClassFit.from_json("x", cf.to_json()) == cf
    np.testing.assert_allclose(CF.call_time_s(nbytes, 1.0, BW, PEAK, stages=(1e9,)), base)


def test_chain_tiles_that_miss_l2_wait_longer():
    """A chain unit costs t_k + t_km G / U: at G = U every tile misses L2, at G = U / 4 a
    quarter does; without deduplicated bytes every tile counts as a miss; JSON keeps t_km and
    a class without it writes none."""
    cf = dataclasses.replace(CF, l2_miss=0.5, t_depth_s=1e-6, t_depth_miss_s=4e-7, t0_s=0.0)
    per_tile = [
        float(cf.call_time_s(1e3, 1.0, BW, PEAK, dedup_bytes=g, depth=100)) / 100
        for g in (1e3, 250.0)
    ]
    assert per_tile == pytest.approx([1.4e-6, 1.1e-6])
    assert cf.call_time_s(1e3, 1.0, BW, PEAK, depth=100) == pytest.approx(1.4e-4)
    assert ClassFit.from_json("x", cf.to_json()) == cf
    assert "t_depth_miss_s" not in CF.to_json()


def test_an_overlap_exponent_takes_the_bounds_p_norm():
    """Chain 3 us, memory 4 us, compute 1 us: the maximum is 4 us; p = 2 gives
    sqrt(9 + 16 + 1) us, p = 1 their sum; one bound alone stays itself at any p."""
    kw = dict(depth=3000, rows=0)
    plain = CF.call_time_s(4e6, 1e9, BW, PEAK, **kw)
    assert plain == pytest.approx(1e-6 + 4e-6)
    for p, want in (
        (2.0, np.sqrt(26.0)),
        (1.0, 8.0),
        (32.0, 4.0 * (1 + (3 / 4) ** 32) ** (1 / 32)),
    ):
        cf = dataclasses.replace(CF, overlap_p=p)
        assert cf.call_time_s(4e6, 1e9, BW, PEAK, **kw) == pytest.approx(1e-6 + want * 1e-6)
        alone = cf.call_time_s(np.array([4e6, 0.0]), 1.0, BW, PEAK)
        np.testing.assert_allclose(alone, [1e-6 + 4e-6, 1e-6])
    again = dataclasses.replace(CF, overlap_p=2.5)
    assert ClassFit.from_json("x", again.to_json()) == again
    assert "overlap_p" not in CF.to_json()
