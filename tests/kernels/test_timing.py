"""The host wall-clock timer (``kernels.timing.bench_wall``), the CPU's stand-in for CUDA
events: it warms up, samples one call each, rotates over the input sets and reports ``wall``;
on the GPU, interleaved graph timing (``bench_graphs``)."""

from __future__ import annotations

import pytest
import torch
from ssvkit.kernels.timing import WALL, TimingConfig, bench, bench_graphs


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_graphs_interleaves_every_function_alike():
    """Each function is captured once (warm-up calls, then ``graph_launches`` calls in its
    graph) and sampled as often as the others."""
    calls = {0: 0, 1: 0}
    x = torch.zeros(2**22, device="cuda")

    def work(k, n):
        def fn(i):
            calls[k] += 1
            for _ in range(n):
                x.add_(1.0)

        return fn

    config = TimingConfig(warmup=2, graph_launches=3, graph_reps=6, max_total_s=10.0)
    small, large = bench_graphs([work(0, 1), work(1, 4)], config=config)
    assert calls == {0: 2 + 3, 1: 2 + 3}  # captured calls run on replay, not in Python
    assert small.num_samples == large.num_samples == 6
    assert small.timing == large.timing == "graph"
    assert min(small.p10_s, large.p10_s) > 0
