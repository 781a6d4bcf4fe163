"""Block metadata and top-n block selection for sparse verification.

Seed 001 §3.1 scores each KV block with the query of the first draft token against the block's
mean key (eq. 5) and keeps the first and last blocks unconditionally (attention sink, locality).
Seed 004 appendix A.1 extends Quest's channel-wise min/max keys to GQA by scoring with one
representative query per KV head. Both are implemented here with the GQA-averaged query (the mean
of a KV head's ``G`` query heads):

- ``mean``:  ``s[b, h, i, n] = qbar[b, i, h] . mean_k[b, h, n]``
- ``quest``: ``s[b, h, i, n] = sum_d max(qbar_d * min_k[n, d], qbar_d * max_k[n, d])``, computed
  as ``relu(qbar) . max_k + min(qbar, 0) . min_k`` so that both terms are matrix products.

Metadata lives on the device as ``[B, Hkv, NB_max, D]`` float32 tensors, ``NB_max =
ceil(T_max / block_size)``; a partial last block is summarised over its present tokens only.
``BlockMetadata.update`` refreshes just the blocks touched by appended (or rolled-back) tokens,
reading the lengths on the device, so the decode loop can capture it in a CUDA graph.

``select_blocks`` runs ``block_scores`` and one ``kernels.top_blocks`` launch on the score
tensor (forced blocks, ascending output); with ``fused=True`` it scores and picks in one launch
(``kernels.select_kernels.select_kernel``: the programs that pick a row wait on counters for its
scores) where ``kernels.top_blocks``' threshold pick serves the rows. The kernel sweep times
both (``impl``); the two launches stay the default until the one launch measures faster.
``pdl=True`` makes the pick a programmatic dependent launch of the scoring (``kernels.pdl``):
it starts while the scoring drains; the same blocks either way.
``topn_from_scores`` is the pick's fp32 torch reference (``torch.topk`` and a sort).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.checks import check_float_dtype, check_lens
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import LaunchChain, chain_for, check_pdl
from ssvkit.kernels.select_kernels import (
    block_metadata_kernel,
    block_scores_kernel,
    select_kernel,
)
from ssvkit.kernels.top_blocks import (
    check_forced,
    empty_scores,
    threshold_meta,
    threshold_warps,
    top_blocks,
)

KINDS = ("mean", "quest")
# Programs per (b, kv head) in ``update``: an append of up to 64 draft tokens + 1 bonus token
# touches at most ceil(65 / block_size) + 1 blocks; programs loop if more are touched.
_APPEND_TOKENS_HINT = 65
# Scores are fp32-accurate dots: three tf32 MMA passes (``tf32x3``, ~2^-21 relative) on the GPU,
# FMA ("ieee") in the interpreter. A [T_PAD, 32] score tile (16 blocks at t > 32) keeps the
# operands spill-free on sm_90 (2 warps up to t = 16, 8 above).
_SCORE_TILE = 1024


def _check_k_cache(k_cache: torch.Tensor, block_size: int) -> None:
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [B, Hkv, T_max, D], got shape {tuple(k_cache.shape)}")
    check_float_dtype("k_cache", k_cache)
    if not k_cache.is_contiguous():
        raise ValueError("k_cache must be contiguous")
    d = k_cache.shape[3]
    if d < 16 or d & (d - 1):
        raise ValueError(f"k_cache head_dim must be a power of two >= 16, got {d}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size}")


@dataclasses.dataclass(frozen=True, slots=True)
class BlockMetadata:
    """Per-block key summaries ``[B, Hkv, NB_max, D]`` float32 for block selection.

    Attributes
    ----------
    block_size : int
        Tokens per block.
    mean : torch.Tensor or None
        Mean key of each block (seed 001 eq. 5); present when ``"mean"`` was built.
    kmin, kmax : torch.Tensor or None
        Channel-wise min/max keys (Quest); present when ``"quest"`` was built.

    The tensors are updated in place by ``update``, so a captured CUDA graph that reads them sees
    the refreshed values.
    """

    block_size: int
    mean: torch.Tensor | None
    kmin: torch.Tensor | None
    kmax: torch.Tensor | None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, t in (("mean", self.mean), ("quest", self.kmin)) if t is not None)

    @property
    def num_blocks(self) -> int:
        return self._any().shape[2]

    def _any(self) -> torch.Tensor:
        return self.mean if self.mean is not None else self.kmin

    @classmethod
    def build(
        cls,
        k_cache: torch.Tensor,
        prefix_lens: torch.Tensor,
        block_size: int,
        kinds: tuple[str, ...] = ("mean",),
    ) -> BlockMetadata:
        """Summarise every block of ``k_cache[b, :, :prefix_lens[b]]``.

        Parameters
        ----------
        k_cache : torch.Tensor
            ``[B, Hkv, T_max, D]`` fp16/bf16/fp32, contiguous.
        prefix_lens : torch.Tensor
            ``[B]`` int32 on the device of ``k_cache``.
        block_size : int
            Tokens per block (a power of two).
        kinds : tuple of str
            Any of ``"mean"`` (mean keys) and ``"quest"`` (min/max keys).

        Returns
        -------
        BlockMetadata
            Tensors ``[B, Hkv, ceil(T_max / block_size), D]`` float32. Blocks past the prefix
            hold unspecified values; scoring masks them.
        """
        _check_k_cache(k_cache, block_size)
        kinds = tuple(kinds)
        if not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
        b, hkv, t_max, d = k_cache.shape
        check_lens(prefix_lens, b, k_cache.device, "prefix_lens")
        nb = triton.cdiv(t_max, block_size)

        def alloc() -> torch.Tensor:
            return torch.zeros((b, hkv, nb, d), dtype=torch.float32, device=k_cache.device)

        meta = cls(
            block_size=block_size,
            mean=alloc() if "mean" in kinds else None,
            kmin=alloc() if "quest" in kinds else None,
            kmax=alloc() if "quest" in kinds else None,
        )
        meta._launch(k_cache, torch.zeros_like(prefix_lens), prefix_lens, num_progs=nb)
        return meta

    def update(self, k_cache: torch.Tensor, old_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Refresh, in place, the blocks spanned by positions ``[min(old, new), max(old, new))``.

        Reads the lengths on the device (no host synchronisation); launches
        ``B * Hkv * (ceil(65 / block_size) + 1)`` programs that loop over the touched blocks, so
        any append length is handled and the common one (a verification round) takes one pass.

        Parameters
        ----------
        k_cache : torch.Tensor
            The cache the metadata was built from, with the new keys already written.
        old_lens, new_lens : torch.Tensor
            ``[B]`` int32: the prefix lengths the metadata currently describes, and the new ones.
        """
        _check_k_cache(k_cache, self.block_size)
        ref = self._any()
        b, hkv, t_max, d = k_cache.shape
        if (b, hkv, triton.cdiv(t_max, self.block_size), d) != tuple(ref.shape):
            raise ValueError(
                f"k_cache shape {tuple(k_cache.shape)} does not match metadata {tuple(ref.shape)}"
            )
        check_lens(old_lens, b, k_cache.device, "old_lens")
        check_lens(new_lens, b, k_cache.device, "new_lens")
        num_progs = triton.cdiv(_APPEND_TOKENS_HINT, self.block_size) + 1
        self._launch(k_cache, old_lens, new_lens, num_progs=min(num_progs, ref.shape[2]))

    def _launch(
        self, k_cache: torch.Tensor, old_lens: torch.Tensor, new_lens: torch.Tensor, num_progs: int
    ) -> None:
        ref = self._any()
        b, hkv, _, d = k_cache.shape
        block_metadata_kernel[(b * hkv, num_progs)](
            k_cache,
            old_lens,
            new_lens,
            self.mean if self.mean is not None else ref,
            self.kmin if self.kmin is not None else ref,
            self.kmax if self.kmax is not None else ref,
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            ref.stride(0),
            ref.stride(1),
            ref.stride(2),
            hkv,
            k_cache.shape[2],
            NUM_PROGS=num_progs,
            BLOCK_SIZE=self.block_size,
            D=d,
            HAS_MEAN=self.mean is not None,
            HAS_MINMAX=self.kmin is not None,
        )


