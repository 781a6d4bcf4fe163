import numpy as np
import pytest
from ssvkit.perfmodel.calibrated import make_predictor
from ssvkit.perfmodel.draft_host import (
    check_coefficients,
    draft_host_features,
    draft_host_s,
    shipped_coefficients,
)
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload


def test_features_grow_with_sequences_and_nodes_for_ngram_and_with_levels_for_a_draft_model():
    # drafter codes: 1 draft model, 2 n-gram; a point drafting nothing has no host draft step
    x = draft_host_features(
        [2, 2, 1, 2, 1], [1, 32, 32, 32, 4], [16, 16, 16, 0, 0], [5, 5, 6, 0, 0]
    )
    want = [[1, 1, 16, 0], [1, 32, 512, 0], [0, 0, 0, 6], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert x.tolist() == want
    coef = {"round": 1e-5, "sequence": 2e-6, "sequence_node": 1e-6, "model_level": 5e-5}
    assert draft_host_s(coef, [2], [8], [4], [4])[0] == pytest.approx(1e-5 + 16e-6 + 32e-6)
    assert draft_host_s(coef, [1], [8], [4], [4])[0] == pytest.approx(4 * 5e-5)


def test_bad_coefficients_are_refused_by_name():
    ok = {"round": 0.0, "sequence": 0.0, "sequence_node": 0.0, "model_level": 0.0}
    with pytest.raises(ValueError, match="x.sequence must be"):
        check_coefficients("x", {**ok, "sequence": -1.0})
    with pytest.raises(ValueError, match="x.model_level must be"):
        check_coefficients("x", {k: v for k, v in ok.items() if k != "model_level"})
    with pytest.raises(ValueError, match="x.node is not one of"):
        check_coefficients("x", {**ok, "node": 1})


def test_h200_prices_the_ngram_draft_step_on_the_host_and_scales_with_the_batch():
    shipped = shipped_coefficients("h200")
    assert shipped is not None
    model = get_model("llama-3.1-8b")
    s = Strategy(name="ng", tree="chain:4", drafter=DrafterSpec(kind="ngram"))
    pts = [(s, Workload(context_len=8192, batch=b)) for b in (1, 32)]
    c = build_columns(model, pts)
    p = predict_columns(model, c, make_predictor(get_gpu("h200"), tp=c.tp))
    host = p.op_seconds["draft.host"]
    depth = np.full(len(c), 4.0)
    assert np.allclose(host, draft_host_s(shipped[0], c.drafter, c.batch, c.num_draft, depth))
    assert host[1] > 4 * host[0] > 0
    assert np.allclose(p.draft_s - host, p.draft_s[0] - host[0], rtol=0.5)  # the GPU part is tiny


def test_h200_prices_a_draft_models_levels_on_the_host():
    coef = shipped_coefficients("h200")[0]
    model = get_model("llama-3.1-8b")
    dm = DrafterSpec(kind="draft_model", model="engine/checkpoints/tiny-draft")
    pts = [
        (Strategy(name=t, tree=t, drafter=dm), Workload(context_len=8192, batch=b))
        for t, b in (("chain:2", 1), ("chain:6", 1), ("chain:6", 32))
    ]
    c = build_columns(model, pts)
    p = predict_columns(model, c, make_predictor(get_gpu("h200"), tp=c.tp), dm)
    host = p.op_seconds["draft.host"]
    assert coef["model_level"] > 0
    assert np.allclose(host, coef["model_level"] * np.array([2, 6, 6]))  # per level only
