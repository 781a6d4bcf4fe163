"""Acceptance: greedy on hand-made trees, and chi-square tests that multi-draft rejection
sampling reproduces the target distribution (first token, and the second given the first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from ssvkit.engine.acceptance import accept_greedy, accept_stochastic
from ssvkit.engine.drafter import draw_children
from ssvkit.engine.tree import DraftTree

V = 6


def _onehot_logits(argmax: list[int], v: int = 8) -> torch.Tensor:
    x = torch.full((1, len(argmax), v), -5.0)
    x[0, torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return x


def test_greedy_takes_the_deepest_matching_path():
    # root -> {1, 2}; 1 -> {3}; 2 -> {4 -> 5}.
    tree = DraftTree.from_parents([-1, 0, 0, 1, 2, 4]).tensors(1, "cpu")
    tokens = torch.tensor([[7, 3, 4, 1, 2, 6]])
    # Target argmax per row: root says 4 (node 2), node 2 says 2 (node 4), node 4 says 5.
    acc = accept_greedy(tree, tokens, _onehot_logits([4, 0, 2, 0, 5, 0]))
    assert acc.count.tolist() == [3]  # root, node 2, node 4
    assert acc.path[0, :3].tolist() == [0, 2, 4]
    assert acc.bonus.tolist() == [5]  # node 5 holds 6, the target wanted 5
    acc = accept_greedy(tree, tokens, _onehot_logits([1, 0, 0, 0, 0, 0]))
    assert acc.count.tolist() == [1] and acc.bonus.tolist() == [1]


def _markov(seed: int, temperature: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * 1.5 / temperature  # logits of next | last


def _round(n: int, spec: str, stochastic_drafts: bool, seed: int):
    """``n`` independent rounds of a tree over a Markov target/draft pair; returns the emitted
    first and second tokens (second = -1 when the round emitted one token)."""
    torch.manual_seed(seed)
    target = _markov(1)
    draft = target + 0.8 * _markov(2)  # a draft that agrees with the target part of the time
    tree = DraftTree.from_spec(spec, "position")
    tt = tree.tensors(n, "cpu")
    tokens = torch.zeros((n, tree.num_nodes), dtype=torch.int64)  # root token 0
    probs = torch.zeros((n, tree.num_nodes, V))
    for node in range(tree.num_nodes):
        kids = tree.children[node]
        if not kids:
            continue
        logits = draft[tokens[:, node]][:, None]  # [n, 1, V]
        cand, q = draw_children(logits, len(kids), 1.0 if stochastic_drafts else 0.0)
        for r, c in enumerate(kids):
            tokens[:, c] = cand[:, 0, r]
        if q is not None:
            probs[:, node] = q[:, 0]
    acc = accept_stochastic(tt, tokens, target[tokens], probs if stochastic_drafts else None, 1.0)
    # Emitted: the accepted drafts (path entries 1..count-1), then the bonus token.
    kept = tokens.gather(1, acc.path)
    first = torch.where(acc.count >= 2, kept[:, 1], acc.bonus)
    second = torch.where(acc.count >= 3, kept[:, 2], torch.where(acc.count == 2, acc.bonus, -1))
    return first.numpy(), second.numpy(), torch.softmax(target, -1).double().numpy()


def _chi2_p(samples: np.ndarray, p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(p))
    return chisquare(counts, p / p.sum() * counts.sum()).pvalue


@pytest.mark.parametrize("spec", ["chain:3", "full:3x2", "best:10:4"])
@pytest.mark.parametrize("stochastic_drafts", [True, False])
def test_rejection_sampling_preserves_the_target_distribution(spec, stochastic_drafts):
    first, second, p = _round(40_000, spec, stochastic_drafts, seed=7)
    assert _chi2_p(first, p[0]) > 1e-3
    for x1 in range(V):  # the second token given the first, where the round continued
        pick = (first == x1) & (second >= 0)
        if pick.sum() > 500:
            assert _chi2_p(second[pick], p[x1]) > 1e-3, x1
    # Something was accepted: the test exercises the accept branch, not only the residual.
    assert (second >= 0).mean() > 0.15


def test_chi_square_detects_a_biased_sampler():
    # Control: emitting the draft's top candidate unconditionally is not the target
    # distribution, and the same test must say so.
    first, _, p = _round(40_000, "chain:3", False, seed=7)
    wrong = (_markov(1) + 0.8 * _markov(2)).argmax(-1)[0].item()
    biased = np.where(np.arange(first.size) % 2 == 0, wrong, first)
    assert _chi2_p(biased, p[0]) < 1e-6


class _Launches:
    """Ops dispatched that launch a kernel on a GPU: not views, not allocations, not the host
    scalars that wrap a Python number, and none while ``paused`` (the ops Triton's CPU
    interpreter runs inside a kernel launch)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        names = []
        self.paused = False
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if outer.paused:
                    return func(*args, **(kwargs or {}))
                view = any(
                    r.alias_info is not None and not r.alias_info.is_write
                    for r in func._schema.returns
                )
                host = func.__name__.split(".")[0] in ("empty", "empty_strided", "scalar_tensor")
                if not view and not host:
                    names.append(func.__name__)
                return func(*args, **(kwargs or {}))

        self.mode, self.names = Mode(), names