def _check_q(q: torch.Tensor, meta: BlockMetadata) -> None:
    ref = meta._any()
    if q.dim() != 4:
        raise ValueError(f"q must be [B, t, H, D], got shape {tuple(q.shape)}")
    check_float_dtype("q", q)
    if q.stride(3) != 1:
        raise ValueError("q must have a contiguous last dimension")
    b, t, h, d = q.shape
    if b != ref.shape[0] or d != ref.shape[3] or h % ref.shape[1] != 0:
        raise ValueError(
            f"q shape {tuple(q.shape)} does not fit metadata [B, Hkv, NB, D]={tuple(ref.shape)}"
        )
    if q.device != ref.device:
        raise ValueError(f"q must be on {ref.device}, got {q.device}")
    if not 1 <= t <= 64:
        raise ValueError(f"q has t={t} rows; 1..64 are supported")


def block_scores(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    *,
    method: str = "mean",
    chain: LaunchChain | None = None,
) -> torch.Tensor:
    """Score every block of every KV head for every query row.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]``; the ``G = H / Hkv`` query heads of a KV head are averaged in fp32.
    meta : BlockMetadata
        Built with the kind ``method`` needs.
    prefix_lens : torch.Tensor
        ``[B]`` int32; block ``n`` is live when ``n * block_size < prefix_lens[b]``.
    method : str
        ``"mean"`` (seed 001 eq. 5) or ``"quest"`` (seed 004 A.1).
    chain : LaunchChain, optional
        The calling op's launches (``kernels.pdl``), of which this one is the next.

    Returns
    -------
    torch.Tensor
        ``[B, Hkv, t, NB_max]`` float32, ``-inf`` for blocks past the prefix.
    """
    launch = _score_launch(q, meta, prefix_lens, method)
    b, hkv = q.shape[0], launch.scores.shape[1]
    block_scores_kernel[(launch.programs, hkv, b)](
        *launch.args, **launch.meta, **chain_for(chain).meta(), num_warps=launch.num_warps
    )
    return launch.scores


