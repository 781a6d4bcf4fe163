"""The fused element-wise kernels' op rows, end to end on the CPU: the sweep group
(``validation.fused_op_sweep.fused_ops``) checks each kernel against its fp32 reference and
names its rows as the step model's fused classes with the bytes the step model counts; the fit
(``calibration.fit``) makes those classes from such rows; a profile with them prices the fused
path itself, no stand-in."""

import pytest
import torch
from ssvkit.calibration.fit import fit_profile, op_class
from ssvkit.calibration.sweep import TOKENS
from ssvkit.perfmodel.calibrated import CalibratedPredictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.ops import FUSED_CLASSES
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import Strategy, Workload
from ssvkit.validation import fused_op_sweep as sweep

TINY = ModelSpec(
    name="tiny",
    family="llama",
    num_layers=2,
    hidden_size=256,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=256,
)
BW, T0 = 3.0e12, 2.0e-6  # the synthetic rows' law: T0 + bytes / BW


class Recorder:
    """The runner's interface as the sweep group uses it: records each config, times nothing."""

    resident = False

    def __init__(self):
        self.configs = []

    def rotations(self, working_set_bytes):
        return 1

    def time_op(self, op, params, fn, *, num_inputs, unique_bytes, flops):
        self.configs.append((op, params, unique_bytes, flops))


@pytest.fixture(scope="module")
def configs():
    rec = Recorder()
    sweep.fused_ops(rec, {"tiny": TINY}, device="cpu")
    return rec.configs


def test_the_fused_group_checks_and_names_its_rows(configs):
    """One row per (m, shape) and op: the kernel's class names, ``impl: fused`` (the embedding
    gather is the engine's torch call)."""
    ops = [c[0] for c in configs]
    assert set(ops) == set(FUSED_CLASSES)
    assert all(ops.count(op) == len(TOKENS) for op in FUSED_CLASSES)  # one shape each
    for op, params, _, _ in configs:
        assert params["impl"] == ("engine" if op == "embed" else "fused")
    norm = next(p for op, p, _, _ in configs if op == "add_rms_norm" and p["m"] == 1)
    silu = next(p for op, p, _, _ in configs if op == "silu_mul_fused" and p["m"] == 1)
    row = {"params": norm, "op": "add_rms_norm"}
    assert op_class(row) == "add_rms_norm/d256"  # per width, like torch's norm
    assert op_class({"params": silu, "op": "silu_mul_fused"}) == "silu_mul_fused"  # no m1 split


def test_the_check_refuses_a_kernel_that_is_wrong(monkeypatch):
    def wrong(gate_up):
        return torch.zeros(gate_up.shape[:-1] + (gate_up.shape[-1] // 2,), dtype=gate_up.dtype)

    monkeypatch.setattr(sweep.layer_ops, "silu_mul", wrong)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="fused sweep check: silu_mul differs"):
        sweep.check_fused(gen, "cpu", torch.float32)


def _rows(configs):
    return [
        {
            "op": op,
            "params": params,
            "median_s": T0 + nbytes / BW,
            "timing": "graph",
            "unique_bytes": nbytes,
            "flops": flops,
            "device_name": "NVIDIA H200",
            "timestamp": "2026-12-01T00:00:00+00:00",
            "git_commit": "0" * 40,
        }
        for op, params, nbytes, flops in configs
    ]


def test_their_rows_fit_classes_that_price_the_fused_path_itself(configs):
    """Fitted on the rows, every fused class holds out within 5 %; the profile prices the step
    model's fused ops with them (no stand-in), at the synthetic law for the bytes the step model
    counts: the sweep's bytes and the step model's agree."""
    ceil = {"hbm_bytes_per_s": BW, "bf16_flops_per_s": 1e15}
    doc, _ = fit_profile(_rows(configs), "h200", ceil)
    names = {"add_rms_norm/d256", "rope_kv_write", "silu_mul_fused", "embed"}
    assert set(doc["classes"]) == names
    for name in names:
        assert doc["classes"][name]["error"]["heldout"]["median_ape"] < 0.05, name
    profile = Profile.from_json(doc, "h200")
    c = build_columns(TINY, [(Strategy.from_name("sd_dense", tree="chain:3"), Workload())])
    pred = predict_columns(TINY, c, CalibratedPredictor(get_gpu("h200"), profile, tp=c.tp))
    assert not pred.stand_in[0] and pred.stand_ins == {}
    for key in ("add_rms_norm", "rope_kv_write", "silu_mul", "embed"):
        op = pred.ops[f"verify.{key}"]
        calls = float(op.calls[0])
        law = calls * (T0 + float(op.bytes[0]) / calls / BW)
        assert float(pred.op_seconds[f"verify.{key}"][0]) == pytest.approx(law, rel=0.05), key


def test_the_summary_shows_the_llama_shapes_rows():
    row = {
        "op": "add_rms_norm",
        "params": {"m": 16, "d": 4096, "dtype": "bfloat16", "impl": "fused"},
        "median_s": 2.5e-6,
    }
    other = {**row, "params": {**row["params"], "d": 8192}, "median_s": 9e-6}
    lines = sweep.fused_summary([row, other]).splitlines()
    norm = next(line for line in lines if line.startswith("add_rms_norm"))
    assert norm.split()[1:] == ["-", "2.50", "-", "-"]  # m = 1, 16, 128, 512
    assert next(line for line in lines if line.startswith("embed")).split()[1:] == ["-"] * 4
