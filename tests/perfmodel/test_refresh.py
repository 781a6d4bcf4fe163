import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ssvkit.perfmodel.refresh import (
    schedule_every,
)
from ssvkit.perfmodel.seed_formulas import (
    adjacent_jaccard,
    choose_anchor_layers,
    jaccard,
    reuse_source,
    schedule_cost_s,
    schedule_from_anchors,
)


def test_schedule_every_and_cost():
    r = schedule_every(8, 4)
    assert r.tolist() == [True, False, False, False, True, False, False, False]
    # 2 refresh layers at 3 ms + 6 reuse layers at 1 ms
    assert schedule_cost_s(r, 3e-3, 1e-3) == pytest.approx(12e-3)
    assert schedule_every(5, 1).all()


@given(st.integers(1, 64), st.integers(0, 64), st.integers(0, 64))
def test_cost_monotone_in_refresh_layers(num_layers, a, b):
    lo, hi = sorted((min(a, num_layers), min(b, num_layers)))
    r_lo = np.zeros(num_layers, bool)
    r_lo[:lo] = True
    r_hi = np.zeros(num_layers, bool)
    r_hi[:hi] = True
    assert schedule_cost_s(r_lo, 2.0, 1.0) <= schedule_cost_s(r_hi, 2.0, 1.0)


def test_jaccard_and_anchors():
    assert jaccard([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(1 / 3)
    assert jaccard([0, 0], [0, 0]) == 0.0
    m = np.array(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],  # same as layer 0
            [0, 0, 1, 1, 0, 0],  # disjoint from layer 1: J = 0
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 0, 1, 0],  # J = 1/3 with layer 3
        ],
        bool,
    )
    np.testing.assert_allclose(adjacent_jaccard(m), [0, 1, 0, 1, 1 / 3])
    assert choose_anchor_layers(m, 2).tolist() == [0, 2]
    assert choose_anchor_layers(m, 3).tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="num_anchors"):
        choose_anchor_layers(m, 0)


def test_reuse_source_eq9():
    r = schedule_from_anchors(6, [2, 4])
    assert reuse_source(r).tolist() == [0, 0, 2, 2, 4, 4]
    with pytest.raises(ValueError, match="anchor"):
        schedule_from_anchors(4, [5])
