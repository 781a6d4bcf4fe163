import dataclasses
import gzip
import json
from dataclasses import dataclass, field

import numpy as np
import pytest
from ssvkit.perfmodel import loop_host
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import Strategy, parse_tree, tree_expected_tokens
from ssvkit.perfmodel.tree_tokens import alpha_from_tokens, expected_tokens_interp
from ssvkit.planner.controller import ControllerConfig, OnlineController
from ssvkit.planner.estimators import accepted_histogram, pooled_chain_tokens
from ssvkit.planner.profile import (
    REGIMES,
    RegimeProfile,
    load_profile,
    profile_from_traces,
    regime_of,
)
from ssvkit.planner.rank import rank, strategy_from_json
from ssvkit.planner.space import (
    SpaceSpec,
    describe,
    enumerate_space,
    invalid_reason,
    strategy_id,
    valid_strategies,
)
from ssvkit.validation.records import record_path
from ssvkit.validation.stats import ranking_quality

from ssvkit.cli import main

M, G = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
SMALL = SpaceSpec(
    trees=("chain:2", "chain:6", "best:16:6"),
    group_sizes=(1, 4),
    refresh_every=(1, 4),
    top_ns=(16,),
)


def test_space_enumeration_is_deduplicated_and_ids_are_stable():
    space = enumerate_space(SMALL)
    ids = [s.name for s in space]
    assert len(ids) == len(set(ids))
    # dense and NSA keep one traversal and NSA one grouping: the packed row tiles (its kernels
    # select per row under every mode; one draft row a tile is the naive baseline)
    dense = [s for s in space if not s.is_sparse]
    assert len(dense) == 3 and {s.traversal for s in dense} == {"bfs"}
    nsa = [s for s in space if s.is_sparse]
    assert {(s.traversal, s.mode, s.group_size, s.metadata) for s in nsa} == {
        ("bfs", "shared", 1, "nsa")
    }
    assert {s.nsa_rows_per_tile for s in nsa} == {0} and "| nsa |" in describe(nsa[0])
    assert len(nsa) == 3 * 2  # trees x refresh schedules
    # block-metadata selection: per_query one traversal, union/shared all three, C in 1, 4
    mean = [
        s for s in enumerate_space(dataclasses.replace(SMALL, metadata=("mean",))) if s.is_sparse
    ]
    assert len(mean) == 3 * 2 * (1 + 2 * 3 * 2) and {s.metadata for s in mean} == {"mean"}
    with pytest.raises(ValueError, match="unknown metadata"):
        SpaceSpec(metadata=("nsa", "lsh"))
    # a tree that drafts nothing is one strategy, whatever the drafter
    ar = SpaceSpec(drafters=("eagle", "ngram"), trees=("chain:0", "chain:2"), modes=("dense",))
    assert [(s.drafter.kind, s.tree) for s in enumerate_space(ar)] == [
        ("eagle", "chain:0"),
        ("eagle", "chain:2"),
        ("ngram", "chain:2"),
    ]
    s = space[5]
    assert strategy_id(dataclasses.replace(s, name="other")) == strategy_id(s) == s.name
    assert strategy_id(dataclasses.replace(s, top_n=s.top_n * 2)) != strategy_id(s)
    assert "|" in describe(s)


def test_validity_rules_name_the_reason():
    glm = get_model("glm-4-9b")  # 16 query heads per KV head
    big_group = Strategy(tree="best:16:6", attention="sparse", mode="union", group_size=16)
    assert invalid_reason(big_group, glm, G, 32768).startswith("kernel: C*G=256")
    assert invalid_reason(Strategy(tree="chain:64"), M, G, 32768).startswith("rows:")
    assert invalid_reason(
        Strategy(tree="chain:4", attention="sparse", top_n=64), M, G, 2048
    ).startswith("budget:")
    tight = dataclasses.replace(G, smem_per_block_bytes=16 * 1024)
    assert invalid_reason(
        Strategy(tree="chain:4", attention="sparse", mode="union", group_size=4), M, tight, 32768
    ).startswith("smem:")
    narrow = Strategy(tree="best:16:6", attention="sparse", metadata="mean", window=8)
    assert invalid_reason(narrow, M, G, 32768) == "window: window 8 < 17 verification rows"
    assert invalid_reason(dataclasses.replace(narrow, metadata="nsa"), M, G, 32768) is None
    keep, rejected = valid_strategies(SMALL, M, G, 4096)
    assert all(invalid_reason(s, M, G, 4096) is None for s in keep)


def test_regime_of_a_context():
    assert regime_of(3000) == "<=4K" and regime_of(20000) == "32K" and regime_of(10**6) == "64K+"


def test_pooled_chain_tokens_read_shorter_chains_from_longer_ones():
    assert accepted_histogram([0, 2, 2, 4]) == [1, 0, 2, 0, 1] and accepted_histogram([]) == []
    with pytest.raises(ValueError, match="must be >= 0"):
        accepted_histogram([1, -1])
    # A 4-chain that accepted 0, 2, 2, 4 drafts in four rounds: a 2-chain would have accepted
    # 0, 2, 2, 2 (tokens/round 1 + 6/4); a 2-chain's own run of 1, 1 (1 + 1).
    four, two = (4, accepted_histogram([0, 2, 2, 4])), (2, accepted_histogram([1, 1]))
    assert pooled_chain_tokens([four, two], 2) == pytest.approx(((1 + 6 / 4) + 2.0) / 2)
    assert pooled_chain_tokens([four, two], 4) == pytest.approx(1 + 8 / 4)  # its own only
    assert pooled_chain_tokens([two, (4, [])], 4) is None  # no run long enough with rounds
    with pytest.raises(ValueError, match="chain length must be >= 1"):
        pooled_chain_tokens([four], 0)
    # Geometric acceptance: the pooled estimate of a short chain from long chains' rounds is
    # the short chain's expected tokens, and its spread falls with the rounds added.
    rng = np.random.default_rng(0)
    a = 0.6

    def run(k, n=400):
        m = np.minimum(rng.geometric(1 - a, n) - 1, k)  # leading acceptances, capped at k
        return k, accepted_histogram(m)

    want = tree_expected_tokens(parse_tree("chain:2"), a)
    own = [pooled_chain_tokens([run(2)], 2) for _ in range(200)]
    pooled = [pooled_chain_tokens([run(2), run(4), run(7)], 2) for _ in range(200)]
    assert np.mean(pooled) == pytest.approx(want, abs=0.01)
    assert np.std(pooled) < 0.7 * np.std(own)


