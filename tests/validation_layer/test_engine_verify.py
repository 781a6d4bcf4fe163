"""``engine_verify --campaign`` on the CPU (the torch backend, timed by the wall clock), with the
tiny random geometry of ``test_scale_campaign``: a scale campaign's cells at their batch and
context, each op beside the step model's prediction of it, resumable, stopped after S seconds,
memory planned as the campaign planned it; and the tiny-pair campaign's path as before."""

from __future__ import annotations

import json

import pytest
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.validation import engine_verify, scale_campaign, scale_verify
from ssvkit.validation.decode_figures import step_prediction
from ssvkit.validation.engine_ops import OP_GROUPS
from ssvkit.validation.engine_verify_table import row_strategy, strategy_label, verify_markdown
from ssvkit.validation.full_batch import row_figures
from ssvkit.validation.records import measured_strategy

from tests.validation_layer.test_scale_campaign import CONFIG, ONE_MIB_GIB


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """A scale campaign decoded on the CPU: batch 2 at context 1100 (the sparse baseline is
    predicted there), a dense and a grouped sparse baseline with refresh and reuse layers."""
    tmp = tmp_path_factory.mktemp("verify")
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    out = tmp / "scale.json"
    argv = [
        "--models", f"random:{tmp / 'config.json'}",
        "--contexts", "1100",
        "--batches", "2",
        "--baselines", "sd_dense,ssv",
        "--acceptances", "0.8",
        "--new-tokens", "3",
        "--device", "cpu",
        "--out", str(out),
    ]  # fmt: skip
    assert scale_campaign.main(argv) == 0
    return out


def _verify(campaign, out, *extra):
    return engine_verify.main(
        ["--campaign", str(campaign), "--device", "cpu", "--out", str(out), *extra]
    )


def test_a_scale_campaign_is_timed_op_by_op_beside_its_prediction(
    campaign, tmp_path, capsys, monkeypatch
):
    doc = json.loads(campaign.read_text())
    out = tmp_path / "verify.json"
    got = _verify(campaign, out, "--ops")
    assert json.loads(out.read_text()) == got
    assert got["benchmark"] == scale_verify.BENCHMARK and got["complete"]
    assert got["gpu"] == doc["gpu"] and got["kv"] == "prefill" and got["device"] == "cpu"
    cells = [r for r in doc["rows"] if r["status"] == "measured"]
    assert [r["key"] for r in got["rows"]] == [scale_verify.cell_key(r) for r in cells]
    engine_ops = {o for names, _ in OP_GROUPS.values() for o in names}
    for row, cell in zip(got["rows"], cells, strict=True):
        s = measured_strategy(cell)
        assert row["status"] == "measured" and row["batch"] == 2 and row["context"] == 1100
        assert row["t"] == len(s.parents(0.8)) + 1 and row["graph_s"] > 0
        assert row["campaign_verify_s"] == cell["measured"]["steps_s"]["verify"]
        assert set(row["ops"]) <= engine_ops and "attention" in row["ops"]
        # Each group: its engine ops' seconds per forward beside the step model's ops.
        pred, _, _ = step_prediction(
            s,
            cell["model"].removeprefix("random:"),
            None,
            1100,
            2,
            row_figures(cell)[1],
            cell["selection"]["group_overlap"],
            doc["gpu"],
            elementwise="torch",  # the CPU runs the torch backend
            loop="serial",  # a forward alone: no loop
        )
        groups = row["groups"]
        assert groups["qkv_proj"]["predicted_s"] == pytest.approx(
            float(pred.op_seconds["verify.qkv_proj"][0])
        )
        ops = row["ops"]
        assert groups["norms"]["measured_s"] == pytest.approx(
            sum(ops[o]["median_s"] * ops[o]["count"] for o in OP_GROUPS["norms"][0])
        )
        grouped = sum(g["predicted_s"] for g in groups.values())
        assert grouped == pytest.approx(row["predicted_verify_s"])
    ssv = got["rows"][1]
    assert ssv["baseline"] == "ssv" and ssv["ops"]["attention_reuse"]["count"] > 0
    assert ssv["selection"]["top_n"] == measured_strategy(cells[1]).top_n
    printed = capsys.readouterr().out
    assert "measured/predicted ms per forward" in printed and "rope_kv_writ" in printed
    # A second call with --resume measures nothing: every cell is in --out.
    monkeypatch.setattr(scale_verify, "measure_cell", _never)
    again = _verify(campaign, out, "--ops", "--resume")
    assert again["rows"] == got["rows"] and again["complete"]


def _never(*args, **kwargs):
    raise AssertionError("a cell already in --out measured again")


