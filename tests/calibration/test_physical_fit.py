"""The physical model's fit on committed rows: the plan it describes is the one the rows ran."""

import numpy as np
from ssvkit.calibration import ceilings
from ssvkit.calibration.physical_fit import fit_physical, predict_rows, row_work
from ssvkit.calibration.physical_sets import committed
from ssvkit.perfmodel.hardware import get_gpu


def test_dense_rows_record_the_plans_split_count():
    rows, _ = committed("h100-sxm")
    spec = get_gpu("h100-sxm", measured=False)
    dense = [r for r in rows if r["op"] == "dense_verify"]
    assert dense
    assert all(row_work(r, spec).num_splits == r["params"]["num_splits"] for r in dense)


def test_refit_is_deterministic_and_prices_the_other_gpu():
    rows, ceiling = committed("h100-sxm")
    spec = get_gpu("h100-sxm", measured=False)
    sub = rows[::4]
    bw, peak = ceiling["hbm_bytes_per_s"], ceiling["bf16_flops_per_s"]
    a, b = fit_physical(sub, bw, peak, spec), fit_physical(sub, bw, peak, spec)
    assert a == b
    pred = predict_rows(a, sub, bw, peak, spec)
    meas = np.array([r["median_s"] for r in sub])
    assert np.median(np.abs(pred / meas - 1)) < 0.25  # the model fits its own rows
    # the same constants price the H200's group sizes 3 and 6, which no H100 row has
    o_rows, o_ceiling = committed("h200")
    odd = [r for r in o_rows if r["params"]["group_size"] in (3, 6)]
    assert odd and not any(r["params"]["group_size"] in (3, 6) for r in rows)
    p = predict_rows(a, odd, o_ceiling["hbm_bytes_per_s"], o_ceiling["bf16_flops_per_s"], spec)
    assert np.all(np.isfinite(p)) and np.all(p > 0)


def test_committed_rows_are_the_ceilings_rows():
    rows, ceiling = committed("h100-sxm")
    assert ceiling == ceilings.derive("h100-sxm", ceilings.profile_rows("h100-sxm"))["ceilings"]
    assert {r["op"] for r in rows} == {"dense_verify", "sparse_verify"}