@dataclasses.dataclass(frozen=True, slots=True)
class _ScoreLaunch:
    """The scoring's output, its programs per (sequence, KV head), and the arguments,
    constexprs and warps ``score_range`` takes (either kernel of ``kernels.select_kernels``)."""

    scores: torch.Tensor
    programs: int
    args: tuple
    meta: dict
    num_warps: int


def _score_launch(
    q: torch.Tensor, meta: BlockMetadata, prefix_lens: torch.Tensor, method: str
) -> _ScoreLaunch:
    if method not in KINDS:
        raise ValueError(f"method must be one of {KINDS}, got {method!r}")
    if method not in meta.kinds:
        raise ValueError(f"meta was built without {method!r}; it has {meta.kinds}")
    _check_q(q, meta)
    b, t, h, d = q.shape
    _, hkv, nb, _ = meta._any().shape
    check_lens(prefix_lens, b, q.device, "prefix_lens")
    out = empty_scores(b, hkv, t, nb, q.device)
    t_pad = max(16, triton.next_power_of_2(t))
    block_nb = min(32, _SCORE_TILE // t_pad)
    tiles = _score_tiles(triton.cdiv(nb, block_nb) * hkv * b, q.device)
    ref = meta._any()
    args = (
        q,
        meta.mean if method == "mean" else ref,
        meta.kmin if method == "quest" else ref,
        meta.kmax if method == "quest" else ref,
        prefix_lens,
        out,
    )
    strides = (*q.stride()[:3], *ref.stride()[:3], *out.stride()[:3])
    constexprs = dict(
        G=h // hkv,
        T_PAD=t_pad,
        BLOCK_NB=block_nb,
        TILES=tiles,
        D=d,
        BLOCK_SIZE=meta.block_size,
        QUEST=method == "quest",
        PRECISION="tf32x3" if q.device.type == "cuda" else "ieee",
    )
    return _ScoreLaunch(
        out,
        triton.cdiv(nb, block_nb * tiles),
        (*args, *strides, t, nb),
        constexprs,
        2 if t_pad <= 16 else 8,
    )


def _score_tiles(num_tiles: int, device: torch.device) -> int:
    """Score tiles per program: the most (up to 16) that still leave two programs per SM, so
    a large batch amortises each program's query average over many tiles and a small one keeps
    every SM busy."""
    sms = num_sms(device)
    tiles = 16
    while tiles > 1 and triton.cdiv(num_tiles, tiles) < 2 * sms:
        tiles //= 2
    return tiles


def topn_from_scores(
    scores: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_size: int,
    *,
    top_n: int,
    num_sink: int = 1,
    num_local: int = 1,
) -> torch.Tensor:
    """``[B, Hkv, t, NB]`` scores -> ``[B, Hkv, t, top_n]`` int32 block ids, ascending, ``-1`` last:
    the torch reference of ``kernels.top_blocks.top_blocks`` (ties may resolve differently).

    The first ``num_sink`` and last ``num_local`` live blocks (the last one may be partial) are
    forced in by raising their score to ``+inf``; the rest is ``torch.topk``. Static shapes, no
    host synchronisation.
    """
    check_forced(num_sink, num_local, top_n)
    nb = scores.shape[-1]
    live = ((prefix_lens.to(torch.int64) + block_size - 1) // block_size).view(-1, 1, 1, 1)
    j = torch.arange(nb, device=scores.device)
    forced = ((j < num_sink) | (j >= live - num_local)) & (j < live)
    scores = torch.where(forced, torch.full_like(scores, float("inf")), scores)
    if nb < top_n:
        pad = scores.new_full((*scores.shape[:-1], top_n - nb), float("-inf"))
        scores = torch.cat([scores, pad], dim=-1)
    vals, idx = torch.topk(scores, top_n, dim=-1)
    # Dead picks (score -inf: fewer live blocks than top_n) sort last, then become -1.
    big = torch.iinfo(torch.int64).max
    idx = torch.where(vals == float("-inf"), torch.full_like(idx, big), idx)
    idx = torch.sort(idx, dim=-1).values
    return torch.where(idx == big, torch.full_like(idx, -1), idx).to(torch.int32)


def select_blocks(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    *,
    top_n: int,
    method: str = "mean",
    num_sink: int = 1,
    num_local: int = 1,
    first_token_only: bool = False,
    fused: bool = False,
    pdl: bool = False,
) -> torch.Tensor:
    """Top-n prefix blocks per (sequence, KV head, query row).

    Parameters
    ----------
    q : torch.Tensor
        ``[B, t, H, D]`` verifier queries.
    meta : BlockMetadata
        Block summaries of the prefix.
    prefix_lens : torch.Tensor
        ``[B]`` int32.
    top_n : int
        Blocks per row, forced ones included.
    method : str
        ``"mean"`` or ``"quest"`` (see ``block_scores``).
    num_sink, num_local : int
        First / last live blocks always selected (seed 001 §3.1).
    first_token_only : bool
        Seed 001's rule: row 0 (the first draft token) selects for every row.
    fused : bool
        Score and pick in one launch (``kernels.select_kernels.select_kernel``) where the
        threshold pick serves the rows (``kernels.top_blocks.threshold_meta``); False, or rows
        it does not serve: the scores, then ``kernels.top_blocks`` (two launches). Both pick
        the same blocks.
    pdl : bool
        Launch the pick as a programmatic dependent of the scoring (``kernels.pdl``; compute
        capability 9.0 or later): the same blocks, one launch gap less.

    Returns
    -------
    torch.Tensor
        ``[B, Hkv, t, top_n]`` int32, ascending per row, ``-1`` padding at the end when a
        sequence has fewer than ``top_n`` live blocks.
    """
    if top_n < 1 or top_n >= 2**30:
        raise ValueError(f"top_n must be in [1, 2^30), got {top_n}")
    check_forced(num_sink, num_local, top_n)
    if pdl:
        check_pdl(q.device)
    chain = LaunchChain(pdl)
    rows = q[:, :1] if first_token_only else q
    pick = threshold_meta(meta.num_blocks, top_n) if fused else None
    if pick is None:
        scores = block_scores(rows, meta, prefix_lens, method=method, chain=chain)
        idx = top_blocks(
            scores,
            prefix_lens,
            block_size=meta.block_size,
            top_n=top_n,
            num_sink=num_sink,
            num_local=num_local,
            chain=chain,
        )
    else:
        forced = (num_sink, num_local)
        idx = _select_one_launch(rows, meta, prefix_lens, method, forced, pick, chain)
    if first_token_only:
        idx = idx.expand(-1, -1, q.shape[1], -1).contiguous()
    return idx


def _select_one_launch(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    method: str,
    forced: tuple[int, int],
    pick: dict,
    chain: LaunchChain,
) -> torch.Tensor:
    """``select_kernel``: ``score_programs`` programs per (sequence, KV head) score, one per
    row picks (``pick``: the threshold pick's constexprs), on ``1 + 2 B Hkv`` arrival
    counters. Its warps are the more of the two steps' own."""
    launch = _score_launch(q, meta, prefix_lens, method)
    b, hkv, t, _ = launch.scores.shape
    rows = b * hkv * t
    out = torch.empty((b, hkv, t, pick["TOP_N"]), dtype=torch.int32, device=q.device)
    scratch = torch.empty((rows, pick["CAP"]), dtype=torch.int64, device=q.device)
    counters = arrival_counters(1 + 2 * b * hkv, q.device)
    pick_warps = threshold_warps(rows, pick["CHUNK"], q.device)
    q_, mean, kmin, kmax, lens, scores, *rest = launch.args
    select_kernel[(b * hkv * (launch.programs + t),)](
        q_,
        mean,
        kmin,
        kmax,
        lens,
        scores,
        out,
        scratch,
        counters,
        *rest,
        *forced,
        launch.programs,
        NUM_KV_HEADS=hkv,
        **launch.meta,
        **pick,
        **chain.meta(),
        num_warps=max(launch.num_warps, pick_warps),
    )
    return out


def reference_block_metadata(
    k_cache: torch.Tensor, prefix_lens: torch.Tensor, block_size: int
) -> dict[str, torch.Tensor]:
    """fp32 torch mean/min/max keys ``[B, Hkv, NB_max, D]``; blocks past the prefix are 0."""
    b, hkv, t_max, d = k_cache.shape
    nb = -(-t_max // block_size)
    k = torch.zeros((b, hkv, nb * block_size, d), dtype=torch.float32, device=k_cache.device)
    k[:, :, :t_max] = k_cache.float()
    pos = torch.arange(nb * block_size, device=k_cache.device)
    valid = (pos[None, :] < prefix_lens[:, None].long()).view(b, 1, nb, block_size, 1)
    k = k.view(b, hkv, nb, block_size, d)
    count = valid.sum(3).clamp(min=1).float()
    any_valid = valid.any(3)
    kmin = torch.where(valid, k, torch.full_like(k, float("inf"))).amin(3)
    kmax = torch.where(valid, k, torch.full_like(k, float("-inf"))).amax(3)
    return {
        "mean": torch.where(valid, k, torch.zeros_like(k)).sum(3) / count,
        "kmin": torch.where(any_valid, kmin, torch.zeros_like(kmin)),
        "kmax": torch.where(any_valid, kmax, torch.zeros_like(kmax)),
    }


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
