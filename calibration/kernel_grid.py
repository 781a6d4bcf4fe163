"""The kernel sweep's configs as data: what each config times, before anything runs.

A ``KernelConfig`` is one set of inputs built on the GPU (a KV cache, selections, queries) and
the rows timed on it, its ``Variant`` s: dense verification (and torch SDPA), sparse
verification per mode and group size, repair per missed fraction, NSA per path and
implementation (step ``nsa``: the packed row tiles; step ``nsa_tiles``: the row schedules of
``NSA_TILE_ROWS``, ``nsa_tiles_configs``), block selection. Each variant's params are the
row's params, so a variant is pending exactly when ``Runner.pending`` says its row is missing.
Configs carry their head geometry (``kernel_inputs.GEOMETRIES``); ``sweep_configs`` lists a
``Sweep`` grid's configs at one geometry in the order the sweep runs them, with the keys of the
rows already measured.

    configs = sweep_configs(FULL_SWEEP, ("dense", "sparse"), "llama-3.1-8b")
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES
from ssvkit.perfmodel.nsa_plan import DEFAULT_CONTEXT_TILES, is_packed
from ssvkit.perfmodel.select_work import one_launch_fits

STEPS = ("dense", "sparse", "repair", "nsa", "select", "nsa_tiles")
# select_blocks' ``impl``: scores and pick in one launch, or the two launches (the default).
SELECT_IMPLS = ("one_launch", "two_launch")
K = 1024
WORKING_SET_BYTES = 200 * 2**20  # 4x the H100's 50 MB L2: the large sparse batch's target
NSA_REUSE_OVERLAP = 0.7
NSA_EXTRA = dict(window=ki.NSA_KW["window"], comp_block=32, comp_stride=16)
# Draft rows a row tile of the ``nsa_tiles`` step: 1, seed 000's naive baseline
# (``sd_sparse_naive``); 4, SSV's default grouping (``ssv``, union C = 4).
NSA_TILE_ROWS = (1, 4)
# nsa_verify's implementations and the params each adds to its rows: the unfused rows run their
# branches side by side (``NsaVerifyConfig.branch_streams``).
NSA_IMPLS = {"fused": {}, "unfused": {"branch_streams": True}}


@dataclass(frozen=True, slots=True)
class Sweep:
    """The configs timed, as axes crossed per op; ``QUICK_SWEEP`` is a subset."""

    # 48K, 96K and t = 12 are calibration's held-out values: timed, never fitted.
    dense_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    dense_tokens: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)
    dense_batches: tuple[int, ...] = (1, 16)
    sdpa: bool = True  # torch SDPA on the dense configs' inputs (the baseline; never fitted)
    sparse_contexts: tuple[int, ...] = (16 * K, 64 * K)
    sparse_tokens: int = 16  # two groups of C = 8
    top_ns: tuple[int, ...] = (16, 32, 64)
    overlaps: tuple[float, ...] = (0.5, 0.7, 0.9)
    group_sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    sparse_min_large_batch: int = 16  # raised until the working set reaches 200 MB
    repair_contexts: tuple[int, ...] = (16 * K, 64 * K)
    repair_batches: tuple[int, ...] = (1, 4, 16)
    repair_top_n: int = 64
    missed_fractions: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
    other_batches: tuple[int, ...] = (1, 16)  # repair, nsa and select
    nsa_contexts: tuple[int, ...] = (16 * K, 64 * K)
    nsa_tokens: tuple[int, ...] = (16,)
    select_contexts: tuple[int, ...] = (8 * K, 16 * K, 32 * K, 48 * K, 64 * K, 96 * K, 128 * K)
    select_batches: tuple[int, ...] = (1, 4, 16)
    select_top_ns: tuple[int, ...] = (16, 64)
    block_size: int = 64
    tokens: int = 16  # draft rows of the repair, nsa and select configs


FULL_SWEEP = Sweep()
QUICK_SWEEP = Sweep(
    dense_contexts=(8 * K, 64 * K),
    dense_tokens=(1, 16, 64),
    dense_batches=(1,),
    sparse_contexts=(64 * K,),
    top_ns=(32,),
    overlaps=(0.7,),
    group_sizes=(1, 4),
    missed_fractions=(0.0, 0.25, 0.5),
    other_batches=(1,),
    nsa_contexts=(64 * K,),
    select_contexts=(64 * K,),
    select_batches=(1,),
    select_top_ns=(32,),
    repair_contexts=(64 * K,),
    repair_batches=(1,),
)
# The tiny pair's verify shapes (engine/checkpoints, validation/data/campaign.json): contexts
# up to its 32K positions, the campaign's tree sizes (1, 3, 5, 17 rows), its NSA budget.
TINY_SWEEP = Sweep(
    dense_contexts=(2 * K, 4 * K, 8 * K, 16 * K, 30 * K),
    dense_tokens=(1, 2, 3, 4, 5, 8, 12, 16, 17, 32),
    dense_batches=(1,),
    nsa_contexts=(4 * K, 8 * K, 16 * K, 30 * K),
    nsa_tokens=(1, 3, 5, 12, 17),
    other_batches=(1,),
)


@dataclass(frozen=True, slots=True)
class Variant:
    """One row a config times: its op, its params (the row's), and the knob the op's runner
    takes (``(mode, group)`` of sparse rows, ``(mode, fraction)`` of repair rows, ``(mode,
    impl)`` of NSA rows; ``()`` for the others)."""

    op: str
    params: dict
    knob: tuple = ()


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """One set of inputs and the rows timed on it."""

    step: str = field(metadata={"help": "the op step (STEPS)"})
    geometry: str = field(metadata={"help": "head geometry (kernel_inputs.GEOMETRIES)"})
    common: dict = field(metadata={"help": "params every variant shares (context, batch, ...)"})
    variants: tuple[Variant, ...] = field(metadata={"help": "the rows timed on the inputs"})
    extra: dict = field(default_factory=dict, metadata={"help": "step-specific params"})

    def __post_init__(self) -> None:
        if self.step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, got {self.step!r}")
        if self.geometry not in ki.GEOMETRIES:
            raise ValueError(f"geometry must be one of {', '.join(ki.GEOMETRIES)}")
        if not self.variants:
            raise ValueError("a config times at least one variant")

    @property
    def name(self) -> str:
        """A readable identity: step, geometry and the shared params."""
        short = ",".join(f"{k}={v}" for k, v in self.common.items() if k != "tree")
        return f"{self.step}@{self.geometry}[{short}]"


def dense_config(ctx: int, t: int, bsz: int, sdpa: bool = True) -> KernelConfig:
    """dense_verify (and torch SDPA) at the geometry in use."""
    p = ki.base_params(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
    ops = ("dense_verify", "torch_sdpa") if sdpa else ("dense_verify",)
    return KernelConfig("dense", ki.current_geometry(), p, tuple(Variant(op, p) for op in ops))


def sparse_variants(groups: tuple[int, ...]) -> list[tuple[str, int]]:
    """``per_query``, ``union`` at each group size and ``shared`` at each one above 1."""
    return (
        [("per_query", 1)]
        + [("union", c) for c in groups]
        + [("shared", c) for c in groups if c > 1]
    )


def sparse_config(
    ctx: int,
    t: int,
    bsz: int,
    top_n: int,
    overlap: float,
    variants: list[tuple[str, int]],
    block_size: int = 64,
) -> KernelConfig:
    """sparse_verify per (mode, group size) on one set of selections."""
    common = dict(
        context_len=ctx,
        num_query_tokens=t,
        batch=bsz,
        overlap=overlap,
        top_n=top_n,
        block_size=block_size,
        tree="binary",
    )
    vs = tuple(
        Variant("sparse_verify", ki.base_params(mode=m, group_size=c, **common), (m, c))
        for m, c in variants
    )
    return KernelConfig("sparse", ki.current_geometry(), common, vs)


def repair_config(
    ctx: int, t: int, bsz: int, top_n: int, fractions: tuple[float, ...], block_size: int = 64
) -> KernelConfig:
    """repair per missed fraction, and the recompute of every block."""
    common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n)
    common["block_size"] = block_size
    knobs = [("repair", f) for f in fractions] + [("recompute", 1.0)]
    vs = tuple(
        Variant("repair", ki.base_params(mode=m, missed_fraction=f, **common), (m, f))
        for m, f in knobs
    )
    return KernelConfig("repair", ki.current_geometry(), common, vs)


def nsa_config(
    ctx: int,
    t: int,
    bsz: int,
    overlap: float | None,
    rows_per_tile: int = 0,
    top_n: int | None = None,
) -> KernelConfig:
    """nsa_verify fused and unfused: refresh and reuse on the refresh path's own indices
    (``overlap`` None: random queries, so rows barely overlap), or reuse alone on indices with
    that exact adjacent-row overlap. ``rows_per_tile`` > 0 times them with that row schedule
    (step ``nsa_tiles``; the rows carry ``params.rows_per_tile`` and the kernels' default
    ``params.context_tiles``, the packed step's rows neither key, so their keys stay those of
    the rows already measured; a row schedule's row without ``context_tiles`` ran
    "per_tile"). The unfused rows carry ``params.branch_streams`` True: their branches side by
    side, the kernels' default (an unfused row without it ran them on one stream, under a key
    of its own). ``top_n``: the blocks each row selects (default NSA's,
    ``kernel_inputs.NSA_KW``)."""
    common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
    common.update(top_n=top_n or ki.NSA_KW["top_n"], block_size=ki.NSA_KW["block_size"])
    if overlap is not None:
        common["overlap"] = overlap
    if rows_per_tile:
        common["rows_per_tile"] = rows_per_tile
        common["context_tiles"] = DEFAULT_CONTEXT_TILES
    modes = ("reuse", "refresh") if overlap is None else ("reuse",)
    vs = tuple(
        Variant("nsa_verify", nsa_params(m, i, common, NSA_EXTRA), (m, i))
        for m in modes
        for i in NSA_IMPLS
    )
    step = "nsa_tiles" if rows_per_tile else "nsa"
    return KernelConfig(step, ki.current_geometry(), common, vs, dict(NSA_EXTRA))


def nsa_params(mode: str, impl: str, common: dict, extra: dict) -> dict:
    """The params of an NSA row of ``mode`` and ``impl`` on a config's ``common`` and ``extra``
    params, with the params its implementation adds (``NSA_IMPLS``)."""
    return ki.base_params(mode=mode, impl=impl, **common, **extra, **NSA_IMPLS[impl])


def nsa_tiles_packed(t: int, rows_per_tile: int) -> bool:
    """Whether ``rows_per_tile`` runs the packed tiles at ``t`` draft rows and the geometry in
    use (its rows fit one tile, or it packs as many rows): the ``nsa`` step times those."""
    return bool(is_packed(t, ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, rows_per_tile))


def select_config(ctx: int, t: int, bsz: int, top_n: int, method: str, block_size: int = 64):
    """select_blocks of one metadata kind, in one launch and in two (``impl``) on the same
    inputs; in two only where the one launch does not fit an SM (``one_launch_fits``)."""
    common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, top_n=top_n)
    p = ki.base_params(block_size=block_size, method=method, **common)
    kinds = 2 if method == "quest" else 1
    fused = one_launch_fits(t, p["head_dim"], kinds, DEFAULT_SMEM_PER_SM_BYTES)
    impls = SELECT_IMPLS if fused else SELECT_IMPLS[1:]
    vs = tuple(Variant("select_blocks", {**p, "impl": i}, (i,)) for i in impls)
    return KernelConfig("select", ki.current_geometry(), p, vs)


def selection_rng(seed: int, *key: float) -> np.random.Generator:
    """A generator per config, so a resumed run rebuilds the same selections."""
    return np.random.default_rng([seed, *(int(round(k * 1000)) for k in key)])


def sparse_batch(sw: Sweep, ctx: int, top_n: int, overlap: float, rng) -> int:
    """Smallest batch >= ``sw.sparse_min_large_batch`` whose deduplicated working set reaches
    200 MB (at most 64)."""
    idx = ki.overlap_block_idx([ctx // sw.block_size], sw.sparse_tokens, top_n, overlap, rng)
    per_seq = ki.group_blocks(idx, sw.sparse_tokens) * ki.kv_bytes(sw.block_size)
    return int(min(64, max(sw.sparse_min_large_batch, math.ceil(WORKING_SET_BYTES / per_seq))))


def sweep_configs(
    sw: Sweep, steps: tuple[str, ...], geometry: str, seed: int = 0
) -> list[KernelConfig]:
    """The configs of ``sw`` for ``steps`` at ``geometry``, in the order the sweep runs them."""
    out: list[KernelConfig] = []
    with ki.geometry(geometry):
        for step in steps:
            out += _STEP_CONFIGS[step](sw, seed)
    return out


def _dense(sw: Sweep, seed: int) -> list[KernelConfig]:
    return [
        dense_config(ctx, t, bsz, sw.sdpa)
        for bsz in sw.dense_batches
        for ctx in sw.dense_contexts
        for t in sw.dense_tokens
    ]


def _sparse(sw: Sweep, seed: int) -> list[KernelConfig]:
    out = []
    variants = sparse_variants(sw.group_sizes)
    for ctx, top_n, gamma in itertools.product(sw.sparse_contexts, sw.top_ns, sw.overlaps):
        big = sparse_batch(sw, ctx, top_n, gamma, selection_rng(seed, ctx, top_n, gamma))
        for bsz in (1, big):
            cfg = sparse_config(ctx, sw.sparse_tokens, bsz, top_n, gamma, variants, sw.block_size)
            out.append(cfg)
    return out


def _repair(sw: Sweep, seed: int) -> list[KernelConfig]:
    return [
        repair_config(ctx, sw.tokens, bsz, sw.repair_top_n, sw.missed_fractions, sw.block_size)
        for bsz, ctx in itertools.product(sw.repair_batches, sw.repair_contexts)
    ]


def _nsa(sw: Sweep, seed: int) -> list[KernelConfig]:
    return [
        nsa_config(ctx, t, bsz, overlap)
        for bsz, t in itertools.product(sw.other_batches, sw.nsa_tokens)
        for ctx, overlap in itertools.product(sw.nsa_contexts, (None, NSA_REUSE_OVERLAP))
    ]


def nsa_tiles_configs(sw: Sweep, seed: int = 0) -> list[KernelConfig]:
    """The NSA configs of ``sw`` (``_nsa``'s grid) under each schedule of ``NSA_TILE_ROWS``,
    those whose tiles are the packed ones left out. One row a tile runs the kernels' one-row
    path, fitted as ``nsa_verify/<mode>/<impl>/per_query`` (``calibration.fit``), the class the
    step model prices the naive baseline with; four rows a tile are fitted with the packed
    class, whose features carry each row's tile geometry."""
    return [
        nsa_config(ctx, t, bsz, overlap, rows)
        for rows in NSA_TILE_ROWS
        for bsz, t in itertools.product(sw.other_batches, sw.nsa_tokens)
        if not nsa_tiles_packed(t, rows)
        for ctx, overlap in itertools.product(sw.nsa_contexts, (None, NSA_REUSE_OVERLAP))
    ]


def _select(sw: Sweep, seed: int) -> list[KernelConfig]:
    return [
        select_config(ctx, sw.tokens, bsz, top_n, method, sw.block_size)
        for bsz in sw.select_batches
        for ctx in sw.select_contexts
        for top_n in sw.select_top_ns
        for method in ("mean", "quest")
    ]


_STEP_CONFIGS = {
    "dense": _dense,
    "sparse": _sparse,
    "repair": _repair,
    "nsa": _nsa,
    "select": _select,
    "nsa_tiles": nsa_tiles_configs,
}
