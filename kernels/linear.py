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

The kernel's epilogue takes a decoder layer's element-wise work into the projections' launches
(``kernels.linear_kernels``): ``linear_add_norm`` adds the residual and leaves the next RMSNorm
pending (``PendingNorm``: the sum times the norm's weight and the sum's squares per tile), a
``linear`` given that ``pending`` norm applies its row scale, and ``swiglu`` computes
``silu(gate) * up`` of a gate/up projection. Off the kernel, the same results come from torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
from ssvkit.kernels.arrivals import arrival_counters
from ssvkit.kernels.checks import FLOAT_DTYPES
from ssvkit.kernels.dense_verify import dot_precision
from ssvkit.kernels.device import num_sms
from ssvkit.kernels.layer_ops import norm_eps
from ssvkit.kernels.linear_kernels import linear_kernel
from ssvkit.kernels.pdl import INTERPRETED
from ssvkit.perfmodel.linear_rule import MAX_ROWS, MIN_WEIGHT_BYTES
from ssvkit.perfmodel.numbers import require_at_least_one

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
        require_at_least_one(self, ("split", "num_stages"))
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


class PendingNorm(NamedTuple):
    """An RMSNorm of rows whose row scale is still to apply: the rows hold the input times the
    norm's weight, ``sumsq`` ``[parts, rows]`` (fp32) the input rows' squares summed over parts
    of their ``dim`` columns, ``eps`` the norm's epsilon. ``linear(rows, w, pending=...)`` is
    ``linear(rms_norm(input, weight, eps), w)`` with each row's ``rsqrt(mean(x^2) + eps)``
    applied to its products."""

    sumsq: torch.Tensor
    eps: float


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
    pending: PendingNorm | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``x @ weight.T + bias`` (``F.linear``'s contract) in ``x``'s dtype with fp32
    accumulation: on the GPU or the interpreter, the weight-streaming kernel where
    ``streams_weight`` says so (rows counted with leading dimensions flattened) or a ``config``
    asks for it (at most ``MAX_ROWS`` rows), torch otherwise. ``config`` overrides
    ``linear_config``'s launch.

    ``pending`` scales each row's products by its pending norm (``PendingNorm``) before the
    bias. ``swiglu`` takes ``weight`` as the gate's rows over the up's (``[2F, K]``) and returns
    ``silu(gate) * up`` ``[..., F]``, computed from the fp32 products."""
    if swiglu and weight.shape[0] % 2:
        raise ValueError(f"swiglu needs an even number of weight rows, got {weight.shape[0]}")
    return _linear(x, weight, bias, config, pending=pending, swiglu=swiglu)[0]


def linear_add_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float | None = None,
    bias: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, PendingNorm]:
    """The residual sum ``s = residual + linear(x, weight, bias)`` in ``x``'s dtype, and the
    next RMSNorm of ``s`` pending: ``s * norm_weight`` and ``s``'s squares summed over each
    tile's columns (``PendingNorm``), for the next ``linear`` to apply. One launch where
    ``linear`` runs its kernel; its rule and ``config`` as there."""
    if residual.shape != (*x.shape[:-1], weight.shape[0]) or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must be {x.dtype} of shape {(*x.shape[:-1], weight.shape[0])}, got "
            f"{residual.dtype} of shape {tuple(residual.shape)}"
        )
    if norm_weight.shape != (weight.shape[0],) or not norm_weight.is_contiguous():
        raise ValueError(
            f"norm_weight must be contiguous [{weight.shape[0]}], got {tuple(norm_weight.shape)}"
        )
    s, g, sumsq = _linear(x, weight, bias, config, residual=residual, norm_weight=norm_weight)
    return s, g, PendingNorm(sumsq, norm_eps(eps))


def _linear(x, weight, bias, config, *, pending=None, swiglu=False, residual=None,
            norm_weight=None):  # fmt: skip
    """The launch behind ``linear`` and ``linear_add_norm``: ``(y, g, sumsq)``, the last two
    None without a residual."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if pending is not None:
        _check_pending(pending, rows, x.device)
    streams = config is not None and (x.is_cuda or INTERPRETED)
    streams = streams or kernel_streams(rows, weight, x.device)
    if not streams or x.shape[-1] == 0:  # no input columns: nothing to stream
        return _torch_linear(x, weight, bias, pending, swiglu, residual, norm_weight)
    if rows > MAX_ROWS:
        raise ValueError(f"the weight-streaming kernel takes at most {MAX_ROWS} rows, got {rows}")
    _check(x, weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype, device=x.device)
    cfg = config or linear_config(m, n, k, num_sms(x.device))
    tiles = triton.cdiv(n, cfg.block_n)
    add_norm = residual is not None
    g = torch.empty_like(y) if add_norm else None
    sumsq = torch.empty((tiles, m), dtype=torch.float32, device=x.device) if add_norm else None
    if m and n:
        _launch(x2, weight, bias, y, cfg, pending, swiglu, residual, norm_weight, g, sumsq)
    return _shaped(y, g, sumsq, lead)


def _launch(x2, weight, bias, y, cfg, pending, swiglu, residual, norm_weight, g, sumsq):
    """``linear_kernel`` over ``x2`` ``[m, k]`` into ``y`` (and ``g``, ``sumsq`` where a
    residual is added): ``cfg``'s tiles, its K split cut to whole steps of ``BLOCK_K``, the
    split's fp32 partials and arrival counters where it splits."""
    m, k = x2.shape
    n = weight.shape[0]
    tiles = triton.cdiv(n, cfg.block_n)
    add_norm = residual is not None
    k_steps = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split)
    split = triton.cdiv(triton.cdiv(k, cfg.block_k), k_steps)
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
        counts = arrival_counters(tiles, x2.device)
    else:
        part = counts = y
    res = residual.reshape(m, n) if add_norm else y
    if res.stride(-1) != 1:
        res = res.contiguous()
    linear_kernel[(tiles, split)](
        x2,
        weight,
        bias if bias is not None else y,
        y,
        part,
        counts,
        res,
        norm_weight if add_norm else y,
        g if add_norm else y,
        sumsq if add_norm else part,
        pending.sumsq if pending is not None else part,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        res.stride(0),
        k_steps,
        pending.sumsq.shape[0] if pending is not None else 0,
        1.0 / k,
        pending.eps if pending is not None else 0.0,
        SS_BLOCK=triton.next_power_of_2(pending.sumsq.shape[0]) if pending is not None else 1,
        HAS_BIAS=bias is not None,
        ADD_NORM=add_norm,
        ROW_SCALE=pending is not None,
        SWIGLU=swiglu,
        BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT=split,
        DOT_PRECISION=dot_precision(x2.dtype),
        num_stages=cfg.num_stages,
        num_warps=cfg.num_warps,
    )