def test_stop_after_memory_and_bad_input(campaign, tmp_path):
    out = tmp_path / "verify.json"
    stopped = _verify(campaign, out, "--stop-after", "0")
    assert stopped["rows"] == [] and not stopped["complete"]
    assert json.loads(out.read_text())["rows"] == []
    small = _verify(campaign, tmp_path / "small.json", "--available-gib", ONE_MIB_GIB)
    assert small["complete"] and {r["status"] for r in small["rows"]} == {"skipped"}
    assert all(r["reason"].startswith("batch 2 at context 1100 needs ") for r in small["rows"])
    with pytest.raises(ValueError, match="--stop-after must be >= 0"):
        _verify(campaign, out, "--stop-after", "-1")
    with pytest.raises(ValueError, match="not a scale campaign's verify breakdown"):
        other = tmp_path / "other.json"
        other.write_text(json.dumps({**stopped, "benchmark": "engine_verify"}))
        _verify(campaign, other, "--resume")


def test_the_tiny_pair_campaign_path_runs_as_before(campaign, tmp_path):
    """An end-to-end campaign document (batch 1, ``context_len``): each (baseline, context)
    verify forward timed, its op breakdown with ``--ops``."""
    scale = json.loads(campaign.read_text())
    run = next(r for r in scale["rows"] if r["baseline"] == "sd_dense")
    doc = {
        "model": run["model"],
        "provenance": {"git_commit": "abc"},
        "rows": [
            {
                "baseline": "sd_dense",
                "context_len": 300,
                "strategy": run["strategy"],
                "measured": {"steps_s": {"verify": v}},
            }
            for v in (1e-3, 3e-3, 2e-3)
        ],
    }
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(doc))
    got = engine_verify.main(
        ["--campaign", str(path), "--ops", "--device", "cpu", "--out", str(tmp_path / "o.json")]
    )
    assert got["benchmark"] == "engine_verify_campaign"
    (row,) = got["rows"]
    assert row["baseline"] == "sd_dense" and row["context_len"] == 300
    assert row["campaign_verify_s"] == 2e-3 and row["graph_s"] > 0
    assert row["t"] == len(measured_strategy(run).parents(0.8)) + 1
    assert {"qkv_proj", "attention", "lm_head"} <= set(row["ops"])


def test_the_results_table_sums_each_attention_op_over_its_layers():
    def op(us, count):
        return {"median_s": us * 1e-6, "count": count}

    row = dict(
        strategy="ssv", context=131072, t=16, graph_s=6.2e-3, graph_over_ops_sum=1.04,
        graph_over_floor=1.63, predicted_verify_s=6.1e-3,
        ops={"qkv_proj": op(16.0, 32), "attention": op(72.0, 8), "attention_reuse": op(44.0, 24)},
    )  # fmt: skip
    lines = verify_markdown({"rows": [row]}).splitlines()
    assert lines[0].startswith("| strategy | context | t | graph ms |") and len(lines) == 3
    # 8 refresh layers at 72 us and 24 reuse layers at 44 us: 1.632 ms; qkv_proj is not attention
    assert lines[2] == "| ssv | 128K | 16 | 6.20 | 1.04 | 1.63 | 1.63 | 6.10 |"


def test_a_row_of_block_metadata_selection_is_labelled_and_predicted_as_run():
    """``--metadata mean`` rows carry their block scores: the table names them, the strategy
    rebuilt for the prediction has them, and a dense baseline is left as it is."""
    assert engine_verify.with_metadata(Strategy.from_name("ar_dense"), "mean").metadata == "nsa"
    assert engine_verify.with_metadata(Strategy.from_name("ssv"), "quest").metadata == "quest"
    row = dict(
        strategy="ar_sparse", metadata="mean", context=131072, t=1, graph_s=4.0e-3,
        graph_over_ops_sum=1.02, graph_over_floor=1.5, predicted_verify_s=None,
        ops={"attention": {"median_s": 20e-6, "count": 32}},
    )  # fmt: skip
    assert row_strategy(row).metadata == "mean"
    assert row_strategy({**row, "metadata": "nsa"}).metadata == "nsa"
    older = {k: v for k, v in row.items() if k != "metadata"}
    assert row_strategy(older).metadata == "nsa"
    assert verify_markdown({"rows": [row]}).splitlines()[2].startswith("| ar_sparse (mean) | 128K")
    assert verify_markdown({"rows": [older]}).splitlines()[2].startswith("| ar_sparse | 128K")


