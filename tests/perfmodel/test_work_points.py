import numpy as np
from ssvkit.perfmodel import work_points
from ssvkit.perfmodel.work_points import at_distinct_points


class Work:
    def __init__(self, a, b):
        self.a, self.b = a, b


def counting(calls):
    def work(kw):
        calls.append(dict(kw))
        return None if kw["x"] == 0 else Work(kw["x"] * 10, kw["x"] + kw["y"])

    return work


def test_each_distinct_point_is_counted_once_and_scattered_back():
    calls = []
    shape = {"x": np.array([[1], [2], [0]]), "y": np.array([5, 5, 7])}
    out = at_distinct_points(shape, counting(calls), ("a", "b"))
    assert len(calls) == 6  # the 3 x 3 grid holds (x, y) in {0, 1, 2} x {5, 7}
    assert out["a"].shape == (3, 3)
    np.testing.assert_array_equal(out["a"], [[10, 10, 10], [20, 20, 20], [0, 0, 0]])
    np.testing.assert_array_equal(out["b"], [[6, 6, 8], [7, 7, 9], [0, 0, 0]])


def test_a_memo_key_counts_a_point_once_per_process_and_per_key(monkeypatch):
    monkeypatch.setattr(work_points, "_COUNTED", {})
    shape = {"x": np.array([1, 2, 0]), "y": 3}
    first, again, other = [], [], []
    want = at_distinct_points(shape, counting(first), ("a", "b"), memo_key=("k", 1))
    got = at_distinct_points(shape, counting(again), ("a", "b"), memo_key=("k", 1))
    assert len(first) == 3 and again == []  # a point that counts nothing is remembered too
    for f in want:
        np.testing.assert_array_equal(got[f], want[f])
    at_distinct_points(shape, counting(other), ("a", "b"), memo_key=("k", 2))
    assert len(other) == 3  # another key (another GPU, mode) is counted on its own


def test_a_full_memo_is_cleared_and_counts_stay_right(monkeypatch):
    monkeypatch.setattr(work_points, "_COUNTED", {})
    monkeypatch.setattr(work_points, "COUNTED_LIMIT", 2)
    calls = []
    shape = {"x": np.arange(1, 6), "y": 1}
    out = at_distinct_points(shape, counting(calls), ("a", "b"), memo_key=("k",))
    assert len(work_points._COUNTED) <= 2
    again = at_distinct_points(shape, counting(calls), ("a", "b"), memo_key=("k",))
    np.testing.assert_array_equal(out["b"], np.arange(2, 7))
    np.testing.assert_array_equal(again["b"], out["b"])
