"""GPU-only tests of the oracle drafter (marked ``gpu``; skipped without CUDA), under CUDA
graphs on the Triton kernels. The bf16 random model here keeps its full residual branches
(unlike ``test_engine_gpu``'s), so its logits hold near-ties that a t-row verify GEMM and the
1-row GEMMs of the oracle's autoregressive reference can order differently: the reference
leaves the decode. The probes re-anchor it: at acceptance 1 every round keeps the whole spine
(for the grouped schedules, whose rows' rounding depends on the other rows' selections, except
the rounds counted off the plan), no verify leaves its last probe, and every probe leaves the
decode's state as it found it (the verify graph's capture aside).

    python -m pytest -q -p no:cacheprovider tests/engine/test_oracle_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import GPU_TINY, random_prompts, tiny_model, watch_probes
from ssvkit.engine.loop import Engine
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NGRAM = DrafterSpec(kind="ngram")
SPARSE = dict(attention="sparse", top_n=8, block_size=64, window=128, metadata="mean")
CASES = {
    "dense": Strategy(name="sd", tree="best:16:6", drafter=NGRAM),
    "union": Strategy(
        name="ssv",
        tree="best:16:6",
        drafter=NGRAM,
        mode="union",
        group_size=4,
        refresh_every=2,
        **SPARSE,
    ),
    "shared": Strategy(
        name="ssv", tree="chain:6", drafter=NGRAM, mode="shared", group_size=4, **SPARSE
    ),
    "nsa": Strategy(
        name="ssv", tree="chain:4", drafter=NGRAM, refresh_every=2, **dict(SPARSE, metadata="nsa")
    ),
}
MODEL = (
    tiny_model(GPU_TINY, seed=0, max_positions=4096, device="cuda", dtype=torch.bfloat16)
    if torch.cuda.is_available()
    else None
)
PROMPTS = random_prompts([1500, 700, 1203], vocab=512, seed=5)
NEW = 96


def _engine(strategy: Strategy, temperature: float, acceptance: float) -> Engine:
    tree = DraftTree.from_spec(strategy.tree, strategy.traversal)
    t_max = max(map(len, PROMPTS)) + NEW + tree.num_nodes + 1
    runner = ModelRunner(MODEL, batch=len(PROMPTS), t_max=t_max, backend="triton", use_graphs=True)
    cfg = DecodeConfig(
        max_new_tokens=NEW, temperature=temperature, seed=1, oracle_acceptance=(acceptance,)
    )
    return Engine(runner, strategy, cfg)


# Strategies whose rows split a union of blocks over programs: a row's rounding follows the
# other rows' selections, so a round may leave its plan (``OracleDrafter.off_plan``).
GROUPED = ("union", "nsa")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("case", list(CASES))
def test_bf16_oracle_keeps_the_whole_spine_at_acceptance_one(case, temperature):
    """Every round keeps the whole spine, except, for the grouped schedules, rounds counted
    off the plan; no sequence's verify leaves its last probe."""
    engine = _engine(CASES[case], temperature, 1.0)
    result = engine.generate(PROMPTS)
    depth = engine.tree.max_depth
    assert not engine.drafter.diverged
    short = 0
    for r in result.rounds:
        for a, e in zip(r.accepted, r.emitted, strict=True):
            short += a < depth and e == a + 1  # kept less than the spine, not cut at the end
    assert short <= engine.drafter.off_plan
    if case not in GROUPED:
        assert engine.drafter.off_plan == 0
    assert [len(t) for t in result.tokens] == [NEW] * len(PROMPTS)


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_probe_under_graphs_leaves_no_state_behind(case, monkeypatch):
    changes = watch_probes(monkeypatch)
    engine = _engine(CASES[case], 0.8, 0.8)
    result = engine.generate(PROMPTS)
    assert not engine.drafter.diverged
    assert len(changes) >= len(result.rounds)
    assert changes[0] in ([], ["graphs"])  # the first probe captures the verify graph
    assert not any(changes[1:]), changes
