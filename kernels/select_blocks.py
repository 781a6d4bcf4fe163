"""Block metadata and top-n block selection for sparse verification.

Seed 001 §3.1 scores each KV block with the query of the first draft token against the block's
mean key (eq. 5) and keeps the first and last blocks unconditionally (attention sink, locality).
Seed 004 appendix A.1 extends Quest's channel-wise min/max keys to GQA by scoring with one
representative query per KV head. Both are implemented here (``block_scores``: ``mean`` and
``quest``) with the GQA-averaged query, on :mod:`kernels.block_metadata`'s per-block key
summaries (the scoring: :mod:`kernels.block_scores`). ``select_blocks`` runs the scoring and
one ``kernels.top_blocks`` launch on the scores (forced blocks, ascending output; with
``tile_pick`` the scoring also writes each score tile's maximum, which the pick reads instead of
whole rows), or both in one launch (``fused=True``);
:mod:`kernels.select_reference` holds the fp32 torch references.
"""

from __future__ import annotations

import torch
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.block_scores import (
    ScoreLaunch,
    block_scores,
    launch_fitted,
    score_block_nb,
    scores_and_tile_max,
)
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import LaunchChain, check_pdl
from ssvkit.kernels.select_kernels import select_kernel
from ssvkit.kernels.top_blocks import (
    check_forced,
    check_relative,
    relative_slots,
    threshold_meta,
    threshold_warps,
    top_blocks,
)
from ssvkit.perfmodel.pick_work import pow2, tile_pick_pays
from triton.runtime.errors import OutOfResources

__all__ = ["block_scores", "select_blocks"]


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
    positions: torch.Tensor | None = None,
    window: int = 0,
    tile_pick: bool | None = None,
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
        the same blocks. The one launch saves a launch but runs its pick rows on the scoring's
        few places an SM: on the H200 it takes 1.05-1.66x the two launches' time (medians by
        draft rows and batch; 0.88x at best, up to 4x at 64 rows and batch 16) over the
        calibration rows of both (``calibration/profiles/h200/kernel_bench.jsonl``), so
        False is the default.
    pdl : bool
        Launch the pick as a programmatic dependent of the scoring (``kernels.pdl``; compute
        capability 9.0 or later): the same blocks, one launch gap less.
    positions, window :
        The position-relative rule instead of the prefix rule (``kernels.top_blocks.
        relative_slots``; ``num_local`` 0): ``[B, t]`` int64 absolute positions of the rows and
        the local window in tokens.
    tile_pick : bool, optional
        In the two launches, the scoring also writes each score tile's maximum and
        ``kernels.top_blocks``' tile pick reads the maxima and the few tiles that can hold a
        pick instead of whole score rows: the same blocks. None: where
        ``perfmodel.pick_work.tile_pick_pays`` says it pays (long rows, more rows than SMs).

    Returns
    -------
    torch.Tensor
        ``[B, Hkv, t, top_n]`` int32, ascending per row, ``-1`` padding at the end when a
        sequence has fewer than ``top_n`` live blocks; with ``positions`` the window's
        ``relative_slots`` blocks follow each row's picks.
    """
    if top_n < 1 or top_n >= 2**30:
        raise ValueError(f"top_n must be in [1, 2^30), got {top_n}")
    check_forced(num_sink, num_local, top_n)
    if positions is not None and first_token_only:
        raise ValueError("positions and first_token_only exclude each other")
    if positions is not None:
        check_relative(positions, window, meta.block_size, num_local, q.shape[:2], q.device)
    if pdl:
        check_pdl(q.device)
    chain = LaunchChain(pdl)
    rows = q[:, :1] if first_token_only else q
    pick = threshold_meta(meta.num_blocks, top_n) if fused else None
    if pick is None:
        if tile_pick is None:
            tile_pick = _tile_pick_pays(rows, meta, top_n, num_sink, num_local, method)
        if tile_pick:
            scores, tile_max = scores_and_tile_max(
                rows, meta, prefix_lens, method=method, chain=chain
            )
        else:
            scores = block_scores(rows, meta, prefix_lens, method=method, chain=chain)
            tile_max = None
        idx = top_blocks(
            scores,
            prefix_lens,
            block_size=meta.block_size,
            top_n=top_n,
            num_sink=num_sink,
            num_local=num_local,
            chain=chain,
            positions=positions,
            window=window,
            tile_max=tile_max,
        )
    else:
        forced = (num_sink, num_local)
        relative = (positions, window)
        try:
            idx = _select_one_launch(rows, meta, prefix_lens, method, forced, relative, pick, chain)
        except OutOfResources as e:
            raise ValueError(
                f"select_blocks(fused=True) does not fit the SM's shared memory at head_dim "
                f"{q.shape[3]} with {rows.shape[1]} rows ({method}); use fused=False"
            ) from e
    if first_token_only:
        idx = idx.expand(-1, -1, q.shape[1], -1).contiguous()
    return idx


def _tile_pick_pays(
    rows: torch.Tensor, meta: BlockMetadata, top_n: int, num_sink: int, num_local: int, method: str
) -> bool:
    """``perfmodel.pick_work.tile_pick_pays`` for the score rows of ``rows`` (``[B, t, H,
    D]`` queries) at the scoring's tile width."""
    b, t, _, d = rows.shape
    width = score_block_nb(max(16, pow2(t)), d, method)
    n_rows = b * meta.shape[1] * t
    return tile_pick_pays(
        n_rows, meta.num_blocks, top_n, num_sink, num_local, width, num_sms(rows.device)
    )


def _select_one_launch(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    method: str,
    forced: tuple[int, int],
    relative: tuple[torch.Tensor | None, int],
    pick: dict,
    chain: LaunchChain,
) -> torch.Tensor:
    """``select_kernel``: ``score_programs`` programs per (sequence, KV head) score, one per
    row picks (``pick``: the threshold pick's constexprs; ``relative``: the rows' positions
    and the window, or None), on ``1 + 2 B Hkv`` arrival counters. Its warps are the more of
    the two steps' own."""

    def launch_one(launch: ScoreLaunch) -> torch.Tensor:
        b, hkv, t, _ = launch.scores.shape
        rows = b * hkv * t
        positions, window = relative
        local = 0 if positions is None else relative_slots(window, meta.block_size)
        out = torch.empty((b, hkv, t, pick["TOP_N"] + local), dtype=torch.int32, device=q.device)
        scratch = torch.empty((rows, pick["CAP"]), dtype=torch.int64, device=q.device)
        counters = arrival_counters(1 + 2 * b * hkv, q.device)
        pick_warps = threshold_warps(rows, pick["CHUNK"], q.device)
        q_, mean, kmin, kmax, lens, scores, *rest = launch.args
        with chain.attempt():
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
                prefix_lens if positions is None else positions,
                *rest,
                *forced,
                window,
                launch.programs,
                NUM_KV_HEADS=hkv,
                **launch.meta,
                **pick,
                LOCAL_SLOTS=local,
                **chain.meta(),
                num_warps=max(launch.num_warps, pick_warps),
            )
        return out

    return launch_fitted("select", launch_one, q, meta, prefix_lens, method)
