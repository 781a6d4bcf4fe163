import io

import numpy as np
import pytest
from ssvkit.sweep import capacity_plots, plots
from ssvkit.sweep.grid import spec_from_doc
from ssvkit.sweep.runner import run_sweep

from ssvkit.cli import main, plot_cmd

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A sweep with a capacity table, written by the CLI."""
    folder = tmp_path_factory.mktemp("plots")
    argv = ["sweep", "--context", "2K,8K", "--batch", "1,4,16", "--acceptance", "0.6,0.8"]
    argv += ["--vary", "group_size=2,8", "--no-progress", "--workers", "1"]
    argv += ["--capacity-rates", "4", "--capacity-strategies", "ar_dense,sd_dense"]
    argv += ["--capacity-num-requests", "30", "--capacity-output-tokens", "32"]
    argv += ["--capacity-iterations", "2", "--out", str(folder / "s.csv")]
    assert main(argv) == 0
    return folder


def test_plot_writes_every_kind(saved, capsys):
    capsys.readouterr()
    assert main(["plot", str(saved / "s.csv")]) == 0
    out = capsys.readouterr().out
    names = sorted(p.name for p in saved.glob("*.png"))
    assert names == [
        "s-csv-capacity.png",
        "s-csv-heatmap-vs-ar_dense.png",
        "s-csv-heatmap-vs-ar_sparse.png",
        "s-csv-heatmap-vs-sd_dense.png",
        "s-csv-heatmap-vs-sd_sparse_naive.png",
        "s-csv-pareto.png",
        "s-csv-roofline.png",
    ]
    for n in names:
        assert (saved / n).read_bytes().startswith(PNG) and f"wrote {saved / n}" in out


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--kind", "bars"], "--kind 'bars': choose from heatmap, pareto, roofline, capacity"),
        (["--model", "qwen3-8b"], "model 'qwen3-8b' is not in the sweep (has llama-3.1-8b)"),
        (["--batch", "3"], "batch 3 is not in the sweep (has 1, 4, 16)"),
        (["--baselines", "ssv"], "baseline 'ssv' is not in the sweep"),
        (["--kind", "heatmap", "--strategies", "nope"], "strategy 'nope' is not in the selection"),
        (["--capacity", "none.csv"], "no capacity table 'none.csv'"),
    ],
)
def test_bad_plot_options_write_nothing(saved, tmp_path, capsys, extra, needle):
    assert main(["plot", str(saved / "s.csv"), "--out-dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ssvkit plot: error: ") and needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_not_a_sweep_table(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["plot", str(bad)]) == 2
    assert "is not a sweep table (no 'strategy' column)" in capsys.readouterr().err


def test_pareto_front_hand_computed():
    lat = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 0.5])
    thr = np.array([10.0, 30.0, 20.0, 25.0, 40.0, 5.0])
    # by latency: (0.5, 5) (1, 10) (2, 30) [2, 20 dominated] [3, 25 dominated] (4, 40)
    assert plots.pareto_front(lat, thr).tolist() == [5, 0, 1, 4]


def test_speedup_over_an_sd_baseline_is_a_ratio_at_the_same_cell():
    t = run_sweep(
        spec_from_doc({"context_len": ["4K", "16K"], "acceptance": [0.6, 0.9], "batch": [1, 2]}),
        workers=1,
    ).table
    mask, pinned = plots.select(t, {"batch": 2}, ("context_len", "acceptance"))
    assert pinned["batch"] == 2 and mask.sum() == 5 * 4
    speed = plots._speedup_over(t, mask, "sd_dense")
    for i in np.flatnonzero(mask):
        ref = mask & (t["strategy"] == "sd_dense") & (t["context_len"] == t["context_len"][i])
        ref &= t["acceptance"] == t["acceptance"][i]
        assert speed[i] == pytest.approx(t["tokens_per_s"][i] / t["tokens_per_s"][ref][0])
    assert np.isnan(speed[~mask]).all()
    grid, ctxs, accs = plots._pivot(t, mask, "ssv", speed)
    assert grid.shape == (2, 2) and ctxs == [4096, 16384] and accs == [0.6, 0.9]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One small sweep saved as CSV and as Parquet under one stem, in folder ``a``."""
    folder = tmp_path_factory.mktemp("small") / "a"
    folder.mkdir()
    argv = ["sweep", "--context", "8K", "--strategies", "ar_dense,sd_dense", "--workers", "1"]
    argv += ["--no-progress"]
    assert main([*argv, "--out", str(folder / "run.csv")]) == 0
    pytest.importorskip("pyarrow")
    assert main([*argv, "--out", str(folder / "run.parquet")]) == 0
    return folder


def _pngs(folder):
    return sorted(p.name for p in folder.glob("*.png"))


