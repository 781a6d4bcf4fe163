"""Block scores of :mod:`kernels.select_blocks`: every block of every KV head scored for every
query row against the block metadata (``block_scores``), and the score launch both of
``kernels.select_kernels``' kernels run (``ScoreLaunch``), at the first tile and pipeline
shape that fits the SM's shared memory (``launch_fitted``).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from ssvkit.kernels.block_metadata import KINDS, BlockMetadata
from ssvkit.kernels.checks import check_float_dtype, check_lens
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import LaunchChain, chain_for
from ssvkit.kernels.select_kernels import block_scores_kernel
from ssvkit.kernels.top_blocks import TileMax, empty_scores
from triton.runtime.errors import OutOfResources

# Scores are dots of the query's and the metadata's bf16 parts: three bf16 MMAs a product
# (``bf16x3``, within ~2^-16 of the fp32 dot) on the GPU, FMA ("ieee") in the interpreter.
# A score tile is [T_PAD, 32] (16 blocks past 32 rows).
_SCORE_TILE = 1024
# Past 16 rows, a query this many fp32 columns wide or wider (head dimension times metadata
# kinds: quest at 128, either method at 256) scores 16-block tiles, which keep its program's
# operands at a narrower query's size; the shapes' times (``validation.score_tiles``) put this
# rule within 5% of the fastest shape at 15 of 24 cases and 1.22x it at worst.
_WIDE_QUERY_COLUMNS = 256
# The head-dimension columns of one score product: a head of 256 is scored in two halves of 128,
# whose operands are those of a head of 128.
_D_CHUNK = 128
# Tiles a score program walks: at least two, so its pipelined loop loads a tile while it
# scores the one before; at most four, so a large batch still spreads over every SM's slots.
_MIN_TILES, _MAX_TILES = 2, 4
# Metadata tiles the score loop keeps in flight (its software pipeline's stages).
_SCORE_STAGES = 3
# The rows of a score launch's first part when no shape of all its rows fits (``_score_rows``).
_SPLIT_ROWS = 32
# The score shape (``_score_shapes``) that first fitted each launch's shared memory, by
# (kernel, T_PAD, D, method, device); a launch none fitted keeps its last error instead.
_FITTED_SHAPE: dict[tuple, int | OutOfResources] = {}


def score_block_nb(t_pad: int, head_dim: int, method: str) -> int:
    """Blocks of a score tile: ``_SCORE_TILE / T_PAD``, at most 32, and 16 past 16 rows when
    the query is ``_WIDE_QUERY_COLUMNS`` fp32 columns or wider."""
    kinds = 2 if method == "quest" else 1
    if t_pad > 16 and head_dim * kinds >= _WIDE_QUERY_COLUMNS:
        return 16
    return min(32, _SCORE_TILE // t_pad)


def _score_shapes(t_pad: int, head_dim: int, method: str) -> list[tuple[int, int]]:
    """The (BLOCK_NB, stages) a score launch tries in order: its own tile and pipeline
    first, then fewer stages and 16-block tiles, until one fits the SM's shared memory. On an
    H100's or H200's SM of 227 KB quest at head dimension 256 past 32 rows takes two stages at
    four warps (its 64-row query tile and two kinds' tiles); at 128 and below the first shape
    fits. Where no shape fits (an SM of less shared memory) ``block_scores`` scores the rows in
    parts."""
    block_nb = score_block_nb(t_pad, head_dim, method)
    shapes = [(block_nb, _SCORE_STAGES), (block_nb, 2), (16, 2), (16, 1)]
    return list(dict.fromkeys(shapes))


def launch_fitted(
    name: str, launch_one, q, meta, prefix_lens, method: str, out=None, tile_max: bool = False
):
    """``launch_one(score_launch)`` with the first shape of ``_score_shapes`` whose kernel fits
    the SM's shared memory, scoring into ``out`` (a fresh score tensor when None); returns
    what it returns. The shape that fitted, or the error when none did, is remembered per
    launch key: later calls, CUDA graph captures included, compile and try no other. A shape
    that does not fit fails when its kernel loads, before it runs: a retry leaves no partial
    output."""
    t_pad = max(16, triton.next_power_of_2(q.shape[1]))
    key = (name, t_pad, q.shape[3], method, q.device)
    known = _FITTED_SHAPE.get(key, 0)
    if isinstance(known, OutOfResources):
        raise known
    shapes = _score_shapes(t_pad, q.shape[3], method)
    for i in range(known, len(shapes)):
        launch = _score_launch(q, meta, prefix_lens, method, shapes[i], out, tile_max)
        try:
            got = launch_one(launch)
        except OutOfResources as e:
            if i == len(shapes) - 1:
                _FITTED_SHAPE[key] = e
                raise
            continue
        _FITTED_SHAPE[key] = i
        return got
    raise AssertionError("unreachable: the last shape raises")


def score_warps(t_pad: int, method: str) -> int:
    """Warps of a score program: 2 for the mean key's one product a tile up to ``T_PAD`` 32, 4
    for wider tiles and for quest's two products (the split operands of two bf16x3 products
    would leave two warps issue-bound). Eight warps are slower on the H200 at every tile
    width: the program's fp32 tiles spread over more warps than its products keep busy."""
    if method == "quest" or t_pad > 32:
        return 4
    return 2


