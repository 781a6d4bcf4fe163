"""A fixed batch (``SimConfig.static_batch``): finished sequences keep their slots, and the trace
acceptance of a batch (sequence 0 replays, the others draw from its counts)."""

import numpy as np
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.sim.acceptance import build_acceptance
from ssvkit.sim.config import SimConfig
from ssvkit.sim.scenarios import simulate


def _run(**kw):
    kw = {"batch": 8, **kw}
    cfg = SimConfig(scenario="sd_dense", context_len=4096, num_tokens=64, seed=5, **kw)
    res = simulate(cfg)
    return res.recorder.num_steps, res.figures["simulated_tokens_per_s"]["value"]


def test_a_static_batch_pays_every_slot_until_the_last_sequence_ends():
    rounds, tps = _run()
    static_rounds, static_tps = _run(static_batch=True)
    assert static_rounds == rounds  # the same draws end the same sequences in the same rounds
    assert static_tps < tps  # the rounds after the first sequence ends cost the whole batch
    one = dict(batch=1)
    assert _run(**one) == _run(static_batch=True, **one)  # one sequence has no tail


def test_a_batch_replays_the_trace_once_and_draws_the_rest_from_it():
    counts = [0, 3, 1, 2, 2, 0, 1]
    acc = build_acceptance("trace", parse_tree("chain:3"), 0.7, trace=_Trace(counts))
    first = acc.sampler(np.random.default_rng(0), 0, 4)
    assert [first() for _ in range(2 * len(counts))] == counts * 2
    other = acc.sampler(np.random.default_rng(1), 1, 4)
    drawn = [other() for _ in range(400)]
    assert set(drawn) == set(counts) and drawn[: len(counts)] != counts


class _Trace:
    """The columns ``build_acceptance`` reads of a trace."""

    def __init__(self, accepted):
        self.cols = {"accepted": np.array(accepted), "drafted": np.full(len(accepted), 3)}

    def column(self, name):
        return self.cols[name]
