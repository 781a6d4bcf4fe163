"""``kernels.accept``: the one-launch rejection-sampling walk makes the decisions of its torch
reference from the same uniforms, on ragged trees, both draft kinds and the logits dtypes."""

from __future__ import annotations

import pytest
import torch
from ssvkit.engine.drafter import draw_children
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.accept import accept_sampled, reference_accept_sampled, uniforms_needed

SPECS = ["chain:1", "chain:4", "full:3x2", "best:10:4", "best:7:3"]


def _case(spec, b, v, stochastic, dtype, device, seed):
    """A draft tree whose tokens were drawn from a draft near the target (even seeds) or far
    from it (odd seeds), so that walks accept, reject and exhaust siblings."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.from_spec(spec, "position")
    tt = tree.tensors(b, "cpu")
    t = tree.num_nodes
    target = torch.randn(b, t, v, generator=g) * 2.0
    draft = target + (0.7 if seed % 2 == 0 else 2.5) * torch.randn(b, t, v, generator=g)
    tokens = torch.randint(0, v, (b, t), generator=g)
    probs = torch.zeros(b, t, v)
    torch.manual_seed(seed)
    for node in range(t):
        kids = tree.children[node]
        if kids:
            cand, q = draw_children(
                draft[:, node : node + 1], len(kids), 1.0 if stochastic else 0.0
            )
            for r, c in enumerate(kids):
                tokens[:, c] = cand[:, 0, r]
            if q is not None:
                probs[:, node] = q[:, 0]
    n = uniforms_needed(tree.max_depth, tt.children.shape[1], deterministic=not stochastic)
    u = torch.rand(b, n, generator=g)
    args = (
        tokens.to(device),
        target.to(dtype).to(device),
        probs.to(device) if stochastic else None,
        tt.children.to(device),
        tree.max_depth,
        1.0 if seed % 2 else 0.7,
        u.to(device),
    )
    return args


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("stochastic", [True, False])
@pytest.mark.parametrize(
    ("b", "v", "dtype"), [(9, 37, torch.float32), (4, 256, torch.float16), (3, 259, torch.bfloat16)]
)
def test_fused_walk_matches_the_reference(spec, stochastic, b, v, dtype, device):
    for seed in range(4):
        args = _case(spec, b, v, stochastic, dtype, device, seed)
        path, count, bonus = accept_sampled(*args)
        r_path, r_count, r_bonus = reference_accept_sampled(*args)
        torch.testing.assert_close(count, r_count, rtol=0, atol=0)
        torch.testing.assert_close(path, r_path, rtol=0, atol=0)
        torch.testing.assert_close(bonus, r_bonus, rtol=0, atol=0)
        assert int(bonus.min()) >= 0 and int(bonus.max()) < v


def test_the_cases_exercise_accepts_and_rejections(device):
    counts = []
    for seed in range(4):
        args = _case("best:10:4", 16, 37, True, torch.float32, device, seed)
        counts.append(accept_sampled(*args)[1].cpu())
    c = torch.cat(counts)
    assert int(c.min()) == 1 and int(c.max()) >= 3  # rejected at the root and walked deep


def test_an_exhausted_draft_skips_children_it_could_not_propose(device):
    # q puts all its mass on the first child's token: once that is rejected q_2 is empty
    # and the second child (q_2(c_2) = 0) must be skipped, never accepted.
    tree = DraftTree.from_spec("full:2x1", "position")
    tt = tree.tensors(1, "cpu")
    v = 8
    logits = torch.full((1, 3, v), -30.0)
    logits[0, 0, 5] = 0.0  # the target wants token 5 after the root
    tokens = torch.tensor([[0, 3, 5]])
    probs = torch.zeros(1, 3, v)
    probs[0, 0, 3] = 1.0
    u = torch.full((1, uniforms_needed(1, 2, deterministic=False)), 0.5)
    args = (tokens, logits, probs, tt.children, 1, 1.0, u)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    path, count, bonus = accept_sampled(*args)
    assert int(count[0]) == 1 and int(bonus[0]) == 5
    r = reference_accept_sampled(*args)
    assert int(r[1][0]) == 1 and int(r[2][0]) == 5


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"u": torch.zeros(2, 3)}, "u must be"),
        ({"depth": 9}, "depth must be"),
        ({"temperature": 0.0}, "temperature must be"),
        ({"tokens": torch.zeros(2, 5, dtype=torch.int32)}, "tokens must be"),
        ({"draft_probs": torch.zeros(2, 5, 3)}, "draft_probs must be"),
    ],
)
def test_bad_inputs_name_the_bad_value(change, match):
    tree = DraftTree.from_spec("chain:4", "position")
    kw = {
        "tokens": torch.zeros(2, 5, dtype=torch.int64),
        "logits": torch.zeros(2, 5, 11),
        "draft_probs": None,
        "children": tree.tensors(2, "cpu").children,
        "depth": 4,
        "temperature": 1.0,
        "u": torch.zeros(2, uniforms_needed(4, 1, deterministic=True)),
    }
    kw.update(change)
    for fn in (accept_sampled, reference_accept_sampled):
        with pytest.raises(ValueError, match=match):
            fn(**kw)
