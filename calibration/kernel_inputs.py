"""Inputs of the kernel sweep: the attention geometry timed, random attention inputs, sparse
block selections with an exact adjacent-row overlap, and the byte counts of the rows.

Byte and FLOP counts are the minimum the op's algorithm must move and compute: the KV it needs
read once, plus q, o and lse (and indices). Sparse block selections keep ``round(overlap *
top_n)`` blocks of the row before and draw the rest fresh (new to their span of ``SPAN`` rows
where the prefix has room), so the load fraction ``f_load`` of each group size is known.

The geometry is module state that every builder and byte count reads at call time:
``use_geometry`` switches it (the kernel sweep sets each config's own, ``geometry`` for a block).
``GEOMETRIES`` holds the heads timed: the registry models' (their counts read from
``perfmodel.models``), the engine's trained tiny pair, and one head dimension of 64 at GQA 8
that no registry model has.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np
import torch
from ssvkit.kernels.tree import ancestor_bitmask
from ssvkit.perfmodel.models import get_model


def _heads(model: str) -> tuple[int, int, int]:
    m = get_model(model)
    return m.num_q_heads, m.num_kv_heads, m.head_dim


NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = _heads("llama-3.1-8b")  # the default (use_geometry)
# name -> (query heads, KV heads, head dim); GQA ratios 4, 16, 5, 8, 4 and 8.
GEOMETRIES = {
    name: _heads(name) for name in ("llama-3.1-8b", "glm-4-9b", "qwen3-14b", "qwen3-30b-a3b")
}
GEOMETRIES["tiny"] = (8, 2, 64)  # engine/checkpoints/tiny-target
GEOMETRIES["tiny-draft"] = (4, 2, 64)  # engine/checkpoints/tiny-draft
GEOMETRIES["16q-2kv-d64"] = (16, 2, 64)
GEOMETRIES["8q-4kv-d256"] = (8, 4, 256)  # Gemma-3-4B, Gemma-2-2B
# Geometries of the test design only (``calibration.unseen_design``), never of a fit row.
GEOMETRIES["llama-3.1-70b"] = _heads("llama-3.1-70b")
GEOMETRIES["28q-4kv-d128"] = (28, 4, 128)
GEOMETRIES["24q-8kv-d128"] = (24, 8, 128)
GEOMETRIES["12q-2kv-d128"] = (12, 2, 128)
GEOMETRIES["16q-8kv-d256"] = (16, 8, 256)
DTYPE = torch.bfloat16
ELEM_BYTES = 2
SPAN = 8  # rows over which fresh blocks are new: groups of C in {1, 2, 4, 8} nest in it
DEVICE = "cuda"
# NSA's branches as the sweep runs them: selection, sliding window, compressed tokens.
NSA_KW = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)


def use_geometry(name: str) -> None:
    """Time another attention geometry: the module's head counts, which every input builder,
    byte count and row reads at call time."""
    global NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM
    if name not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {', '.join(GEOMETRIES)}, got {name!r}")
    NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = GEOMETRIES[name]


def current_geometry() -> str:
    """The name of the geometry in use (the first of ``GEOMETRIES`` with its head counts)."""
    heads = (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM)
    return next(name for name, g in GEOMETRIES.items() if g == heads)


@contextlib.contextmanager
def geometry(name: str) -> Iterator[None]:
    """Use geometry ``name`` inside the block, then the one used before."""
    before = current_geometry()
    use_geometry(name)
    try:
        yield
    finally:
        use_geometry(before)


def generator(seed: int) -> torch.Generator:
    """A seeded generator on the sweep's device."""
    return torch.Generator(device=DEVICE).manual_seed(seed)


