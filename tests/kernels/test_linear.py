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
    PendingNorm,
    _torch_linear,
    linear,
    linear_add_norm,
    linear_config,
    streams_weight,
)
from ssvkit.kernels.timing import poisoned_allocations
from torch.utils._python_dispatch import TorchDispatchMode
from triton import cdiv as triton_cdiv

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


class _DispatchedOps(TorchDispatchMode):
    """The aten ops a block dispatches, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias", [False, True])
def test_a_projection_off_the_kernel_is_one_gemm(bias):
    """Where the kernel does not stream the weight (more rows than it takes, a weight under
    ``MIN_WEIGHT_BYTES``), a plain projection is ``F.linear`` alone, bit for bit: no casts of
    its output around the GEMM, each of which would be a launch of its own in the step."""
    for lead, n, k in (((2, 3), 64, 96), ((MAX_ROWS + 1,), 16, 32)):
        x, w, b = _case(lead, n, k, torch.bfloat16, bias, seed=3)
        with _DispatchedOps() as seen:
            y = linear(x, w, b)
        gemms = [f for f in seen.names if f not in ("t", "view", "_unsafe_view", "reshape")]
        assert gemms == ["addmm" if bias else "mm"], seen.names
        assert torch.equal(y, torch.nn.functional.linear(x, w, b))


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


def _normed(s, w, eps):
    sf = s.float()
    return sf * torch.rsqrt(sf.square().mean(-1, keepdim=True) + eps) * w.float()


# (leading dims, producer N (the normed width), consumer N, K, producer split, consumer split)
CHAIN_CASES = [
    ((1,), 100, 130, 300, None, None),
    ((2, 3), 130, 96, 520, 3, 2),
    ((MAX_ROWS,), 70, 64, 129, 2, 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CHAIN_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}")
def test_residual_norm_chain_matches_reference(case, dtype):
    """A projection added to a residual with the next RMSNorm pending, then the next projection
    applying it (with a bias; as a SwiGLU pair), against fp32 ``s = r + x W^T``,
    ``rms_norm(s) W2^T + b`` and ``silu(.) * up`` of its halves; on the kernel with splits that
    do not divide the steps and in torch, which agree."""
    if HAS_CUDA and dtype == torch.float32:
        dtype = torch.float16
    lead, n1, n2, k, split1, split2 = case
    gen = torch.Generator().manual_seed(n1 + k)
    x, w1, _ = _case(lead, n1, k, dtype, False, seed=n1)
    r = torch.randn((*lead, n1), generator=gen).to(dtype).to(DEV)
    nw = (1 + 0.5 * torch.randn((n1,), generator=gen)).to(dtype).to(DEV)
    w2 = (torch.randn((n2, n1), generator=gen) / n1**0.5).to(dtype).to(DEV)
    b2 = torch.randn((n2,), generator=gen).to(dtype).to(DEV)
    eps = 1e-5
    cfg1 = LinearConfig(block_n=32, block_k=64, split=split1 or 1)
    cfg2 = LinearConfig(block_n=32, block_k=32, split=split2 or 1)
    with poisoned_allocations():
        s, g, pending = linear_add_norm(x, w1, r, nw, eps, config=cfg1)
        y = linear(g, w2, b2, config=cfg2, pending=pending)
        act = linear(g, w2, config=cfg2, pending=pending, swiglu=True)
    s_ref = x.float() @ w1.float().T + r.float()
    _check_close(s, s_ref, dtype)
    assert pending.sumsq.shape == (triton_cdiv(n1, 32), s.numel() // n1)
    h = _normed(s, nw, eps)
    y_ref = h @ w2.float().T + b2.float()
    _check_close(y, y_ref, dtype)
    gate, up = (h @ w2.float().T).chunk(2, dim=-1)
    _check_close(act, torch.nn.functional.silu(gate) * up, dtype)
    torch_s, torch_g, torch_ss = _torch_linear(x, w1, None, None, False, r, nw)
    _check_close(s, torch_s.float(), dtype)
    _check_close(g, torch_g.float(), dtype)
    torch_y = _torch_linear(g, w2, b2, PendingNorm(torch_ss, eps), False, None, None)[0]
    _check_close(y, torch_y.float(), dtype)
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(x.device))


def _check_close(y, ref, dtype):
    assert torch.isfinite(y).all() and y.shape == ref.shape
    scale = ref.abs().max().clamp(min=1.0)
    torch.testing.assert_close(y.float(), ref, atol=TOL[dtype] * scale * 2, rtol=TOL[dtype] * 2)


def test_chain_rejects_bad_inputs():
    x, w, _ = _case((3,), 16, 32, torch.float32, False, seed=4)
    r = torch.zeros((3, 16), device=DEV)
    nw = torch.ones(16, device=DEV)
    with pytest.raises(ValueError, match="residual must be"):
        linear_add_norm(x, w, r[:2], nw, config=LinearConfig())
    with pytest.raises(ValueError, match="norm_weight must be"):
        linear_add_norm(x, w, r, nw[:8], config=LinearConfig())
    with pytest.raises(ValueError, match="pending.sumsq must be"):
        linear(x, w, pending=PendingNorm(torch.zeros((2, 4), device=DEV), 1e-5))
    with pytest.raises(ValueError, match="swiglu needs an even"):
        linear(x, w[:15], swiglu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 16, MAX_ROWS])
def test_gpu_bf16_chain_at_llama_shapes(rows):
    """Llama-3.1-8B's layer chain in bf16 on the launch rule's configs: the output projection
    added to the residual with the post-attention norm pending, the gate/up projection applying
    it as a SwiGLU pair, the down projection added to the residual with the next input norm
    pending and the q/k/v projection applying it, each against fp32."""
    gen = torch.Generator().manual_seed(rows)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16).to(DEV)

    d, f, eps = 4096, 14336, 1e-5
    o, r = rand(rows, d), rand(rows, d)
    w_o, w_gu = rand(d, d, scale=d**-0.5), rand(2 * f, d, scale=d**-0.5)
    w_down, w_qkv = rand(d, f, scale=f**-0.5), rand(6144, d, scale=d**-0.5)
    n1, n2 = 1 + rand(d, scale=0.2), 1 + rand(d, scale=0.2)
    with poisoned_allocations():
        s, g, post = linear_add_norm(o, w_o, r, n1, eps)
        act = linear(g, w_gu, pending=post, swiglu=True)
        s2, g2, pre = linear_add_norm(act, w_down, s, n2, eps)
        qkv = linear(g2, w_qkv, pending=pre)
    s_ref = o.float() @ w_o.float().T + r.float()
    _check_close(s, s_ref, torch.bfloat16)
    gate, up = (_normed(s, n1, eps) @ w_gu.float().T).chunk(2, dim=-1)
    act_ref = torch.nn.functional.silu(gate) * up
    _check_close(act, act_ref, torch.bfloat16)
    s2_ref = act.float() @ w_down.float().T + s.float()
    _check_close(s2, s2_ref, torch.bfloat16)
    _check_close(qkv, _normed(s2, n2, eps) @ w_qkv.float().T, torch.bfloat16)
    assert all(int(buf.abs().sum()) == 0 for buf in counter_buffers(DEV))
