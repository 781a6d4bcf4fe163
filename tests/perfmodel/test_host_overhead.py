"""The decode loop's host overhead per round (``perfmodel.host_overhead``): its features, the
price of a round from a set of coefficients, and the check of coefficients read from a file."""

import dataclasses

import numpy as np
import pytest
from ssvkit.perfmodel.host_overhead import (
    OVERHEAD_TERMS,
    check_overhead,
    host_overhead_s,
    overhead_features,
)
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

NGRAM = Strategy(tree="chain:4", drafter=DrafterSpec(kind="ngram"))
DM = DrafterSpec(kind="draft_model", model="x")
SPARSE = dict(attention="sparse", mode="union", group_size=4, refresh_every=2)


def test_features_count_rounds_drafting_nodes_levels_and_host_lookups():
    # round, speculative, draft_model, node, draft_level, sparse, host_node
    ar = dataclasses.replace(NGRAM, tree="chain:0")
    assert overhead_features(ar).tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert overhead_features(NGRAM).tolist() == [1, 1, 0, 4, 0, 0, 4]
    wide = dataclasses.replace(NGRAM, tree="parents:-1,-1,-1,0,1,2", drafter=DM, **SPARSE)
    assert overhead_features(wide).tolist() == [1, 1, 1, 6, 2, 1, 0]  # 6 nodes, 2 levels
    dm_ar = dataclasses.replace(ar, drafter=DM)
    assert overhead_features(dm_ar).tolist() == [1, 0, 0, 0, 0, 0, 0]  # drafts nothing
    assert len(overhead_features(wide)) == len(OVERHEAD_TERMS)


def test_a_round_is_priced_term_by_term():
    coef = {"round": 1e-4, "speculative": -2e-5, "node": 1e-5, "draft_level": 3e-4}
    coef |= {"draft_model": 5e-5, "sparse": 2e-4, "host_node": 7e-6}
    ar = dataclasses.replace(NGRAM, tree="chain:0")
    assert host_overhead_s(coef, ar) == pytest.approx(1e-4)
    # n-gram chain of 4: round + speculative + 4 nodes + 4 host lookups
    assert host_overhead_s(coef, NGRAM) == pytest.approx(1e-4 - 2e-5 + 4e-5 + 2.8e-5)
    # draft model, 6 nodes on 2 levels, sparse: its levels and the sparse term, no host lookups
    wide = dataclasses.replace(NGRAM, tree="parents:-1,-1,-1,0,1,2", drafter=DM, **SPARSE)
    want = 1e-4 - 2e-5 + 5e-5 + 6e-5 + 2 * 3e-4 + 2e-4
    assert host_overhead_s(coef, wide) == pytest.approx(want, rel=1e-12)
    # A missing term counts 0, no coefficients price 0 (the step model alone).
    assert host_overhead_s({"node": 1e-5}, NGRAM) == pytest.approx(4e-5)
    assert host_overhead_s({}, wide) == 0.0
    # The price is the features' dot product with the coefficients in OVERHEAD_TERMS order.
    w = np.array([coef[t] for t in OVERHEAD_TERMS])
    assert host_overhead_s(coef, wide) == float(overhead_features(wide) @ w)


def test_coefficients_from_a_file_are_checked():
    assert check_overhead("16K.overhead", {"round": 1e-4, "speculative": -3e-5}) == {
        "round": 1e-4,
        "speculative": -3e-5,
    }
    assert check_overhead("16K.overhead", {"node": 0}) == {"node": 0.0}
    for bad, msg in (
        ({"launch": 1.0}, "16K.overhead.launch is not one of round, speculative"),
        ({"node": -1e-6}, "16K.overhead.node must be a finite number >= 0, got -1e-06"),
        ({"round": True}, "16K.overhead.round must be a finite number >= 0"),
        ({"speculative": float("inf")}, "16K.overhead.speculative must be a finite number"),
        ({"round": 1e-5, "speculative": -3e-5}, "16K.overhead: round \\+ speculative must be"),
        ({"speculative": -1e-6}, "round \\+ speculative must be >= 0"),
    ):
        with pytest.raises(ValueError, match=msg):
            check_overhead("16K.overhead", bad)