def test_a_row_of_another_query_grouping_is_labelled_and_predicted_as_run(capsys):
    """``--grouping MODE:C`` sets the grouping of the block-metadata strategies (NSA selects per
    row, dense has none); its rows name it and rebuild it for the prediction; a bad value is a
    one-line error."""
    from ssvkit.validation.engine_verify_table import (
        parse_grouping,
        row_strategy,
        strategy_label,
        with_grouping,
    )

    assert parse_grouping("shared:4") == ("shared", 4) and parse_grouping(None) is None
    for bad in ("shared", "shared:0", "pairs:2", "per_query:2", "union:x"):
        with pytest.raises(ValueError, match="--grouping"):
            parse_grouping(bad)
    mean = engine_verify.with_metadata(Strategy.from_name("ssv"), "mean")
    shared = with_grouping(mean, ("shared", 4))
    assert (shared.mode, shared.group_size, shared.metadata) == ("shared", 4, "mean")
    nsa = Strategy.from_name("ssv")
    assert with_grouping(nsa, ("shared", 4)) == nsa  # NSA selects per row
    dense = Strategy.from_name("sd_dense")
    assert with_grouping(dense, ("shared", 4)) == dense
    attention = dict(kind="sparse", mode="shared", group_size=4)
    row = dict(strategy="ssv", metadata="mean", attention=attention)
    assert strategy_label(row) == "ssv (mean, shared C=4)"
    assert (row_strategy(row).mode, row_strategy(row).group_size) == ("shared", 4)
    own = dict(row, attention=dict(attention, mode=mean.mode, group_size=mean.group_size))
    assert strategy_label(own) == "ssv (mean)"
    with pytest.raises(SystemExit) as e:
        engine_verify.parse_args(["--grouping", "shared:x"])
    assert e.value.code == 2
    assert "--grouping must be MODE:C" in capsys.readouterr().err


def test_a_row_of_another_refresh_cadence_is_labelled_and_predicted_as_run(capsys):
    """``--refresh-every N[,M]`` gives every sparse strategy a row set per cadence (dense ones
    one); a row names a cadence that is not its baseline's and rebuilds it for the prediction;
    a bad value is a one-line error."""
    from ssvkit.validation.engine_verify_table import parse_refresh, with_refresh

    assert parse_refresh("1, 8,8") == (1, 8) and parse_refresh(None) is None
    for bad in ("0", "x", "4,", "-2"):
        with pytest.raises(ValueError, match="--refresh-every"):
            parse_refresh(bad)
    ssv = Strategy.from_name("ssv")
    dense = Strategy.from_name("sd_dense")
    assert with_refresh(dense, 8) == dense and with_refresh(ssv, None) == ssv
    assert with_refresh(ssv, 8).refresh_every == 8
    attention = dict(kind="sparse", mode=ssv.mode, group_size=ssv.group_size, refresh_every=8)
    row = dict(strategy="ssv", metadata="mean", attention=attention)
    assert strategy_label(row) == "ssv (mean, refresh every 8)"
    assert row_strategy(row).refresh_every == 8
    own = dict(row, attention=dict(attention, refresh_every=ssv.refresh_every))
    assert strategy_label(own) == "ssv (mean)"
    assert engine_verify.row_key("ssv", "mean", row) != engine_verify.row_key("ssv", "mean", own)
    with pytest.raises(SystemExit) as e:
        engine_verify.parse_args(["--refresh-every", "0"])
    assert e.value.code == 2
    assert "--refresh-every must be layers >= 1" in capsys.readouterr().err


def test_a_row_of_another_nsa_tile_plan_is_labelled_and_predicted_as_run(capsys):
    """``--nsa-tile-plan`` runs the NSA strategies under that plan; a row records it in its
    attention, which labels it, keys it apart from the default plan's row and prices it."""
    attention = dict(kind="nsa", refresh_every=4, tile_plan="fit_slots")
    row = dict(strategy="ssv", metadata="nsa", attention=attention)
    assert strategy_label(row) == "ssv (tile plan fit_slots)"
    assert row_strategy(row).nsa_tile_plan == "fit_slots"
    own = dict(row, attention=dict(attention, tile_plan="fixed"))
    old = dict(row, attention={k: v for k, v in attention.items() if k != "tile_plan"})
    assert strategy_label(own) == strategy_label(old) == "ssv"
    assert engine_verify.row_key("ssv", "nsa", row) != engine_verify.row_key("ssv", "nsa", own)
    assert engine_verify.row_key("ssv", "nsa", own) == engine_verify.row_key("ssv", "nsa", old)
    assert engine_verify.parse_args(["--nsa-tile-plan", "fit"]).nsa_tile_plan == "fit"
    with pytest.raises(SystemExit) as e:
        engine_verify.parse_args(["--nsa-tile-plan", "wide"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--nsa-tile-plan" in err and "wide" in err and "\n" not in err
