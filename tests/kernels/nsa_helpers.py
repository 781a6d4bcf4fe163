"""Inputs of the NSA kernel tests (``test_nsa_verify``, ``test_nsa_fold``): random ragged
shapes at a scaled-down NSA geometry, NaN wherever a correct kernel must not read."""

from __future__ import annotations

import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.nsa_verify import compress_kv
from ssvkit.kernels.tree import ancestor_bitmask, batch_parents
from ssvkit.perfmodel.acceptance import chain_parents

DEV = "cuda" if HAS_CUDA else "cpu"
CPU_DTYPES = [torch.float16, torch.float32]
# NSA-like geometry scaled down: blocks of 16, windows of 16 every 8 tokens.
NSA_KW = dict(top_n=4, block_size=16, window=24, comp_block=16, comp_stride=8)
# NSA's published geometry (l = 32, d = 16, l' = 64, n = 16, w = 512) for GPU and heuristics.
GPU_KW = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)


def tree_parents(bsz: int, t: int, tree: str) -> torch.Tensor:
    if tree == "chain":
        return batch_parents(chain_parents(t), bsz)
    # A binary tree in BFS order (node i hangs under (i - 1) // 2): branching at every level.
    heap = [-1] + [(i - 1) // 2 for i in range(1, t)]
    return torch.tensor(heap, dtype=torch.int32).expand(bsz, t).contiguous()


def random_block_idx(prefix_lens, hkv, t, top_n, block_size, gen) -> torch.Tensor:
    """Each row picks up to ``top_n`` distinct prefix blocks, in random slot order with ``-1``
    holes, from a small per-head pool so that neighbouring rows overlap."""
    idx = torch.full((len(prefix_lens), hkv, t, top_n), -1, dtype=torch.int32)
    for b, length in enumerate(prefix_lens):
        nb = -(-length // block_size)
        for h in range(hkv):
            pool = torch.randperm(nb, generator=gen)[: top_n + 2]
            for i in range(t):
                n = int(torch.randint(0, min(top_n, len(pool)) + 1, (1,), generator=gen))
                chosen = pool[torch.randperm(len(pool), generator=gen)[:n]]
                slots = torch.randperm(top_n, generator=gen)[:n]
                idx[b, h, i, slots] = chosen.to(torch.int32)
    return idx


def make_inputs(prefix_lens, t, h, hkv, d, dtype, *, tree="tree", seed=0, slack=7):
    """Random ragged inputs. The cache holds ``max(prefix) + t`` positions plus ``slack`` that
    is not a multiple of any tile; positions past each ``prefix + t`` and compressed slots past
    each ``comp_lens`` hold NaN, which a correct kernel never reads."""
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    t_max = max(prefix_lens) + t + slack
    q = torch.randn((bsz, t, h, d), generator=gen).to(dtype).to(DEV)
    k = torch.randn((bsz, hkv, t_max, d), generator=gen).to(dtype).to(DEV)
    v = torch.randn((bsz, hkv, t_max, d), generator=gen).to(dtype).to(DEV)
    lens = torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)
    comp_k, comp_v, comp_lens = compress_kv(
        k, v, lens, comp_block=NSA_KW["comp_block"], comp_stride=NSA_KW["comp_stride"]
    )
    for b, length in enumerate(prefix_lens):
        k[b, :, length + t :] = float("nan")
        v[b, :, length + t :] = float("nan")
        comp_k[b, :, int(comp_lens[b]) :] = float("nan")
        comp_v[b, :, int(comp_lens[b]) :] = float("nan")
    mask = ancestor_bitmask(tree_parents(bsz, t, tree)).to(DEV)
    gates = torch.rand((bsz, t, h, 3), generator=gen).to(DEV)
    idx = random_block_idx(prefix_lens, hkv, t, NSA_KW["top_n"], NSA_KW["block_size"], gen)
    return (q, k, v, lens, mask, comp_k, comp_v, gates), idx.to(DEV)


def make_gpu_inputs(prefix_lens, t, seed):
    """Llama-3.1-8B attention geometry (32 query heads, 8 KV heads, D = 128) in bf16."""
    gen = torch.Generator().manual_seed(seed)
    bsz, h, hkv, d = len(prefix_lens), 32, 8, 128
    t_max = max(prefix_lens) + t + 3
    q = torch.randn((bsz, t, h, d), generator=gen).bfloat16().cuda()
    k = torch.randn((bsz, hkv, t_max, d), generator=gen).bfloat16().cuda()
    v = torch.randn((bsz, hkv, t_max, d), generator=gen).bfloat16().cuda()
    lens = torch.tensor(prefix_lens, dtype=torch.int32, device="cuda")
    ck, cv, _ = compress_kv(k, v, lens, comp_block=32, comp_stride=16)
    mask = ancestor_bitmask(tree_parents(bsz, t, "tree")).cuda()
    gates = torch.rand((bsz, t, h, 3), generator=gen).cuda()
    return q, k, v, lens, mask, ck, cv, gates
