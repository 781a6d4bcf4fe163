"""Shared helpers of the engine tests: tiny random models and prompts."""

from __future__ import annotations

import torch
from ssvkit.engine.checkpoint import ModelSource, build_model
from ssvkit.engine.config import ModelConfig

HAS_CUDA = torch.cuda.is_available()
TINY = ModelConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
)

# The GPU tests' random model: big enough for the Triton kernels' tiles and sparse selections
# over 1-2K-token prompts.
GPU_TINY = ModelConfig(
    vocab_size=512,
    hidden_size=512,
    intermediate_size=1024,
    num_layers=4,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
)


def tiny_model(
    cfg: ModelConfig = TINY,
    seed: int = 0,
    *,
    max_positions: int = 512,
    noise=0.0,
    device="cpu",
    dtype=torch.float32,
):
    """A random model; ``noise`` > 0 perturbs every weight by that share of its std (a draft
    that agrees with the target part of the time)."""
    m = build_model(
        ModelSource("tiny", cfg, None, seed),
        max_positions=max_positions,
        device=device,
        dtype=torch.float32,
    )
    if noise:
        g = torch.Generator(device=device).manual_seed(seed + 1000)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(noise * p.std() * torch.randn(p.shape, generator=g, device=device))
    return m.to(dtype)


def random_prompts(lengths, vocab=256, seed=1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def persistent_state(engine) -> dict:
    """Copies of what outlives a round of ``engine``: lengths, each sequence's committed KV,
    the cache's summaries, the device tensors its graphs read (the acceptance's counters and
    uniforms), the captured graphs and the generators (the oracle drafter's included)."""
    cache = engine.target.cache
    lens = cache.lens.tolist()
    out = {
        "lens": lens,
        **{f"kv{b}": cache.kv[:, :, b, :, :n].clone() for b, n in enumerate(lens)},
        "rng": torch.get_rng_state(),
        "oracle_rng": engine.drafter._rng.bit_generator.state,
        "graphs": (len(engine.target.graphs), engine.target.graphs.captures),
        **{
            str(k): v.clone()
            for k, v in engine.target.graph_constants.items()
            if isinstance(v, torch.Tensor)
        },
    }
    if cache.device.type == "cuda":
        out["cuda_rng"] = torch.cuda.get_rng_state()
    for name in ("comp_k", "comp_v", "comp_lens"):
        if getattr(cache, name) is not None:
            out[name] = getattr(cache, name).clone()
    for layer, meta in enumerate(cache.meta or ()):
        out[f"meta{layer}"] = meta.mean.clone()
    return out


def changed_state(before: dict, after: dict) -> list[str]:
    """The keys of two ``persistent_state`` snapshots whose values differ."""
    return [
        k
        for k, v in before.items()
        if not (torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k])
    ]


def watch_probes(monkeypatch) -> list[list[str]]:
    """Wrap every oracle probe (``engine.oracle.round_probe``) of the engines built after this
    call: the list returned collects, per probe in order, the ``persistent_state`` keys of
    the probing engine that it changed."""
    from ssvkit.engine import loop

    own_probes, own_round_probe = loop.Engine._oracle_probes, loop.round_probe
    probing: list = []  # the engine whose round is being probed
    changes: list[list[str]] = []

    def oracle_probes(self, roots, history):
        probing[:] = [self]
        return own_probes(self, roots, history)

    def round_probe(*args):
        own = own_round_probe(*args)

        def probe(tokens):
            before = persistent_state(probing[0])
            out = own(tokens)
            changes.append(changed_state(before, persistent_state(probing[0])))
            return out

        return probe

    monkeypatch.setattr(loop.Engine, "_oracle_probes", oracle_probes)
    monkeypatch.setattr(loop, "round_probe", round_probe)
    return changes
