"""The simulator's per-round loop overhead (``SimConfig.loop_overhead_s``)."""

import pytest
from ssvkit.sim.config import SimConfig
from ssvkit.sim.scenarios import simulate


def test_loop_overhead_adds_to_every_round_and_to_the_analytic_figure():
    base = dict(scenario="sd_dense", context_len=4096, num_tokens=256, seed=3)
    bare = simulate(SimConfig(**base))
    slow = simulate(SimConfig(**base, loop_overhead_s=5e-4))
    rounds = slow.recorder.num_steps
    assert rounds == bare.recorder.num_steps  # same acceptance draws, same rounds
    sim_s = lambda r: r.figures["simulated_tokens_per_s"]["value"]  # noqa: E731
    tokens = 256
    t_bare, t_slow = tokens / sim_s(bare), tokens / sim_s(slow)
    assert t_slow - t_bare == pytest.approx(rounds * 5e-4, rel=1e-6)
    a_bare = bare.figures["analytic_round_s"]["value"]
    assert slow.figures["analytic_round_s"]["value"] == pytest.approx(a_bare + 5e-4)
    with pytest.raises(ValueError, match="loop_overhead_s"):
        SimConfig(loop_overhead_s=-1.0)
