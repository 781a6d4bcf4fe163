"""The draft model's forwards per round as the engine runs them: one per tree level over the
root and every node drafted so far, and the catch-up of a kept deepest leaf, which a batch
runs when any of its sequences kept one."""

import numpy as np
import pytest
from ssvkit.perfmodel.acceptance import TreeAcceptance, full_depth_probability
from ssvkit.perfmodel.predictor import RooflinePredictor
from ssvkit.perfmodel.step import build_columns, predict_columns
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload, chain_parents

from tests.perfmodel.test_step import GPU
from tests.perfmodel.test_step import TINY as TARGET


def _predict(tree: str, batch: int, alpha: float):
    from ssvkit.engine.checkpoint import TINY_DRAFT

    drafter = DrafterSpec(kind="draft_model", model=str(TINY_DRAFT))
    s = Strategy(name="sd", tree=tree, drafter=drafter)
    c = build_columns(TARGET, [(s, Workload(context_len=4096, batch=batch, acceptance=alpha))])
    return c, predict_columns(TARGET, c, RooflinePredictor(GPU, tp=c.tp), drafter)


def test_full_depth_probability_of_a_chain_is_alpha_to_the_depth():
    acc = TreeAcceptance.from_alpha(0.7)
    p0 = acc.p(0, 0)
    assert full_depth_probability(chain_parents(3), acc) == pytest.approx(p0**3)
    assert full_depth_probability([], acc) == 0.0
    # two children of the root, one grandchild below the first: only the grandchild is deepest
    assert full_depth_probability([-1, -1, 0], acc) == pytest.approx(p0 * p0)


def test_catch_up_runs_when_any_sequence_of_the_batch_kept_the_deepest_leaf():
    c1, one = _predict("chain:3", 1, 0.6)
    c32, many = _predict("chain:3", 32, 0.6)
    p = c1.full_depth[0]
    assert 0 < p < 1 and c32.full_depth[0] == pytest.approx(p)
    # the catch-up's layer ops run 1 - (1 - p)^B times a round, of a one-node forward
    for cols, pred in ((c1, one), (c32, many)):
        b = cols.batch[0]
        times = 1 - (1 - p) ** b
        calls = pred.ops["draft.model.catch_up.attention"].calls[0]
        assert calls == pytest.approx(2 * times)  # the draft model's two layers
    assert many.ops["draft.model.catch_up.attention"].calls[0] > 1.9
    # and an autoregressive-like chance of 0 leaves it out
    c0, none = _predict("chain:3", 32, 0.0)
    assert np.all(none.ops["draft.model.catch_up.attention"].calls == 0)


def test_level_forwards_run_the_root_and_every_node_drafted_so_far():
    # full 2x2: level 0 runs the root (1 row), level 1 the root and its 2 children (3 rows)
    _, pred = _predict("full:2x2", 4, 0.0)
    qkv = pred.ops["draft.model.qkv_proj"]
    # the linear ops' rows: batch x (1 + 3), over the draft model's two layers
    draft_cfg = _draft_spec()
    n = (draft_cfg.num_q_heads + 2 * draft_cfg.num_kv_heads) * draft_cfg.head_dim
    assert qkv.flops[0] == pytest.approx(2 * 2 * (4 * (1 + 3)) * n * draft_cfg.hidden_size)


def _draft_spec():
    from ssvkit.engine.checkpoint import TINY_DRAFT

    return DrafterSpec(kind="draft_model", model=str(TINY_DRAFT)).draft_spec()
