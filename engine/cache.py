"""The KV cache: preallocated ``[L, 2, B, Hkv, T_max, D]``, per-sequence lengths, block summaries.

Layer ``l``'s keys are ``kv[l, 0]`` ``[B, Hkv, T_max, D]`` (contiguous), values ``kv[l, 1]``.
Sequence ``b`` holds its committed prefix in ``[0, lens[b])``; a verify step writes its ``t``
draft-tail entries at ``[lens[b], lens[b] + t)``. ``commit`` moves the accepted path's entries
to ``lens[b], lens[b] + 1, ...`` and advances ``lens``, which rolls the rest back; the block
metadata and NSA's compressed tokens are then refreshed for the touched blocks only. Nothing
here reads the lengths on the host on the Triton path.

``intact`` marks, per sequence, a length below which nothing has written the KV since the mark
(``ModelRunner.prefill`` sets it to the prompt lengths, so that a later prefill of the same
prompts can reuse them). Every write here lands at or past the committed length, and only
``set_lens`` lowers a length, dropping the mark when it goes below it. Code that writes ``kv``
below the lengths by other means sets ``intact`` to None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from ssvkit.engine.config import ModelConfig
from ssvkit.kernels.accept_commit import move_kept
from ssvkit.kernels.block_metadata import KINDS, BlockMetadata, reference_block_metadata
from ssvkit.kernels.nsa_compress import (
    compress_kv,
    max_compressed,
    num_compressed,
    reference_compress_kv,
    update_compressed_kv,
)


@dataclass(frozen=True, slots=True)
class KVTarget:
    """Where one layer's keys and values of a forward go, for a kernel that stores them itself
    (``kernels.rope_kv_write``)."""

    k_cache: torch.Tensor = field(metadata={"help": "[B, Hkv, T_max, D] view of the layer's keys"})
    v_cache: torch.Tensor = field(metadata={"help": "[B, Hkv, T_max, D] view of its values"})
    slots: torch.Tensor = field(metadata={"help": "[B, t] int64 cache position of every row"})


class KVCache:
    """KV cache of one model for a batch of ``B`` sequences.

    Parameters
    ----------
    cfg : ModelConfig
        Layers, KV heads and head dim.
    batch, t_max : int
        Sequences and positions per sequence (prefix + draft tail).
    dtype, device
        Cache storage.
    use_triton : bool
        Maintain summaries with the Triton kernels (GPU, or the CPU interpreter) instead of
        torch (CPU tests).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        t_max: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        use_triton: bool,
    ) -> None:
        self.num_layers = cfg.num_layers
        self.t_max = t_max
        self.use_triton = use_triton
        shape = (cfg.num_layers, 2, batch, cfg.num_kv_heads, t_max, cfg.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = torch.zeros(batch, dtype=torch.int32, device=device)
        self._row0 = _first_rows(shape, device)
        self.meta: list[BlockMetadata] | None = None
        # Compressed tokens [L, B, Hkv, NC_max, D] and their per-layer (k, v) views.
        self.comp_k: torch.Tensor | None = None
        self.comp_v: torch.Tensor | None = None
        self.comp: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.comp_lens: torch.Tensor | None = None
        self.comp_shape: tuple[int, int] | None = None  # (comp_block, comp_stride)
        self.intact: list[int] | None = None  # see the module docstring

    @property
    def batch(self) -> int:
        return self.kv.shape[2]

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def k(self, layer: int) -> torch.Tensor:
        return self.kv[layer, 0]  # [B, Hkv, T_max, D]

    def v(self, layer: int) -> torch.Tensor:
        return self.kv[layer, 1]

    def write(
        self, layer: int, rows: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store ``k``, ``v`` ``[B, t, Hkv, D]`` of sequences ``rows`` at positions ``slots``
        (both ``[B, t]`` int64; ``rows[b, i] = b``, built once per forward)."""
        self.kv[layer, 0][rows, :, slots] = k.to(self.kv.dtype)
        self.kv[layer, 1][rows, :, slots] = v.to(self.kv.dtype)

    def tail_writer(self, t: int) -> TailWriter:
        """The KV sink of a ``t``-row verify forward: every sequence's tail at ``lens[b] + i``."""
        return TailWriter(self, self.tail_slots(t))

    def tail_rows(self, t: int) -> torch.Tensor:
        """``[B, t]`` int64 sequence index of every tail entry (for ``write``)."""
        return torch.arange(self.batch, device=self.device)[:, None].expand(self.batch, t)

    def tail_slots(self, t: int) -> torch.Tensor:
        """``[B, t]`` int64 positions of the draft tail: ``lens[b] + i``."""
        return self.lens.long()[:, None] + torch.arange(t, device=self.device)

    # ------------------------------------------------------------------ summaries

    def require_blocks(self, block_size: int, kinds: tuple[str, ...]) -> None:
        """Make sure block metadata of ``block_size`` with ``kinds`` exists (built from the
        current prefix when it does not)."""
        bad = set(kinds) - set(KINDS)
        if bad:
            raise ValueError(f"block metadata kinds must be among {KINDS}, got {sorted(bad)}")
        have = self.meta[0] if self.meta else None
        if have is not None and have.block_size == block_size:
            if set(kinds) <= set(have.kinds):
                return
            kinds = tuple(sorted(set(kinds) | set(have.kinds)))
        self.meta = [self._build_meta(layer, block_size, kinds) for layer in range(self.num_layers)]

    def require_compressed(self, comp_block: int, comp_stride: int) -> None:
        """Make sure NSA's compressed tokens for ``(comp_block, comp_stride)`` exist."""
        if self.comp_shape == (comp_block, comp_stride):
            return
        self.comp_shape = (comp_block, comp_stride)
        self.comp_k, self.comp_v, self.comp_lens = self._compress_all()
        self.comp = [(self.comp_k[layer], self.comp_v[layer]) for layer in range(self.num_layers)]

    def _compress_all(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every layer's compressed tokens ``[L, B, Hkv, NC_max, D]`` (one launch on Triton)
        and the ``[B]`` int32 window counts."""
        comp_block, comp_stride = self.comp_shape
        kw = dict(comp_block=comp_block, comp_stride=comp_stride)
        if self.use_triton:
            return compress_kv(self.kv[:, 0], self.kv[:, 1], self.lens, **kw)
        per_layer = [
            reference_compress_kv(self.k(layer), self.v(layer), self.lens, **kw)
            for layer in range(self.num_layers)
        ]
        ck = torch.stack([c[0] for c in per_layer]).to(self.kv.dtype)
        cv = torch.stack([c[1] for c in per_layer]).to(self.kv.dtype)
        return ck, cv, per_layer[0][2].to(torch.int32)

    def drop_summaries(self, *, meta: bool, comp: bool) -> None:
        """Forget the block metadata and/or the compressed tokens: commits stop refreshing
        them, and ``require_blocks`` / ``require_compressed`` build them again."""
        if meta:
            self.meta = None
        if comp:
            self.comp = self.comp_k = self.comp_v = self.comp_lens = self.comp_shape = None

    def _build_meta(self, layer: int, block_size: int, kinds) -> BlockMetadata:
        if self.use_triton:
            return BlockMetadata.build(self.k(layer), self.lens, block_size, kinds)
        ref = reference_block_metadata(self.k(layer), self.lens, block_size)
        return BlockMetadata.from_values(
            block_size,
            mean=ref["mean"] if "mean" in kinds else None,
            kmin=ref["kmin"] if "quest" in kinds else None,
            kmax=ref["kmax"] if "quest" in kinds else None,
        )

    def refresh_summaries(self, old_lens: torch.Tensor, max_growth: int) -> None:
        """Bring the summaries from ``old_lens`` to ``self.lens`` (grown by <= ``max_growth``)."""
        if self.meta is not None:
            for layer, meta in enumerate(self.meta):
                if self.use_triton:
                    meta.update(self.k(layer), old_lens, self.lens)
                else:
                    ref = reference_block_metadata(self.k(layer), self.lens, meta.block_size)
                    for name in ("mean", "kmin", "kmax"):
                        if getattr(meta, name) is not None:
                            meta.set_values(name, ref[name])
        if self.comp is not None:
            comp_block, comp_stride = self.comp_shape
            if self.use_triton:  # every layer in one launch
                new = update_compressed_kv(
                    self.kv[:, 0],
                    self.kv[:, 1],
                    self.comp_k,
                    self.comp_v,
                    self.comp_lens,
                    self.lens,
                    comp_block=comp_block,
                    comp_stride=comp_stride,
                    max_new_tokens=max_growth,
                )
                self.comp_lens.copy_(new)
            else:
                fresh_k, fresh_v, _ = self._compress_all()
                self.comp_k.copy_(fresh_k)
                self.comp_v.copy_(fresh_v)
                self.comp_lens.copy_(
                    torch.clamp(
                        num_compressed(self.lens, comp_block, comp_stride),
                        max=max_compressed(self.t_max, comp_block, comp_stride),
                    )
                )

    def rebuild_summaries(self) -> None:
        """Recompute every summary from the current prefixes (after prefill), in place: the
        tensors keep their addresses, so captured CUDA graphs stay valid."""
        if self.meta is not None:
            for layer, meta in enumerate(self.meta):
                fresh = self._build_meta(layer, meta.block_size, meta.kinds)
                for name in ("mean", "kmin", "kmax"):
                    dst = getattr(meta, name)
                    if dst is not None:
                        dst.copy_(getattr(fresh, name))
        if self.comp is not None:
            fresh_k, fresh_v, lens = self._compress_all()
            self.comp_k.copy_(fresh_k)
            self.comp_v.copy_(fresh_v)
            self.comp_lens.copy_(lens)

    # ------------------------------------------------------------------ commit

    def commit(self, path: torch.Tensor, count: torch.Tensor) -> None:
        """Keep the accepted path of the draft tail; roll the rest back.

        The kept tail entries are gathered and written to ``lens[b], lens[b] + 1, ...`` in one
        gather and one scatter for all layers at once, over the cache seen as rows of ``D``
        elements: indexing the 6-D cache with two index tensors instead makes torch split each
        launch in two until every part spans under 2^31 bytes, up to ``2 L`` launches each on a
        cache of tens of GB. ``lens`` then advances, and everything past it (the rejected
        entries) is dead; the summaries are refreshed for the touched blocks.

        Parameters
        ----------
        path : torch.Tensor
            ``[B, P]`` int64 tail indices of the kept entries in order (root first); entries
            ``j >= count[b]`` are ignored (pad them with ``j``).
        count : torch.Tensor
            ``[B]`` int32 kept entries per sequence (``0 <= count <= P``).
        """
        b, p = path.shape
        j = torch.arange(p, device=path.device)
        base = self.lens.long()[:, None]
        path = torch.where(j[None, :] < count[:, None], path, j[None, :])
        # Rows of D elements of the flat cache: one gather and one scatter whatever its size.
        rows = self.kv.view(-1, self.kv.shape[-1])
        src = self._row0[:, None, :] + (base + path)[:, :, None]  # [B, P, L * 2 * Hkv]
        dst = self._row0[:, None, :] + (base + j)[:, :, None]
        rows[dst] = rows[src]  # the gather reads every kept entry before any is overwritten
        old = self.lens.clone()
        self.lens += count.to(torch.int32)
        self.refresh_summaries(old, p)

    def commit_kept(
        self, path: torch.Tensor, count: torch.Tensor, old_lens: torch.Tensor, *, move: bool
    ) -> None:
        """``commit`` after ``kernels.accept_commit`` raised ``lens`` by ``count`` from
        ``old_lens``: the kept entries' move in one launch (``kernels.accept_commit.move_kept``;
        none when ``move`` is False, a chain's path being ``0, 1, ...``) and the summaries'
        refresh."""
        if move:
            move_kept(self.kv, path, count, self.lens)
        self.refresh_summaries(old_lens, path.shape[1])

    def set_lens(self, lens: torch.Tensor) -> None:
        """Set the committed lengths (after prefill) and rebuild the summaries; a length below
        ``intact`` drops that mark (later writes may land below it)."""
        if self.intact is not None and any(
            n < k for n, k in zip(lens.tolist(), self.intact, strict=True)
        ):
            self.intact = None
        self.lens.copy_(lens.to(self.lens.device, torch.int32))
        self.rebuild_summaries()


def _first_rows(shape: tuple[int, ...], device) -> torch.Tensor:
    """``[B, L * 2 * Hkv]`` int64: the row of position 0 of every (layer, key/value, head) of
    each sequence in the cache ``shape`` ``[L, 2, B, Hkv, T_max, D]`` seen as rows of ``D``."""
    layers, _, batch, heads, t_max, _ = shape
    lk = torch.arange(2 * layers)[:, None, None]
    b = torch.arange(batch)[None, :, None]
    h = torch.arange(heads)[None, None, :]
    first = ((lk * batch + b) * heads + h) * t_max  # [2L, B, Hkv]
    return first.transpose(0, 1).reshape(batch, -1).to(device)


class TailWriter:
    """KV sink (``engine.model.KVSink``) of a forward over the draft tail of every sequence:
    row ``(b, i)`` goes to ``slots[b, i]``. ``write`` is the torch path's indexed store,
    ``target`` the views the Triton path's fused kernel stores into."""

    def __init__(self, cache: KVCache, slots: torch.Tensor) -> None:
        self.cache, self.slots = cache, slots
        self._rows: torch.Tensor | None = None  # built by the first ``write`` of a forward

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self._rows is None:
            self._rows = self.cache.tail_rows(self.slots.shape[1])
        self.cache.write(layer, self._rows, self.slots, k, v)

    def target(self, layer: int) -> KVTarget:
        return KVTarget(self.cache.k(layer), self.cache.v(layer), self.slots)
