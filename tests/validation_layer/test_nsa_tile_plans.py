"""The tile-plan benchmark's correctness check, run in the CPU interpreter on a small case: both
plans' calls as the benchmark makes them, so a call the check cannot make fails here rather
than on the GPU machine."""

import pytest
from ssvkit.kernels.nsa_verify import NsaVerifyConfig
from ssvkit.validation import nsa_stages as ns
from ssvkit.validation import nsa_tile_plans as ntp


def _case(knob: str, rows_per_tile: int):
    """The check's small case: input sets, both values' configs and the label. 256 keys: 15
    compressed tokens, the refresh picks 4 of 8 blocks, the window covers a quarter."""
    sets = ns.input_sets(1, 4, 256, 260, 1)
    field, values, _ = ntp.KNOBS[knob]
    configs = {p: NsaVerifyConfig(rows_per_tile=rows_per_tile, **{field: p}) for p in values}
    return sets, configs, f"b1 t4 256 r{rows_per_tile}"


@pytest.mark.parametrize(
    ("knob", "rows_per_tile"),
    [("tile_plan", 0), ("fit_slots", 4), ("context_tiles", 1), ("paired", 4), ("score_map", 0)],
)
def test_the_check_passes_on_both_values(small_nsa, knob, rows_per_tile):
    ntp.check(*_case(knob, rows_per_tile))


def test_the_check_passes_on_a_tile_padded_to_64_rows(small_nsa):
    """Eight draft rows of the tiny geometry's group of 4: a 32-row tile, padded to 64 rows
    under ``warpgroup_rows_from`` 17, checked against the unpadded tile's calls."""
    from ssvkit.kernels.nsa_launch import tile_packing

    field, values, schedules = ntp.KNOBS["warpgroup_rows"]
    configs = {p: NsaVerifyConfig(rows_per_tile=0, **{field: p}) for p in values}
    assert schedules == (0,)
    assert [tile_packing(8, 4, c, 16)[2] for c in configs.values()] == [32, 64]
    ntp.check(ns.input_sets(1, 8, 256, 264, 1), configs, "b1 t8 256 r0")


def test_the_check_catches_a_wrong_output(small_nsa, monkeypatch):
    sets, configs, label = _case("paired", 4)
    field, values, _ = ntp.KNOBS["paired"]
    real = ntp._call

    def off_by_one(name, s, unions, config, i):
        out = real(name, s, unions, config, i)
        return (out[0] + 1, *out[1:]) if getattr(config, field) == values[1] else out

    monkeypatch.setattr(ntp, "_call", off_by_one)
    with pytest.raises(AssertionError, match=f"{label} reuse"):
        ntp.check(sets, configs, label)


def test_a_stopped_resume_keeps_every_cached_case_and_is_incomplete(tmp_path, monkeypatch):
    from ssvkit.validation.bench import RunCache

    cache = RunCache(tmp_path / "c.jsonl", {"s": 1})
    todo = [(1, 1, 32768), (1, 1, 131072), (4, 1, 131072)]
    for key in ("b1-t1-131072", "b4-t1-131072"):
        cache.get(key, lambda key=key: {"key": key})
    monkeypatch.setattr(ntp, "run_case", lambda *a: pytest.fail("measured past the stop"))
    rows, complete = ntp.measure(todo, cache, stop_at=0.0)
    assert [r["key"] for r in rows] == ["b1-t1-131072", "b4-t1-131072"] and not complete
    rows, complete = ntp.measure(todo[1:], cache, stop_at=0.0)
    assert len(rows) == 2 and complete


def test_the_tables_print_a_knob_that_times_the_refresh_calls_only(capsys):
    assert ntp.knob_calls("score_map") == ("refresh", "refresh_unfused")
    assert ntp.knob_calls("paired") == ntp.CALLS
    times = {
        f"r{r}_{p}_{n}": 2e-5 if p == "matrix" else 1e-5
        for r in (0, 1, 4)
        for p in ("matrix", "band")
        for n in ("refresh", "refresh_unfused")
    }
    row = dict(batch=1, num_query_tokens=16, context_len=131072, floor_s=1e-5, times_s=times)
    ntp.print_row(row, "score_map")
    ntp.print_summary([row], "score_map")
    out = capsys.readouterr().out
    assert "reuse" not in out.splitlines()[0] and "refresh    20.0/   10.0 us" in out
    assert "    - /     -" in out and "  2.0 /   1.0" in out


def test_the_summary_of_a_knob_of_the_unfused_calls_shows_those_calls(capsys):
    assert ntp.knob_calls("branch_streams") == ("reuse_unfused", "refresh_unfused")
    times = {
        f"r{r}_{p}_{n}": 3e-5 if p is False else 2e-5
        for r in (0, 1, 4)
        for p in (False, True)
        for n in ntp.knob_calls("branch_streams")
    }
    row = dict(batch=1, num_query_tokens=1, context_len=131072, floor_s=1e-5, times_s=times)
    ntp.print_summary([row], "branch_streams")
    head, *lines = capsys.readouterr().out.strip().splitlines()
    assert "reuse_unfused False/True" in head and "refresh_unfused False/True" in head
    assert len(lines) == 3 and all("  3.0 /   2.0" in x and "-" not in x for x in lines)