def _check_q(q: torch.Tensor, meta: BlockMetadata) -> None:
    ref = meta._any()
    mb, mhkv, _, md = meta.shape
    if q.dim() != 4:
        raise ValueError(f"q must be [B, t, H, D], got shape {tuple(q.shape)}")
    check_float_dtype("q", q)
    if q.stride(3) != 1:
        raise ValueError("q must have a contiguous last dimension")
    b, t, h, d = q.shape
    if b != mb or d != md or h % mhkv != 0:
        raise ValueError(
            f"q shape {tuple(q.shape)} does not fit metadata [B, Hkv, NB, D]={meta.shape}"
        )
    if d > 2 * _D_CHUNK:
        raise ValueError(f"q head dim must be at most {2 * _D_CHUNK}, got {d}")
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

    The query is the GQA-averaged ``qbar`` (the mean of a KV head's ``G`` query heads):

    - ``mean``:  ``s[b, h, i, n] = qbar[b, i, h] . mean_k[b, h, n]``
    - ``quest``: ``s[b, h, i, n] = sum_d max(qbar_d * min_k[n, d], qbar_d * max_k[n, d])``,
      computed as ``relu(qbar) . max_k + min(qbar, 0) . min_k`` so that both terms are matrix
      products.

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
    _check_method(method, meta)
    _check_q(q, meta)
    b, t, _, _ = q.shape
    _, hkv, nb, _ = meta.shape
    out = empty_scores(b, hkv, t, nb, q.device)
    _score_rows(q, meta, prefix_lens, method, chain_for(chain), out, False)
    return out


def scores_and_tile_max(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    *,
    method: str = "mean",
    chain: LaunchChain | None = None,
) -> tuple[torch.Tensor, TileMax | None]:
    """``block_scores``, and the maxima of the score tiles the launch wrote as it scored
    them (``kernels.top_blocks.TileMax``, one a row per ``BLOCK_NB`` blocks): what
    ``kernels.top_blocks``' tile pick reads instead of whole rows. None for the maxima where no
    score shape of all the rows fits and they are scored in parts."""
    _check_method(method, meta)
    _check_q(q, meta)
    b, t, _, _ = q.shape
    _, hkv, nb, _ = meta.shape
    out = empty_scores(b, hkv, t, nb, q.device)
    return out, _score_rows(q, meta, prefix_lens, method, chain_for(chain), out, True)


def score_at(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    *,
    method: str,
    block_nb: int,
    stages: int,
    num_warps: int,
) -> tuple[torch.Tensor, object]:
    """One ``block_scores`` launch at a tile, pipeline and warp count of the caller's choosing
    (``validation.score_tiles`` times the shapes against the rule's): the scores and the
    compiled kernel (its ``n_regs``, ``n_spills``, ``metadata.shared``). ``OutOfResources``
    when the shape does not fit the SM."""
    if block_nb < 16 or block_nb & (block_nb - 1) or stages < 1:
        raise ValueError(
            f"block_nb must be a power of two >= 16 and stages >= 1, got {block_nb}, {stages}"
        )
    launch = _score_launch(q, meta, prefix_lens, method, (block_nb, stages))
    compiled = block_scores_kernel[(launch.programs, launch.scores.shape[1], q.shape[0])](
        *launch.args, **launch.meta, PDL=False, num_warps=num_warps
    )
    return launch.scores, compiled


def _score_rows(
    q, meta, prefix_lens, method: str, chain: LaunchChain, out: torch.Tensor, tile_max: bool
) -> TileMax | None:
    """``block_scores`` of ``q``'s rows into ``out``, and with ``tile_max`` its tiles'
    maxima: one launch, or, where no score shape of all the rows fits the SM's shared memory,
    the first 32 rows and the rest apart (each a launch of the chain; no maxima)."""

    def launch_one(launch: ScoreLaunch) -> TileMax | None:
        b, hkv = q.shape[0], launch.scores.shape[1]
        with chain.attempt():
            block_scores_kernel[(launch.programs, hkv, b)](
                *launch.args, **launch.meta, **chain.meta(), num_warps=launch.num_warps
            )
        return launch.tile_max

    try:
        return launch_fitted("scores", launch_one, q, meta, prefix_lens, method, out, tile_max)
    except OutOfResources:
        t = q.shape[1]
        if t <= _SPLIT_ROWS:
            raise
        for lo, hi in ((0, _SPLIT_ROWS), (_SPLIT_ROWS, t)):
            part = q[:, lo:hi]
            _score_rows(part, meta, prefix_lens, method, chain, out[:, :, lo:hi], False)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class ScoreLaunch:
    """The scoring's output (and its tiles' maxima, if asked), its programs per (sequence, KV
    head), and the arguments, constexprs and warps ``score_range`` takes (either kernel of
    ``kernels.select_kernels``)."""

    scores: torch.Tensor
    tile_max: TileMax | None
    programs: int
    args: tuple
    meta: dict
    num_warps: int


def _check_method(method: str, meta: BlockMetadata) -> None:
    if method not in KINDS:
        raise ValueError(f"method must be one of {KINDS}, got {method!r}")
    if method not in meta.kinds:
        raise ValueError(f"meta was built without {method!r}; it has {meta.kinds}")


def _score_launch(
    q: torch.Tensor,
    meta: BlockMetadata,
    prefix_lens: torch.Tensor,
    method: str,
    shape: tuple[int, int],
    out: torch.Tensor | None = None,
    tile_max: bool = False,
) -> ScoreLaunch:
    """The scoring's launch at ``shape`` (BLOCK_NB, pipeline stages, ``_score_shapes``), into
    ``out`` (``[B, Hkv, t, NB]``, rows of any stride; a fresh ``empty_scores`` when None), with
    ``tile_max`` each ``BLOCK_NB`` blocks' maxima into a fresh ``TileMax``."""
    _check_method(method, meta)
    _check_q(q, meta)
    b, t, h, d = q.shape
    _, hkv, nb, _ = meta.shape
    check_lens(prefix_lens, b, q.device, "prefix_lens")
    out = empty_scores(b, hkv, t, nb, q.device) if out is None else out
    t_pad = max(16, triton.next_power_of_2(t))
    block_nb, stages = shape
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
    strides = (*q.stride()[:3], *ref.stride()[:4], *out.stride()[:3])
    tiles_of_row = triton.cdiv(nb, block_nb)
    tmax = None
    if tile_max:
        values = torch.empty((b, hkv, t, tiles_of_row), dtype=torch.int32, device=q.device)
        tmax = TileMax(values, block_nb)
        maxima = (values, values.stride(0), values.stride(1), tiles_of_row)
    else:
        maxima = (out, 0, 0, 0)
    constexprs = dict(
        G=h // hkv,
        T_PAD=t_pad,
        BLOCK_NB=block_nb,
        TILES=tiles,
        NUM_STAGES=stages,
        D=d,
        D_CHUNK=min(d, _D_CHUNK),
        BLOCK_SIZE=meta.block_size,
        QUEST=method == "quest",
        PRECISION="bf16x3" if q.device.type == "cuda" else "ieee",
        TILE_MAX=tile_max,
    )
    return ScoreLaunch(
        out,
        tmax,
        triton.cdiv(nb, block_nb * tiles),
        (*args, *strides, t, nb, *maxima),
        constexprs,
        score_warps(t_pad, method),
    )


def _score_tiles(num_tiles: int, device: torch.device) -> int:
    """Score tiles per program: the most in ``[_MIN_TILES, _MAX_TILES]`` that still leave two
    programs per SM (``_MIN_TILES`` where none does)."""
    sms = num_sms(device)
    tiles = _MAX_TILES
    while tiles > _MIN_TILES and triton.cdiv(num_tiles, tiles) < 2 * sms:
        tiles //= 2
    return tiles