def test_profile_file_and_traces(tmp_path):
    p = tmp_path / "prof.json"
    p.write_text(
        json.dumps(
            {
                "version": 1,
                "source": "t",
                "regimes": {
                    "16K": {"acceptance": {"eagle": 0.4}, "overlap": {"bfs": 0.6}},
                    "default": {"acceptance": {"ngram": 0.3}},
                },
            }
        )
    )
    prof = load_profile(p)
    assert prof.alpha("16K", "eagle") == 0.4 and prof.alpha("8K", "ngram") == 0.3
    assert prof.alpha("8K", "eagle") == 0.7 and prof.gamma("16K", "bfs") == 0.6
    p.write_text(json.dumps({"version": 1, "regimes": {"16K": {"acceptance": {"eagle": 1.4}}}}))
    with pytest.raises(ValueError, match="16K.acceptance.eagle"):
        load_profile(p)
    s = Strategy(tree="chain:4", name="x")
    e = tree_expected_tokens(parse_tree("chain:4"), 0.6)
    rounds = [
        {
            "strategy": "x",
            "context_len": 16000,
            "drafted": 4,
            "accepted": a,
            "group_overlap": [0.5, 0.7],
        }
        for a in (round(e - 1),) * 3
    ]
    measured = profile_from_traces([({}, rounds)], {"x": s})
    assert measured.alpha("16K", "eagle") == pytest.approx(
        alpha_from_tokens("chain:4", round(e - 1) + 1)
    )
    assert measured.gamma("16K", "position") == pytest.approx(0.6)


def test_ranking_is_sorted_and_reacts_to_acceptance():
    regimes = {"32K": 32768}
    hi = rank(M, G, SMALL, RegimeProfile(acceptance={"32K": {"eagle": 0.9}}), regimes=regimes)
    r_hi = hi["regimes"]["32K"]["ranking"]
    assert [x["tokens_per_s"] for x in r_hi] == sorted(
        (x["tokens_per_s"] for x in r_hi), reverse=True
    )
    chains = SpaceSpec(trees=("chain:2", "chain:6"), modes=("dense",))
    deep = rank(M, G, chains, RegimeProfile(acceptance={"32K": {"eagle": 0.9}}), regimes=regimes)
    shallow = rank(M, G, chains, RegimeProfile(acceptance={"32K": {"eagle": 0.1}}), regimes=regimes)
    top = lambda d: d["regimes"]["32K"]["ranking"][0]["strategy"]["tree"]  # noqa: E731
    # long chains pay for their drafting steps only when drafts get accepted
    assert top(deep) == "chain:6" and top(shallow) == "chain:2"
    assert hi["regimes"]["32K"]["provenance"].startswith("calibrated:")
    s = strategy_from_json(r_hi[0]["strategy"])
    assert strategy_id(s) == r_hi[0]["id"]


@dataclass
class Stats:
    round: int
    strategy: Strategy
    accepted: tuple
    context_lens: tuple = (30000,)
    drafted: int = 16
    step_s: dict = field(default_factory=dict)
    shadow: dict | None = None

    @property
    def mean_accepted(self):
        return sum(self.accepted) / len(self.accepted)


def _controller(**cfg):
    doc = rank(
        M, G, SMALL, RegimeProfile(acceptance={"32K": {"eagle": 0.8}}), regimes={"32K": 32768}
    )
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    return OnlineController(doc, M, G, prof, ControllerConfig(**cfg))


def test_controller_keeps_a_strategy_whose_acceptance_matches():
    c = _controller(patience=3)
    s = c.initial_strategy(30000)
    tokens = tree_expected_tokens(parse_tree(s.tree), 0.8)
    acc = int(round(tokens - 1))
    assert all(c.after_round(Stats(i, s, (acc,))) is None for i in range(30))
    assert c.switches == []


def test_controller_switches_once_when_acceptance_collapses_and_does_not_oscillate():
    c = _controller(patience=3, cooldown=10)
    s = c.initial_strategy(30000)
    switched = []
    for i in range(60):
        new = c.after_round(Stats(i, s, (0,)))  # nothing accepted, round after round
        if new is not None:
            switched.append((i, new))
            s = new
    assert 1 <= len(switched) <= 2
    first = switched[0][1]
    assert len(parse_tree(first.tree)) < len(parse_tree(c.initial_strategy(30000).tree))
    log = c.switches[0]
    assert log["observed_alpha"] < log["expected_alpha"] - 0.1 and log["predicted_gain"] > 0.05


