"""Which profile prices a GPU: its own, one transferred from its architecture (evaluated with the
target's ceilings), another architecture's only when asked, the bare roofline on request."""

import numpy as np
import pytest
from ssvkit.perfmodel import profiles
from ssvkit.perfmodel.calibrated import CalibratedPredictor, make_predictor
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.predictor import Op, RooflinePredictor
from ssvkit.perfmodel.profiles import nearest_profile_gpu, shipped_profile, transfer

SOURCE = shipped_profile("h100-sxm")
PID = SOURCE.profile_id


# These tests price the H200 by transfer (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("h200_without_a_profile")


@pytest.mark.parametrize(
    ("gpu", "label"),
    [
        ("h100-sxm", f"calibrated:{PID}"),
        ("h200", f"transferred:{PID}->h200"),
        ("h100-pcie", f"transferred:{PID}->h100-pcie"),
    ],
)
def test_labels_of_profiled_and_transferred_gpus(gpu, label):
    pred = make_predictor(get_gpu(gpu))
    assert isinstance(pred, CalibratedPredictor) and pred.provenance == label
    assert pred.at(np.array([0])).provenance == label  # per-point copies keep the label


def test_another_architecture_is_refused_then_accepted_with_the_opt_in():
    with pytest.raises(ValueError) as e:
        make_predictor(get_gpu("a100-80g"))
    msg = str(e.value)
    assert "\n" not in msg and "a100-80g" in msg and "ampere" in msg
    assert "hopper (h100-sxm)" in msg and "--roofline" in msg
    pred = make_predictor(get_gpu("a100-80g", any_architecture=True))
    assert pred.provenance == f"transferred-cross-arch:{PID}->a100-80g"


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "a100-80g"])
def test_roofline_is_the_bare_datasheet_roofline_even_with_a_profile(gpu):
    pred = make_predictor(get_gpu(gpu, measured=False))
    assert type(pred) is RooflinePredictor and pred.provenance == "datasheet"
    assert pred.gpu.hbm_bytes_per_s == get_gpu(gpu, measured=False).hbm_bytes_per_s


def test_transfer_refuses_a_profile_of_another_architecture_naming_both():
    with pytest.raises(ValueError, match=r"h100-sxm \(hopper\), not a100-80g \(ampere\)"):
        transfer(SOURCE, get_gpu("a100-80g"))


def _gemm(nbytes, flops, depth):
    one = np.array([1.0])
    return Op("gemm", flops * one, nbytes * one, one, kernel="gemm", depth=depth * one)


def test_transferred_gemm_is_the_source_fit_on_the_target_ceilings():
    """A 1 GB GEMM call, evaluated by hand: t0 + max(t_k K, memory, flops / (e_c PEAK)) with
    the H100 SXM's fitted gemm class and the H200's ceilings (measured, committed), where the
    memory term at the source, bytes / (e_b BW0), splits into the bytes at the source's copy
    rate, which follow the target's copy rate, and the rest, which follows its GEMM rate."""
    nbytes, flops, depth = 1e9, 1e11, 4096
    h200 = get_gpu("h200")
    c = SOURCE.classes["gemm"]
    eb = np.interp(np.log10(nbytes), c.bytes_knots, c.bytes_eff)
    ef = np.interp(np.log10(flops), c.flops_knots, c.flops_eff)
    bw, peak = h200.hbm_bytes_per_s, h200.bf16_flops_per_s
    bw0, peak0 = SOURCE.copy_bytes_per_s, SOURCE.gemm_flops_per_s
    assert h200.provenance.startswith("calibrated:h200-ceilings")
    at_source = nbytes / (eb * bw0)
    hbm = min(nbytes / bw0, at_source)
    memory = hbm * bw0 / bw + (at_source - hbm) * peak0 / peak
    want = c.t0_s + max(c.t_depth_s * depth, memory, flops / (ef * peak))
    got = make_predictor(h200).op_time_s(_gemm(nbytes, flops, depth))
    assert got[0] == pytest.approx(want, rel=1e-12)
    # Memory-bound under the copy rate: the source's own time is the whole term at its rates.
    own = make_predictor(get_gpu("h100-sxm")).op_time_s(_gemm(nbytes, flops, depth))
    assert memory > flops / (ef * peak) and eb < 1
    assert own[0] - c.t0_s == pytest.approx(at_source, rel=1e-12)


def test_measured_ceilings_of_the_target_replace_its_datasheet():
    h200 = get_gpu("h200").with_measured(
        {"profile_id": "h200-test", "ceilings": {"hbm_bytes_per_s": 4.2e12}}
    )
    pred = make_predictor(h200)
    assert pred.profile.copy_bytes_per_s == 4.2e12
    assert pred.profile.gemm_flops_per_s == h200.bf16_flops_per_s
    assert pred.provenance == f"transferred:{PID}->h200"


def test_a_transfer_outside_the_measured_range_is_flagged_extrapolated():
    pred = make_predictor(get_gpu("h200"))
    top = 10 ** SOURCE.classes["gemm"].bytes_range[1]
    both = Op(
        "gemm",
        np.array([1e9, 1e9]),
        np.array([1e8, 100 * top]),
        np.ones(2),
        kernel="gemm",
        depth=np.full(2, 64.0),
    )
    pred.op_time_s(both)
    assert pred.outside.tolist() == [False, True]


def test_nearest_profile_is_the_closest_copy_bandwidth_of_the_architecture(monkeypatch):
    monkeypatch.setattr(profiles, "profile_gpus", lambda: ["h200", "h100-sxm"])
    # 2.0 TB/s is closer to the H100 SXM's 3.35 than to the H200's 4.8 (as a ratio).
    assert nearest_profile_gpu(get_gpu("h100-pcie")) == "h100-sxm"
    # Only with the opt-in does another architecture's nearest profile count.
    assert nearest_profile_gpu(get_gpu("b200", any_architecture=True)) == "h200"
    with pytest.raises(ValueError, match="hopper \\(h200\\), hopper \\(h100-sxm\\)"):
        nearest_profile_gpu(get_gpu("b200"))
