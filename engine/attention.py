"""Attention of a tree forward through ``kernels``: dense, sparse history or NSA, with a
refresh/reuse schedule over layers.

``AttentionConfig.from_strategy`` maps a ``perfmodel.strategy.Strategy`` onto one of three kinds:
``dense`` (``kernels.dense_verify``), ``sparse`` (block-metadata selection, then
``kernels.sparse_verify``) and ``nsa`` (``kernels.nsa_verify``'s three branches). A *refresh*
layer selects the blocks and the *reuse* layers after it take its indices (``TreeAttention``).

Sparse selection is *position-relative* (``select_relative``; ``kernels.top_blocks.
relative_slots``; needs ``window >= t``, checked), so speculative decoding stays lossless
against autoregressive decoding with the same attention.

Two backends: ``triton`` (the kernels; GPU, or the CPU interpreter) and ``torch`` (the kernels'
fp32 references, a batched equivalent for dense; CPU tests). No host synchronisation on the
Triton path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from ssvkit.engine.cache import KVCache
from ssvkit.engine.tree import TreeTensors
from ssvkit.kernels.dense_verify import dense_verify
from ssvkit.kernels.group_plan import build_group_plan
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    nsa_verify,
    nsa_verify_unfused,
    reference_nsa_verify,
)
from ssvkit.kernels.select_blocks import select_blocks
from ssvkit.kernels.select_reference import topn_from_scores
from ssvkit.kernels.sparse_verify import reference_sparse_verify, sparse_verify
from ssvkit.kernels.top_blocks import relative_slots
from ssvkit.perfmodel.nsa_plan import DEFAULT_CONTEXT_TILES, DEFAULT_TILE_PLAN
from ssvkit.perfmodel.strategy import Strategy, nsa_rows_per_tile

KINDS = ("dense", "sparse", "nsa")
BACKENDS = ("torch", "triton")
DEFAULT_GATES = (1.0 / 3, 1.0 / 3, 1.0 / 3)


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """How a tree forward attends (one per strategy; hashable, so graphs are keyed by it)."""

    kind: str = field(default="dense", metadata={"help": "dense | sparse | nsa"})
    mode: str = field(default="per_query", metadata={"help": "per_query | union | shared"})
    group_size: int = field(default=1, metadata={"help": "queries per group C"})
    top_n: int = field(default=16, metadata={"help": "selected blocks per query"})
    block_size: int = field(default=64, metadata={"help": "tokens per block"})
    window: int = field(default=512, metadata={"help": "local-window tokens always attended"})
    metadata: str = field(default="mean", metadata={"help": "sparse block scores: mean | quest"})
    comp_block: int = field(default=32, metadata={"help": "NSA compression window"})
    comp_stride: int = field(default=16, metadata={"help": "NSA compression stride"})
    refresh_every: int = field(default=1, metadata={"help": "a refresh layer every N layers"})
    fused: bool = field(default=True, metadata={"help": "NSA: fused refresh/reuse kernels"})
    num_sink: int = field(default=1, metadata={"help": "first blocks always selected"})
    gates: tuple[float, float, float] = field(
        default=DEFAULT_GATES, metadata={"help": "NSA branch gates (compressed, selected, window)"}
    )
    context_tiles: str = field(
        default=DEFAULT_CONTEXT_TILES,
        metadata={"help": "NSA compressed branch's row tiles (NsaVerifyConfig.context_tiles)"},
    )
    tile_plan: str = field(
        default=DEFAULT_TILE_PLAN,
        metadata={"help": "NSA row tiles and slots (NsaVerifyConfig.tile_plan)"},
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"attention kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "dense":
            return
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {bs}")
        if self.top_n < 1 or self.group_size < 1 or self.refresh_every < 1:
            raise ValueError("top_n, group_size and refresh_every must be >= 1")
        if not 0 <= self.num_sink <= self.top_n:
            raise ValueError(f"num_sink={self.num_sink} must lie in [0, top_n={self.top_n}]")
        if self.kind == "sparse" and self.metadata not in ("mean", "quest"):
            raise ValueError(f"sparse metadata must be mean or quest, got {self.metadata!r}")
        if self.kind == "nsa" and not 1 <= self.comp_stride <= self.comp_block:
            raise ValueError(
                f"NSA needs 1 <= comp_stride <= comp_block, got {self.comp_stride}, "
                f"{self.comp_block}"
            )

    @classmethod
    def from_strategy(cls, s: Strategy, **overrides) -> AttentionConfig:
        """The attention of strategy ``s`` (``overrides``: fields to set instead).

        - ``dense``: ``kernels.dense_verify`` (every prefix token plus the tree-masked tail).
        - ``sparse`` (``metadata`` mean or quest): on a *refresh* layer,
          ``kernels.select_blocks.select_blocks`` scores the prefix blocks and picks each
          row's by the position-relative rule (``select_relative`` on the torch backend); the
          following *reuse* layers take those indices. ``kernels.sparse_verify`` runs them
          ``per_query``, ``union`` (exact: the group streams the deduplicated union) or
          ``shared`` (approx: the group's first row's blocks), with a ``build_group_plan``
          shared by the layers of one refresh.
        - ``nsa``: ``kernels.nsa_verify``'s compressed/selected/window branches; the refresh
          path returns the block indices it selected, reuse layers pass them back with the
          union plan built once per refresh (``fusion=none`` runs the unfused baseline
          ``nsa_verify_unfused`` instead). The mode sets the draft rows of a row tile, which
          share one load of their blocks' union (``rows_per_tile``): ``per_query`` one (each
          row streams its own blocks, the naive baseline), ``union`` C, ``shared`` as many as
          the tile holds. The model is not NSA-trained, so the learned gates are constants
          (``gates``), as mean pooling stands in for NSA's learned compression.
        """
        if not s.is_sparse:
            return cls(kind="dense", **overrides)
        kw = dict(
            kind="nsa" if s.metadata == "nsa" else "sparse",
            mode=s.mode,
            group_size=1 if s.mode == "per_query" else s.group_size,
            top_n=s.top_n,
            block_size=s.block_size,
            window=s.window,
            metadata="mean" if s.metadata == "nsa" else s.metadata,
            comp_block=s.comp_block,
            comp_stride=s.comp_stride,
            refresh_every=s.refresh_every,
            fused=s.fusion == "refresh_reuse",
            context_tiles=s.nsa_context_tiles,
            tile_plan=s.nsa_tile_plan,
        )
        kw.update(overrides)
        return cls(**kw)

    def is_refresh(self, layer: int) -> bool:
        return layer % self.refresh_every == 0

    @property
    def rows_per_tile(self) -> int:
        """NSA: draft rows of one row tile under the mode (``perfmodel.strategy``'s
        ``nsa_rows_per_tile``; 0 = as many as the tile holds)."""
        return nsa_rows_per_tile(self.mode, self.group_size)

    @property
    def local_slots(self) -> int:
        """Block slots of the local window (sparse kind; ``kernels.top_blocks.relative_slots``)."""
        return relative_slots(self.window, self.block_size)

    def check_tree(self, t: int, head_group: int) -> None:
        """Raise ``ValueError`` when ``t`` verify rows cannot run with this config."""
        if self.kind == "sparse":
            if self.window < t:
                raise ValueError(
                    f"sparse window={self.window} must be >= the {t} verify rows (exact "
                    "position-relative selection)"
                )
            c = 1 if self.mode == "per_query" else min(self.group_size, t)
            if c * head_group > 128:
                raise ValueError(
                    f"group_size * (H / Hkv) = {c} * {head_group} exceeds 128 packed rows"
                )
            if self.mode == "union" and c > 31:
                raise ValueError(f"union groups hold at most 31 queries, got {c}")


def select_relative(
    scores: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor, cfg: AttentionConfig
) -> torch.Tensor:
    """The position-relative block choice (``kernels.top_blocks.relative_slots``) of fp32
    ``scores`` ``[B, Hkv, t, NB]``: ``[B, Hkv, t, top_n + local_slots]`` int32, the ``top_n``
    scored picks ascending (``-1`` when fewer candidates), then the local window's blocks
    (``-1`` past the committed prefix); ``positions`` ``[B, t]`` int64 absolute positions of the
    rows, ``lens`` ``[B]`` committed lengths. The torch path of the Triton backend's
    ``kernels.select_blocks.select_blocks`` with positions (ties may resolve differently)."""
    return topn_from_scores(
        scores,
        lens,
        cfg.block_size,
        top_n=cfg.top_n,
        num_sink=cfg.num_sink,
        num_local=0,
        positions=positions,
        window=cfg.window,
    )


def torch_dense_verify(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lens: torch.Tensor,
    tree_mask: torch.Tensor,
) -> torch.Tensor:
    """fp32 torch ``kernels.dense_verify`` for the CPU path, batched over sequences (the
    kernel's reference loops over them); reads the longest length on the host to trim the
    cache."""
    b, t, h, d = q.shape
    hkv = k_cache.shape[1]
    span = int(lens.max()) + t
    k, v = k_cache[:, :, :span].float(), v_cache[:, :, :span].float()
    pos = torch.arange(span, device=q.device)
    j = pos[None, :] - lens.long()[:, None]  # [B, span] tail index of each position
    bit = (tree_mask[:, :, None] >> j.clamp(0, 63)[:, None, :]) & 1  # [B, t, span]
    allowed = (j < 0)[:, None, :] | ((j < t)[:, None, :] & (bit != 0))
    qf = q.float().view(b, t, hkv, h // hkv, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, t, D]
    s = torch.einsum("bkgtd,bksd->bkgts", qf, k) * d**-0.5
    p = torch.softmax(s.masked_fill(~allowed[:, None, None], float("-inf")), dim=-1)
    o = torch.einsum("bkgts,bksd->bkgtd", p, v)
    return o.permute(0, 3, 1, 2, 4).reshape(b, t, h, d)


def torch_block_scores(q: torch.Tensor, meta, lens: torch.Tensor, method: str) -> torch.Tensor:
    """fp32 torch ``kernels.select_blocks.block_scores`` over maintained metadata."""
    b, t, h, d = q.shape
    _, hkv, nb, _ = meta.shape
    qbar = q.float().view(b, t, hkv, h // hkv, d).mean(3).transpose(1, 2)  # [B, Hkv, t, D]
    if method == "mean":
        s = qbar @ meta.values("mean").transpose(-1, -2)
    else:
        s = qbar.clamp(min=0) @ meta.values("kmax").transpose(-1, -2)
        s = s + qbar.clamp(max=0) @ meta.values("kmin").transpose(-1, -2)
    live = torch.arange(nb, device=q.device)[None, :] * meta.block_size < lens[:, None].long()
    return torch.where(live.view(b, 1, 1, nb), s, float("-inf"))


class TreeAttention:
    """The ``attend(layer, q)`` callback of one tree forward (see ``engine.model``).

    Holds the refresh/reuse state (block indices and group plan of the last refresh layer) and,
    with ``record=True``, keeps each layer's ``q`` for the selection statistics.
    """

    def __init__(
        self,
        cfg: AttentionConfig,
        cache: KVCache,
        tree: TreeTensors,
        positions: torch.Tensor,
        *,
        backend: str,
        record: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.cfg, self.cache, self.tree, self.positions = cfg, cache, tree, positions
        self.triton = backend == "triton"
        self.recorded: list[torch.Tensor] | None = [] if record else None
        self.block_idx: torch.Tensor | None = None
        self.plan = None
        self._gates: torch.Tensor | None = None
        self.nsa_config = NsaVerifyConfig(
            rows_per_tile=cfg.rows_per_tile,
            context_tiles=cfg.context_tiles,
            tile_plan=cfg.tile_plan,
        )

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s attention of ``q``: a sparse or NSA layer selects its blocks on a
        refresh layer (and on the forward's first), else takes the last refresh's."""
        if self.recorded is not None:
            self.recorded.append(q)
        if self.cfg.kind == "dense":
            return self._dense(layer, q)
        refresh = self.cfg.is_refresh(layer) or self.block_idx is None
        if self.cfg.kind == "sparse":
            return self._sparse(layer, q, refresh)
        return self._nsa(layer, q, refresh)

    def _operands(self, layer: int):
        """The layer's cached keys and values, the cache lengths and the tree mask."""
        cache = self.cache
        return cache.k(layer), cache.v(layer), cache.lens, self.tree.mask

    def _dense(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        k, v, lens, mask = self._operands(layer)
        if self.triton:
            return dense_verify(q, k, v, lens, mask, validate=False)[0]
        return torch_dense_verify(q, k, v, lens, mask).to(q.dtype)

    def _sparse(self, layer: int, q: torch.Tensor, refresh: bool) -> torch.Tensor:
        cfg = self.cfg
        k, v, lens, mask = self._operands(layer)
        if refresh:
            self._select(layer, q, lens)
        kw = dict(mode=cfg.mode, group_size=cfg.group_size, block_size=cfg.block_size)
        if self.triton:
            return sparse_verify(
                q, k, v, lens, mask, self.block_idx, validate=False, plan=self.plan, **kw
            )[0]
        return reference_sparse_verify(q, k, v, lens, mask, self.block_idx, **kw)[0].to(q.dtype)

    def _select(self, layer: int, q: torch.Tensor, lens: torch.Tensor) -> None:
        """A sparse refresh layer's block indices and, on Triton, their group plan: the state
        the reuse layers after it take."""
        cfg = self.cfg
        meta = self.cache.meta[layer]
        if self.triton:
            self.block_idx = select_blocks(
                q,
                meta,
                lens,
                top_n=cfg.top_n,
                method=cfg.metadata,
                num_sink=cfg.num_sink,
                num_local=0,
                positions=self.positions,
                window=cfg.window,
            )
            self.plan = build_group_plan(self.block_idx, None, cfg.group_size, cfg.mode)
        else:
            scores = torch_block_scores(q, meta, lens, cfg.metadata)
            self.block_idx = select_relative(scores, self.positions, lens, cfg)

    def _nsa(self, layer: int, q: torch.Tensor, refresh: bool) -> torch.Tensor:
        cfg = self.cfg
        k, v, lens, mask = self._operands(layer)
        ck, cv = self.cache.comp[layer]
        kw = dict(
            block_idx=None if refresh else self.block_idx,
            top_n=cfg.top_n,
            block_size=cfg.block_size,
            window=cfg.window,
            comp_block=cfg.comp_block,
            comp_stride=cfg.comp_stride,
            num_sink=cfg.num_sink,
        )
        gates = self.gates(q)
        if self.triton:
            if not cfg.fused:
                o, self.block_idx = nsa_verify_unfused(
                    q, k, v, lens, mask, ck, cv, gates, validate=False, config=self.nsa_config, **kw
                )
                return o
            # A refresh's union plan is the one the reuse layers after it share.
            o, self.block_idx, self.plan = nsa_verify(
                q,
                k,
                v,
                lens,
                mask,
                ck,
                cv,
                gates,
                validate=False,
                union=None if refresh else self.plan,
                return_union=True,
                config=self.nsa_config,
                **kw,
            )
            return o
        o, self.block_idx = reference_nsa_verify(q, k, v, lens, mask, ck, cv, gates, **kw)
        return o.to(q.dtype)

    def gates(self, q: torch.Tensor) -> torch.Tensor:
        if self._gates is None:
            b, t, h, _ = q.shape
            # Filled by kernels, not copied from the host: safe inside CUDA-graph capture.
            g = torch.empty((b, t, h, 3), dtype=torch.float32, device=q.device)
            for i, value in enumerate(self.cfg.gates):
                g[..., i].fill_(value)
            self._gates = g
        return self._gates
