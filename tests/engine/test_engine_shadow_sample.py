"""The n-gram shadow on a fixed sample of the batch (``engine.ngram.shadow_sample``): the work
of a round (the committed tokens the shadow reads) does not grow with the batch, the sample's
counts are its sequences' own, each beside the sum, and the decode loop hands the controller's
bound to the warm drafter."""

from __future__ import annotations

import pytest
from engine_helpers import random_prompts, tiny_model
from ssvkit.engine.controller import SequenceWalks, ShadowAcceptance
from ssvkit.engine.loop import Engine
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter, shadow_sample
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.perfmodel.strategy import Strategy

TREES = ("best:8:4",)


def test_the_sample_spreads_evenly_over_the_batch():
    assert shadow_sample(32, 8) == (2, 6, 10, 14, 18, 22, 26, 30)
    assert shadow_sample(5, 4) == (0, 1, 3, 4)
    assert shadow_sample(4, 8) == shadow_sample(4, 0) == (0, 1, 2, 3)
    for batch in range(1, 40):
        for bound in range(1, batch):
            s = shadow_sample(batch, bound)
            assert len(set(s)) == bound and s == tuple(sorted(s)) and 0 <= s[0] and s[-1] < batch
    with pytest.raises(ValueError, match="bound >= 0, got 3 and -1"):
        shadow_sample(3, -1)
    with pytest.raises(ValueError, match="shadow_sequences must be >= 0, got -2"):
        NgramDrafter("cpu", 3, 8, (), -2)


def _texts(batch: int, n: int = 300) -> list[list[int]]:
    """Text of sequence j: the j-th of a few repetitive-ish texts, in turn."""
    base = [random_prompts([37], seed=s)[0] * 10 for s in range(5)]
    return [base[j % 5][:n] for j in range(batch)]


def _drive(batch: int, sample: int, rounds: int = 40, per_round=(1, 3, 2, 5)):
    """A warm n-gram drafter with a shadow over ``batch`` sequences of ``_texts``, sequence j
    committing ``per_round[(r + j) % 4]`` tokens in round r: per round, the tokens the shadow
    read and its ``ShadowAcceptance``."""
    texts = _texts(batch)
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, TREES, sample)
    d.start([t[:60] for t in texts])
    hist, out = [t[:60] for t in texts], []
    for r in range(rounds):
        for j, (h, t) in enumerate(zip(hist, texts, strict=True)):
            h += t[len(h) : len(h) + per_round[(r + j) % 4]]
        read = d.shadow_tokens
        d.sync(hist)
        out.append((d.shadow_tokens - read, d.take_shadow()))
    return out


def test_the_shadows_work_per_round_does_not_grow_with_the_batch():
    """Sample 4: whatever the batch, the shadow reads at most 4 x 5 tokens a round (the most a
    sequence commits here), and exactly its sampled sequences' -- where scoring every sequence
    reads the batch's, 16 times more at batch 64 than at 4."""
    work = {b: [w for w, _ in _drive(b, 4)] for b in (4, 16, 64)}
    for b, w in work.items():
        assert max(w) <= 4 * 5 and sum(w) > 40 * 4, (b, w)
    # the sampled sequences of 16 (2, 6, 10, 14) and of 64 (8, 24, 40, 56) commit the same
    # counts, two rounds apart: the same work
    assert sorted(work[16]) == sorted(work[64])
    everyone = {b: sum(w for w, _ in _drive(b, 0, rounds=10)) for b in (4, 64)}
    assert everyone[64] == 16 * everyone[4]


