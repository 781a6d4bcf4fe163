"""The decoder layer's norms and SwiGLU activation and the forward's token embedding, one launch
each (``kernels.rope_kv_write`` holds the layer's third fused op, rotary with the KV-cache
store).

At decode sizes (a few rows of 4K-16K elements) these ops are bound by launch and memory latency,
not bandwidth, so each is a single kernel that reads its inputs once: ``rms_norm``,
``add_rms_norm`` (the residual add fused with the norm that follows it) and ``silu_mul``, each
computed in fp32 and returned in its input's dtype, and ``embed``, the gather of the tokens'
rows (torch's embedding takes a slower path for a dozen or so ids). Rows up to
``MAX_NORM_BLOCK`` elements stay in registers (wider ones take a second pass), and rows
narrower than a ``TILE`` are packed several to a program.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from ssvkit.kernels.checks import check_float_dtype

MAX_NORM_BLOCK = 16384  # widest row a norm keeps in registers
TILE = 4096  # elements of a program's tile: narrow rows are packed several to a program
SILU_BLOCK = 1024
EMBED_BLOCK = 1024  # elements of a gather program's tile


@triton.jit
def _residual(x_ptr, d_ptr, offs_x, offs_d, mask, HAS_DELTA: tl.constexpr):
    """One tile of the rows the norm reads: ``x``, or ``x + delta`` rounded to ``x``'s dtype."""
    x = tl.load(x_ptr + offs_x, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + offs_d, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [N, C]; rows at stride_x
    delta_ptr,  # [N, C] (HAS_DELTA)
    w_ptr,  # [C]
    res_ptr,  # [N, C] contiguous: x + delta (HAS_DELTA)
    y_ptr,  # [N, C] contiguous
    NUM_ROWS,
    NUM_COLS,
    stride_x,
    stride_d,
    eps,
    HAS_DELTA: tl.constexpr,
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # columns per chunk
    NUM_CHUNKS: tl.constexpr,
):
    tl.static_assert(NUM_CHUNKS == 1 or ROWS == 1, "rows wider than a chunk go one a program")
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < NUM_ROWS
    x_rows = (rows * stride_x)[:, None]
    d_rows = (rows * stride_d)[:, None]
    o_rows = (rows * NUM_COLS)[:, None]
    offs = tl.arange(0, BLOCK)[None, :]
    if NUM_CHUNKS == 1:
        # The whole row stays in registers between the reduction and the scaling.
        mask = row_ok[:, None] & (offs < NUM_COLS)
        s = _residual(x_ptr, delta_ptr, x_rows + offs, d_rows + offs, mask, HAS_DELTA)
        if HAS_DELTA:
            tl.store(res_ptr + o_rows + offs, s, mask=mask)
        sf = s.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(sf * sf, 1) / NUM_COLS + eps)[:, None]
        w = tl.load(w_ptr + offs, mask=offs < NUM_COLS, other=0.0).to(tl.float32)
        tl.store(y_ptr + o_rows + offs, (sf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            cols = c * BLOCK + offs
            mask = row_ok[:, None] & (cols < NUM_COLS)
            s = _residual(x_ptr, delta_ptr, x_rows + cols, d_rows + cols, mask, HAS_DELTA)
            if HAS_DELTA:
                tl.store(res_ptr + o_rows + cols, s, mask=mask)
            sf = s.to(tl.float32)
            acc += sf * sf
        rstd = tl.math.rsqrt(tl.sum(acc, 1) / NUM_COLS + eps)[:, None]
        # The second pass recomputes the sum from the inputs (L2-resident) rather than reading
        # back the residual stores, which other threads of this program may not have finished.
        for c in range(NUM_CHUNKS):
            cols = c * BLOCK + offs
            mask = row_ok[:, None] & (cols < NUM_COLS)
            s = _residual(x_ptr, delta_ptr, x_rows + cols, d_rows + cols, mask, HAS_DELTA)
            w = tl.load(w_ptr + cols, mask=cols < NUM_COLS, other=0.0).to(tl.float32)
            y = s.to(tl.float32) * rstd * w
            tl.store(y_ptr + o_rows + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, NUM_ROWS, NUM_COLS, stride_gu, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < NUM_ROWS)[:, None] & (cols < NUM_COLS)[None, :]
    src = gu_ptr + (rows * stride_gu)[:, None] + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + NUM_COLS, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up  # torch's silu: x / (1 + exp(-x))
    dst = out_ptr + (rows * NUM_COLS)[:, None] + cols[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _embed_kernel(
    ids_ptr,
    table_ptr,
    out_ptr,
    NUM_ROWS,
    NUM_COLS,
    stride_t,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < NUM_ROWS
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    mask = row_ok[:, None] & (cols < NUM_COLS)[None, :]
    v = tl.load(table_ptr + (ids * stride_t)[:, None] + cols[None, :], mask=mask)
    tl.store(out_ptr + (rows * NUM_COLS)[:, None] + cols[None, :], v, mask=mask)


def norm_eps(eps: float | None) -> float:
    """The epsilon of an fp32 RMSNorm, by torch's rule: ``None`` is float32's machine epsilon."""
    if eps is None:
        return torch.finfo(torch.float32).eps
    if not (eps >= 0 and eps < float("inf")):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


def _check_rows(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[N, C]`` rows (a view when its leading dims allow one)."""
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last dim, got shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"{name}'s last dim must be contiguous, got strides {x.stride()}")
    return x.reshape(-1, x.shape[-1])


def _norm_launch(x, delta, weight, eps):
    check_float_dtype("x", x)
    rows = _check_rows("x", x)
    cols = x.shape[-1]
    if weight.shape != (cols,):
        raise ValueError(f"weight must be [{cols}], got shape {tuple(weight.shape)}")
    check_float_dtype("weight", weight)
    if weight.device != x.device or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous on {x.device}, got {weight.device}")
    eps = norm_eps(eps)
    drows = rows
    if delta is not None:
        if delta.shape != x.shape or delta.dtype != x.dtype or delta.device != x.device:
            raise ValueError(
                f"delta must match x {tuple(x.shape)} {x.dtype} on {x.device}, got "
                f"{tuple(delta.shape)} {delta.dtype} on {delta.device}"
            )
        drows = _check_rows("delta", delta)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res = torch.empty_like(y) if delta is not None else y
    n = rows.shape[0]
    if n == 0:
        return res, y
    block = min(triton.next_power_of_2(cols), MAX_NORM_BLOCK)
    per_program = max(1, TILE // block)
    _rms_norm_kernel[(triton.cdiv(n, per_program),)](
        rows,
        drows,
        weight,
        res,
        y,
        n,
        cols,
        rows.stride(0),
        drows.stride(0),
        eps,
        HAS_DELTA=delta is not None,
        ROWS=per_program,
        BLOCK=block,
        NUM_CHUNKS=triton.cdiv(cols, block),
        num_warps=min(max(per_program * block // 512, 1), 16),
    )
    return res, y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``F.rms_norm(x, (C,), weight, eps)`` over the last dim ``C`` of ``x``, one launch.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., C]`` bf16, fp16 or fp32, last dim contiguous.
    weight : torch.Tensor
        ``[C]``, contiguous, on ``x``'s device.
    eps : float, optional
        None is float32's machine epsilon, as in torch.

    Returns
    -------
    torch.Tensor
        ``x * rsqrt(mean(x^2) + eps) * weight``, computed in fp32, in ``x.dtype``.
    """
    return _norm_launch(x, None, weight, eps)[1]


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual ``s = x + delta`` in ``x.dtype`` and ``rms_norm(s, weight, eps)``, one launch.

    Parameters
    ----------
    x, delta : torch.Tensor
        ``[..., C]`` of one shape, dtype and device (as ``rms_norm``'s ``x``).
    weight : torch.Tensor
        ``[C]``, as ``rms_norm``'s.
    eps : float, optional
        As ``rms_norm``'s.

    Returns
    -------
    s : torch.Tensor
        The residual, a torch add's result bit for bit.
    y : torch.Tensor
        ``rms_norm`` of ``s`` as rounded to ``x.dtype``, so both outputs equal
        ``s = x + delta; rms_norm(s)`` up to the reduction's order.
    """
    if delta is None:
        raise ValueError("delta must be a tensor, got None")
    return _norm_launch(x, delta, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate, up = gate_up.chunk(2, -1)``: ``[..., 2F]`` -> ``[..., F]``,
    fp32 inside, rounded once to ``gate_up.dtype``."""
    check_float_dtype("gate_up", gate_up)
    rows = _check_rows("gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even, got {gate_up.shape[-1]}")
    cols = gate_up.shape[-1] // 2
    out = torch.empty((*gate_up.shape[:-1], cols), dtype=gate_up.dtype, device=gate_up.device)
    n = rows.shape[0]
    if n:
        block = min(triton.next_power_of_2(cols), SILU_BLOCK)
        per_program = SILU_BLOCK // block
        grid = (triton.cdiv(n, per_program), triton.cdiv(cols, block))
        _silu_mul_kernel[grid](
            rows, out, n, cols, rows.stride(0), ROWS=per_program, BLOCK=block, num_warps=4
        )
    return out


def embed(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, table)``: the rows ``table[ids]``, ``[*ids.shape, D]``, one launch of
    tiles of ``EMBED_BLOCK`` elements (a few rows of a wide table a program, or a slice of one
    row). Every id must lie in ``[0, V)``; the gather does not check them on the device."""
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be int32 or int64, got {ids.dtype}")
    check_float_dtype("table", table)
    if table.dim() != 2 or table.stride(1) != 1 or table.device != ids.device:
        raise ValueError(
            f"table must be [V, D] with unit stride along D on {ids.device}, got shape "
            f"{tuple(table.shape)}, strides {table.stride()} on {table.device}"
        )
    flat = ids.reshape(-1).contiguous()
    cols = table.shape[1]
    out = torch.empty((*ids.shape, cols), dtype=table.dtype, device=table.device)
    n = flat.numel()
    if n and cols:
        block = min(triton.next_power_of_2(cols), EMBED_BLOCK)
        per_program = EMBED_BLOCK // block
        grid = (triton.cdiv(n, per_program), triton.cdiv(cols, block))
        _embed_kernel[grid](
            flat, table, out, n, cols, table.stride(0), ROWS=per_program, BLOCK=block, num_warps=4
        )
    return out


# ---------------------------------------------------------------------------- fp32 references


def reference_rms_norm(x, weight, eps=None) -> torch.Tensor:
    """fp32 ``rms_norm`` of ``x`` (read as fp32)."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), norm_eps(eps))


def reference_add_rms_norm(x, delta, weight, eps=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual in ``x.dtype`` (torch's add) and the fp32 norm of that rounded sum."""
    s = x + delta
    return s, reference_rms_norm(s, weight, eps)


def reference_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return F.silu(gate) * up
