import numpy as np
import pytest

from ssvkit.cli import main
from sweep import plots
from sweep.grid import spec_from_doc
from sweep.runner import run_sweep

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
        "s-capacity.png",
        "s-heatmap-vs-ar_dense.png",
        "s-heatmap-vs-ar_sparse.png",
        "s-heatmap-vs-sd_dense.png",
        "s-heatmap-vs-sd_sparse_naive.png",
        "s-pareto.png",
        "s-roofline.png",
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
