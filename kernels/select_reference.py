"""The fp32 torch references of block selection (:mod:`kernels.select_blocks`): the pick
(``topn_from_scores``, ``torch.topk`` and a sort, under the prefix rule or the position-relative
one), the block scores and the whole selection straight from the key cache."""

from __future__ import annotations

import torch
from ssvkit.kernels.block_metadata import KINDS, reference_block_metadata
from ssvkit.kernels.top_blocks import check_forced, check_relative, relative_slots


def topn_from_scores(
    scores: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_size: int,
    *,
    top_n: int,
    num_sink: int = 1,
    num_local: int = 1,
    positions: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """``[B, Hkv, t, NB]`` scores -> ``[B, Hkv, t, top_n]`` int32 block ids, ascending, ``-1`` last:
    the torch reference of ``kernels.top_blocks.top_blocks`` (ties may resolve differently).

    The first ``num_sink`` and last ``num_local`` live blocks (the last one may be partial) are
    forced in by raising their score to ``+inf``, blocks past the live prefix left out by
    lowering theirs to ``-inf`` (whatever the row holds there); the rest is ``torch.topk``.
    With ``positions`` (``[B, t]``) and ``window``, the position-relative rule
    (``kernels.top_blocks.relative_slots``): the candidates end before each row's window and
    the window's blocks follow the picks. Static shapes, no host synchronisation.
    """
    check_forced(num_sink, num_local, top_n)
    nb = scores.shape[-1]
    live = ((prefix_lens.to(torch.int64) + block_size - 1) // block_size).view(-1, 1, 1, 1)
    limit = live
    if positions is not None:
        rows = (scores.shape[0], scores.shape[2])  # [B, t]
        check_relative(positions, window, block_size, num_local, rows, scores.device)
        # [B, t]: the first block of each row's window
        lo = torch.clamp(positions - window, min=0) // block_size
        limit = torch.minimum(lo[:, None, :, None], live)
    j = torch.arange(nb, device=scores.device)
    forced = ((j < num_sink) | (j >= live - num_local)) & (j < limit)
    scores = torch.where(j < limit, scores, torch.full_like(scores, float("-inf")))
    scores = torch.where(forced, torch.full_like(scores, float("inf")), scores)
    if nb < top_n:
        pad = scores.new_full((*scores.shape[:-1], top_n - nb), float("-inf"))
        scores = torch.cat([scores, pad], dim=-1)
    vals, idx = torch.topk(scores, top_n, dim=-1)
    # Dead picks (score -inf: fewer live blocks than top_n) sort last, then become -1.
    big = torch.iinfo(torch.int64).max
    idx = torch.where(vals == float("-inf"), torch.full_like(idx, big), idx)
    idx = torch.sort(idx, dim=-1).values
    idx = torch.where(idx == big, torch.full_like(idx, -1), idx).to(torch.int32)
    if positions is None:
        return idx
    return torch.cat([idx, _window_blocks(positions, live, window, block_size, idx.shape)], -1)


def _window_blocks(positions, live, window: int, block_size: int, shape) -> torch.Tensor:
    """``[B, Hkv, t, relative_slots]`` int32: the blocks from the one holding ``p - window``
    on that begin before ``p`` and inside the prefix, ``-1`` for the others."""
    lo = torch.clamp(positions - window, min=0) // block_size  # [B, t]
    hi = torch.div(positions - 1, block_size, rounding_mode="floor")  # last block before p
    local = lo[..., None] + torch.arange(relative_slots(window, block_size), device=lo.device)
    ok = (local <= hi[..., None]) & (local < live.view(-1, 1, 1))
    local = torch.where(ok, local, -1).to(torch.int32)[:, None]
    return local.expand(shape[0], shape[1], shape[2], -1)


def reference_block_scores(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_size: int,
    *,
    method: str = "mean",
) -> torch.Tensor:
    """fp32 torch ``block_scores`` computed straight from the key cache."""
    meta = reference_block_metadata(k_cache, prefix_lens, block_size)
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
    qbar = q.float().view(b, t, hkv, h // hkv, d).mean(3).transpose(1, 2)  # [B, Hkv, t, D]
    if method == "mean":
        s = qbar @ meta["mean"].transpose(-1, -2)
    elif method == "quest":
        q4 = qbar.unsqueeze(3)  # [B, Hkv, t, 1, D]
        lo, hi = meta["kmin"].unsqueeze(2), meta["kmax"].unsqueeze(2)
        s = torch.maximum(q4 * lo, q4 * hi).sum(-1)
    else:
        raise ValueError(f"method must be one of {KINDS}, got {method!r}")
    nb = s.shape[-1]
    live = torch.arange(nb, device=q.device)[None, :] * block_size < prefix_lens[:, None].long()
    return torch.where(live.view(b, 1, 1, nb), s, torch.full_like(s, float("-inf")))


def reference_select_blocks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_size: int,
    *,
    top_n: int,
    method: str = "mean",
    num_sink: int = 1,
    num_local: int = 1,
    first_token_only: bool = False,
) -> torch.Tensor:
    """fp32 torch ``select_blocks`` computed straight from the key cache."""
    rows = q[:, :1] if first_token_only else q
    s = reference_block_scores(rows, k_cache, prefix_lens, block_size, method=method)
    idx = topn_from_scores(
        s, prefix_lens, block_size, top_n=top_n, num_sink=num_sink, num_local=num_local
    )
    return idx.expand(-1, -1, q.shape[1], -1).contiguous() if first_token_only else idx
