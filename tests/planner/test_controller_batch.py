"""The online controller at batch > 1: it scores candidates at the batch it decodes (the
ranking's unless given), refuses rounds of a larger batch, and reads the n-gram shadow's walks
per sequence, the batch's counts being summed over its sequences."""

import dataclasses
import math
from dataclasses import dataclass, field

import pytest
from ssvkit.engine.controller import ShadowAcceptance
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import Strategy, chain_length
from ssvkit.perfmodel.tree_tokens import expected_tokens_interp
from ssvkit.planner.controller import ControllerConfig, OnlineController
from ssvkit.planner.profile import RegimeProfile
from ssvkit.planner.rank import rank, score
from ssvkit.planner.space import SpaceSpec, strategy_id

M, G = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
SPACE = SpaceSpec(
    drafters=("eagle", "ngram"),
    trees=("chain:0", "chain:2", "chain:6"),
    modes=("dense", "per_query"),
    refresh_every=(1,),
    top_ns=(16,),
)
PROFILE = RegimeProfile(acceptance={"32K": {"eagle": 0.8, "ngram": 0.3}})


@dataclass
class Stats:
    round: int
    strategy: Strategy
    accepted: tuple
    context_lens: tuple = (30000,)
    drafted: int = 6
    step_s: dict = field(default_factory=dict)
    shadow: dict | None = None

    @property
    def mean_accepted(self):
        return sum(self.accepted) / len(self.accepted)


def _controller(batch: int, given: int | None = None) -> OnlineController:
    doc = rank(M, G, SPACE, PROFILE, batch=batch, regimes={"32K": 32768})
    return OnlineController(doc, M, G, PROFILE, ControllerConfig(), given)


def test_the_controller_scores_at_the_rankings_batch_and_refuses_a_larger_round():
    c = _controller(8)
    assert c.batch == 8 and _controller(8, given=4).batch == 4
    cands = list(c._book.candidates("32K").values())
    # Scored as the engine runs under an online controller: serially.
    scored, _ = score(M, G, cands, 32768, PROFILE, "32K", 8, loop="serial")
    want = {strategy_id(x.strategy): x.round_s for x in scored}
    assert c._book.round_s("32K", cands) == pytest.approx(want, rel=1e-12)
    # At batch 1 every candidate's round is shorter: the batch is what was scored. (How much
    # shorter is the profile's: a sparse round at 32K reads a small share of the KV, so its
    # batch of 8 costs little more than one sequence.)
    single = _controller(8, given=1)._book.round_s("32K", cands)
    assert all(single[k] < v for k, v in want.items())
    scored_single, _ = score(M, G, cands, 32768, PROFILE, "32K", 1, loop="serial")
    assert single == pytest.approx(
        {strategy_id(x.strategy): x.round_s for x in scored_single}, rel=1e-12
    )
    s = c.initial_strategy(30000)
    assert c.after_round(Stats(0, s, (2,) * 8, context_lens=(30000,) * 8)) is None
    with pytest.raises(ValueError, match="a round of 9 sequences handed to a controller"):
        c.after_round(Stats(1, s, (2,) * 9, context_lens=(30000,) * 9))
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        _controller(1, given=0)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_walk_is_read_per_sequence_whatever_the_batch(batch):
    """From autoregressive decoding, every sequence's walk of n-gram chain:6 took a round every
    other token, and the shadow reports them summed over the batch: chain:6 spends half a round
    of its own per round of the current strategy at any batch (a batch advances all its
    sequences each round), so its paired gain is the one of batch 1 -- the batch's summed rounds
    per round would price it ``batch`` times too slow."""
    c = _controller(batch)
    ar = dataclasses.replace(c.initial_strategy(30000), tree="chain:0")
    ng6 = next(
        x
        for x in c._book.candidates("32K").values()
        if x.drafter.kind == "ngram" and x.tree == "chain:6" and not x.is_sparse
    )
    keep, w, w2, r1, r2 = 1.0 - c.config.ema, 0.0, 0.0, 0.0, 0.0
    for i in range(80):
        r = i % 2  # per sequence
        walks = tuple(batch * r for _ in range(8))
        sh = ShadowAcceptance(batch, (batch * r,) + (0,) * 7, walks, walks)
        c._shadow.observe({"ngram": sh}, 1.0, keep, batch)
        w, w2 = keep * w + 1.0, keep * keep * w2 + 1.0
        r1, r2 = keep * r1 + r, keep * r2 + r * r
    mean, var = r1 / w, r2 / w - (r1 / w) ** 2
    high = mean + c.config.confidence_z * math.sqrt(var * w2) / w
    rs = c._book.round_s("32K", [ar, ng6])
    want = rs[strategy_id(ar)] / (high * rs[strategy_id(ng6)]) - 1.0
    assert c._scorer.walk_gain("32K", ar, ng6, 2.0) == pytest.approx(want, rel=1e-9)


def test_sequences_that_accept_differently_are_judged_on_the_batch_mean():
    """Half the batch accepts its whole chain every round, half nothing: the batch's mean is
    what the profile expects, so the controller keeps the strategy (the EMA takes the batch's
    mean); a batch whose every sequence accepts nothing collapses and is left."""
    c = _controller(8)
    s = c.initial_strategy(30000)
    k = chain_length(s.tree)
    assert s.drafter.kind == "eagle" and k > 0
    mean = expected_tokens_interp(s.tree, 0.8) - 1.0
    mixed = (min(round(2 * mean), k), 0) * 4
    assert abs(sum(mixed) / 8 - mean) < 0.5
    for i in range(60):
        assert c.after_round(Stats(i, s, mixed, context_lens=(30000,) * 8)) is None
    c = _controller(8)
    new = None
    for i in range(60):
        new = new or c.after_round(Stats(i, s, (0,) * 8, context_lens=(30000,) * 8))
    assert new is not None and c.switches[0]["reason"] in ("collapse", "acceptance")
