"""The kernel sweep's select rows, run once in the CPU interpreter with the timing replaced: both
implementations (one launch, two launches) on the same inputs, and the sweep's correctness
check of the two against each other and the reference."""

from __future__ import annotations

import types

import pytest
import torch
from ssvkit.calibration import kernel_checks as checks
from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops as ops
from ssvkit.kernels import select_blocks as sb


class RecordingRunner:
    """The parts of ``calibration.runner.Runner`` the sweep calls: every config pending, each
    timed op run once and recorded instead of timed."""

    def __init__(self):
        self.rows = []

    def pending(self, op, params):
        return ["graph"]

    def out_of_time(self):
        return False

    def time_op(self, op, params, fn, *, num_inputs, unique_bytes, flops):
        self.rows.append((op, params, fn(0).cpu()))


def test_select_rows_time_one_and_two_launches_on_the_same_inputs(tiny_cpu):
    runner = RecordingRunner()
    for method in ("mean", "quest"):
        assert ops.run_config(runner, kg.select_config(2048, 3, 1, 16, method), 0, sb)
    got = {(p["method"], p["impl"]): idx for op, p, idx in runner.rows if op == "select_blocks"}
    assert set(got) == {(m, i) for m in ("mean", "quest") for i in kg.SELECT_IMPLS}
    for method in ("mean", "quest"):
        assert torch.equal(got[method, "one_launch"], got[method, "two_launch"])
        assert got[method, "one_launch"].shape == (1, ki.NUM_KV_HEADS, 3, 16)


def test_the_select_check_passes_on_the_interpreter(tiny_cpu, monkeypatch):
    """On one KV head of the tiny geometry's four-head groups: the check's pick runs a program
    per (sequence, KV head, draft row), and a second head would only repeat them."""
    monkeypatch.setattr(ki, "NUM_Q_HEADS", ki.NUM_Q_HEADS // ki.NUM_KV_HEADS)
    monkeypatch.setattr(ki, "NUM_KV_HEADS", 1)
    checks.check_select(sb)


def test_the_select_check_compares_the_one_launch_pick_with_the_two_launch_one(
    tiny_cpu, monkeypatch
):
    """A one-launch pick that differs from the two-launch pick fails the check: it runs both."""
    monkeypatch.setattr(ki, "NUM_Q_HEADS", ki.NUM_Q_HEADS // ki.NUM_KV_HEADS)
    monkeypatch.setattr(ki, "NUM_KV_HEADS", 1)
    seen = []

    def select_blocks(*args, fused=False, **kwargs):
        seen.append(fused)
        idx = sb.select_blocks(*args, fused=False, **kwargs)
        return idx.flip(-1) if fused else idx

    broken = types.SimpleNamespace(
        select_blocks=select_blocks,
        BlockMetadata=sb.BlockMetadata,
    )
    with pytest.raises(checks.CorrectnessError, match="one launch and two launches differ"):
        checks.check_select(broken)
    assert seen == [False, True]
