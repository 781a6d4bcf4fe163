"""Top-n block pick per score row, in one Triton launch: the last step of both block
selections (:mod:`kernels.select_blocks` from block metadata, the NSA refresh path of
:mod:`kernels.nsa_verify` from compressed attention).

One program per ``[B, Hkv, t]`` row of ``[.., NB_max]`` fp32 scores picks the row's ``top_n``
best blocks of its prefix's ``ceil(prefix / block_size)`` live blocks, the first ``num_sink``
and last ``num_local`` forced in, ties to the lower block, and writes them ascending with ``-1``
padding when fewer blocks are live, with no host synchronisation. Two kernels make the same pick
(``top_blocks`` says which serves a row); they are :mod:`kernels.top_blocks_kernels`', and this
module plans and launches them. ``kernels.select_reference.topn_from_scores`` is the reference.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import triton
from ssvkit.kernels.checks import check_lens
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import LaunchChain, chain_for
from ssvkit.kernels.tile_pick_kernels import tile_pick_kernel
from ssvkit.kernels.top_blocks_kernels import threshold_blocks_kernel, topk_blocks_kernel
from ssvkit.perfmodel import pick_work

# Score rows start at multiples of this many floats. Triton 3.6's LLVM (SLP vectorizer) aborts
# compiling the threshold pick for some rows of unaligned length.
ROW_ALIGN = 16
# Blocks of one row the kernel holds in registers at once, and a row's layout in chunks: the
# plan's own (``perfmodel.pick_work``), which the cost model prices.
TOPK_CHUNK = pick_work.TOPK_CHUNK
_row_layout = pick_work.row_layout
# The tile pick's plan (``perfmodel.pick_work``), which the cost model prices too.
tile_pick_meta = pick_work.tile_pick_plan
# The threshold pick (``threshold_blocks_kernel``) serves rows that fit in registers with
# ``top_n`` up to this. Its strided groups number ``GROUPS_PER_PICK`` per padded pick (at least
# ``MIN_GROUPS``): more groups raise the bound towards the exact cut, so fewer candidates pass
# it, but make the pick among the group maxima longer. Random scores leave about 1.4 ``top_n``
# candidates at two groups a pick, so ``CANDIDATES_PER_PICK`` = 2 holds them with room to
# spare; a row with more falls back to the rounds.
THRESHOLD_MAX_TOP_N = 256
GROUPS_PER_PICK = 2
MIN_GROUPS = 64
CANDIDATES_PER_PICK = 2


def top_blocks(
    scores: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    block_size: int,
    top_n: int,
    num_sink: int = 1,
    num_local: int = 1,
    chain: LaunchChain | None = None,
    num_warps: int | None = None,
    positions: torch.Tensor | None = None,
    window: int = 0,
    tile_max: TileMax | None = None,
) -> torch.Tensor:
    """Pick the ``top_n`` best live blocks of every score row, one program per row.

    Three kernels make the same pick. With ``tile_max``, ``tile_pick_kernel`` reads the
    maxima and only the tiles that can hold a pick. ``threshold_blocks_kernel`` (rows that fit
    in registers, ``top_n`` up to ``THRESHOLD_MAX_TOP_N``: ``threshold_meta``) bounds the
    answer by the ``top_n``-th largest maximum of strided groups, compacts the few blocks
    above it and cuts them exactly: work linear in the row. ``topk_blocks_kernel`` takes one
    max-reduction over the row per pick: longer rows, larger ``top_n``, and the threshold
    kernel's fallback when scores defeat its groups.

    Parameters
    ----------
    scores : torch.Tensor
        ``[B, Hkv, t, NB_max]`` fp32. Scores from ``empty_scores`` are read in place; other
        layouts are copied first.
    prefix_lens : torch.Tensor
        ``[B]`` int32; sets each sequence's ``ceil(prefix / block_size)`` live blocks.
    block_size : int
        Tokens per block.
    top_n : int
        Blocks per row, forced ones included, in ``[1, 2^30)``.
    num_sink, num_local : int
        First / last live blocks always picked.
    chain : LaunchChain, optional
        The calling op's launches (``kernels.pdl``), of which this pick is the next.
    num_warps : int, optional
        A row program's warps (a power of two; default ``threshold_warps``' or the rounds
        kernel's rule); the pick is the same for any.
    positions, window :
        The position-relative rule (``relative_slots``): ``[B, t]`` absolute positions of the
        rows and the local window in tokens.
    tile_max : TileMax, optional
        The maxima of the rows' tiles, written with the scores (``kernels.block_scores``):
        the tile pick (``tile_pick_kernel``) then serves the rows ``tile_pick_meta`` takes,
        reading the maxima and the few tiles that can hold a pick instead of whole rows.

    Returns
    -------
    torch.Tensor
        ``[B, Hkv, t, top_n]`` int32 block ids, ascending, ``-1`` padded; with ``positions``,
        ``[B, Hkv, t, top_n + relative_slots(window, block_size)]``: the picks, then the
        window's blocks.
    """
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two >= 1, got {num_warps}")
    if scores.dim() != 4 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be [B, Hkv, t, NB] float32, got {tuple(scores.shape)}")
    if top_n < 1 or top_n >= 2**30:
        raise ValueError(f"top_n must be in [1, 2^30), got {top_n}")
    check_forced(num_sink, num_local, top_n)
    b, hkv, t, nb_max = scores.shape
    check_lens(prefix_lens, b, scores.device, "prefix_lens")
    local = check_relative(positions, window, block_size, num_local, (b, t), scores.device)
    pos = prefix_lens if positions is None else positions
    scores = _aligned_rows(scores)
    out = torch.empty((b, hkv, t, top_n + local), dtype=torch.int32, device=scores.device)
    if out.numel() == 0:
        return out
    r = _PickRows(
        scores,
        prefix_lens,
        out,
        pos,
        num_sink,
        num_local,
        window,
        block_size,
        local,
        chain_for(chain).meta(),
    )
    tiled = (
        None
        if tile_max is None
        else tile_pick_meta(nb_max, top_n, num_sink, num_local, tile_max.width)
    )
    meta = threshold_meta(nb_max, top_n)
    if tiled is not None:
        _check_tile_max(tile_max, scores)
        _launch_tile_pick(r, tile_max, tiled, num_warps)
    elif meta is not None:
        _launch_threshold_pick(r, meta, num_warps)
    else:
        _launch_rounds_pick(r, top_n, num_warps)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class TileMax:
    """The maxima of a score tensor's tiles of ``width`` consecutive blocks: ``values``,
    ``[B, Hkv, t, ceil(NB / width)]`` int32, each the largest score of its tile as the int32
    that orders like it (``kernels.tile_pick_kernels.ordered_max``)."""

    values: torch.Tensor
    width: int


def _check_tile_max(tile_max: TileMax, scores: torch.Tensor) -> None:
    b, hkv, t, nb = scores.shape
    want = (b, hkv, t, triton.cdiv(nb, tile_max.width))
    v = tile_max.values
    if tuple(v.shape) != want or v.dtype != torch.int32 or v.device != scores.device:
        raise ValueError(
            f"tile_max must be {list(want)} int32 on {scores.device}, got {list(v.shape)} "
            f"{v.dtype} on {v.device}"
        )
    if v.stride(3) != 1 or v.stride()[:3] != (hkv * t * v.stride(2), t * v.stride(2), v.stride(2)):
        raise ValueError("tile_max rows must be evenly strided with contiguous tiles")


class _PickRows(NamedTuple):
    """What every pick kernel of one ``top_blocks`` call reads and writes: the aligned
    ``[B, Hkv, t, NB_max]`` scores, the prefix lengths, the output, the rows' positions (the
    prefix lengths under the prefix rule), the forced counts, the window, the block size, the
    window's slots and the launch chain's options."""

    scores: torch.Tensor
    prefix_lens: torch.Tensor
    out: torch.Tensor
    pos: torch.Tensor
    num_sink: int
    num_local: int
    window: int
    block_size: int
    local: int
    launch: dict

    @property
    def rows(self) -> int:
        b, hkv, t, _ = self.scores.shape
        return b * hkv * t

    def row_args(self) -> tuple:
        """The positions, draft rows, row length and row stride every pick kernel takes after
        its tensors."""
        _, _, t, nb_max = self.scores.shape
        return (self.pos, t, nb_max, self.scores.stride(2))

    def constexprs(self) -> dict:
        """The constexprs and launch options every pick kernel takes."""
        return dict(
            NUM_KV_HEADS=self.scores.shape[1],
            BLOCK_SIZE=self.block_size,
            LOCAL_SLOTS=self.local,
            **self.launch,
        )


def _launch_tile_pick(r: _PickRows, tile_max: TileMax, tiled: dict, num_warps: int | None) -> None:
    """The tile pick over ``r``'s rows: the tile maxima, then the tiles that can hold a pick
    (one warp a row unless ``num_warps``)."""
    scratch = torch.empty(
        (r.rows, tiled["S_CAP"] + tiled["CAP"]), dtype=torch.int32, device=r.scores.device
    )
    tile_pick_kernel[(r.rows,)](
        r.scores,
        tile_max.values,
        r.prefix_lens,
        r.out,
        scratch,
        *r.row_args(),
        tile_max.values.stride(2),
        r.num_sink,
        r.num_local,
        r.window,
        num_warps=num_warps or 1,
        **tiled,
        **r.constexprs(),
    )


def _launch_threshold_pick(r: _PickRows, meta: dict, num_warps: int | None) -> None:
    """The threshold pick over ``r``'s rows (``threshold_meta``'s shapes; ``threshold_warps``
    a row unless ``num_warps``)."""
    scratch = torch.empty((r.rows, meta["CAP"]), dtype=torch.int64, device=r.scores.device)
    threshold_blocks_kernel[(r.rows,)](
        r.scores,
        r.prefix_lens,
        r.out,
        scratch,
        *r.row_args(),
        r.num_sink,
        r.num_local,
        r.window,
        num_warps=num_warps or threshold_warps(r.rows, meta["CHUNK"], r.scores.device),
        **meta,
        **r.constexprs(),
    )


def _launch_rounds_pick(r: _PickRows, top_n: int, num_warps: int | None) -> None:
    """The rounds kernel over ``r``'s rows: one max-reduction over the row per pick."""
    chunk, tail, num_chunks = _row_layout(r.scores.shape[3])
    topk_blocks_kernel[(r.rows,)](
        r.scores,
        r.prefix_lens,
        r.out,
        *r.row_args(),
        r.num_sink,
        r.num_local,
        r.window,
        TOP_N=top_n,
        TOP_N_PAD=max(16, triton.next_power_of_2(top_n)),
        CHUNK=chunk,
        TAIL=tail,
        NUM_CHUNKS=num_chunks,
        num_warps=num_warps or _warps(r.rows, chunk + tail, r.scores.device),
        **r.constexprs(),
    )


