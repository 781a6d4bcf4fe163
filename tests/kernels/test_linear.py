"""``kernels.linear`` against fp32 ``x @ w.T + b`` on ragged shapes, its launch rule and its
checks.

CPU: Triton interpreter, fp16/fp32 (the conftest sets ``TRITON_INTERPRET``). GPU (``gpu``
marker): bf16 at Llama-3.1-8B's projection shapes and CUDA-graph capture.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import HAS_CUDA
from ssvkit.kernels.arrivals import counter_buffers
from ssvkit.kernels.linear import (
    MAX_ROWS,
    MIN_WEIGHT_BYTES,
    LinearConfig,
    linear,
    linear_config,
    streams_weight,
)
from ssvkit.kernels.timing import poisoned_allocations

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _case(lead, n, k, dtype, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((*lead, k), generator=gen).to(dtype)
    w = (torch.randn((n, k), generator=gen) / k**0.5).to(dtype)
    b = torch.randn((n,), generator=gen).to(dtype) if bias else None
    return x.to(DEV), w.to(DEV), None if b is None else b.to(DEV)


def _check(y, x, w, b, dtype):
    ref = x.float() @ w.float().T + (0.0 if b is None else b.float())
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert torch.isfinite(y).all()
    scale = ref.abs().max().clamp(min=1.0)
    torch.testing.assert_close(y.float(), ref, atol=TOL[dtype] * scale, rtol=TOL[dtype])


# (leading dims, N, K, split): rows 1..MAX_ROWS, widths off the tile and step sizes, splits that
# do not divide the steps (the last split takes fewer).
CASES = [
    ((1,), 100, 300, None),
    ((2, 3), 130, 520, 3),
    ((1, 16), 64, 256, 2),
    ((31,), 200, 1000, 4),
    ((MAX_ROWS,), 70, 129, 2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}s{c[3]}")
def test_matches_reference(case, bias, dtype):
    if HAS_CUDA and dtype == torch.float32:
        dtype = torch.float16
    lead, n, k, split = case
    x, w, b = _case(lead, n, k, dtype, bias, seed=n + k)
    cfg = LinearConfig(block_n=64, block_k=64, split=split or 1)
    with poisoned_allocations():
        y = linear(x, w, b, config=cfg)
    _check(y, x, w, b, dtype)
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(x.device))


def test_strided_rows_and_where_the_kernel_runs():
    """Rows at a stride (a slice of a wider projection) go through the kernel as they are; the
    kernel runs for few rows against a large weight, F.linear elsewhere, and a launch asked of
    more rows than the kernel takes is refused."""
    x, w, _ = _case((5,), 48, 96, torch.float32, False, seed=1)
    wide = torch.cat([x, x], dim=1)[:, :96]
    assert wide.stride(0) == 192
    _check(linear(wide, w, config=LinearConfig(block_k=32)), wide, w, None, torch.float32)
    many, w2, b2 = _case((MAX_ROWS + 1,), 16, 32, torch.float32, True, seed=2)
    _check(linear(many, w2, b2), many, w2, b2, torch.float32)
    with pytest.raises(ValueError, match="at most"):
        linear(many, w2, b2, config=LinearConfig())
    big = torch.empty((MIN_WEIGHT_BYTES // 2 // 1024, 1024), dtype=torch.bfloat16, device="meta")
    assert streams_weight(MAX_ROWS, big) and not streams_weight(MAX_ROWS + 1, big)
    assert not streams_weight(1, big[:-1])


def test_launch_rule():
    """Splits fill about one program an SM; the pipeline takes a program's share of shared
    memory, deeper when one wave holds every program."""
    o_proj = linear_config(16, 4096, 4096, 132)  # 64 tiles
    assert (o_proj.block_n, o_proj.block_k, o_proj.split, o_proj.num_stages) == (64, 128, 2, 5)
    assert linear_config(16, 6144, 4096, 132).split == 1  # 96 tiles: one wave unsplit
    assert linear_config(1, 256, 4096, 132).split == 32  # 4 tiles, 32 steps
    assert linear_config(1, 64, 200, 132).split == 2  # never more splits than steps
    wide = linear_config(64, 28672, 4096, 132)  # 448 tiles: waves of two programs an SM
    assert (wide.split, wide.num_stages) == (1, 3)
    assert linear_config(64, 4096, 4096, 132).num_stages == 5  # one wave: the whole budget


@pytest.mark.parametrize(
    "x_shape, w_shape, kw, match",
    [
        ((2, 8), (4, 9), {}, "weight must be"),
        ((2, 8), (4, 8), {"w_dtype": torch.float16}, "weight must be"),
        ((2, 8), (4, 8), {"bias": (5,)}, "bias must be"),
        ((2, 8), (4, 8), {"x_dtype": torch.int32}, "x dtype"),
    ],
)
def test_rejects_bad_inputs(x_shape, w_shape, kw, match):
    x = torch.zeros(x_shape, dtype=kw.get("x_dtype", torch.float32), device=DEV)
    w = torch.zeros(w_shape, dtype=kw.get("w_dtype", torch.float32), device=DEV)
    b = torch.zeros(kw["bias"], device=DEV) if "bias" in kw else None
    with pytest.raises(ValueError, match=match):
        linear(x, w, b, config=LinearConfig())
    with pytest.raises(ValueError, match="split"):
        LinearConfig(split=0)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 16, MAX_ROWS])
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096)])
def test_gpu_bf16_matches_reference(rows, n, k):
    x, w, b = _case((rows,), n, k, torch.bfloat16, n == 6144, seed=rows)
    with poisoned_allocations():
        y = linear(x, w, b)
    _check(y, x, w, b, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_cuda_graph_capture():
    """A captured split launch replays on new inputs and leaves its counters zeroed."""
    x, w, _ = _case((16,), 4096, 4096, torch.bfloat16, False, seed=3)
    linear(x, w)  # compile and make the counter buffer before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = linear(x, w)
    for seed in (4, 5):
        x.copy_(_case((16,), 4096, 4096, torch.bfloat16, False, seed=seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x, w, None, torch.bfloat16)
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(x.device))