class _KernelLaunches:
    """Launches of ``kernels.accept_commit``'s Triton kernels, each one entry of the names of
    the ``_Launches`` in ``current``, the ops its launch dispatches not counted."""

    def __init__(self, monkeypatch):
        from ssvkit.kernels import accept_commit

        self.current: _Launches | None = None
        for attr in ("_accept_commit_kernel", "_move_kept_kernel"):
            kernel = getattr(accept_commit, attr)
            monkeypatch.setattr(accept_commit, attr, self._Counted(kernel, attr, self))

    class _Counted:
        def __init__(self, kernel, name, owner):
            self.kernel, self.name, self.owner = kernel, name, owner

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches = self.owner.current
                launches.names.append(self.name)
                launches.paused = True
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    launches.paused = False

            return launch


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("spec", ["chain:0", "chain:4", "full:2x3"])
def test_the_accept_step_launches_what_perfmodel_prices(spec, backend, monkeypatch):
    """perfmodel's ``verify.accept`` counts the acceptance graph's launches: those it
    dispatches here (greedy, dense; torch ops on the torch backend, the ``kernels.accept_commit``
    launches and the argmax on the triton backend), less the vocabulary pass
    (``verify.sampling``), plus the copies of the graph's two inputs."""
    from engine_helpers import TINY, random_prompts, tiny_model
    from ssvkit.engine.loop import Engine
    from ssvkit.engine.runner import ModelRunner
    from ssvkit.engine.settings import DecodeConfig
    from ssvkit.perfmodel.accept_ops import accept_launches
    from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

    tree = DraftTree.from_spec(spec, "position")
    drafter = DrafterSpec(kind="ngram")
    strategy = Strategy(name="sd", tree=spec, drafter=drafter)
    runner = ModelRunner(tiny_model(seed=3), batch=2, t_max=128, backend=backend)
    engine = Engine(runner, strategy, DecodeConfig(max_new_tokens=4))
    counted, accept = [], engine.acceptor.accept
    kernels = _KernelLaunches(monkeypatch)

    def counting(*args):
        launches = kernels.current = _Launches()
        with launches.mode:
            out = accept(*args)
        counted.append(launches.names)
        return out

    engine.acceptor.accept = counting
    engine.generate(random_prompts([37, 21], seed=5))
    fused = backend == "triton"
    branches = tree.max_children > 1
    expect = accept_launches(tree.max_depth, TINY.num_layers, 0, 0, fused, branches) - 2 + 1
    # The first round also makes the graph's constant input (once per engine, outside it).
    assert [len(n) for n in counted[1:]] == [expect] * (len(counted) - 1)
    if fused:
        moves = ["_move_kept_kernel"] if branches else []
        assert all(n.count("_accept_commit_kernel") == 1 for n in counted)
        assert all([x for x in n if x == "_move_kept_kernel"] == moves for n in counted)
    else:
        assert all(n.count("index_put_.default") == 1 for n in counted)
