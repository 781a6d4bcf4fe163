import math

import numpy as np
import pytest
from ssvkit.sweep.capacity import LOW_LOAD_FRACTION, _serve, capacity_table, capacity_tasks, search
from ssvkit.sweep.grid import spec_from_doc
from ssvkit.sweep.runner import run_sweep

# Short prompts and few requests keep each serving run to a few hundredths of a second.
CAP = {"num_requests": 40, "output_tokens": 64, "iterations": 4}


def _spec(**capacity):
    return spec_from_doc(
        {
            "context_len": ["2K"],
            "strategies": ["ar_dense", "sd_dense"],
            "capacity": {**CAP, "rates": [3, 40], **capacity},
        }
    )


@pytest.fixture(scope="module")
def sized():
    return run_sweep(_spec(slo_ttft_s=0.5, slo_tpot_s=0.02), workers=1)


def test_rate_search_brackets_the_slo(sized):
    spec = sized.spec
    tasks = capacity_tasks(spec)
    assert len(tasks) == 2
    cap = sized.capacity
    for t in tasks:
        i = np.flatnonzero(cap["strategy"] == t.strategy.label)[0]
        rstar, mu = cap["replica_requests_per_s"][i], cap["replica_saturation_requests_per_s"][i]
        assert 0 < rstar <= mu
        assert cap["status"][i] in ("slo_bound", "throughput_bound")
        assert cap["simulations"][i] == (2 if cap["status"][i] == "throughput_bound" else 7)
        figs = _serve(t, rstar)
        assert figs["slo_met"]["value"] / t.spec.num_requests >= t.spec.attainment
        if cap["status"][i] == "slo_bound":
            # The bracket [r*, hi] shrinks to a ratio 64^(1/2^iterations); hi fails the SLO.
            hi = rstar * LOW_LOAD_FRACTION ** (-(0.5**t.spec.iterations))
            for rate in (hi, mu):
                figs = _serve(t, rate)
                assert figs["slo_met"]["value"] / t.spec.num_requests < t.spec.attainment
        assert cap["provenance"][i].startswith("sim:serve:seed=0;costs:")


def test_gpus_needed_and_best(sized):
    cap = sized.capacity
    assert len(cap["model"]) == 4  # 2 strategies x 2 rates
    for i in range(4):
        rstar = cap["replica_requests_per_s"][i]
        assert cap["gpus_needed"][i] == math.ceil(cap["requests_per_s"][i] / rstar) * cap["tp"][i]
    for rate in (3.0, 40.0):
        rows = np.flatnonzero(cap["requests_per_s"] == rate)
        best = rows[cap["best"][rows]]
        assert len(best) == 1
        assert cap["gpus_needed"][best[0]] == cap["gpus_needed"][rows].min()


def test_unattainable_and_unfit_cells():
    spec = spec_from_doc(
        {
            "context_len": ["2K", "1M"],
            "strategies": ["ar_dense"],
            "capacity": {**CAP, "rates": [1], "slo_tpot_s": 1e-5},
        }
    )
    tasks = capacity_tasks(spec)
    results = [search(t) for t in tasks]
    assert [r["status"] for r in results] == ["slo_unattainable", "does_not_fit"]
    assert results[0]["simulations"] == 3 and results[1]["simulations"] == 0
    table = capacity_table(tasks, results)
    assert np.isnan(table["gpus_needed"]).all() and not table["best"].any()


def test_capacity_grid_is_bounded():
    with pytest.raises(ValueError, match=r"covers 10 \(cell, strategy\) pairs.*max_cells=4"):
        capacity_tasks(
            spec_from_doc({"context_len": ["2K", "4K"], "capacity": {"rates": [1], "max_cells": 4}})
        )