def test_controller_leaves_a_strategy_without_drafts_by_probing():
    """Acceptance collapses -> autoregressive decoding wins the re-score; AR observes no
    acceptance, so after ``probe_after`` rounds the controller probes the best drafting
    strategy again instead of staying there for good."""
    space = dataclasses.replace(SMALL, trees=("chain:0", "chain:6"), modes=("dense",))
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    cfg = ControllerConfig(patience=2, cooldown=0, probe_after=5, stride=1)
    c = OnlineController(doc, M, G, prof, cfg)
    s = first = c.initial_strategy(30000)
    assert parse_tree(s.tree)
    rounds = []
    for i in range(40):
        drafts = len(parse_tree(s.tree))
        new = c.after_round(Stats(i, s, (0,), drafted=drafts))
        if new is not None:
            rounds.append(i)
            s = new
    reasons = [x["reason"] for x in c.switches]
    assert reasons[:2] == ["acceptance", "probe"], c.switches
    assert c.switches[1]["to"] == strategy_id(first)
    assert rounds[1] - rounds[0] == 5  # probed after exactly probe_after rounds without drafts
    with pytest.raises(ValueError, match="probe_after must be >= 1"):
        ControllerConfig(probe_after=0)


def _chain_rounds(rng, alpha: float, k: int, n: int) -> list[int]:
    """Accepted drafts of ``n`` rounds of a ``k``-chain at per-draft acceptance ``alpha``."""
    out = []
    for _ in range(n):
        m = 0
        while m < k and rng.random() < alpha:
            m += 1
        out.append(m)
    return out


def test_controller_collapse_trigger_is_fast_on_a_collapse_and_quiet_otherwise():
    """A chain accepting nothing at a profiled 0.8 re-scores within a few rounds even inside
    the cooldown (reason ``collapse``); at its profiled acceptance, or after a mild drop, the
    collapse test stays quiet over hundreds of rounds (the EMA's patience handles drifts)."""
    space = dataclasses.replace(SMALL, trees=("chain:0", "chain:6"), modes=("dense",))
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    huge = 10**6  # no patience and no cooldown reach: only a collapse can act
    cfg = ControllerConfig(patience=huge, cooldown=huge, probe_after=huge)
    c = OnlineController(doc, M, G, prof, cfg)
    s = c.initial_strategy(30000)
    assert parse_tree(s.tree) == (-1, 0, 1, 2, 3, 4)
    for i in range(50):
        s = c.after_round(Stats(i, s, (0,), drafted=6)) or s
    assert [(x["reason"], x["round"]) for x in c.switches] == [("collapse", 3)], c.switches
    assert not parse_tree(s.tree)  # to autoregressive decoding
    rng = np.random.default_rng(0)
    for alpha in (0.8, 0.7):  # as profiled; 0.1 below it (a drift, not a collapse)
        c = OnlineController(doc, M, G, prof, cfg)
        s = c.initial_strategy(30000)
        for i, m in enumerate(_chain_rounds(rng, alpha, 6, 400)):
            assert c.after_round(Stats(i, s, (m,), drafted=6)) is None, (alpha, c.switches)
    off = OnlineController(doc, M, G, prof, dataclasses.replace(cfg, collapse_llr=0.0))
    s = off.initial_strategy(30000)
    assert all(off.after_round(Stats(i, s, (0,), drafted=6)) is None for i in range(50))
    with pytest.raises(ValueError, match="collapse_llr must be >= 0"):
        ControllerConfig(collapse_llr=-1.0)


def test_controller_backs_off_probes_that_fail():
    """A drafter that collapses for good: every probe goes back to autoregressive decoding, and
    each one doubles the wait before the next (5, 10, 20, then ``probe_max``)."""
    space = dataclasses.replace(SMALL, trees=("chain:0", "chain:6"), modes=("dense",))
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    cfg = ControllerConfig(patience=2, cooldown=0, probe_after=5, probe_max=20, stride=1)
    c = OnlineController(doc, M, G, prof, cfg)
    s = c.initial_strategy(30000)
    for i in range(200):
        drafts = len(parse_tree(s.tree))
        s = c.after_round(Stats(i, s, (0,), drafted=drafts)) or s
    probes = [x["round"] for x in c.switches if x["reason"] == "probe"]
    backs = [x["round"] for x in c.switches if x["reason"] == "acceptance"]
    waits = [p - max(b for b in backs if b < p) for p in probes]
    assert waits[:4] == [5, 10, 20, 20], c.switches
    # A drafter that then holds for probe_after rounds resets the wait.
    for i in range(200, 260):
        drafts = len(parse_tree(s.tree))
        acc = drafts if drafts else 0  # the text suits the drafter again
        s = c.after_round(Stats(i, s, (acc,), drafted=drafts)) or s
    assert parse_tree(s.tree) and c._probe_wait == 5


def test_controller_prices_a_switch_by_its_destination():
    """Switch costs are kept per destination kind: a dear catch-up of the draft model must not
    stop a cheap switch to autoregressive decoding, and each switch measures its own kind."""
    space = dataclasses.replace(SMALL, trees=("chain:0", "chain:6"), modes=("dense",))
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    cfg = ControllerConfig(patience=2, cooldown=0, stride=1)

    def first_switch(costs):
        c = OnlineController(doc, M, G, prof, cfg, switch_cost_s=costs)
        s = c.initial_strategy(30000)
        for i in range(10):
            new = c.after_round(Stats(i, s, (0,), drafted=6))
            if new is not None:
                return c, new
        return c, None

    c, new = first_switch({"eagle": 10.0, "none": 1e-4})
    assert new is not None and not parse_tree(new.tree)
    assert c.switches[0]["switch_cost_s"] == pytest.approx(1e-4)
    _, new = first_switch({"eagle": 1e-4, "none": 10.0})  # AR dear: not worth a switch
    assert new is None
    _, new = first_switch(10.0)  # one figure for every destination
    assert new is None
    c, new = first_switch({})
    c.after_round(Stats(10, new, (0,), drafted=0, step_s={"switch": 0.002}))
    assert c.switch_costs["none"] == 0.002 and c.switch_cost(new) == 0.002
    with pytest.raises(ValueError, match="switch_cost_s"):
        OnlineController(doc, M, G, prof, cfg, switch_cost_s={"none": -1.0})