def test_sweeps_sharing_a_stem_get_png_names_of_their_own(small, tmp_path, capsys):
    for name in ("run.csv", "run.parquet"):
        assert main(["plot", str(small / name), "--kind", "pareto"]) == 0
    assert _pngs(small) == ["run-csv-pareto.png", "run-parquet-pareto.png"]
    other = tmp_path / "b"
    other.mkdir()
    (other / "run.csv").write_bytes((small / "run.csv").read_bytes())
    out = tmp_path / "figs"
    out.mkdir()
    for sweep in (small / "run.csv", other / "run.csv", small / "run.parquet"):
        assert main(["plot", str(sweep), "--kind", "pareto", "--out-dir", str(out)]) == 0
    assert _pngs(out) == [
        "a-run-csv-pareto.png",
        "a-run-parquet-pareto.png",
        "b-run-csv-pareto.png",
    ]
    assert plot_cmd.png_source(out / "b-run-csv-pareto.png") == str((other / "run.csv").resolve())


def test_a_png_of_another_sweep_is_not_overwritten(small, tmp_path, capsys):
    out = tmp_path / "figs"
    out.mkdir()
    twin = tmp_path / "x" / "a"
    twin.mkdir(parents=True)
    (twin / "run.csv").write_bytes((small / "run.csv").read_bytes())
    argv = ["--kind", "pareto", "--out-dir", str(out)]
    assert main(["plot", str(small / "run.csv"), *argv]) == 0
    before = (out / "a-run-csv-pareto.png").read_bytes()
    assert main(["plot", str(small / "run.csv"), *argv]) == 0  # the same sweep: redrawn
    capsys.readouterr()
    assert main(["plot", str(twin / "run.csv"), *argv]) == 2
    err = capsys.readouterr().err
    assert f"holds a plot of {str((small / 'run.csv').resolve())!r}" in err, err
    assert (out / "a-run-csv-pareto.png").read_bytes() == before
    (out / "mine.png").write_bytes(b"not a plot")
    assert plot_cmd.png_source(out / "mine.png") is None


def test_png_source_chunk_keeps_a_valid_png(tmp_path):
    from matplotlib.image import imread

    png = plots.pareto(run_sweep(spec_from_doc({"context_len": ["4K"]}), workers=1).table, {})
    tagged = plot_cmd.with_source(png, "/data/é sweep.csv")
    (tmp_path / "t.png").write_bytes(tagged)
    assert tagged.startswith(PNG) and len(tagged) > len(png)
    assert imread(tmp_path / "t.png").shape == imread(io.BytesIO(png)).shape  # CRCs check out
    assert plot_cmd.png_source(tmp_path / "t.png") == "/data/é sweep.csv"


def _cap(rows):
    """A capacity table of (strategy, tp, context, r*, sized rate, GPUs) rows."""
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    table = {
        "strategy": np.array(cols[0], dtype=object),
        "tp": np.array(cols[1]),
        "context_len": np.array(cols[2]),
        "replica_requests_per_s": np.array(cols[3], dtype=float),
        "requests_per_s": np.array(cols[4], dtype=float),
        "gpus_needed": np.array(cols[5], dtype=float),
        "status": np.array(["slo_bound"] * n, dtype=object),
        "slo_ttft_s": np.full(n, 2.0),
        "slo_tpot_s": np.full(n, 0.05),
        "attainment": np.full(n, 0.9),
    }
    for axis, v in (("model", "m"), ("gpu", "g"), ("acceptance", 0.7), ("overlap", 0.75)):
        table[axis] = np.array([v] * n, dtype=object if isinstance(v, str) else float)
    table["kv_bytes"] = np.full(n, 2)
    return table


def test_capacity_series_share_a_line_only_when_their_curves_coincide():
    cap = _cap(
        [
            ("a", 1, 8192, 4.5, 4.0, 1),
            ("b", 1, 8192, 5.0, 4.0, 1),  # ceil(R / 4.5) == ceil(R / 5) == 1 for every R <= 4
            ("c", 1, 8192, 1.5, 4.0, 3),
            ("d", 2, 8192, 0.0, 4.0, 0),
        ]
    )
    rates = np.linspace(0.01, 4.0, 400)
    series = capacity_plots.capacity_series(cap, np.ones(4, dtype=bool), rates)
    assert [e["keys"] for e in series] == [[("a", 1), ("b", 1)], [("c", 1)], [("d", 2)]]
    assert series[2]["gpus"] is None
    labels = [capacity_plots._series_label(e) for e in series]
    assert labels[0] == "a tp=1 = b tp=1: identical here (r*=4.5/5/s; 1 GPUs)"
    assert labels[1] == "c tp=1 (r*=1.5/s; 3 GPUs)" and labels[2] == "d tp=2: slo_bound"
    wide = capacity_plots.capacity_series(cap, np.ones(4, dtype=bool), np.linspace(0.01, 8.0, 800))
    assert [e["keys"] for e in wide][:2] == [[("a", 1)], [("b", 1)]]  # 2 vs 1 GPUs at R=4.8
    assert capacity_plots.capacity(cap, {}).startswith(PNG)


def test_long_titles_wrap_inside_the_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.8, 4.2), layout="constrained")
    fig.add_subplot()
    pinned = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "acceptance": 0.6, "overlap": 0.75}
    plots.wrapped_suptitle(
        fig, "capacity (TTFT <= 2 s, TPOT <= 50 ms for 90% of requests)", str(pinned)
    )
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = fig._suptitle.get_window_extent(renderer)
    assert fig._suptitle.get_text().count("\n") >= 2
    assert 0 <= box.x0 and box.x1 <= fig.bbox.x1
