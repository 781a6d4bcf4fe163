"""Each step of the kernel sweep runs its config's real kernels in the CPU interpreter (fp32, a
small context, timing faked): its rows carry the config's head geometry and the derived params
of their inputs, the geometry in use is restored, and a rerun times nothing."""

from __future__ import annotations

import pytest
import torch
from ssvkit.calibration import kernel_grid as kg
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops as ops
from ssvkit.calibration.runner import Runner, read_rows
from ssvkit.kernels import timing as tm

GEOMETRY = "16q-2kv-d64"
CEIL = dict(copy_bytes_per_s=1e12, gemm_flops_per_s=1e15, launch=2e-6, graph=1e-6)


@pytest.fixture
def cpu_sweep(monkeypatch):
    monkeypatch.setattr(ki, "DEVICE", "cpu")
    monkeypatch.setattr(ki, "DTYPE", torch.float32)  # bf16 tl.dot is wrong in the interpreter

    def bench(fn, timing, *, num_inputs, config):
        fn(num_inputs - 1)
        return tm.Timing(1e-5, 0.9e-5, 1.1e-5, timing, 3)

    monkeypatch.setattr(tm, "bench", bench)
    monkeypatch.setattr(tm, "num_rotations", lambda working_set_bytes: 2)  # not eight sets


def _configs() -> list[kg.KernelConfig]:
    with ki.geometry(GEOMETRY):
        return [
            kg.dense_config(1000, 3, 2, sdpa=False),
            kg.sparse_config(1024, 5, 1, 4, 0.5, [("per_query", 1), ("union", 3), ("shared", 3)]),
            kg.repair_config(1024, 3, 1, 8, (0.25,)),
            kg.nsa_config(1536, 3, 1, kg.NSA_REUSE_OVERLAP),  # reuse only: fewer NSA calls
            kg.select_config(1024, 3, 1, 4, "mean"),
        ]


def _recording(fn, impl: str, ran: list):
    """``fn`` that first notes its ``impl`` and its config's ``branch_streams`` in ``ran``."""

    def record(*args, **kw):
        config = kw.get("config")
        ran.append((impl, None if config is None else config.branch_streams))
        return fn(*args, **kw)

    return record


def test_every_step_times_its_configs_at_their_geometry(tmp_path, cpu_sweep, monkeypatch):
    from ssvkit.kernels import nsa_verify, select_blocks, sparse_verify

    ran = []  # (implementation, the config's branch_streams) of each NSA call
    for name, impl in (("nsa_verify", "fused"), ("nsa_verify_unfused", "unfused")):
        monkeypatch.setattr(nsa_verify, name, _recording(getattr(nsa_verify, name), impl, ran))

    mods = {"sparse": sparse_verify, "nsa": nsa_verify, "select": select_blocks}
    r = Runner(tmp_path / "rows.jsonl", 600.0, config=tm.QUICK_TIMING, timings=("graph",))
    r.ceil = dict(CEIL)
    configs = _configs()
    assert ki.current_geometry() == "llama-3.1-8b"
    for cfg in configs:
        assert ops.run_config(r, cfg, 0, mods.get(cfg.step))
        assert ki.current_geometry() == "llama-3.1-8b"
    rows = read_rows(r.path)
    assert len(rows) == sum(len(c.variants) for c in configs) == 10
    assert {(x["params"]["num_q_heads"], x["params"]["head_dim"]) for x in rows} == {(16, 64)}
    by_op = {}
    for x in rows:
        by_op.setdefault(x["op"], []).append(x["params"])
    assert by_op["dense_verify"][0]["num_splits"] >= 1
    union = next(p for p in by_op["sparse_verify"] if p["mode"] == "union")
    assert 0 < union["f_load"] <= 1 and union["global_unique_bytes"] > 0
    assert [p["missed_blocks"] for p in by_op["repair"]] == [2, 8]
    nsa = {(p["mode"], p["impl"], p["window"], p["overlap"]) for p in by_op["nsa_verify"]}
    assert nsa == {("reuse", i, 512, 0.7) for i in ("fused", "unfused")}
    # Each variant runs with its row's branch_streams (none: one stream), not the default.
    assert {(p["impl"], p.get("branch_streams")) for p in by_op["nsa_verify"]} == {
        ("fused", None),
        ("unfused", True),
    }
    assert set(ran) == {("fused", False), ("unfused", True)}
    assert all(not ops.run_config(r, cfg, 0, mods.get(cfg.step)) for cfg in configs)
    assert len(read_rows(r.path)) == 10
    assert {p["impl"] for p in by_op["select_blocks"]} == {"one_launch", "two_launch"}