@pytest.mark.parametrize("transfer", [0.0, 0.5])
def test_controller_moves_to_another_drafter_when_only_its_own_collapses(transfer):
    """The n-gram drafter finds nothing (random bytes). The EAGLE candidates score as profiled
    (``transfer`` 0, the default) or with half the n-gram drafter's drop: on this large
    model drafting costs little, so either way EAGLE beats autoregressive decoding, and the
    controller goes to it at once; EAGLE then doing as profiled, it stays there. (Scored with
    the whole drop, ``transfer`` 1, nothing pays by more than the hysteresis here.)"""
    space = dataclasses.replace(
        SMALL, drafters=("ngram", "eagle"), trees=("chain:0", "chain:6"), modes=("dense",)
    )
    prof = RegimeProfile(acceptance={"32K": {"eagle": 0.8, "ngram": 0.85}})
    doc = rank(M, G, space, prof, regimes={"32K": 32768})
    first = strategy_from_json(doc["regimes"]["32K"]["ranking"][0]["strategy"])
    assert first.drafter.kind == "ngram"
    cfg = ControllerConfig(patience=3, cooldown=4, stride=1, transfer=transfer, probe_after=32)
    c = OnlineController(doc, M, G, prof, cfg)
    s = c.initial_strategy(30000)
    e6 = round(tree_expected_tokens(parse_tree("chain:6"), 0.8) - 1)
    kinds = []
    for i in range(120):
        acc = 0 if s.drafter.kind == "ngram" else e6  # EAGLE accepts what its profile says
        new = c.after_round(Stats(i, s, (acc if parse_tree(s.tree) else 0,)))
        s = new or s
        kinds.append(s.drafter.kind if parse_tree(s.tree) else "ar")
    assert [x["reason"] for x in c.switches] == ["acceptance"], c.switches
    assert set(kinds) == {"ngram", "eagle"} and s.drafter.kind == "eagle" and parse_tree(s.tree)


SHADOW_SPACE = dataclasses.replace(
    SMALL, drafters=("eagle", "ngram"), modes=("dense",), trees=("chain:0", "chain:2", "chain:6")
)
SHADOW_PROFILE = RegimeProfile(acceptance={"32K": {"eagle": 0.8, "ngram": 0.3}})


def _shadow_controller(**cfg) -> OnlineController:
    doc = rank(M, G, SHADOW_SPACE, SHADOW_PROFILE, regimes={"32K": 32768})
    return OnlineController(doc, M, G, SHADOW_PROFILE, ControllerConfig(**cfg))


def _shadow(rng, alpha: float, positions: int = 3, chain: int = 8):
    """What the engine reports: leading matches of ``positions`` chain proposals, each draft
    matching with probability ``alpha``."""
    from ssvkit.engine.controller import ShadowAcceptance

    matched = [0] * chain
    for _ in range(positions):
        k = 0
        while k < chain and rng.random() < alpha:
            k += 1
        for j in range(k):
            matched[j] += 1
    return {"ngram": ShadowAcceptance(positions, tuple(matched))}


def _accepted(rng, tree: str, alpha: float) -> int:
    """Accepted drafts of one chain round at per-token acceptance ``alpha``."""
    k, n = 0, len(parse_tree(tree))
    while k < n and rng.random() < alpha:
        k += 1
    return k


def _drive(
    c: OnlineController, s: Strategy, rounds: int, alpha: dict, shadow_alpha: float, seed: int = 0
) -> Strategy:
    """Feed ``rounds`` rounds: the current drafter accepts at ``alpha[kind]``, the shadow sees
    n-gram chains matching at ``shadow_alpha``; switch whenever the controller says so."""
    rng = np.random.default_rng(seed)
    for i in range(rounds):
        drafts = len(parse_tree(s.tree))
        acc = _accepted(rng, s.tree, alpha[s.drafter.kind]) if drafts else 0
        new = c.after_round(Stats(i, s, (acc,), drafted=drafts, shadow=_shadow(rng, shadow_alpha)))
        s = new or s
    return s


def test_controller_declares_its_drafters_and_reads_the_shadow():
    c = _shadow_controller()
    assert c.drafter_kinds() == ("eagle", "ngram")
    s = c.initial_strategy(30000)
    assert s.drafter.kind == "eagle" and parse_tree(s.tree)
    ng6 = dataclasses.replace(
        s, drafter=dataclasses.replace(s.drafter, kind="ngram"), tree="chain:6"
    )
    assert c.shadow_alpha("32K", ng6, s) is None  # nothing seen yet
    rng = np.random.default_rng(1)
    for i in range(60):
        c.after_round(Stats(i, s, (4,), drafted=6, shadow=_shadow(rng, 0.6, positions=5)))
    # Decayed leading-match counts -> expected tokens of chain:6 -> alpha, close to the truth.
    assert c.shadow_alpha("32K", ng6, s) == pytest.approx(0.6, abs=0.1)
    two = dataclasses.replace(ng6, tree="chain:2")
    assert c.shadow_alpha("32K", two, s) == pytest.approx(0.6, abs=0.15)
    assert c.shadow_alpha("32K", dataclasses.replace(ng6, tree="full:2x2"), s) is None