def binary_tree_mask(bsz: int, t: int, device) -> torch.Tensor:
    """Ancestor bitmask of a binary heap tree (node i's parent is (i - 1) // 2)."""
    parents = torch.tensor([(i - 1) // 2 for i in range(t)], dtype=torch.int32, device=device)
    return ancestor_bitmask(parents.expand(bsz, t).contiguous())


def attention_inputs(bsz, t, t_max, prefix_lens, gen, device=None):
    """Random q, k_cache, v_cache (bf16, never zeros), prefix_lens and a binary-tree mask."""
    device = device or DEVICE
    q = torch.randn((bsz, t, NUM_Q_HEADS, HEAD_DIM), generator=gen, device=device).to(DTYPE)
    kv_shape = (bsz, NUM_KV_HEADS, t_max, HEAD_DIM)
    k = torch.randn(kv_shape, generator=gen, device=device, dtype=DTYPE)
    v = torch.randn(kv_shape, generator=gen, device=device, dtype=DTYPE)
    lens = torch.tensor(prefix_lens, dtype=torch.int32, device=device)
    return q, k, v, lens, binary_tree_mask(bsz, t, device)


def nsa_inputs(mod, bsz, t, prefix_lens, t_max, gen):
    """Attention inputs plus NSA's compressed K/V and its three branch gates."""
    q, k, v, lens, mask = attention_inputs(bsz, t, t_max, prefix_lens, gen)
    comp_k, comp_v, _ = mod.compress_kv(k, v, lens, comp_block=32, comp_stride=16)
    gates = torch.sigmoid(torch.randn((bsz, t, NUM_Q_HEADS, 3), generator=gen, device=DEVICE))
    return (q, k, v, lens, mask, comp_k, comp_v, gates)


def metadata_rotations(q: torch.Tensor, meta, count: int, gen=None) -> list[tuple]:
    """``count`` input sets of a block selection: ``(q, meta)``, then fresh random queries of
    ``q``'s shape and dtype (drawn from ``gen`` when given) with copies of ``meta``'s tensors
    (a ``BlockMetadata``: distinct memory, the same values), so a timed rotation reads no
    input another set left in L2."""
    names = [f.name for f in dataclasses.fields(meta) if torch.is_tensor(getattr(meta, f.name))]
    sets = [(q, meta)]
    for _ in range(count - 1):
        fresh = torch.randn(q.shape, device=q.device, generator=gen).to(q.dtype)
        copies = {n: getattr(meta, n).clone() for n in names}
        sets.append((fresh, dataclasses.replace(meta, **copies)))
    return sets


def overlap_block_idx(num_blocks: list[int], t: int, top_n: int, overlap: float, rng) -> np.ndarray:
    """``[B, Hkv, t, top_n]`` int32 block selections with an exact adjacent-row overlap.

    Row ``i`` keeps ``round(overlap * top_n)`` blocks of row ``i - 1`` and draws the rest from
    blocks unused in its span of ``SPAN`` rows (or, when the prefix is too short, unused by row
    ``i - 1``): a group of ``C`` rows then loads ``top_n * (1 + (C - 1) * (1 - overlap))`` blocks.
    """
    keep = round(overlap * top_n)
    out = np.empty((len(num_blocks), NUM_KV_HEADS, t, top_n), dtype=np.int32)
    for b, nb in enumerate(num_blocks):
        if nb - top_n < (top_n - keep if t > 1 else 0):
            raise ValueError(f"sequence {b}: {nb} blocks cannot hold top_n={top_n} at {overlap=}")
        for h in range(NUM_KV_HEADS):
            prev: np.ndarray | None = None
            used: set[int] = set()
            for i in range(t):
                if prev is None:
                    cur = rng.choice(nb, top_n, replace=False)
                else:
                    if i % SPAN == 0:
                        used = set(prev.tolist())
                    kept = rng.choice(prev, keep, replace=False)
                    pool = np.setdiff1d(np.arange(nb), np.fromiter(used, dtype=np.int64))
                    if pool.size < top_n - keep:
                        pool = np.setdiff1d(np.arange(nb), prev)
                    cur = np.concatenate([kept, rng.choice(pool, top_n - keep, replace=False)])
                used |= set(cur.tolist())
                out[b, h, i] = np.sort(cur)
                prev = cur
    return out


def random_block_idx(num_blocks: list[int], t: int, width: int, rng) -> np.ndarray:
    """``[B, Hkv, t, width]`` int32: independent random distinct blocks per row, ascending."""
    out = np.empty((len(num_blocks), NUM_KV_HEADS, t, width), dtype=np.int32)
    for b, nb in enumerate(num_blocks):
        for h in range(NUM_KV_HEADS):
            for i in range(t):
                out[b, h, i] = np.sort(rng.choice(nb, width, replace=False))
    return out


def group_blocks(idx: np.ndarray, group: int) -> int:
    """Distinct blocks summed over consecutive row groups of ``group`` (-1 ignored)."""
    bsz, hkv, t, n = idx.shape
    total = 0
    for g0 in range(0, t, group):
        s = np.sort(idx[:, :, g0 : g0 + group].reshape(bsz, hkv, -1), axis=-1)
        distinct = (s[..., 1:] != s[..., :-1]) & (s[..., 1:] >= 0)
        total += int(distinct.sum() + (s[..., 0] >= 0).sum())
    return total


def f_load_formula(group: int, overlap: float) -> float:
    """SSV's load fraction ``(1 + (C - 1)(1 - gamma)) / C`` (seed 000)."""
    return (1 + (group - 1) * (1 - overlap)) / group


def qol_bytes(bsz: int, t: int) -> int:
    """q read + o written (bf16) + lse written (fp32)."""
    return 2 * bsz * t * NUM_Q_HEADS * HEAD_DIM * ELEM_BYTES + bsz * NUM_Q_HEADS * t * 4


def kv_bytes(tokens: int) -> int:
    """K and V bytes of ``tokens`` positions of one KV head."""
    return 2 * tokens * HEAD_DIM * ELEM_BYTES


def base_params(**kw) -> dict:
    """A kernel row's params: the geometry and every knob (None where the op has none), with
    ``kw`` set."""
    p = {
        "context_len": None,
        "num_query_tokens": None,
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "batch": None,
        "mode": None,
        "group_size": None,
        "overlap": None,
        "top_n": None,
        "block_size": None,
        "dtype": "bfloat16",
    }
    p.update(kw)
    return p
