"""The NSA stage benchmark's calls, each run once in the CPU interpreter on a small case, so a
kernel step renamed or re-signed fails here rather than on the GPU machine."""

import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.validation import nsa_stages as ns


def test_every_timed_call_of_the_benchmark_runs(monkeypatch):
    monkeypatch.setattr(ki, "DEVICE", "cpu")
    monkeypatch.setattr(ki, "DTYPE", torch.float32)  # the interpreter's bf16 dot is wrong
    geometry = zip(("NUM_Q_HEADS", "NUM_KV_HEADS", "HEAD_DIM"), ki.GEOMETRIES["tiny"], strict=True)
    for name, value in geometry:
        monkeypatch.setattr(ki, name, value)
    sets, plan, slots, rslots, unions, parts = ns.prepare(1, 4, 2048, 2052, num_sets=1)
    calls = ns.calls(sets, plan, slots, rslots, unions, parts)
    assert {"reuse", "refresh", "stage_scores", "stage_topk", "stage_merge"} <= set(calls)
    for fn in calls.values():
        fn(0)
    o, idx = calls["refresh"](0)
    assert not torch.isnan(o).any() and idx.shape == (1, ki.NUM_KV_HEADS, 4, ns.KW["top_n"])
