"""Every ``python -m`` entry point of the packages reports a usage error as ``ssvkit`` does: one
line on stderr naming the bad argument, exit code 2, no usage block, no traceback."""

from __future__ import annotations

import importlib

import pytest

MODULES = (
    "calibration.ceilings",
    "calibration.draft_host_fit",
    "calibration.intervals",
    "calibration.kernel_sweep",
    "calibration.sweep",
    "validation.adaptive_regime",
    "validation.adaptive_replay",
    "validation.batched_decode",
    "validation.controller_cost",
    "validation.dense_row_tile",
    "validation.draft_step",
    "validation.e2e_campaign",
    "validation.engine_op_sweep",
    "validation.engine_verify",
    "validation.h100_campaign",
    "validation.l2_flush",
    "validation.nsa_launches",
    "validation.nsa_profile",
    "validation.nsa_stages",
    "validation.nsa_tile_plans",
    "validation.planner_eval",
    "validation.profiler_teardown",
    "validation.readme",
    "validation.rescore",
    "validation.scale_campaign",
    "validation.shadow_sample",
    "validation.sparse_grouping",
    "validation.sparse_warps",
)


@pytest.mark.parametrize("name", MODULES)
def test_an_unknown_option_is_one_line_and_exit_2(name, capsys):
    module = importlib.import_module(f"ssvkit.{name}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--no-such-option"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err, err
    # the bad option, or first the required ones it lacks
    assert "--no-such-option" in err or "the following arguments are required" in err, err


def test_intervals_refuse_a_gpu_without_a_profile_in_one_line(capsys):
    from ssvkit.calibration import intervals

    for argv in (["--gpu", "nosuch", "--check"], ["--gpu", "nosuch"]):
        with pytest.raises(SystemExit) as exit_info:
            intervals.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no fitted profile for 'nosuch'" in err, err