def empty_scores(
    batch: int, num_kv_heads: int, num_rows: int, num_blocks: int, device: torch.device
) -> torch.Tensor:
    """An fp32 ``[B, Hkv, t, NB]`` score tensor whose rows start 64-byte aligned (row stride
    a multiple of ``ROW_ALIGN``): what ``top_blocks`` reads without a copy."""
    stride = triton.cdiv(max(num_blocks, 1), ROW_ALIGN) * ROW_ALIGN
    full = torch.empty((batch, num_kv_heads, num_rows, stride), dtype=torch.float32, device=device)
    return full[..., :num_blocks]


def _aligned_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` itself when its rows are evenly strided by a multiple of ``ROW_ALIGN``, else
    a copy that is."""
    b, hkv, t, nb = scores.shape
    s = scores.stride(2)
    if scores.stride()[1:] == (t * s, s, 1) and scores.stride(0) == hkv * t * s:
        if s % ROW_ALIGN == 0:
            return scores
    out = empty_scores(b, hkv, t, nb, scores.device)
    out.copy_(scores)
    return out


def check_forced(num_sink: int, num_local: int, top_n: int) -> None:
    """The forced first and last blocks must be non-negative counts that fit in ``top_n``."""
    if num_sink < 0 or num_local < 0 or num_sink + num_local > top_n:
        raise ValueError(
            f"num_sink={num_sink} and num_local={num_local} must be >= 0 and fit in top_n={top_n}"
        )


def relative_slots(window: int, block_size: int) -> int:
    """Block slots of the local window under the position-relative rule: the window
    ``[p - window, p)`` of a row at position ``p`` meets at most ``window // block_size + 1``
    blocks.

    The rule: a row at ``p`` attends every block that meets its window and begins inside the
    prefix, plus its ``top_n`` best-scored live blocks that end before the window begins, the
    first ``num_sink`` of those forced in. Those candidates are complete and committed whatever
    the round boundaries, so a token attends to the same keys whether it is verified in a
    draft tree or decoded alone (with ``window`` at least the draft rows): speculative decoding
    stays lossless against autoregressive decoding with the same sparse attention. The prefix
    rule's forced last blocks move with the round boundary; this rule has no ``num_local``."""
    return window // block_size + 1


def check_relative(
    positions: torch.Tensor | None,
    window: int,
    block_size: int,
    num_local: int,
    rows: tuple[int, int],
    device: torch.device,
) -> int:
    """The window's block slots of a position-relative pick (0 without ``positions``), after
    checking ``positions`` (``[B, t]`` int64 on ``device``, contiguous), ``window`` (>= 0) and
    that ``num_local`` is 0 under the rule."""
    if positions is None:
        return 0
    if positions.shape != rows or positions.dtype != torch.int64 or positions.device != device:
        raise ValueError(
            f"positions must be {list(rows)} int64 on {device}, got {list(positions.shape)} "
            f"{positions.dtype} on {positions.device}"
        )
    if not positions.is_contiguous():
        raise ValueError("positions must be contiguous")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if num_local != 0:
        raise ValueError(
            f"num_local={num_local} does not apply with positions: the window's blocks are "
            "the local ones (num_local must be 0)"
        )
    return relative_slots(window, block_size)


def threshold_meta(nb_max: int, top_n: int) -> dict | None:
    """The threshold pick's constexprs for rows of ``nb_max`` blocks (``TOP_N``, ``TOP_N_PAD``,
    ``CHUNK``, ``TAIL``, ``GROUPS``, ``TAIL_ROWS``, ``CAP``), or None where the rounds kernel
    serves the shape: a row longer than one chunk and its tail, or ``top_n`` above
    ``THRESHOLD_MAX_TOP_N``."""
    chunk, tail, num_chunks = _row_layout(nb_max)
    top_n_pad = max(16, triton.next_power_of_2(top_n))
    if num_chunks != 1 or top_n_pad > min(chunk, THRESHOLD_MAX_TOP_N):
        return None
    groups = min(chunk, max(MIN_GROUPS, GROUPS_PER_PICK * top_n_pad))
    return dict(
        TOP_N=top_n,
        TOP_N_PAD=top_n_pad,
        CHUNK=chunk,
        TAIL=tail,
        GROUPS=groups,
        TAIL_ROWS=max(2, tail // groups),
        CAP=CANDIDATES_PER_PICK * top_n_pad,
    )


def _warps(rows: int, chunk: int, device: torch.device) -> int:
    """Warps of one row's program. Up to one row per SM, a row has the SM to itself and 4
    warps (8 for 4096-block chunks) split each round's max-reduction, shortening the row.
    Beyond, rows share the SMs and run side by side, so a row takes the fewest warps that
    hold a chunk's int64 keys in registers (1 up to 2048 blocks): its rounds then need no
    cross-warp barrier, and the SM's other warps serve other rows."""
    if rows <= num_sms(device):
        return 4 if chunk <= 2048 else 8
    return max(1, chunk // 2048)


def threshold_warps(rows: int, chunk: int, device: torch.device) -> int:
    """Warps of one row's threshold pick: 4 (8 for chunks beyond 2048 blocks) while a row has
    an SM to itself, so more warps share its pass over the scores. Beyond, rows share the SMs:
    a chunk beyond 2048 blocks takes 2 warps (its register tile spills at 1), a shorter one 2
    up to eight rows an SM, then 1, as rows side by side fill the SM with their own warps and
    fewer warps a row spend less on cross-warp reductions. Measured:
    ``validation/data/pick-warps-h200.json``."""
    sms = num_sms(device)
    if rows <= sms:
        return 4 if chunk <= 2048 else 8
    if chunk > 2048:
        return 2
    return 2 if rows <= 8 * sms else 1
