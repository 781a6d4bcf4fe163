import pytest
from ssvkit.perfmodel.baselines import compare
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import BASELINES, Workload

from ssvkit.cli import predict_plot as pp

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}


@pytest.fixture(scope="module")
def rows():
    strategies = [BASELINES[b] for b in ("ar_dense", "sd_dense", "ssv")]
    return compare(
        get_model("llama-3.1-8b"),
        get_gpu("h100-sxm"),
        strategies,
        [8192, 32768],
        Workload(context_len=8192),
    )


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_each_format_is_rendered_in_that_format(rows, fmt):
    data = pp.predict_plot(rows, get_gpu("h100-sxm"), "bf16", fmt)
    assert data.startswith(MAGIC[fmt])
    assert data == pp.predict_plot(rows, get_gpu("h100-sxm"), "bf16", fmt)  # no timestamp
    if fmt == "svg":
        assert b"<svg" in data[:1000] and b"speedup over ar_dense" in data


def test_png_is_the_default_and_other_formats_are_refused(rows):
    assert pp.predict_plot(rows, get_gpu("h100-sxm"), "bf16").startswith(MAGIC["png"])
    with pytest.raises(ValueError, match="plot format 'jpg': choose from png, pdf, svg"):
        pp.predict_plot(rows, get_gpu("h100-sxm"), "bf16", "jpg")


def test_roofline_panel_names_every_strategy_and_every_op(rows):
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    pp._roofline_panel(ax, rows, get_gpu("h100-sxm"), "bf16", pp._style(rows))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("roofline: ") and labels[1:] == ["ar_dense", "sd_dense", "ssv"]
    key = ax.texts[-1].get_text()
    ops = {p[1] for p in pp._op_points(rows, 32768)}
    assert all(op in key for op in ops) and "lm_head" in ops
    numbers = [t.get_text() for t in ax.texts[:-1]]
    assert numbers == [str(i) for i in range(1, len(numbers) + 1)]


def test_clusters_join_points_closer_than_the_threshold():
    # On a 1 x 1 inch axes spanning 1..100 both ways, a decade is half an inch.
    pts = [("s", "a", 1.0, 1.0), ("s", "b", 1.1, 1.0), ("s", "c", 10.0, 10.0), ("t", "d", 1.2, 1.0)]
    groups = pp.clusters(pts, (1.0, 1.0), ((1.0, 100.0), (1.0, 100.0)), min_in=0.05)
    assert [[p[1] for p in g] for g in groups] == [["a", "b", "d"], ["c"]]
    apart = pp.clusters(pts, (1.0, 1.0), ((1.0, 100.0), (1.0, 100.0)), min_in=0.01)
    assert [[p[1] for p in g] for g in apart] == [["a"], ["b"], ["d"], ["c"]]
