"""The test design of ``kernel_sweep --grid unseen``: calls no calibration row times."""

from ssvkit.calibration import kernel_design as kd
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import unseen_design as ud
from ssvkit.calibration.kernel_sweep import parse_args
from ssvkit.perfmodel.rows import row_key


def _keys(configs):
    return {row_key(v.op, "graph", v.params) for c in configs for v in c.variants}


def test_no_unseen_row_is_a_design_row():
    unseen = ud.unseen_configs()
    assert unseen
    assert not _keys(unseen) & _keys(kd.design_configs())


def test_unseen_geometries_are_outside_the_design():
    design = {ki.GEOMETRIES[g] for g in kd.GEOMETRIES}
    for cfg in ud.unseen_configs():
        assert cfg.geometry in ud.GEOMETRIES
        assert ki.GEOMETRIES[cfg.geometry] not in design
    assert {c.geometry for c in ud.unseen_configs()} == set(ud.GEOMETRIES)


def test_every_step_of_the_design_has_calls_within_the_cache_limit():
    configs = ud.unseen_configs()
    assert {c.step for c in configs} == set(ud.STEPS)
    for c in configs:
        heads = ki.GEOMETRIES[c.geometry][1]
        assert c.common["batch"] * heads * c.common["context_len"] <= kd.MAX_CACHE_TOKENS


def test_the_design_is_seeded():
    a, b = ud.unseen_configs(seed=0), ud.unseen_configs(seed=0)
    assert [c.name for c in a] == [c.name for c in b]
    assert [c.name for c in a] != [c.name for c in ud.unseen_configs(seed=1)]


def test_the_sweep_takes_the_unseen_grid(tmp_path):
    opts = parse_args(["--out", str(tmp_path), "--grid", "unseen", "--ops", "dense,select"])
    assert {c.step for c in opts.configs()} == {"dense", "select"}
