"""Per-block key summaries for block selection (:mod:`kernels.select_blocks`): each KV block's
mean key (seed 001, eq. 5) and its channel-wise min/max keys (Quest, seed 004 appendix A.1).

Metadata lives on the device as ``[B, Hkv, NB_max, 2, D]`` bfloat16 tensors, ``NB_max =
ceil(T_max / block_size)``: each fp32 summary ``x`` as two parts, ``hi = bf16(x)`` and ``lo =
bf16(x - hi)`` (``split_parts``; ``hi + lo`` is ``x`` within ~2^-17 of it), the same four bytes
an element as fp32, which the scoring multiplies in three bf16 MMAs with no conversion
(``kernels.select_kernels.score_range``). A partial last block is summarised over its present
tokens only.
``BlockMetadata.update`` refreshes just the blocks touched by appended (or rolled-back) tokens,
reading the lengths on the device, so the decode loop can capture it in a CUDA graph.
``reference_block_metadata`` is the fp32 torch reference.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from ssvkit.kernels.block_metadata_kernels import block_metadata_kernel
from ssvkit.kernels.checks import check_float_dtype, check_lens

# The summaries a BlockMetadata can hold: mean keys, or min/max keys (Quest).
KINDS = ("mean", "quest")
# The parts of a stored summary element: its bf16 high part and the bf16 rest (``split_parts``).
PARTS = 2
# Programs per (b, kv head) in ``update``: an append of up to 64 draft tokens + 1 bonus token
# touches at most ceil(65 / block_size) + 1 blocks; programs loop if more are touched.
_APPEND_TOKENS_HINT = 65


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


def split_parts(x: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` fp32 as ``[..., 2, D]`` bf16 parts: ``bf16(x)`` and ``bf16(x - bf16(x))``."""
    hi = x.float().to(torch.bfloat16)
    lo = (x.float() - hi.float()).to(torch.bfloat16)
    return torch.stack((hi, lo), dim=-2)


def join_parts(parts: torch.Tensor) -> torch.Tensor:
    """The fp32 summaries ``[..., D]`` of ``[..., 2, D]`` parts (``split_parts``)."""
    return parts[..., 0, :].float() + parts[..., 1, :].float()


@dataclasses.dataclass(frozen=True, slots=True)
class BlockMetadata:
    """Per-block key summaries for block selection, each ``[B, Hkv, NB_max, 2, D]`` bfloat16:
    an fp32 summary in two parts (``split_parts``; ``values`` gives it back as fp32).

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

    def __post_init__(self) -> None:
        tensors = {n: getattr(self, n) for n in ("mean", "kmin", "kmax")}
        present = {n: x for n, x in tensors.items() if x is not None}
        if not present or (tensors["kmin"] is None) != (tensors["kmax"] is None):
            raise ValueError("BlockMetadata needs mean, or kmin and kmax, or all three")
        shape = next(iter(present.values())).shape
        for name, x in present.items():
            if x.dtype != torch.bfloat16 or x.dim() != 5 or x.shape[3] != PARTS:
                raise ValueError(
                    f"BlockMetadata.{name} must be [B, Hkv, NB, {PARTS}, D] bfloat16 parts "
                    f"(split_parts), got {x.dtype} {tuple(x.shape)}"
                )
            if x.shape != shape or x.stride(4) != 1:
                raise ValueError(
                    f"BlockMetadata.{name} {tuple(x.shape)} must match {tuple(shape)} and "
                    "have a contiguous last dimension"
                )

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, t in (("mean", self.mean), ("quest", self.kmin)) if t is not None)

    @property
    def num_blocks(self) -> int:
        return self._any().shape[2]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, Hkv, NB_max, D)`` of the summaries."""
        b, hkv, nb, _, d = self._any().shape
        return b, hkv, nb, d

    def _any(self) -> torch.Tensor:
        return self.mean if self.mean is not None else self.kmin

    def values(self, name: str) -> torch.Tensor:
        """Summary ``name`` (``"mean"``, ``"kmin"`` or ``"kmax"``) as ``[B, Hkv, NB_max, D]``
        fp32."""
        parts = getattr(self, name)
        if parts is None:
            raise ValueError(f"this BlockMetadata has no {name!r}; its kinds are {self.kinds}")
        return join_parts(parts)

    @classmethod
    def from_values(
        cls,
        block_size: int,
        mean: torch.Tensor | None = None,
        kmin: torch.Tensor | None = None,
        kmax: torch.Tensor | None = None,
    ) -> BlockMetadata:
        """Metadata of fp32 summaries ``[B, Hkv, NB_max, D]`` (``reference_block_metadata``'s),
        stored in parts."""
        parts = [None if x is None else split_parts(x) for x in (mean, kmin, kmax)]
        return cls(block_size, *parts)

    def set_values(self, name: str, x: torch.Tensor) -> None:
        """Overwrite summary ``name`` in place with the fp32 ``x`` ``[B, Hkv, NB_max, D]``."""
        getattr(self, name).copy_(split_parts(x))

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
            Tensors ``[B, Hkv, ceil(T_max / block_size), 2, D]`` bfloat16 (an fp32 summary in
            two parts). Blocks past the prefix hold unspecified values; scoring masks them.
        """
        _check_k_cache(k_cache, block_size)
        kinds = tuple(kinds)
        if not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
        b, hkv, t_max, d = k_cache.shape
        check_lens(prefix_lens, b, k_cache.device, "prefix_lens")
        nb = triton.cdiv(t_max, block_size)

        def alloc() -> torch.Tensor:
            shape = (b, hkv, nb, PARTS, d)
            return torch.zeros(shape, dtype=torch.bfloat16, device=k_cache.device)

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
        if (b, hkv, triton.cdiv(t_max, self.block_size), d) != self.shape:
            raise ValueError(
                f"k_cache shape {tuple(k_cache.shape)} does not match metadata {self.shape}"
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
            ref.stride(3),
            hkv,
            k_cache.shape[2],
            NUM_PROGS=num_progs,
            BLOCK_SIZE=self.block_size,
            D=d,
            HAS_MEAN=self.mean is not None,
            HAS_MINMAX=self.kmin is not None,
        )


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