def test_controller_reads_a_chains_walk_not_the_average_over_positions():
    """Bursty text: the shadow's positions match whole chains of 8 one time in four (a long
    matching stretch counts at each of its positions), so the average over positions puts
    chain:6 well above what a chain:6 run accepts, which its walk measured: 0.5 drafts a
    round. The controller scores chain:6 at the walk's figure."""
    from ssvkit.engine.controller import ShadowAcceptance

    c = _shadow_controller()
    s = c.initial_strategy(30000)
    ng6 = dataclasses.replace(
        s, drafter=dataclasses.replace(s.drafter, kind="ngram"), tree="chain:6"
    )
    walks = tuple(range(4, 12))  # rounds a walk of chain k took over the 12 positions
    sh = ShadowAcceptance(12, (3,) * 8, walks, tuple(w // 2 for w in walks))
    assert sh.accepted(6) == pytest.approx(4 / 9) and sh.accepted_per_position(6) == 1.5
    for i in range(60):
        c.after_round(Stats(i, s, (4,), drafted=6, shadow={"ngram": sh}))
    walked = alpha_from_tokens("chain:6", 1.0 + 4 / 9)
    assert c.shadow_alpha("32K", ng6, s) == pytest.approx(walked, abs=1e-9)
    assert walked < alpha_from_tokens("chain:6", 2.5) - 0.2


def test_controller_switches_to_ngram_when_its_shadow_accepts_whole_chains():
    """Repetitive text: the draft drafter does as profiled, but the n-gram shadow matches
    nearly every chain. The controller re-scores on the shadow (reason ``shadow``), goes to the
    longest n-gram chain and, n-gram then accepting what the shadow said, stays there; from
    autoregressive decoding too, which observes nothing of its own."""
    c = _shadow_controller()
    s = _drive(c, c.initial_strategy(30000), 120, {"eagle": 0.8, "ngram": 0.97}, 0.97)
    assert [x["reason"] for x in c.switches] == ["shadow"], c.switches
    assert s.drafter.kind == "ngram" and s.tree == "chain:6"
    assert c.switches[0]["observed_alpha"] > 0.9 and c.switches[0]["expected_alpha"] < 0.5
    c = _shadow_controller(probe_after=1000)
    ar = dataclasses.replace(c.initial_strategy(30000), tree="chain:0")
    s = _drive(c, ar, 60, {"eagle": 0.8, "ngram": 0.97}, 0.97)
    assert [x["reason"] for x in c.switches] == ["shadow"] and s.drafter.kind == "ngram"


def test_controller_does_not_switch_on_noise():
    """Everything as profiled, sampled round by round (1-7 tokens per round, shadow chains of
    3 positions): 400 rounds, several seeds, no switch."""
    for seed in range(3):
        c = _shadow_controller()
        _drive(c, c.initial_strategy(30000), 400, {"eagle": 0.8, "ngram": 0.3}, 0.3, seed)
        assert c.switches == [], (seed, c.switches)


def test_controller_leaves_a_collapsing_drafter_and_keeps_ngram_off_random_text():
    """Random bytes: the draft drafter collapses and the n-gram shadow finds nothing either.
    The controller leaves the collapsing drafter once, not for n-gram drafting (its shadow says
    it would accept nothing), and a shadow that stays low never triggers a re-score."""
    c = _shadow_controller(probe_after=1000)
    first = c.initial_strategy(30000)
    s = _drive(c, first, 200, {"eagle": 0.05, "ngram": 0.0}, 0.0)
    assert [x["reason"] for x in c.switches] == ["collapse"], c.switches
    assert c.switches[0]["from"] == strategy_id(first)
    assert s.drafter.kind != "ngram" or not parse_tree(s.tree)


def test_controller_rescore_agrees_with_a_full_score():
    """The controller re-scores from cached round times and interpolated tokens per round;
    it must rank the candidates as a full ``score`` at the same shifted acceptance does."""
    from ssvkit.planner.rank import score

    c = _controller()
    c.warm()
    s = c.initial_strategy(30000)
    for alpha in (0.1, 0.5, 0.95):
        c._acceptance.ema.alpha = alpha
        best, gain = c._rescore(s, "32K", 32768, 0.8)
        cands = list(c._book.candidates("32K").values())
        shift = dict(c._scorer.shift)
        full, _ = score(M, G, cands, 32768, c.profile, "32K", acceptance_scale=shift)
        top = full[0].strategy
        if best is not None:
            assert strategy_id(best) == strategy_id(top)
        else:  # no switch: either the current one is on top, or the gain is below hysteresis
            assert strategy_id(top) == strategy_id(s) or gain <= c.config.hysteresis


def test_controller_from_a_ranking_document_and_regimes_it_lacks():
    doc = rank(
        M, G, SMALL, RegimeProfile(acceptance={"32K": {"eagle": 0.8}}), regimes={"32K": 32768}
    )
    doc = json.loads(json.dumps(doc))  # as read back from the file
    c = OnlineController.from_ranking(doc, ControllerConfig(patience=2, cooldown=0))
    assert c.model.name == M.name and c.gpu.name == G.name
    assert c.profile.alpha("32K", "eagle") == 0.8
    with pytest.raises(ValueError, match="regime 8K, which the ranking does not hold"):
        c.initial_strategy(8000)
    # A sequence that grows past the ranked regimes is re-scored with the nearest one.
    s = c.initial_strategy(30000)
    new = None
    for i in range(6):
        new = c.after_round(Stats(i, s, (0,), context_lens=(70000,))) or new
    assert new is not None and c.switches
    bad = dict(doc, profile={"version": 9})
    with pytest.raises(ValueError, match="the ranking's profile must have version 1 or 2"):
        OnlineController.from_ranking(bad)


def test_rank_cli(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["rank", "--trees", "chain:4,best:16:6", "--top", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert all(r in text for r in REGIMES)
    doc = json.loads(out.read_text())
    assert doc["version"] == 1 and set(doc["regimes"]) == set(REGIMES)
    assert main(["rank", "--acceptance-profile", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["rank", "--trees", "bush:3"]) == 2
    assert main(["rank", "--metadata", "lsh"]) == 2
    assert "unknown metadata ['lsh']" in capsys.readouterr().err
    assert main(["rank", "--trees", "best:16:6", "--metadata", "nsa,mean", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["regimes"]["16K"]["ranking"]
    assert {r["strategy"]["metadata"] for r in ranked if r["strategy"]["attention"] != "dense"} == {
        "nsa",
        "mean",
    }


EVALUATION = record_path("planner.json")


def test_rank_cli_ranks_the_installed_evaluation_and_keeps_its_ranking_quality(tmp_path, capsys):
    """``--evaluation`` ranks with the evaluation's model, GPU, space, contexts and profile: the
    space the evaluation ranked comes back on the CPU. The ranking the evaluation used
    (``--ranking-out``, installed beside it) is its record and orders the strategies it measured
    within its targets (Kendall tau and regret against the same measured tokens/s); the current
    model's top pick stays within the regret target. Its Kendall tau is not gated here: the
    evaluation ran the engine and kernels of its commit, whose NSA calls the current kernels
    outrun, so its sparse strategies measured slower than the H100 profile, fitted on the
    current kernels, prices them."""
    out = tmp_path / "r.json"
    assert main(["rank", "--evaluation", str(EVALUATION), "--top", "1", "--out", str(out)]) == 0
    assert "ranked as the evaluation planner.json (commit " in capsys.readouterr().out
    got = json.loads(out.read_text())
    with gzip.open(EVALUATION.with_name("planner-ranking.json.gz"), "rt") as fh:
        want = json.load(fh)
    doc = json.loads(EVALUATION.read_text())
    targets = doc["targets"]
    assert set(got["regimes"]) == set(want["regimes"]) and "skipped" not in got
    for regime, entry in want["regimes"].items():
        mine = got["regimes"][regime]
        assert mine["context_len"] == entry["context_len"] and mine["assumed"] == []
        # By description: a draft model's ids hash its checkpoint's path, which is this
        # checkout's here and the H100's there.
        predicted = {r["describe"]: r["tokens_per_s"] for r in mine["ranking"]}
        assert set(predicted) == {r["describe"] for r in entry["ranking"]}, regime
        measured = doc["regimes"][regime]["strategies"]
        speeds = [s["measured"]["tokens_per_s"] for s in measured]
        recorded = {r["describe"]: r["tokens_per_s"] for r in entry["ranking"]}
        quality = ranking_quality([recorded[s["describe"]] for s in measured], speeds)
        assert quality["kendall_tau"] >= targets["kendall_tau_min"], (regime, quality)
        assert quality["regret"] <= targets["regret_max"], (regime, quality)
        now = ranking_quality([predicted[s["describe"]] for s in measured], speeds)
        assert now["regret"] <= targets["regret_max"], (regime, now)
    assert main(["rank", "--evaluation", str(EVALUATION), "--trees", "chain:4"]) == 2
    assert "--evaluation sets the model, GPU, space and profile; drop --trees" in (
        capsys.readouterr().err
    )
    assert main(["rank", "--evaluation", str(record_path("campaign.json"))]) == 2
    assert "is not a planner evaluation" in capsys.readouterr().err


def test_profile_inside_a_document_and_what_is_not_a_profile(tmp_path):
    prof = load_profile(EVALUATION)  # the evaluation's measured profile, not its own regimes
    assert prof.source.startswith("profile:planner.json#profile:")
    assert 0 < prof.alpha("16K", "ngram") < 1
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"version": 1, "regimes": {"16K": {"context_len": 15360}}}))
    with pytest.raises(ValueError, match="regime 16K has 'context_len', not one of acceptance"):
        load_profile(p)
    p.write_text(json.dumps({"version": 1, "rows": []}))
    with pytest.raises(ValueError, match="has no 'regimes' object: not a profile"):
        load_profile(p)


def test_rank_skips_regimes_past_the_models_context_and_names_what_it_assumed():
    small = dataclasses.replace(M, max_position_embeddings=16384)
    doc = rank(small, G, SMALL, RegimeProfile(acceptance={"default": {"eagle": 0.6}}))
    assert set(doc["regimes"]) == {"<=4K", "8K", "16K"}
    assert doc["skipped"]["32K"] == "context 32768 > the model's 16384 trained positions"
    notes = doc["regimes"]["16K"]["assumed"]
    assert not any(n.startswith("acceptance of") for n in notes)  # from ``default``
    assert any(n.startswith("block overlap of bfs") for n in notes)
    bare = rank(M, G, SMALL, RegimeProfile(), regimes={"32K": 32768})["regimes"]["32K"]["assumed"]
    assert bare[0] == "acceptance of eagle (workload default 0.7)"
    full = RegimeProfile(
        acceptance={"32K": {"eagle": 0.6}},
        overlap={"32K": {"bfs": 0.7}},
        attention={"32K": {"eagle@sparse": 0.9}},
    )
    assert rank(M, G, SMALL, full, regimes={"32K": 32768})["regimes"]["32K"]["assumed"] == []
    tiny = dataclasses.replace(M, max_position_embeddings=2048)
    with pytest.raises(ValueError, match="no regime to rank for .*: <=4K: context 4096 > "):
        rank(tiny, G, SMALL, RegimeProfile())


def test_profile_per_tree_acceptance_attention_factor_and_the_loop_host_time(tmp_path):
    from ssvkit.perfmodel.strategy import DrafterSpec
    from ssvkit.planner.profile import attention_key
    from ssvkit.planner.rank import score

    ng = DrafterSpec(kind="ngram")
    dense = Strategy(tree="chain:4", drafter=ng)
    tree7 = dataclasses.replace(dense, tree="chain:7")
    sparse = dataclasses.replace(
        dense,
        attention="sparse",
        mode="union",
        group_size=4,
        refresh_every=2,
        fusion="refresh_reuse",
    )
    shared = dataclasses.replace(sparse, mode="shared")
    assert attention_key(dense) is None
    assert attention_key(sparse) == "exact:nsa32s16:top16x64w512:r2"
    exact = {
        attention_key(dataclasses.replace(sparse, mode="per_query", group_size=1)),
        attention_key(dataclasses.replace(shared, group_size=1)),
        attention_key(dataclasses.replace(sparse, fusion="none")),
    }
    assert exact == {"exact:nsa32s16:top16x64w512:r2"}
    # NSA selects per row whatever the mode: sharing applies to block-metadata selection.
    assert attention_key(shared) == "exact:nsa32s16:top16x64w512:r2"
    shared = dataclasses.replace(shared, metadata="mean")
    assert attention_key(shared) == "shared4:mean:top16x64w512:r2"
    prof = RegimeProfile(
        {"16K": {"ngram": 0.6, "ngram@chain:7": 0.5, "draft_model": 0.8}},
        {},
        "t",
        {
            "16K": {
                "exact:nsa32s16:top16x64w512:r2": 0.5,
                "shared4:mean:top16x64w512:r2": 3.0,
                "draft_model@exact:nsa32s16:top16x64w512:r2": 0.9,
            }
        },
    )
    assert prof.alpha_for("16K", dense) == 0.6 and prof.alpha_for("16K", tree7) == 0.5
    assert prof.alpha_for("16K", sparse) == pytest.approx(0.3)
    assert prof.alpha_for("16K", shared) == 1.0  # clipped
    # A drafter's own factor wins over the key's; asked for another drafter, that one's.
    dm = dataclasses.replace(sparse, drafter=DrafterSpec(kind="draft_model", model="x"))
    assert prof.alpha_for("16K", dm) == pytest.approx(0.72)
    assert prof.attention_factor("16K", dm, "ngram") == 0.5
    assert prof.attention_factor("16K", sparse, "draft_model") == 0.9
    # a drafter's factor for every key sits between its per-key factor and the key's
    pooled = RegimeProfile(
        attention={"16K": {"ngram@sparse": 0.4, "exact:nsa32s16:top16x64w512:r2": 0.5}}
    )
    assert pooled.attention_factor("16K", sparse) == 0.4
    assert pooled.attention_factor("16K", dm) == 0.5 and pooled.attention_factor("16K", dense) == 1
    # The ranking's round is the step model's, the loop's host time for the GPU host among its
    # ops (``perfmodel.loop_host``): ``loop`` in the breakdown.
    tiny = get_model("engine/checkpoints/tiny-target")
    (sc,), _ = score(tiny, G, [sparse], 16000, prof, "16K")
    coef = loop_host.shipped(G.name).coefficients
    want = loop_host.loop_host_s(coef, [2], [1], [4], [sc.tokens_per_round])[0]
    assert sc.breakdown_s["loop"] == pytest.approx(want) and want > 0
    assert sc.round_s == pytest.approx(sum(sc.breakdown_s.values()))
    assert sc.tokens_per_s == pytest.approx(sc.tokens_per_round / sc.round_s)
    # Version 3 files round-trip; versions 1 and 2 still load, a version 2 file's ``overhead``
    # table (an evaluation's own loop fit) accepted and not read.
    p = tmp_path / "p.json"
    p.write_text(json.dumps(prof.to_json()))
    again = load_profile(p)
    assert prof.to_json()["version"] == 3
    assert again.alpha_for("16K", sparse) == pytest.approx(0.3)
    old = {"16K": {"acceptance": {"ngram": 0.6}, "overhead": {"round": 1e-4}}}
    p.write_text(json.dumps({"version": 2, "regimes": old}))
    assert load_profile(p).alpha("16K", "ngram") == 0.6
    p.write_text(json.dumps({"version": 3, "regimes": old}))
    with pytest.raises(ValueError, match="regime 16K has 'overhead', not one of acceptance"):
        load_profile(p)
    p.write_text(json.dumps({"version": 2, "regimes": {"16K": {"attention": {"k": -1}}}}))
    with pytest.raises(ValueError, match="16K.attention.k must be a finite number >= 0"):
        load_profile(p)


TREE_SPACE = dataclasses.replace(SHADOW_SPACE, trees=("chain:0", "chain:4", "full:2x4"))
TREE_PROFILE = RegimeProfile(acceptance={"32K": {"eagle": 0.5, "ngram": 0.3}})


def _tree_shadow(rng, spec: str, alpha: float, walked: float, positions: int = 3):
    """``_shadow`` with the walk of tree ``spec`` (depth 4): one round a call, accepting all
    four drafts with probability ``walked`` and none otherwise."""
    from ssvkit.engine.controller import ShadowAcceptance

    sh = _shadow(rng, alpha, positions)["ngram"]
    a = 4 if rng.random() < walked else 0
    return {"ngram": ShadowAcceptance(sh.positions, sh.matched, trees=((spec, 1, a, a * a),))}


def test_controller_scores_ngram_trees_from_their_own_walks():
    """The n-gram chains' shadow as profiled, but the walk of the n-gram tree full:2x4 accepts
    whole paths of 4 nine rounds in ten (prose, where the tree's siblings find what the chain
    misses). Its candidates are scored from that walk, not shifted by the chains' shadow: a
    rising tree walk re-scores (reason ``shadow``, keyed by the tree) and the controller goes
    to the n-gram tree; with the walk's figure as profiled it stays put."""
    doc = rank(M, G, TREE_SPACE, TREE_PROFILE, regimes={"32K": 32768})
    c = OnlineController(doc, M, G, TREE_PROFILE, ControllerConfig())
    (spec,) = c.shadow_trees()
    assert spec == "full:2x4"
    s = first = c.initial_strategy(30000)
    assert s.drafter.kind == "eagle"
    tree = next(
        x
        for x in c._book.candidates("32K").values()
        if x.drafter.kind == "ngram" and x.tree == spec
    )
    mean = expected_tokens_interp(s.tree, 0.5) - 1.0  # the eagle tree as profiled, round by round

    def eagle(rng) -> int:
        return int(mean) + (rng.random() < mean - int(mean))

    rng = np.random.default_rng(0)
    for i in range(200):
        acc = eagle(rng) if s.drafter.kind == "eagle" else 4
        drafted = len(parse_tree(s.tree))
        new = c.after_round(
            Stats(i, s, (acc,), drafted=drafted, shadow=_tree_shadow(rng, spec, 0.3, 0.9))
        )
        if i == 40:
            # the decayed walk's accepted drafts per round (~3.6), inverted on the tree
            r, d, _ = c._shadow.walks["ngram"][spec]
            assert 3.0 < d / r <= 4.0
            walked = alpha_from_tokens(spec, 1.0 + d / r)
            assert c.shadow_alpha("32K", tree, first) == pytest.approx(walked, abs=1e-9)
        s = new or s
    assert [x["reason"] for x in c.switches] == ["shadow"], c.switches
    assert s.drafter.kind == "ngram" and s.tree == spec
    sw = c.switches[0]  # the tree's walk against its profile
    assert sw["expected_alpha"] == c._book.alpha_for("32K", tree) and sw["observed_alpha"] > 0.6
    # A walk at what the profile says of the tree: no switch.
    c = OnlineController(doc, M, G, TREE_PROFILE, ControllerConfig())
    prof = expected_tokens_interp(spec, c._book.alpha_for("32K", tree)) - 1.0
    s, rng = c.initial_strategy(30000), np.random.default_rng(1)
    for i in range(200):
        c.after_round(
            Stats(
                i,
                s,
                (eagle(rng),),
                drafted=len(parse_tree(s.tree)),
                shadow=_tree_shadow(rng, spec, 0.3, prof / 4),
            )
        )
    assert c.switches == []


def test_walk_gain_is_the_paired_time_over_the_same_tokens():
    """From autoregressive decoding (one token a round), the walk of n-gram chain:6 took a
    round every other token: chain:6 spends half a round of its own per round of the current
    strategy. ``Rescorer.walk_gain`` is the current's round time over that (taken ``confidence_z``
    standard errors high, over the decayed rounds' effective count) times chain:6's, less
    the amortised switch cost -- checked here against the decayed sums by hand."""
    import math

    from ssvkit.engine.controller import ShadowAcceptance

    c = _shadow_controller()
    ar = dataclasses.replace(c.initial_strategy(30000), tree="chain:0")
    ng6 = next(
        x
        for x in c._book.candidates("32K").values()
        if x.drafter.kind == "ngram" and x.tree == "chain:6"
    )
    assert c._scorer.walk_gain("32K", ar, ng6, 2.0) is None  # nothing walked yet
    keep, w, w2, r1, r2 = 1.0 - c.config.ema, 0.0, 0.0, 0.0, 0.0
    for i in range(80):
        r = i % 2  # a walked round of chain:6 every other token, accepting one draft
        walks = tuple(r for _ in range(8))
        sh = ShadowAcceptance(1, (r,) + (0,) * 7, walks, walks)
        c._shadow.observe({"ngram": sh}, 1.0, keep)
        w, w2 = keep * w + 1.0, keep * keep * w2 + 1.0
        r1, r2 = keep * r1 + r, keep * r2 + r * r
    mean, var = r1 / w, r2 / w - (r1 / w) ** 2
    high = mean + c.config.confidence_z * math.sqrt(var * w2) / w
    rs = c._book.round_s("32K", [ar, ng6])
    tokens = 2.0  # as the re-score expects of chain:6 (the walk: 1 draft a round)
    want = (rs[strategy_id(ar)]) / (high * rs[strategy_id(ng6)]) - 1.0  # no switch cost known
    assert c._scorer.walk_gain("32K", ar, ng6, tokens) == pytest.approx(want, rel=1e-9)
    # Expected fewer tokens than its walk (a sparser attention): more of its rounds.
    assert c._scorer.walk_gain("32K", ar, ng6, 1.5) < want


def test_a_rescore_whose_top_did_not_pay_across_its_interval_is_repeated():
    """The re-score's top paid at its point estimate but not across its interval: the
    controller re-scores again ``patience`` rounds later (reason ``recheck`` when it then
    switches), though nothing deviated or rose since (epsilon 1, no collapse test)."""
    c = _shadow_controller(stride=1, epsilon=1.0, collapse_llr=0.0)
    s = c.initial_strategy(30000)
    other = next(x for x in c._book.candidates("32K").values() if x.tree == "chain:2")
    calls = []

    def rescore(current, regime, ctx, expected, spread=()):
        calls.append(current)
        return (None, 0.3) if len(calls) == 1 else (other, 0.3)

    c._rescore = rescore
    c._recheck_at = 20  # as a re-score before round 20 would have left it
    out = [c.after_round(Stats(i, s, (3,), drafted=6)) for i in range(60)]
    switched = [i for i, x in enumerate(out) if x is not None]
    assert len(calls) == 2 and switched == [20 + c.config.patience]
    assert out[switched[0]] is other and c.switches[-1]["reason"] == "recheck"
    assert c._recheck_at is None
    # A top that did not pay even at its point estimate: no recheck.
    c = _shadow_controller(stride=1, epsilon=1.0, collapse_llr=0.0)
    c._rescore = lambda *a, **k: (None, 0.01)
    c._recheck_at = 5
    assert not any(c.after_round(Stats(i, s, (3,), drafted=6)) for i in range(40))
    assert c._recheck_at is None