def _shaped(y, g, sumsq, lead):
    """The launch's outputs with ``x``'s leading dimensions."""
    n = y.shape[-1]
    return y.reshape(*lead, n), None if g is None else g.reshape(*lead, n), sumsq


def _torch_linear(x, weight, bias, pending, swiglu, residual, norm_weight):
    """``_linear``'s result in torch ops, the products summed in fp32 as the kernel's are. A
    plain projection is one ``F.linear`` launch (its GEMM sums in fp32 and rounds once, the
    bias added before the rounding): a small layer's cost is its launches, and casting its
    output to fp32 and back would add two more without changing a bit of it."""
    if pending is None and not swiglu and residual is None:
        return F.linear(x, weight, bias), None, None
    y = F.linear(x, weight).float()
    if pending is not None:
        ss = pending.sumsq.sum(0).reshape(*x.shape[:-1], 1)
        y = y * torch.rsqrt(ss / x.shape[-1] + pending.eps)
    if bias is not None:
        y = y + bias.float()
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype), None, None
    if residual is None:
        return y.to(x.dtype), None, None
    s = (y + residual.float()).to(x.dtype)
    g = (s.float() * norm_weight.float()).to(x.dtype)
    return s, g, s.float().square().sum(-1).reshape(1, -1)


def kernel_streams(rows: int, weight: torch.Tensor, device: torch.device) -> bool:
    """Whether ``linear`` of ``rows`` rows on ``device`` against ``weight`` runs the
    weight-streaming kernel with its epilogues (else torch ops): ``streams_weight`` on the GPU
    or the Triton interpreter."""
    return (torch.device(device).type == "cuda" or INTERPRETED) and streams_weight(rows, weight)


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


def _check_pending(pending: PendingNorm, rows: int, device: torch.device) -> None:
    """A pending norm's sums of squares: fp32 ``[parts, rows]`` on the input's device."""
    ss = pending.sumsq
    if ss.dtype != torch.float32 or ss.dim() != 2 or ss.shape[1] != rows or ss.device != device:
        raise ValueError(
            f"pending.sumsq must be float32 [parts, {rows}] on {device}, got {ss.dtype} "
            f"{tuple(ss.shape)} on {ss.device}"
        )
    if not ss.is_contiguous():
        raise ValueError(f"pending.sumsq must be contiguous, got strides {ss.stride()}")
