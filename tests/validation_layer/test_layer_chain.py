"""The layer-chain benchmark's shapes and table from rows as it writes them, and its one-line
refusals (rows past the streaming kernel's, an unknown or MoE model, no GPU) that write
nothing."""

import pytest
from cli_refusals import assert_needs_gpu, assert_refused
from ssvkit.perfmodel.models import get_model
from ssvkit.validation import layer_chain as lc


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--rows", "33"], "--rows 33"),
        (["--rows", "0"], "--rows 0"),
        (["--model", "nope"], "--model 'nope'"),
        (["--model", "qwen3-30b-a3b"], "no dense"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "c.json"
    assert_refused(lc.main, ["--out", str(out), *argv], says, capsys, out)


def test_no_gpu_is_refused(tmp_path, capsys, monkeypatch):
    assert_needs_gpu(lc, ["--out", str(tmp_path / "c.json")], capsys, monkeypatch)


def test_layer_shapes_are_the_models_projections():
    shapes = lc.layer_shapes(get_model("llama-3.1-8b"))
    assert shapes == {
        "qkv_proj": (6144, 4096),
        "o_proj": (4096, 4096),
        "gate_up_proj": (28672, 4096),
        "down_proj": (4096, 14336),
    }


def test_table_lists_each_projection_both_ways_and_the_layer(capsys):
    names = [*lc.PROJECTIONS, "layer", "add_rms_norm", "silu_mul"]
    graph = {n: 10e-6 for n in names} | {f"{n}_chained": 9e-6 for n in [*lc.PROJECTIONS, "layer"]}
    lc.print_table([dict(rows=16, graph_s=graph, floor_s={n: 8e-6 for n in lc.PROJECTIONS})])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["16", "qkv_proj", "8.00", "10.00", "9.00"]
    assert out[5].split()[:4] == ["16", "layer", "10.00", "9.00"]


@pytest.mark.gpu
def test_gpu_a_row_count_is_checked_and_timed():
    import torch

    shapes = {"qkv_proj": (384, 256), "o_proj": (256, 256), "gate_up_proj": (1024, 256)}
    shapes["down_proj"] = (256, 512)
    layers = lc._layers(shapes, torch.Generator(device="cuda").manual_seed(0))
    row = lc.run_rows(layers, 4, shapes, 4e12)
    assert all(v > 0 for v in row["graph_s"].values()) and "layer_chained" in row["graph_s"]
