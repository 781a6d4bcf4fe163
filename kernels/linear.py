"""The engine's linear layers: ``y = x @ weight.T (+ bias)``, the weight streamed at copy rate
when ``x`` has few rows.

At decode sizes (a verify step's 1-64 rows against a 4K-128K x 4K weight) a linear layer reads
its weight once and does little arithmetic on it: its floor is the weight's bytes over the copy
bandwidth. ``linear`` then runs one Triton launch that computes ``y.T`` tile by tile (``BLOCK_N``
output rows of the weight against all of ``x``'s rows, so the MMA's wide side is the weight's)
and splits the input dimension over ``split`` programs a tile where the tiles alone leave SMs
idle: those programs write fp32 partials and the last to arrive sums them
(``arrivals.last_to_arrive``), in the same launch. Above ``MAX_ROWS`` rows, for weights small
enough that a launch's latency bounds them, or on a CPU without the Triton interpreter, it is
``torch.nn.functional.linear``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from ssvkit.kernels.arrivals import arrival_counters, last_to_arrive
from ssvkit.kernels.checks import FLOAT_DTYPES
from ssvkit.kernels.dense_verify import dot_precision
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.pdl import INTERPRETED

# Where the weight-streaming kernel runs: few rows against a weight large enough that its bytes,
# not a launch's latency, bound the layer. Beyond these bounds a GEMM library's kernels are as
# fast or faster on the H200 (``calibration/profiles/h200/op_sweep.jsonl``'s gemm rows time
# whichever ``linear`` runs).
MAX_ROWS = 32
MIN_WEIGHT_BYTES = 16 * 2**20
# Shared memory a program's pipeline may take when programs share an SM, and its depth.
STAGE_BYTES_BUDGET = 100 * 1024
MAX_STAGES = 5


@dataclass(frozen=True, slots=True)
class LinearConfig:
    """A launch of the weight-streaming kernel: the weight rows of a tile, the input columns a
    step, the programs a tile's input dimension is split over, the pipeline's depth, warps."""

    block_n: int = 64
    block_k: int = 128
    split: int = 1
    num_stages: int = 3
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        for name in ("split", "num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")


def linear_config(rows: int, n: int, k: int, sms: int) -> LinearConfig:
    """The launch of ``rows`` x ``[n, k]``: tiles of 64 weight rows and steps of 128 columns;
    the input dimension split ``sms // tiles`` ways (as many as the steps allow), so the
    programs fill about one an SM; and the pipeline as deep as a program's share of shared
    memory holds, at most ``MAX_STAGES`` steps: the whole budget of two programs when one wave
    holds every program, half of it when waves follow each other (two programs an SM then
    keep more weight bytes in flight than one deeper one)."""
    block_n, block_k = 64, 128
    tiles = triton.cdiv(n, block_n)
    split = max(1, min(sms // tiles, triton.cdiv(k, block_k)))
    stage = (block_n + max(16, triton.next_power_of_2(rows))) * block_k * 2
    budget = STAGE_BYTES_BUDGET * (2 if tiles * split <= sms else 1)
    stages = max(2, min(MAX_STAGES, budget // stage))
    return LinearConfig(block_n, block_k, split, stages)


@triton.jit
def _linear_kernel(
    x_ptr,  # [M, K], rows at stride_x
    w_ptr,  # [N, K], rows at stride_w
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [M, N], rows at stride_y
    part_ptr,  # [SPLIT, M, N] fp32 partials (SPLIT > 1)
    count_ptr,  # [cdiv(N, BLOCK_N)] arrival counters (SPLIT > 1)
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    K_STEPS,  # BLOCK_K steps a program takes
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs; ignored by 16-bit inputs
):
    tile = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_x
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    k_start = part * K_STEPS * BLOCK_K
    for step in range(K_STEPS):
        offs_k = k_start + step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_cols + offs_k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
    out_mask = n_ok[:, None] & m_ok[None, :]
    y_offs = offs_m[None, :] * stride_y + offs_n[:, None]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        p_offs = offs_m[None, :] * N + offs_n[:, None]
        tl.store(part_ptr + part * M * N + p_offs, acc, mask=out_mask)
        if last_to_arrive(count_ptr + tile, SPLIT):
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(SPLIT):
                total += tl.load(
                    part_ptr + s * M * N + p_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` (``F.linear``'s contract) in ``x``'s dtype with fp32
    accumulation: on the GPU or the interpreter, the weight-streaming kernel where
    ``streams_weight`` says so (rows counted with leading dimensions flattened) or a ``config``
    asks for it (at most ``MAX_ROWS`` rows), ``F.linear`` otherwise. ``config`` overrides
    ``linear_config``'s launch."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not (x.is_cuda or INTERPRETED) or not (config is not None or streams_weight(rows, weight)):
        return F.linear(x, weight, bias)
    if x.shape[-1] == 0:  # no input columns: nothing to stream, the bias alone
        return F.linear(x, weight, bias)
    if rows > MAX_ROWS:
        raise ValueError(f"the weight-streaming kernel takes at most {MAX_ROWS} rows, got {rows}")
    _check(x, weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    cfg = config or linear_config(m, n, k, num_sms(x.device))
    tiles = triton.cdiv(n, cfg.block_n)
    k_steps = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split)
    split = triton.cdiv(triton.cdiv(k, cfg.block_k), k_steps)
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        counts = arrival_counters(tiles, x.device)
    else:
        part = counts = y
    _linear_kernel[(tiles, split)](
        x2,
        weight,
        bias if bias is not None else y,
        y,
        part,
        counts,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        k_steps,
        HAS_BIAS=bias is not None,
        BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT=split,
        DOT_PRECISION=dot_precision(x.dtype),
        num_stages=cfg.num_stages,
        num_warps=cfg.num_warps,
    )
    return y.reshape(*lead, n)


def streams_weight(rows: int, weight: torch.Tensor) -> bool:
    """Whether ``linear`` runs ``rows`` rows against ``weight`` on the weight-streaming kernel
    (else ``F.linear``): few rows against a weight too large for launch latency to dominate."""
    return rows <= MAX_ROWS and weight.numel() * weight.element_size() >= MIN_WEIGHT_BYTES


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Shapes, dtypes, devices and the weight's layout the kernel reads."""
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not supported; use one of {FLOAT_DTYPES}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"weight must be [N, {x.shape[-1]}] for x of shape {tuple(x.shape)}, got "
            f"{tuple(weight.shape)}"
        )
    if weight.dtype != x.dtype or weight.device != x.device or weight.stride(1) != 1:
        raise ValueError(
            f"weight must be {x.dtype} on {x.device} with unit stride along K, got "
            f"{weight.dtype} on {weight.device} with strides {weight.stride()}"
        )
    n = weight.shape[0]
    if bias is not None and (
        bias.shape != (n,) or bias.dtype != x.dtype or bias.device != x.device
    ):
        raise ValueError(
            f"bias must be [{n}] {x.dtype} on {x.device}, got {tuple(bias.shape)} "
            f"{bias.dtype} on {bias.device}"
        )
