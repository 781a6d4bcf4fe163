"""The selection paths benchmark's table from rows as it writes them, and its one-line refusals
(bad batches, contexts, top_n or warps; no GPU) that write nothing."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.validation import select_paths as sp


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--batches", "0"], "--batches 0"),
        (["--tokens", "-1"], "--tokens -1"),
        (["--top-n", "2"], "--top-n 2"),
        (["--contexts", "1000"], "--contexts 1000"),
        (["--warps", "3"], "--warps 3"),
        (["--rules", "window"], "--rules"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "s.json"
    assert_refused(sp.main, ["--out", str(out), *argv], says, capsys, out)


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(sp, ["--out", str(tmp_path / "s.json")], capsys, monkeypatch)


def launches(*us):
    return [dict(kernel=f"k{i}", side_stream=False, median_s=u * 1e-6) for i, u in enumerate(us)]


def test_table_marks_the_rule_warps_and_the_best_ratio(capsys):
    row = dict(
        method="mean",
        rule="relative",
        batch=16,
        context_len=131072,
        t=16,
        top_n=16,
        rule_warps=1,
        floor_s=32e-6,
        graph_s=dict(two_launch=60e-6, candidates={"1": 45e-6, "2": 48e-6}),
        launches=dict(two_launch=launches(42.0, 18.0), candidates=launches(41.5, 3.0)),
    )
    sp.print_table([row])
    out = capsys.readouterr().out.splitlines()
    assert "c1w" in out[0] and "c2w" in out[0]
    cells = out[1].split()
    assert cells[:8] == ["mean", "relative", "16", "131072", "16", "32.0", "60.0", "45.0*"]
    assert cells[8:] == ["48.0", "0.750", "42.0+18.0", "41.5+3.0"]


def test_rule_warps_follow_the_candidate_rule_and_its_fallback(monkeypatch):
    monkeypatch.setattr(sp, "candidate_warps", lambda rows, keys, device: (rows, keys))
    # 128K, batch 16, t 16, 32-block tiles of 4 a program: 17 ranges, 32 runs of 16 keys.
    got = sp.rule_warps(sp.Case("mean", 16, 131072, 16, "prefix", 16), sms=132)
    assert got == (16 * 8 * 16, 32 * 16)
    # top_n 64 keeps 64 candidates a range, wider than a 32-block tile: the two launches.
    assert sp.rule_warps(sp.Case("mean", 16, 131072, 16, "prefix", 64), sms=132) is None


@pytest.mark.gpu
def test_gpu_a_case_is_checked_and_timed():
    row = sp.run_case(sp.Case("quest", 2, 8192, 4, "relative", 16), [1, 4], 4e12)
    assert set(row["graph_s"]["candidates"]) == {"1", "4"}
    assert row["graph_s"]["two_launch"] > 0 and len(row["launches"]["candidates"]) >= 2
