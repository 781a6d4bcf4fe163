"""The host wall-clock timer (``kernels.timing.bench_wall``), the CPU's stand-in for CUDA
events: it warms up, samples one call each, rotates over the input sets and reports ``wall``."""

from __future__ import annotations

import pytest
from ssvkit.kernels.timing import WALL, TimingConfig, bench


def test_bench_wall_samples_plain_calls():
    calls = []
    config = TimingConfig(warmup=2, reps=7, max_total_s=10.0)
    tm = bench(calls.append, WALL, num_inputs=3, config=config)
    assert tm.timing == WALL and tm.num_samples == 7
    assert len(calls) == 2 + 1 + 7  # warm-up, the probe call that sizes the reps, the samples
    assert calls[:2] == [0, 1] and calls[3:] == [0, 1, 2, 0, 1, 2, 0]
    assert 0 <= tm.p10_s <= tm.median_s <= tm.p90_s
    with pytest.raises(ValueError, match="timing must be one of"):
        bench(calls.append, "events")
