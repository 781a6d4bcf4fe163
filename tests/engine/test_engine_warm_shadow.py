"""Warm drafters and the shadow n-gram acceptance: switching between warm drafters is lossless
and catches a drafter up instead of restarting it; the shadow equals the n-gram drafter's own
chains scored position by position, a hand-computed value on a repetitive history, ~0 on random
tokens, and its host cost (its n-gram look-ups) stays small."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch
from engine_helpers import random_prompts, tiny_model
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.controller import ShadowAcceptance
from ssvkit.engine.loop import Engine
from ssvkit.engine.ngram import NgramDrafter
from ssvkit.engine.ngram_index import NgramIndex
from ssvkit.engine.ngram_shadow import walk_text
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

TARGET = tiny_model(seed=0)
DRAFT = tiny_model(seed=0, noise=0.3)
DM = DrafterSpec(kind="draft_model", model="draft")
NG = DrafterSpec(kind="ngram")
AR = Strategy(name="ar")


class Plan:
    """Switches to ``plan[round]`` after that round; records what it was given."""

    def __init__(self, plan: dict[int, Strategy]) -> None:
        self.plan, self.seen = plan, []

    def after_round(self, stats):
        self.seen.append(stats)
        return self.plan.get(stats.round)


class WarmPlan(Plan):
    def drafter_kinds(self):
        return ("draft_model", "ngram", "self_sparse")  # self_sparse has nothing to keep warm


def _engine(strategy, controller, prompts, n=60, draft=DRAFT, temperature=0.0):
    b, t_max = len(prompts), max(map(len, prompts)) + n + 70
    runner = ModelRunner(TARGET, batch=b, t_max=t_max, backend="torch")
    drunner = ModelRunner(draft, batch=b, t_max=t_max, backend="torch")
    cfg = DecodeConfig(max_new_tokens=n, temperature=temperature)
    return Engine(runner, strategy, cfg, draft_runner=drunner, controller=controller), drunner


def _count_calls(obj, name: str) -> list:
    calls, fn = [], getattr(obj, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    setattr(obj, name, spy)
    return calls


DM4 = Strategy(name="dm", tree="chain:4", drafter=DM)
# Autoregressive -> draft model -> n-gram -> autoregressive -> draft model (caught up over the
# n-gram and AR rounds) -> n-gram tree -> draft model again: every kind of hand-over.
PLAN = {
    1: DM4,
    3: Strategy(name="ng", tree="chain:3", drafter=NG),
    5: AR,
    7: DM4,
    9: Strategy(name="ngt", tree="full:3x2", drafter=NG),
    11: Strategy(name="dm2", tree="chain:2", drafter=DM),
}


def test_warm_switches_are_lossless_and_catch_up_instead_of_restarting():
    prompts = random_prompts([90, 57])  # two lengths: the catch-up tails differ per sequence
    ar, _ = _engine(AR, None, prompts)
    reference = ar.generate(prompts).tokens
    cold, cold_runner = _engine(AR, Plan(PLAN), prompts)
    cold_calls = _count_calls(cold_runner, "prefill"), _count_calls(cold_runner, "append")
    cold_res = cold.generate(prompts)
    warm, warm_runner = _engine(AR, WarmPlan(PLAN), prompts)
    assert warm.drafters.warm_kinds == ("draft_model", "ngram")
    prefills = _count_calls(warm_runner, "prefill")
    extends = _count_calls(warm_runner, "append")
    res = warm.generate(prompts)
    assert res.tokens == reference == cold_res.tokens  # greedy: lossless through every switch
    names = "ar ar dm dm ng ng ar ar dm dm ngt ngt dm2".split()
    assert [r.strategy for r in res.rounds[:13]] == names
    # Cold: the draft model starts (a prefill of the whole context) at the first switch to it,
    # then catches up like a warm one. Warm: started before the first round, always caught up.
    assert [len(c) for c in cold_calls] == [1, 2]
    assert len(prefills) == 1 and len(extends) == 3
    # Each catch-up ran exactly the tokens committed while the draft model sat out.
    tails = [list(map(len, call[0])) for call in extends]
    assert all(min(t) > 0 for t in tails)
    assert warm.drafters.built["draft_model"].caught_up == sum(map(sum, tails))
    assert res.warm_s > 0 and cold_res.warm_s == 0.0
    switched = [r.step_s["switch"] for r in res.rounds if "switch" in r.step_s]
    assert len(switched) == len(PLAN)
    assert all("control" in r.step_s for r in res.rounds)


def test_catch_up_runs_the_kept_leaf_the_draft_model_had_not_seen():
    """A draft model identical to the target has every draft accepted: the kept leaf at depth
    D was never run through it (its catch-up is due next round). Switched away right then, it
    must run that leaf at the resume too."""
    prompts = random_prompts([70, 45])
    ar, _ = _engine(AR, None, prompts, n=30)
    eng, runner = _engine(DM4, WarmPlan({1: AR, 3: DM4}), prompts, n=30, draft=TARGET)
    extends = _count_calls(runner, "append")
    res = eng.generate(prompts)
    assert res.tokens == ar.generate(prompts).tokens
    assert [r.accepted for r in res.rounds[:2]] == [[4, 4], [4, 4]]  # every draft kept
    # Two autoregressive tokens plus the pending leaf, per sequence.
    assert [list(map(len, c[0])) for c in extends] == [[3, 3]]


def test_runner_extend_equals_a_prefill_of_the_whole():
    prompts, tails = random_prompts([30, 45]), random_prompts([7, 0], seed=5)
    more = random_prompts([5, 12], seed=6)
    a = ModelRunner(DRAFT, batch=2, t_max=80, backend="torch")
    a.prefill(prompts)
    assert a.extend(tails) == 7 and a.extend(more) == 17
    whole = [p + t + m for p, t, m in zip(prompts, tails, more, strict=True)]
    b = ModelRunner(DRAFT, batch=2, t_max=80, backend="torch")
    b.prefill(whole)
    assert a.cache.lens.tolist() == b.cache.lens.tolist() == [42, 57]
    for row, n in enumerate((42, 57)):
        torch.testing.assert_close(a.cache.kv[:, :, row, :, :n], b.cache.kv[:, :, row, :, :n])
    with pytest.raises(ValueError, match="exceed the cache"):
        a.extend([[1] * 40, []])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_runner_append_equals_a_prefill_of_the_whole(backend):
    """``append`` (chain tree forwards of 8-64 tokens, each committed) leaves the cache as a
    prefill of the whole would: ragged tails across the batch, one longer than a 64-chunk (a
    64-chunk, then a 16-chunk for its last 13), one empty; then the next position's logits
    agree too."""
    prompts = random_prompts([30, 45])
    tails = [random_prompts([77], seed=5)[0], []]
    more = random_prompts([5, 12], seed=6)
    t_max = 200
    a = ModelRunner(DRAFT, batch=2, t_max=t_max, backend=backend)
    a.prefill(prompts)
    chunks = _count_calls(a, "_append_fn")
    assert a.append(tails) == 77 and a.append(more) == 17
    assert [c[0] for c in chunks] == [64, 16, 16]
    whole = [p + t + m for p, t, m in zip(prompts, tails, more, strict=True)]
    b = ModelRunner(DRAFT, batch=2, t_max=t_max, backend=backend)
    b.prefill(whole)
    assert a.cache.lens.tolist() == b.cache.lens.tolist() == [112, 57]
    for row, n in enumerate((112, 57)):
        got, want = a.cache.kv[:, :, row, :, :n], b.cache.kv[:, :, row, :, :n]
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    root = DraftTree.from_parents([-1])
    nxt = torch.tensor([[7], [9]])
    la = a.tree_forward(nxt, root, AttentionConfig())[0]
    lb = b.tree_forward(nxt, root, AttentionConfig())[0]
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="exceed the cache"):
        a.append([[1] * 100, []])


def test_runner_append_falls_back_to_extend_near_the_end_of_the_cache():
    """A padded chunk whose tail would run past ``t_max`` goes through ``extend`` instead."""
    prompts = random_prompts([50, 20])
    a = ModelRunner(DRAFT, batch=2, t_max=56, backend="torch")
    a.prefill(prompts)
    extends = _count_calls(a, "extend")
    assert a.append([[3] * 5, [4] * 5]) == 10  # 50 + an 8-chunk > 56
    assert len(extends) == 1
    b = ModelRunner(DRAFT, batch=2, t_max=56, backend="torch")
    b.prefill([prompts[0] + [3] * 5, prompts[1] + [4] * 5])
    assert a.cache.lens.tolist() == [55, 25]
    torch.testing.assert_close(a.cache.kv[:, :, 0, :, :55], b.cache.kv[:, :, 0, :, :55])


def test_warm_switch_costs_less_than_a_restart():
    """With a 400-token prompt, the switch to the draft model after round 2: a cold one
    prefills the whole context there, a warm one runs only the tokens committed since its
    start before the first round -- counted in the tokens the draft model runs inside the
    switch, not timed (the H100's 15K contexts widen the gap)."""
    prompts = random_prompts([400])
    ran = {}
    for name, ctl in (("cold", Plan), ("warm", WarmPlan)):
        eng, drunner = _engine(AR, ctl({2: DM4}), prompts, n=16)
        calls = {k: _count_calls(drunner, k) for k in ("prefill", "append")}
        install, switches = eng.set_strategy, []

        def spy(strategy, install=install, calls=calls, switches=switches):
            before = {k: len(v) for k, v in calls.items()}
            install(strategy)
            switches.append(
                {k: [sum(map(len, c[0])) for c in v[before[k] :]] for k, v in calls.items()}
            )

        eng.set_strategy = spy
        res = eng.generate(prompts)
        assert [r.strategy for r in res.rounds[2:4]] == ["ar", "dm"]
        assert sum("switch" in r.step_s for r in res.rounds) == 1  # its host time, recorded
        (ran[name],) = [s for s in switches if any(s.values())]
    # Cold: one prefill of the context before the next round's root, the prompt and the 3
    # tokens of rounds 0-2 (one each, autoregressive). Warm, started on the prompt: a catch-up
    # of those 3 tokens alone.
    (cold,), (warm,) = ran["cold"]["prefill"], ran["warm"]["append"]
    assert ran["cold"]["append"] == [] and ran["warm"]["prefill"] == []
    assert (cold, warm) == (400 + 3, 3)


def test_controller_sees_the_shadow_every_round_autoregressive_included():
    prompts = random_prompts([80, 64])
    ctl = WarmPlan({3: AR})
    eng, _ = _engine(Strategy(name="dm", tree="chain:4", drafter=DM), ctl, prompts, n=40)
    res = eng.generate(prompts)
    shadows = [s.shadow["ngram"] for s in ctl.seen]
    assert all(isinstance(s, ShadowAcceptance) and len(s.matched) == 8 for s in shadows)
    assert any(s.drafted == 0 and sh.positions > 0 for s, sh in zip(ctl.seen, shadows, strict=True))
    # Every committed decode position is scored once, less the proposals still waiting for
    # tokens at the end (at most a chain's length per sequence).
    committed = sum(r.tokens for r in res.rounds) + len(prompts)  # the first roots too
    scored = sum(s.positions for s in shadows)
    assert committed - 2 * 8 <= scored <= committed
    assert all("shadow" in r.step_s for r in res.rounds)
    # Without warm drafters: no shadow, no cost.
    eng, _ = _engine(Strategy(name="dm", tree="chain:4", drafter=DM), Plan({}), prompts, n=8)
    assert all(r.shadow is None and "shadow" not in r.step_s for r in eng.generate(prompts).rounds)


class OverlapPlan(WarmPlan):
    overlap = True


def test_overlapped_control_sees_what_the_serial_one_does_and_switches_a_round_later():
    """A controller with ``overlap`` is handed round r during round r + 1 (its host time
    ``control_overlap``, the last round's ``control`` after the loop) with the same
    statistics and shadow as a serial one, and what it returns after round r drafts from
    round r + 2 on; decoding stays lossless through every switch."""
    prompts = random_prompts([90, 57])
    ar, _ = _engine(AR, None, prompts)
    reference = ar.generate(prompts).tokens
    # No switch: the same rounds, statistics and shadows, serial or overlapped.
    serial, overlapped = WarmPlan({}), OverlapPlan({})
    res_s = _engine(DM4, serial, prompts)[0].generate(prompts)
    res_o = _engine(DM4, overlapped, prompts)[0].generate(prompts)
    assert res_s.tokens == res_o.tokens == reference
    assert len(serial.seen) == len(overlapped.seen) == len(res_o.rounds)
    for a, b in zip(serial.seen, overlapped.seen, strict=True):
        assert (a.round, a.strategy, a.accepted, a.shadow) == (
            b.round,
            b.strategy,
            b.accepted,
            b.shadow,
        )
    assert all(
        "control_overlap" in r.step_s and "control" not in r.step_s for r in res_o.rounds[:-1]
    )
    assert "control" in res_o.rounds[-1].step_s
    assert all("control" in r.step_s and "control_overlap" not in r.step_s for r in res_s.rounds)
    # Switches: the plan's strategy drafts one round later than serially.
    ctl = OverlapPlan(PLAN)
    res = _engine(AR, ctl, prompts)[0].generate(prompts)
    assert res.tokens == reference
    names = "ar ar ar dm dm ng ng ar ar dm dm ngt ngt dm2".split()
    assert [r.strategy for r in res.rounds[:14]] == names
    assert [s.strategy.name for s in ctl.seen[:14]] == names  # each round with its own strategy
    assert len([r for r in res.rounds if "switch" in r.step_s]) == len(PLAN)


# ----------------------------------------------------------------------------- shadow


def _shadow_after(prompt: list[int], rounds: list[list[int]], chain: int):
    d = NgramDrafter("cpu", 3, chain)
    d.start([prompt])
    hist, out = list(prompt), []
    for new in rounds:
        hist += new
        d.sync([hist])
        out.append(d.take_shadow())
    return out


def test_shadow_hand_computed_on_a_repetitive_history():
    # Prompt 1 2 3 1 2 3, chains of 3. Round 1 commits 1 2 3: at position 6 the proposal
    # 1 2 3 matches whole (m = 3); at 7, 2 3 | 1 and at 8, 3 | 1 2 wait for the next tokens.
    # Round 2 commits 1 5: position 7 completes (m = 3), 8 fails on 5 (m = 2); position 9
    # proposes 1 2 (m = 1), position 10 proposes 2 (m = 0).
    # The walks start at position 7 (6 holds the first root, which no chain drafts), resolved
    # in round 2: chain:1 accepts 1 at 7 (m = 3) and 1 at 9 (m = 1); chain:2 accepts 2 at 7
    # and 0 at 10; chain:3 accepts 3 at 7.
    first, second = _shadow_after([1, 2, 3, 1, 2, 3], [[1, 2, 3], [1, 5]], chain=3)
    assert first == ShadowAcceptance(1, (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert second == ShadowAcceptance(4, (3, 2, 1), (2, 2, 1), (2, 2, 3))
    assert second.accepted_per_position(3) == (3 + 2 + 1 + 0) / 4
    assert second.accepted_per_position(1) == 3 / 4
    assert second.accepted(1) == 1.0 and second.accepted(3) == 3.0  # the walks'
    assert ShadowAcceptance(4, (3, 2, 1)).accepted(1) == 3 / 4  # not walked: over positions
    with pytest.raises(ValueError, match="chain must lie in"):
        second.accepted(4)
    with pytest.raises(ValueError, match="non-increasing"):
        ShadowAcceptance(2, (1, 2))
    with pytest.raises(ValueError, match="chain 2: rounds must be >= 0 and drafts in"):
        ShadowAcceptance(2, (1, 1), (1, 1), (1, 3))
    with pytest.raises(ValueError, match="rounds and drafts must hold 2"):
        ShadowAcceptance(2, (1, 1), (1,), (1,))


def _drafted_chain(history: list[int], chain: int) -> list[int]:
    """What the n-gram drafter itself drafts after ``history`` (a fresh drafter)."""
    d = NgramDrafter("cpu", 3)
    d.start([history[:-1]])
    tree = DraftTree.from_spec(f"chain:{chain}", "bfs")
    draft = d.draft(torch.tensor([history[-1]]), tree, [history])
    return draft.tokens[0, 1:].tolist()


def test_shadow_equals_the_drafters_own_chains_position_by_position():
    rng = random.Random(3)
    base = [rng.randrange(8) for _ in range(50)]
    seq = base + base[:30] + [rng.randrange(8) for _ in range(20)] + base + base[5:40]
    start, chain = 50, 5
    positions, matched = 0, [0] * chain
    for p in range(start, len(seq)):
        proposal = _drafted_chain(seq[:p], chain)  # drafted with seq[p - 1] as the root
        m = 0
        while m < chain and p + m < len(seq) and seq[p + m] == proposal[m]:
            m += 1
        if m < chain and p + m == len(seq):
            continue  # still waiting for tokens
        positions += 1
        for k in range(m):
            matched[k] += 1
    chunks, i = [], start
    while i < len(seq):
        n = rng.randint(1, 9)
        chunks.append(seq[i : i + n])
        i += n
    got = _shadow_after(seq[:start], chunks, chain)
    assert sum(g.positions for g in got) == positions > 100
    assert [sum(g.matched[k] for g in got) for k in range(chain)] == matched
    assert matched[chain - 1] > 20  # the repeated stretches are scored as accepted


def _reference_shadow(prompt: list[int], rounds: list[list[int]], chain: int, max_n: int = 3):
    """The shadow the plain way: a count table, each position's whole chain drafted from it
    before the position is indexed (longest n-gram; most frequent, then most recent
    continuation; none: repeat the last token), resolved once enough tokens are committed."""
    table: dict[tuple[int, ...], dict[int, list[int]]] = {}
    seq: list[int] = []

    def index(tok: int) -> None:
        p = len(seq)
        for n in range(1, min(max_n, p) + 1):
            slot = table.setdefault(tuple(seq[p - n :]), {}).setdefault(tok, [0, 0])
            slot[0] += 1
            slot[1] = p
        seq.append(tok)

    def draft(ctx: list[int]) -> int:
        for n in range(min(max_n, len(ctx)), 0, -1):
            hits = table.get(tuple(ctx[-n:]))
            if hits:
                return max(hits.items(), key=lambda kv: kv[1])[0]
        return ctx[-1]

    for tok in prompt:
        index(tok)
    waiting, out = [], []
    resolved, walk = {}, [len(seq) + 1] * chain  # the walks: after the first decoded token
    for new in rounds:
        for tok in new:
            ctx, prop = seq[-max_n:], []
            for _ in range(chain):
                prop.append(draft(ctx))
                ctx = (ctx + prop[-1:])[-max_n:]
            waiting.append((len(seq), prop))
            index(tok)
        positions, matched, still = 0, [0] * chain, []
        for p, prop in waiting:
            m = 0
            while m < chain and p + m < len(seq) and seq[p + m] == prop[m]:
                m += 1
            if m < chain and p + m == len(seq):
                still.append((p, prop))  # every committed token matched: wait for more
                continue
            positions += 1
            resolved[p] = m
            for k in range(m):
                matched[k] += 1
        waiting = still
        rounds_k, drafts_k = [0] * chain, [0] * chain
        for k in range(1, chain + 1):
            while walk[k - 1] in resolved:  # a round of chain k, then one after its bonus
                a = min(resolved[walk[k - 1]], k)
                rounds_k[k - 1] += 1
                drafts_k[k - 1] += a
                walk[k - 1] += a + 1
        out.append(ShadowAcceptance(positions, tuple(matched), tuple(rounds_k), tuple(drafts_k)))
    return out


@pytest.mark.parametrize("text", ["code", "repetitive", "random16"])
def test_shadow_equals_a_plain_reference_round_by_round(text):
    """The index's kept best continuation, its single table and the proposals drafted only
    as far as they match: the same counts, round by round, as the plain reference."""
    from ssvkit.engine.corpus import corpus_sample
    from ssvkit.validation.prompts import prompt_tokens

    rng = random.Random(11)
    if text == "random16":
        seq = [rng.randrange(16) for _ in range(2600)]
    elif text == "code":
        # The standard library's sources: the default corpus reads every package on sys.path,
        # this repository's included, so its text would change with the code base.
        seq = corpus_sample(2600, roots=[Path(random.__file__).parent])
    else:
        seq = prompt_tokens(text, 2600)
    rounds, i = [], 2000
    while i < len(seq):
        n = rng.randint(1, 9)
        rounds.append(seq[i : i + n])
        i += n
    got = _shadow_after(seq[:2000], rounds, 8)
    assert got == _reference_shadow(seq[:2000], rounds, 8)
    assert sum(g.positions for g in got) > 550
    if text != "random16":
        assert sum(g.matched[7] for g in got) > 20  # whole chains, waiting across rounds too


class CountingTable(dict):
    """An n-gram table that counts its look-ups."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_shadow_is_near_zero_on_random_tokens_and_cheap():
    """The shadow's host cost, counted in n-gram look-ups rather than timed (``engine.ngram``
    gives the development CPU's microseconds): per committed token, one look-up per n-gram
    ending before it (``max_n``), and ``max_n`` per further draft only while the drafts match,
    whatever the history's length (15K tokens here)."""
    rng = random.Random(0)
    prompt = [rng.randrange(256) for _ in range(15360)]
    d = NgramDrafter("cpu", 3, 8)
    d.start([prompt])
    table = d.shadow_indexes[0].table = CountingTable(d.shadow_indexes[0].table)
    hist, positions, accepted, lookups = list(prompt), 0, 0.0, {}
    for size in (1, 8):
        per_round = []
        for _ in range(200):
            hist += [rng.randrange(256) for _ in range(size)]
            before = table.lookups
            d.sync([hist])
            sh = d.take_shadow()
            per_round.append(table.lookups - before)
            positions += sh.positions
            accepted += sum(sh.matched)
        lookups[size] = per_round
    assert positions > 1500 and accepted / positions < 0.05  # ~1/256 per position
    for size, per_round in lookups.items():
        assert all(3 * size <= n <= 3 * 8 * size for n in per_round), (size, per_round)
        # Drafts past the first look up more only where the first matched (~1/256 here).
        assert sorted(per_round)[len(per_round) // 2] == 3 * size
        assert sum(per_round) < 1.1 * 3 * size * len(per_round)


def test_top_continuation_is_the_first_ranked_candidate():
    rng = random.Random(1)
    idx = NgramIndex(3)
    idx.extend([rng.randrange(12) for _ in range(3000)])
    for key, hits in idx.table.items():
        ranked = sorted(hits.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
        assert idx.top(key) == ranked[0][0] == idx.candidates(list(key), 1)[0]


@pytest.mark.parametrize("max_n", [1, 2, 3, 4])
@pytest.mark.parametrize("alphabet", [3, 12, 256, 40_000, 2**20])
def test_an_index_filled_at_once_is_the_one_built_token_by_token(max_n, alphabet):
    """A prompt indexed into an empty index at once (``NgramIndex._fill``) holds what pushing
    its tokens one by one holds -- every n-gram's continuations with their counts and last
    positions, the first-ranked one on top, nothing ranked yet -- and drafts the same after
    more tokens (a vocabulary whose codes would not fit 62 bits takes the token-by-token
    path)."""
    rng = random.Random(alphabet * 10 + max_n)
    tokens = [rng.randrange(alphabet) for _ in range(1500)]
    tokens[700:760] = tokens[100:160]  # a repeat: counts above 1 at every alphabet
    filled = NgramIndex(max_n)
    filled.extend(tokens)
    pushed = NgramIndex(max_n)
    for t in tokens:
        pushed.extend([t])
    assert filled.tokens == pushed.tokens == tokens
    assert filled.table.keys() == pushed.table.keys()
    for key, hits in pushed.table.items():
        got = filled.table[key]
        assert dict(got) == dict(hits) and got.top == hits.top, key
        assert got.ranked is None and hits.ranked is None
    more = [rng.randrange(alphabet) for _ in range(50)] + tokens[100:130]
    filled.extend(more)
    pushed.extend(more)
    tree = DraftTree.from_spec("best:16:4", acceptance=0.6)
    for end in range(len(tokens), len(filled.tokens), 7):
        tail = filled.tokens[:end][-max_n:]
        assert filled.tree_tokens(tail, tree) == pushed.tree_tokens(tail, tree)


def test_kept_rankings_follow_the_counts():
    """Continuations ranked once (a tree asked for them) stay ranked as the counts grow:
    asked again between any two tokens, the first k equal a fresh sort's."""
    rng = random.Random(2)
    idx = NgramIndex(3)
    for step in range(4000):
        idx.extend([rng.randrange(6) if rng.random() < 0.7 else rng.randrange(40)])
        ctx = idx.tokens[-rng.randint(1, 3) :]
        k = rng.randint(2, 4)
        for n in range(len(ctx), 0, -1):
            hits = idx.table.get(tuple(ctx[-n:]))
            if hits:
                ranked = sorted(hits.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
                assert idx.candidates(ctx, k) == [t for t, _ in ranked[:k]], step
                break
    assert sum(h.ranked is not None for h in idx.table.values()) > 50


@functools.cache
def _repeated_text_run(temperature: float):
    """A prompt of a random text three times over (the n-gram drafter has matches to find) and
    its autoregressive run of 90 tokens with warm drafters (a shadow every round); one run per
    temperature, read by each chain length's test."""
    base = random_prompts([40], seed=5)[0]
    prompts = [base * 3]
    ar, _ = _engine(AR, WarmPlan({}), prompts, n=90, temperature=temperature)
    return prompts, ar.generate(prompts)


@pytest.mark.parametrize("temperature", [0.0, 0.05])
@pytest.mark.parametrize("chain", [2, 4, 7])
def test_shadow_walk_is_the_chain_run_on_the_same_text(chain, temperature):
    """Greedy decoding, and sampling with deterministic drafts (each position's token drawn
    from its own seeded uniform), write the same text whatever decodes it, so the shadow's walk
    of a chain length over an autoregressive run is that chain's own run: the same accepted
    drafts, round by round, over the rounds the walk resolved (the last few positions may still
    wait for tokens). The average over positions is not: it counts a matching stretch once per
    position, the run once per round. (Temperature 0.05: the random tiny model's text repeats
    enough for n-gram drafts to be accepted.)"""
    prompts, ar_res = _repeated_text_run(temperature)
    shadows = [r.shadow["ngram"] for r in ar_res.rounds]
    walked = sum(s.rounds[chain - 1] for s in shadows)
    drafts = sum(s.drafts[chain - 1] for s in shadows)
    ng, _ = _engine(
        Strategy(name="ng", tree=f"chain:{chain}", drafter=NG),
        Plan({}),
        prompts,
        n=90,
        temperature=temperature,
    )
    run = ng.generate(prompts)
    assert run.tokens == ar_res.tokens  # the same text
    real = [r.accepted[0] for r in run.rounds]
    assert len(real) - 3 <= walked <= len(real)
    assert drafts == sum(real[:walked])
    assert sum(real) >= 10  # the chain accepts: the walk is exercised
    positions = sum(s.positions for s in shadows)
    per_position = sum(sum(s.matched[:chain]) for s in shadows) / positions
    assert abs(per_position - drafts / walked) > 0.05  # what the walk corrects


# ----------------------------------------------------------------------------- tree walks


def _tree_walk_reference(seq: list[int], start: int, spec: str, max_n: int = 3):
    """A branching tree's walk the plain way: at each position it drafts at, a fresh drafter
    on the sequence before it drafts the tree (``NgramDrafter.draft``); the round accepts the
    longest root path whose tokens the committed ones match, and the next one drafts after
    its bonus token. Rounds whose tree outlasts the sequence are left out (still waiting)."""
    tree = DraftTree.from_spec(spec, "bfs")
    accepted, p = [], start + 1  # after the first decoded token, as the shadow's walks
    while p < len(seq):
        d = NgramDrafter("cpu", max_n)
        d.start([seq[: p - 1]])
        toks = d.draft(torch.tensor([seq[p - 1]]), tree, [seq[:p]]).tokens[0].tolist()
        depth, alive, waiting = 0, [0], False
        while True:
            kids = [c for n in alive for c in tree.children[n]]
            if not kids:
                break
            if p + depth == len(seq):
                waiting = True
                break
            alive = [c for c in kids if toks[c] == seq[p + depth]]
            if not alive:
                break
            depth += 1
        if waiting:
            break
        accepted.append(depth)
        p += depth + 1
    return accepted


@pytest.mark.parametrize(
    ("text", "length"), [("code", 1000), ("repetitive", 1000), ("random16", 800)]
)
def test_tree_walks_equal_the_drafters_own_trees_round_by_round(text, length):
    """Each walked tree is the tree the n-gram drafter itself drafts at that position from the
    sequence before it, and each round accepts its longest matching path: the same rounds and
    accepted drafts as the plain reference, over random chunks of committed tokens. The walks
    start after 600 tokens; ``length`` gives each text over 60 rounds of every tree (a random
    text over 16 tokens rejects most drafts, a token or two a round: it needs the fewest)."""
    from ssvkit.validation.prompts import prompt_tokens

    rng = random.Random(7)
    seq = (
        [rng.randrange(16) for _ in range(length)]
        if text == "random16"
        else prompt_tokens(text, length)
    )
    start, specs = 600, ("best:8:4", "best:16:6", "full:3x2")
    d = NgramDrafter("cpu", 3, 8, specs + ("chain:3",))  # a chain among them: left to the chains
    assert [s for s, _ in d.shadow_trees] == list(specs)
    d.start([seq[:start]])
    hist, got, i = list(seq[:start]), [], start
    while i < len(seq):
        n = rng.randint(1, 9)
        hist += seq[i : i + n]
        i += n
        d.sync([hist])
        got.append(d.take_shadow())
    for j, spec in enumerate(specs):
        ref = _tree_walk_reference(seq, start, spec)
        rounds = sum(g.trees[j][1] for g in got)
        assert all(g.trees[j][0] == spec for g in got)
        assert rounds == len(ref) > 60
        assert sum(g.trees[j][2] for g in got) == sum(ref)
        assert sum(g.trees[j][3] for g in got) == sum(a * a for a in ref)
    if text != "random16":
        best = sum(g.trees[2][2] for g in got) / sum(g.trees[2][1] for g in got)
        assert best > 0.5  # trees accept: the walk is exercised


def test_tree_walk_hand_computed():
    """Prompt 1 2 1 3 1 2, tree full:2x1 (two children of the root). Round 1 commits 1 (the
    first root, which no round drafts) then 4 at position 7: drafted after 2 1, whose only
    continuation is 3 (the trigram 1 2 1), the children are 3 and 3 again; 4 matches neither:
    0 accepted, next at 8. Round 2 commits 1 2 5: at 8 (after 4, which nothing followed yet)
    the drafter repeats 4: 0, next at 9; at 9, after 4 1 (only the unigram 1 indexed: 2
    twice, then 4 most recent, 3) the children are 2 and 4: 2 matches, 1 accepted at a leaf;
    the next round drafts at 11, after the bonus token 5."""
    d = NgramDrafter("cpu", 3, 1, ("full:2x1",))
    prompt = [1, 2, 1, 3, 1, 2]
    d.start([prompt])
    hist = prompt + [1, 4]
    d.sync([hist])
    first = d.take_shadow()
    assert first.trees == (("full:2x1", 1, 0, 0),)
    hist += [1, 2, 5]
    d.sync([hist])
    second = d.take_shadow()
    assert second.trees == (("full:2x1", 2, 1, 1),)
    assert second.tree_accepted("full:2x1") == 0.5
    with pytest.raises(KeyError, match="not walked"):
        second.tree_accepted("best:8:4")
    with pytest.raises(ValueError, match="tree t: rounds, drafts and squares"):
        ShadowAcceptance(1, (1,), trees=(("t", 1, 2, 2),))  # 2 drafts in 1 round: 4 > 2
    with pytest.raises(ValueError, match="shadow_trees need shadow_chain"):
        NgramDrafter("cpu", 3, 0, ("full:2x1",))


def test_engine_hands_the_controllers_shadow_trees_to_the_warm_drafter():
    class TreePlan(WarmPlan):
        def shadow_trees(self, context_len):
            self.asked = context_len
            return ("best:8:4",)

    base = random_prompts([40], seed=5)[0]
    prompts = [base * 3]
    ctl = TreePlan({})
    eng, _ = _engine(AR, ctl, prompts, n=60)
    eng.generate(prompts)
    assert ctl.asked == 120  # the longest prompt's length
    walks = [s.shadow["ngram"].trees for s in ctl.seen]
    assert all(w[0][0] == "best:8:4" for w in walks)
    assert sum(w[0][1] for w in walks) > 10


@pytest.mark.parametrize("temperature", [0.0, 0.05])
def test_tree_walk_is_the_tree_run_on_the_same_text(temperature):
    """As the chains' walk: greedy decoding, and sampling with deterministic drafts, write the
    same text whatever decodes it, so the shadow's walk of an n-gram tree over an
    autoregressive run is that tree's own run, round by round over the rounds it resolved."""
    spec = "full:2x3"

    class TreePlan(WarmPlan):
        def shadow_trees(self, context_len):
            return (spec,)

    base = random_prompts([40], seed=5)[0]
    prompts = [base * 3]
    ctl = TreePlan({})
    ar, _ = _engine(AR, ctl, prompts, n=90, temperature=temperature)
    ar_res = ar.generate(prompts)
    walks = [s.shadow["ngram"].trees[0] for s in ctl.seen]
    walked, drafts = sum(w[1] for w in walks), sum(w[2] for w in walks)
    tr, _ = _engine(
        Strategy(name="ngt", tree=spec, drafter=NG),
        Plan({}),
        prompts,
        n=90,
        temperature=temperature,
    )
    run = tr.generate(prompts)
    assert run.tokens == ar_res.tokens  # the same text
    real = [r.accepted[0] for r in run.rounds]
    assert len(real) - 3 <= walked <= len(real)
    assert drafts == sum(real[:walked]) >= 10  # the tree accepts: the walk is exercised


@pytest.mark.parametrize("temperature", [0.0, 0.05])
def test_walk_text_is_each_trees_own_run_on_that_text(temperature):
    """``walk_text`` over a decoded text, offline (what the planner's profile scores every
    n-gram tree with): each chain's and tree's rounds and accepted drafts are that tree's own
    run's on the same text, over the rounds it resolved."""
    base = random_prompts([40], seed=5)[0]
    prompts = [base * 3]
    ar, _ = _engine(AR, Plan({}), prompts, n=90, temperature=temperature)
    text = ar.generate(prompts).tokens[0]
    specs = ("chain:3", "chain:7", "full:2x3")
    got = walk_text(prompts[0], text, ("chain:0", *specs))
    assert set(got) == set(specs)  # chain:0 drafts nothing: no walk
    for spec in specs:
        eng, _ = _engine(
            Strategy(name="w", tree=spec, drafter=NG),
            Plan({}),
            prompts,
            n=90,
            temperature=temperature,
        )
        run = eng.generate(prompts)
        assert run.tokens[0] == text  # the same text
        real = [r.accepted[0] for r in run.rounds]
        rounds, drafts = got[spec]
        assert len(real) - 3 <= rounds <= len(real)
        assert drafts == sum(real[:rounds]) >= 10, spec


def test_the_drafters_own_calls_leave_the_shadow_to_sync():
    """``draft`` and ``observe`` index the committed tokens for drafting and score nothing:
    the shadow, on an index of its own, advances on ``sync`` alone (the loop's call behind
    the next round's GPU work), and scores the same counts whenever that comes."""
    from ssvkit.validation.prompts import prompt_tokens

    seq = prompt_tokens("code", 700)
    a, b = NgramDrafter("cpu", 3, 8, ("full:2x3",)), NgramDrafter("cpu", 3, 8, ("full:2x3",))
    a.start([seq[:500]])
    b.start([seq[:500]])
    tree = DraftTree.from_spec("full:2x3", "bfs")
    got_a, got_b = [], []
    for end in range(520, 700, 20):
        hist = seq[:end]
        a.observe([hist], [1])
        a.draft(torch.tensor([hist[-1]]), tree, [hist])
        assert a.take_shadow().positions == 0  # nothing scored by the drafter's own calls
        assert len(a.indexes[0].tokens) == end  # ... which indexed for drafting
        a.sync([hist])
        got_a.append(a.take_shadow())
        b.sync([hist])
        got_b.append(b.take_shadow())
    assert got_a == got_b and sum(g.positions for g in got_a) > 150
