"""Where the prompt sets' best strategies differ: the per-set profiles and the choice, on the
evaluation of record (CPU)."""

import dataclasses
import json

import pytest
from ssvkit.perfmodel.tree_tokens import expected_tokens_interp
from ssvkit.planner.profile import profile_from_json
from ssvkit.planner.space import space_from_json
from ssvkit.validation import adaptive_regime as ar
from ssvkit.validation.records import local_model, record_path

DOC = json.loads(record_path("planner.json").read_text())


def _space_profile():
    space = space_from_json(DOC["space"], "record")
    space = dataclasses.replace(space, draft_model=local_model(space.draft_model))
    return space, profile_from_json(DOC["profile"], "record", "record")


def test_a_sets_profile_scales_each_trees_accepted_drafts():
    """Ratio 1 leaves every acceptance (to the interpolation's precision); a ratio r scales a
    drafter's accepted drafts per round on each of its trees by r and leaves the other
    drafter's and the reference acceptance that resolves the trees."""
    space, profile = _space_profile()
    same = ar.set_profile(profile, space, {"ngram": {"*": 1.0}})
    for regime, table in profile.acceptance.items():
        assert same.acceptance[regime] == pytest.approx(table, abs=1e-4)
    half = ar.set_profile(profile, space, {"ngram": {"*": 0.5}})
    for regime, table in profile.acceptance.items():
        for key, a in table.items():
            kind, _, tree = key.partition("@")
            got = half.acceptance[regime][key]
            if kind != "ngram" or not tree or tree == "chain:0":
                assert got == a
            else:
                drafts = expected_tokens_interp(tree, a) - 1.0
                assert expected_tokens_interp(tree, got) - 1.0 == pytest.approx(
                    0.5 * drafts, abs=1e-3
                )


def test_the_sets_ratios_come_from_the_oracles_runs():
    """Code over code is 1 for every tree; on random bytes the n-gram drafter keeps a
    fraction of its accepted drafts, less than the draft model keeps."""
    space, profile = _space_profile()
    fixed = ar.fixed_strategies(DOC)
    assert set(fixed) == set(DOC["adaptive"]["prompt_sets"])
    ratios = ar.set_ratios(fixed, space, profile, DOC["adaptive"]["regime"])
    assert all(v == 1.0 for r in ratios["code"].values() for v in r.values())
    trees = {t for t in space.trees if t != "chain:0"}
    assert set(ratios["random"]["ngram"]) == trees | {"*"}
    assert ratios["random"]["ngram"]["*"] < ratios["random"]["draft_model"]["*"] < 1


def test_the_choice_is_where_the_sets_best_differ_most(capsys):
    rows = ar.candidate_rows(DOC, [1, 32], "h200", ("16K", "32K"))
    assert [(r["batch"], r["regime"]) for r in rows] == [
        (1, "16K"),
        (1, "32K"),
        (32, "16K"),
        (32, "32K"),
    ]
    for r in rows:
        assert r["sets"]["code"]["gain"] == pytest.approx(0.0, abs=1e-12)
        assert all(v["gain"] >= -1e-9 for v in r["sets"].values())
        assert r["min_off_gain"] <= r["mean_off_gain"]
    chosen = ar.choose(rows)
    assert chosen["mean_off_gain"] == max(r["mean_off_gain"] for r in rows)
    assert ar.main(["--batches", "32", "--regimes", "16K,32K"]) == 0
    out = capsys.readouterr().out
    assert "chosen: batch 32," in out and "code profile's best" in out
    assert ar.main(["--regimes", "64K+"]) == 2
    assert "regime '64K+' is not one of the evaluation's" in capsys.readouterr().err
