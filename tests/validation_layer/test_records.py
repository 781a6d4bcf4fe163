"""The measurements of record: every file is indexed, read through package resources, and names
models and files relative to the project."""

import dataclasses
import gzip
import re

import pytest
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.validation.records import (
    NSA_SCHEDULE,
    command_line,
    data_dir,
    file_label,
    local_model,
    measured_strategy,
    model_label,
    project_label,
    record_path,
    run_schedule,
)

# A path of the machine that measured a document: a home, work or temporary folder.
MACHINE_PATH = re.compile(r"\"(/(?:root|home|work|tmp|mnt|data)/[^\"]*)\"")


def _text(path) -> str:
    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def test_every_record_is_indexed_and_every_indexed_record_is_there():
    index = (data_dir() / "INDEX.md").read_text()
    listed = set(re.findall(r"^\| `([^`/]+)` \|", index, flags=re.M))
    present = {p.name for p in data_dir().iterdir() if p.name != "INDEX.md"}
    assert listed == present
    for name in present:
        assert record_path(name).is_file()
    with pytest.raises(ValueError, match="no measurement of record 'nope.json'"):
        record_path("nope.json")


@pytest.mark.parametrize("name", ["campaign.json", "planner.json", "planner-ranking.json.gz"])
def test_documents_name_no_path_of_the_machine_that_measured_them(name):
    text = _text(record_path(name))
    assert MACHINE_PATH.findall(text) == []
    assert "engine/checkpoints/tiny-draft" in text


def test_labels_are_relative_to_the_project_and_resolve_here(tmp_path):
    ckpt = data_dir().parent.parent / "engine" / "checkpoints" / "tiny-draft"
    assert model_label(ckpt) == "engine/checkpoints/tiny-draft"
    assert model_label("llama-3.1-8b") == "llama-3.1-8b" and model_label(None) is None
    assert local_model("engine/checkpoints/tiny-draft") == str(
        data_dir().parent.parent / "engine" / "checkpoints" / "tiny-draft"
    )
    # A path recorded on another machine resolves to this checkout's folder of the same name.
    assert local_model("/elsewhere/engine/checkpoints/tiny-draft").endswith("tiny-draft")
    with pytest.raises(ValueError, match="is not in this checkout"):
        local_model("/elsewhere/no-such-model")
    assert project_label(record_path("planner.json")) == "validation/data/planner.json"
    assert file_label(tmp_path / "out.json") == "out.json"  # outside the project: its name
    assert file_label("build/x.json") == "build/x.json"  # relative: as given
    line = command_line(
        "ssvkit.validation.planner_eval", ["--out", str(tmp_path / "p.json"), "-x=1"]
    )
    assert line == "python -m ssvkit.validation.planner_eval --out p.json -x=1"


def test_a_project_relative_model_label_resolves_from_any_working_directory(tmp_path, monkeypatch):
    from ssvkit.perfmodel.models import get_model

    monkeypatch.chdir(tmp_path)
    spec = get_model("engine/checkpoints/tiny-draft")
    assert spec.name == "engine/checkpoints/tiny-draft" and spec.num_layers >= 1
    with pytest.raises(ValueError, match="unknown model 'engine/checkpoints/none'"):
        get_model("engine/checkpoints/none")


def test_a_run_records_its_nsa_schedule_and_is_priced_with_it():
    """Runs record their NSA row schedule; a run without one (documents measured when the
    engine packed every NSA strategy's rows) is priced with the packed schedule."""
    naive, ssv = Strategy.from_name("sd_sparse_naive"), Strategy.from_name("ssv")
    assert run_schedule(naive) == {NSA_SCHEDULE: 1} and run_schedule(ssv) == {NSA_SCHEDULE: 4}
    assert run_schedule(Strategy.from_name("sd_dense")) == {}
    assert run_schedule(dataclasses.replace(ssv, metadata="mean")) == {}
    run = {"strategy": dataclasses.asdict(naive)}
    old = measured_strategy(run)
    assert (old.mode, old.nsa_rows_per_tile, old.name) == ("shared", 0, "sd_sparse_naive")
    assert measured_strategy({**run, **run_schedule(naive)}) == naive
    dense = {"strategy": dataclasses.asdict(Strategy.from_name("sd_dense"))}
    assert measured_strategy(dense) == Strategy.from_name("sd_dense")


def test_a_run_whose_strategy_predates_the_compressed_tiling_ran_it_per_tile():
    """A run's strategy without ``nsa_context_tiles`` ran NSA's compressed branch on its row
    schedule's tiles and is priced so; a run that records it keeps what it ran."""
    ssv = Strategy.from_name("ssv")
    assert ssv.nsa_context_tiles == "paired"
    recorded = {"strategy": dataclasses.asdict(ssv), **run_schedule(ssv)}
    assert measured_strategy(recorded) == ssv
    old = {k: v for k, v in dataclasses.asdict(ssv).items() if k != "nsa_context_tiles"}
    priced = measured_strategy({"strategy": old, **run_schedule(ssv)})
    assert priced == dataclasses.replace(ssv, nsa_context_tiles="per_tile")
    bad = "nsa_context_tiles must be one of per_tile, shared, paired"
    with pytest.raises(ValueError, match=bad):
        dataclasses.replace(ssv, nsa_context_tiles="x")
