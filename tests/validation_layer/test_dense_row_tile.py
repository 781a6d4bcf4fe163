"""The row-tile benchmark's widths, the tiles its two rules build, its table, and its refusal
without a GPU, which writes nothing."""

from cli_refusals import assert_needs_gpu
from ssvkit.perfmodel.attention_plan import dense_row_tiles
from ssvkit.validation import dense_row_tile as rt


def test_widths_cover_17_to_32_packed_rows_then_one_control():
    assert rt.widths(4) == [5, 6, 7, 8, 9]
    assert rt.widths(16) == [2, 3]
    assert rt.widths(5) == [4, 5, 6, 7]


def test_the_two_rules_differ_exactly_inside_17_to_32_rows():
    for t in range(1, 20):
        tiles = {r: dense_row_tiles(t, 32, 8, 128, cfg)[0] for r, cfg in rt.RULES.items()}
        inside = 17 <= 4 * t <= 32
        assert (tiles["wgmma"] == 64 and tiles["mma_sync"] == 32) == inside, (t, tiles)
        assert (tiles["wgmma"] == tiles["mma_sync"]) != inside, (t, tiles)


def test_table_splits_controls_and_reports_ratio_and_floor():
    def row(t, rows, new, old):
        return dict(
            geometry="llama-3.1-8b", batch=1, packed_rows=rows, num_query_tokens=t,
            wgmma_s=new, mma_sync_s=old, floor_s=1e-5,
        )  # fmt: skip

    rows = [row(5, 20, 2e-5, 2.5e-5), row(8, 32, 3e-5, 3e-5), row(9, 36, 4e-5, 4.4e-5)]
    lines = rt.table(rows).splitlines()
    assert lines[2] == "| llama-3.1-8b | 1 | 20/32 | 2 | 0.900 | 0.800-1.000 | 2.00-3.00 |"
    assert lines[3] == "| llama-3.1-8b | 1 | 36 (control) | 1 | 0.909 | 0.909-0.909 | 4.00-4.00 |"


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(rt, ["--out", str(tmp_path / "t.json")], capsys, monkeypatch)


def test_every_committed_run_backs_the_default_rule():
    """Where a committed run timed both tiles, the default rule builds the faster one: per
    geometry and batch, the median ratio of the 64-row tile's time to the 32-row one's is at
    most 1 at 17-32 rows, and the controls (one tile either way) agree within 2%."""
    import json

    import numpy as np
    from ssvkit.perfmodel.attention_plan import DEFAULT_DENSE_CONFIG
    from ssvkit.validation.records import data_dir

    runs = sorted(data_dir().glob("dense-row-tile-*.json"))
    assert runs
    for path in runs:
        rows = json.loads(path.read_text())["rows"]
        groups = {}
        for r in rows:
            tile = dense_row_tiles(
                r["num_query_tokens"], r["num_q_heads"], r["num_kv_heads"], r["head_dim"],
                DEFAULT_DENSE_CONFIG,
            )[0]  # fmt: skip
            assert tile == r["block_m_wgmma"], (path.name, r)
            key = (r["geometry"], r["batch"], r["packed_rows"] > 32)
            groups.setdefault(key, []).append(r["wgmma_s"] / r["mma_sync_s"])
        for (geometry, batch, control), ratios in groups.items():
            if control:
                assert np.all(np.abs(np.array(ratios) - 1) <= 0.02), (path.name, geometry, batch)
            else:
                assert np.median(ratios) <= 1.0, (path.name, geometry, batch, ratios)
