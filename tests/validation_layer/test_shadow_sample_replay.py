"""The shadow's sample against the whole batch on replayed texts (``validation.shadow_sample``):
the batch composed from its sequences' own shadows is what a sampled drafter reports, and the
whole batch's estimates lie within the sample's stated error about as often as its level says
-- where the same sample read as a whole batch (its sequences' spread left out) falls far
short on a batch of unlike texts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter, shadow_sample
from ssvkit.validation import shadow_sample as ss

TREES = ("best:8:4", "parents:-1,-1,0,1")


def test_a_composed_round_is_the_sampled_drafters_own():
    texts = ss.pool_texts("mixed", 10, 512, 30)
    sizes = np.random.default_rng(1).integers(1, 6, (30, 10))
    per_seq = [ss.sequence_rounds(t, 512, sizes[:, i], TREES) for i, t in enumerate(texts)]
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, TREES, 3)
    d.start([t[:512] for t in texts])
    hist = [t[:512] for t in texts]
    for r in range(30):
        for i, h in enumerate(hist):
            h += texts[i][len(h) : len(h) + int(sizes[r, i])]
        d.sync(hist)
        toks = [int(x) for x in sizes[r]]
        rows = [s[r] for s in per_seq]
        assert d.take_shadow() == ss.compose(rows, toks, shadow_sample(10, 3))


@pytest.fixture(scope="module")
def checked():
    return {
        kind: ss.check(kind, 16, 4, 1024, 100, 30, TREES, per_round=(1, 5), seed=0)
        for kind in ("code", "mixed")
    }


def test_the_whole_batch_lies_within_the_samples_stated_error(checked):
    """90% intervals (z = 1.645): over 30 draws of 16 texts and three checkpoints each, the
    whole batch's value lies within the sample's error at about that rate for every walk and
    estimate; without the spread the sample leaves out, far less often on unlike texts."""
    for kind, got in checked.items():
        covered = [v["covered"] for v in got.values()]
        assert len(got) == 2 * (SHADOW_MAX_CHAIN + len(TREES)), kind
        assert np.mean(covered) >= 0.85 and min(covered) >= 0.75, (kind, got)
        assert all(v["n"] >= 80 for v in got.values()), kind
    naive = [v["naive"] for v in checked["mixed"].values()]
    assert np.mean(naive) <= 0.6, checked["mixed"]
    assert np.mean([v["naive"] for v in checked["code"].values()]) < np.mean(
        [v["covered"] for v in checked["code"].values()]
    )


def test_the_check_writes_its_figures_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "sample.json"
    args = ["--batch", "8", "--sample", "3", "--context", "512", "--rounds", "20"]
    args += ["--draws", "8", "--sets", "random", "--per-round", "1", "--json", str(out)]
    assert ss.main(args) == 0
    doc = json.loads(out.read_text())
    assert set(doc["sets"]) == {"random"} and doc["args"]["sample"] == 3
    assert all(0 <= v["covered"] <= 1 for v in doc["sets"]["random"].values())
    assert ss.main(["--sample", "1"]) == 2
    assert ss.main(["--per-round", "0-3"]) == 2
    assert ss.main(["--sets", "poetry"]) == 2
    assert "unknown prompt set 'poetry'" in capsys.readouterr().err