def test_the_sample_sums_its_sequences_own_shadows_each_beside():
    """At batch 12 with a sample of 3, each round's counts are the sums of what three batch-1
    drafters on the sampled sequences report, and ``by_sequence`` holds each of theirs (chain
    walks, then the tree's); a sequence that stops advancing counts 0 tokens and is not among
    ``sequences``."""
    batch, sample = 12, 3
    texts = _texts(batch)
    picked = shadow_sample(batch, sample)
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, TREES, sample)
    d.start([t[:60] for t in texts])
    alone = [NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, TREES) for _ in picked]
    for a, b in zip(alone, picked, strict=True):
        a.start([texts[b][:60]])
    hist = [t[:60] for t in texts]
    seen_idle = False
    for r in range(30):
        for j, (h, t) in enumerate(zip(hist, texts, strict=True)):
            if not (j == picked[1] and r >= 20):  # the second sampled sequence is done
                h += t[len(h) : len(h) + 1 + (r + j) % 4]
        d.sync(hist)
        got = d.take_shadow()
        own = []
        for a, b in zip(alone, picked, strict=True):
            a.sync([hist[b]])
            own.append(a.take_shadow())
        assert got.positions == sum(x.positions for x in own)
        assert got.matched == tuple(map(sum, zip(*(x.matched for x in own), strict=True)))
        assert got.rounds == tuple(map(sum, zip(*(x.rounds for x in own), strict=True)))
        assert got.trees[0][1:] == tuple(sum(x.trees[0][i] for x in own) for i in (1, 2, 3))
        assert len(got.by_sequence) == sample
        for x, o in zip(got.by_sequence, own, strict=True):
            assert x.rounds == (*o.rounds, o.trees[0][1]) and x.drafts == (*o.drafts, o.trees[0][2])
        advanced = [bool(x.tokens) for x in got.by_sequence]
        assert got.sequences == sum(advanced)
        if r >= 20:
            assert advanced == [True, False, True] and got.by_sequence[1].rounds == (0,) * 9
            seen_idle = True
    assert seen_idle
    # The whole batch within the bound: the counts alone, as before the sample.
    full = _drive(3, 4, rounds=3)[-1][1]
    assert full.sequences is None and full.by_sequence == ()


def test_a_sampled_shadow_is_checked():
    walks = (SequenceWalks(2, (1,), (1,)), SequenceWalks(0, (0,), (0,)))
    ok = ShadowAcceptance(2, (1,), (1,), (1,), sequences=1, by_sequence=walks)
    assert ok.sequences == 1
    with pytest.raises(ValueError, match="sequences .2. must count the sampled sequences"):
        ShadowAcceptance(2, (1,), (1,), (1,), sequences=2, by_sequence=walks)
    with pytest.raises(ValueError, match="each sampled sequence needs its rounds of the 2 walks"):
        ShadowAcceptance(2, (1,), (1,), (1,), (("t", 1, 0, 0),), 1, walks)
    with pytest.raises(ValueError, match="sequences must be None or >= 0, got -1"):
        ShadowAcceptance(2, (1,), sequences=-1)
    with pytest.raises(ValueError, match="tokens >= 0 and one drafts count per rounds count"):
        SequenceWalks(1, (1, 2), (1,))


class SampledPlan:
    """Keeps the strategy; keeps the n-gram drafter warm with a shadow on ``shadow_sequences``
    sequences; records what it was given."""

    def __init__(self, bound: int) -> None:
        self.shadow_sequences, self.seen = bound, []

    def drafter_kinds(self):
        return ("ngram",)

    def after_round(self, stats):
        self.seen.append(stats)


def test_the_loop_hands_the_controllers_bound_to_the_warm_drafter():
    prompts = random_prompts([50, 41, 47, 39])
    runner = ModelRunner(tiny_model(seed=0), batch=4, t_max=120, backend="torch")
    ctl = SampledPlan(2)
    eng = Engine(runner, Strategy(name="ar"), DecodeConfig(max_new_tokens=20), controller=ctl)
    res = eng.generate(prompts)
    shadows = [s.shadow["ngram"] for s in ctl.seen]
    assert eng._shadow.sampled == (1, 3)
    assert all(len(s.by_sequence) == 2 and s.sequences <= 2 for s in shadows)
    # the shadow reads every token the sampled sequences generate (the first root included)
    # and no other sequence's
    assert eng._shadow.shadow_tokens == len(res.tokens[1]) + len(res.tokens[3]) == 40
