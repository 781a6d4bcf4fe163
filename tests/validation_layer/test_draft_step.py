"""The draft-step benchmark on the CPU (torch backend, wall clock): every graph of a draft
model's round and every level's forward op by op beside the prediction, resumable, stoppable,
and refusing bad input in one line."""

import json

import pytest
from ssvkit.validation import draft_step


def test_a_case_times_every_graph_and_level_and_resumes(tmp_path, capsys, monkeypatch):
    out, cache = tmp_path / "ds.json", tmp_path / "ds.jsonl"
    args = ["--device", "cpu", "--batch", "2", "--contexts", "256", "--trees", "chain:2"]
    args += ["--out", str(out), "--resume", str(cache)]
    assert draft_step.main([*args, "--stop-after", "-1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["rows"] == []
    assert draft_step.main(args) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["nodes"] == 2 and row["depth"] == 2 and len(row["levels"]) == 2
    assert [lv["rows"] for lv in row["levels"]] == [1, 2]  # the root, then root + first draft
    for key in ("expand_s", "catch_up_s", "commit_s", "levels_s"):
        assert row[key] > 0
    assert all(lv["ops"]["attention"]["count"] == 2 for lv in row["levels"])  # two layers
    pred = row["predicted"]
    assert pred["levels_s"] > 0 and 0 < pred["catch_up_probability"] <= 1
    assert any(k.startswith("draft.model.catch_up.") for k in pred["ops"])
    assert "expand" in capsys.readouterr().out

    def fail(*a):
        raise AssertionError("a cached case ran again")

    monkeypatch.setattr(draft_step, "measure_case", fail)
    assert draft_step.main(args) == 0
    assert json.loads(out.read_text())["rows"] == [row]


@pytest.mark.parametrize(
    "bad, word",
    [(["--batch", "0"], "--batch"), (["--acceptance", "1.5"], "--acceptance"),
     (["--trees", "chain:x"], "chain:x")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(bad, word, capsys):
    with pytest.raises(SystemExit) as e:
        draft_step.main(["--device", "cpu", *bad])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "\n" not in err
