"""The decoder's fused element-wise ops (``kernels.layer_ops``, ``kernels.rope_kv_write``)
against their fp32 torch references and against the engine's torch path (``engine.model``'s
RMSNorm / residual adds / SwiGLU, ``engine.rope.apply_rope`` and ``KVCache.write``).

CPU: Triton interpreter, fp16/fp32, small shapes. GPU (``gpu`` marker): bf16 at Llama-3.1-8B's
geometry, bit-exact residuals, and CUDA-graph capture of the engine's calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import assert_close
from ssvkit.engine.rope import apply_rope, expand_angles
from ssvkit.kernels.layer_ops import (
    add_rms_norm,
    embed,
    reference_add_rms_norm,
    reference_rms_norm,
    reference_silu_mul,
    rms_norm,
    silu_mul,
)
from ssvkit.kernels.rope_kv_write import reference_rope_kv_write, rope_kv_write
from ssvkit.kernels.timing import poisoned_allocations

CPU_DTYPES = [torch.float16, torch.float32]
EPS = 1e-5
# (H, Hkv, D, rotary_dim, interleaved, qk_norm): Llama-3.1-8B; GLM (interleaved, half rotary);
# Qwen3-style qk norm at D = 64; partial rotate-half with qk norm at a tiny D.
GEOMETRIES = [
    (32, 8, 128, 128, False, False),
    (14, 2, 64, 32, True, False),
    (14, 2, 64, 64, False, True),
    (4, 2, 16, 8, False, True),
]


def _rand(shape, dtype, seed, device, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype).to(device)


def _torch_norm(x, w, eps=EPS):
    """``engine.model.RMSNorm.forward``: ``F.rms_norm`` in the input dtype."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


# (leading dims, width): one row, ragged row counts, rows packed several to a program, a row
# wider than MAX_NORM_BLOCK (two passes), widths that are not powers of two.
NORM_SHAPES = [((1, 1), 4096), ((3, 5), 96), ((19,), 64), ((2,), 20000), ((1, 16), 1000)]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("lead, width", NORM_SHAPES)
def test_rms_norm_and_add_rms_norm_match_references(lead, width, dtype, device):
    x = _rand((*lead, width), dtype, 1, device)
    delta = _rand((*lead, width), dtype, 2, device)
    w = _rand((width,), dtype, 3, device, scale=0.5) + 1
    with poisoned_allocations():
        y = rms_norm(x, w, EPS)
        res, normed = add_rms_norm(x, delta, w, EPS)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, reference_rms_norm(x, w, EPS), dtype, "o")
    assert_close(y, _torch_norm(x, w), dtype, "o")
    # The residual is torch's add in the input dtype, bit for bit; the norm reads that sum.
    ref_res, ref_normed = reference_add_rms_norm(x, delta, w, EPS)
    assert torch.equal(res, x + delta) and torch.equal(res, ref_res)
    assert_close(normed, ref_normed, dtype, "o")
    assert_close(normed, _torch_norm(x + delta, w), dtype, "o")


def test_rms_norm_eps_follows_torch(device):
    """``eps=None`` is float32's epsilon (torch's rule), and eps matters for tiny rows."""
    x = torch.full((2, 64), 1e-4, device=device)
    w = torch.ones(64, device=device)
    for eps in (None, 0.0, 1e-2):
        torch.testing.assert_close(rms_norm(x, w, eps), F.rms_norm(x, (64,), w, eps))
    assert not torch.allclose(rms_norm(x, w, 1e-2), rms_norm(x, w, None))


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 2 * 1100), (3, 5, 2 * 96), (16, 2 * 13)])
def test_silu_mul_matches_reference_and_the_mlp(shape, dtype, device):
    gu = _rand(shape, dtype, 4, device, scale=3.0)
    with poisoned_allocations():
        out = silu_mul(gu)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert_close(out, reference_silu_mul(gu), dtype, "o")
    gate, up = gu.chunk(2, dim=-1)  # engine.model.MLP: two roundings instead of one
    assert_close(out, F.silu(gate) * up, dtype, "o")


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize(
    "ids_shape, vocab, width", [((1, 1), 7, 4096), ((3, 5), 300, 96), ((13,), 50, 2500)]
)
def test_embed_is_the_table_rows(ids_shape, vocab, width, dtype, ids_dtype, device):
    """Rows packed several to a program, a row over several programs, widths that are not
    powers of two; repeated ids; bit for bit ``F.embedding``."""
    table = _rand((vocab, width), dtype, 5, device)
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, vocab, ids_shape, generator=gen).to(ids_dtype).to(device)
    with poisoned_allocations():
        out = embed(ids, table)
    assert out.shape == (*ids_shape, width) and out.dtype == dtype
    assert torch.equal(out, F.embedding(ids.long(), table))
    cols = table[:, ::2]  # rows at a stride wider than their width
    assert torch.equal(embed(ids, cols.contiguous()[:, :7]), F.embedding(ids.long(), cols[:, :7]))


def _rope_case(geometry, bsz, t, dtype, seed, device):
    """Random inputs shaped as the engine makes them: ``qkv`` a column slice of a wider GEMM
    output (row stride != width), the cache one layer's view of ``[L, 2, B, Hkv, T, D]``, slots
    a random permutation per sequence, positions unrelated to the slots."""
    h, hkv, d, r, interleaved, qk_norm = geometry
    width = (h + 2 * hkv) * d
    gen = torch.Generator().manual_seed(seed)
    qkv = _rand((bsz, t, width + 8), dtype, seed, device)[..., :width]
    max_pos, t_max = 300, t + 7
    ang = torch.rand((max_pos, r // 2), generator=gen) * 50
    kv = _rand((2, 2, bsz, hkv, t_max, d), dtype, seed + 1, device)
    slots = torch.stack([torch.randperm(t_max, generator=gen)[:t] for _ in range(bsz)])
    kw = dict(num_q_heads=h, num_kv_heads=hkv, head_dim=d, rotary_dim=r, interleaved=interleaved)
    if qk_norm:
        kw |= dict(
            q_norm_weight=_rand((d,), dtype, seed + 2, device) + 1,
            k_norm_weight=_rand((d,), dtype, seed + 3, device),
        )
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, max_pos, (bsz, t), generator=gen).to(device)
    return qkv, cos, sin, pos, kv, slots.to(device), kw


def _engine_rope(qkv, cos_t, sin_t, pos, kw):
    """``engine.model.Attention.forward``'s torch path: norm modules, then ``apply_rope``."""
    b, t, _ = qkv.shape
    h, hkv, d = kw["num_q_heads"], kw["num_kv_heads"], kw["head_dim"]
    qk = qkv[..., : (h + hkv) * d].view(b, t, h + hkv, d)
    if "q_norm_weight" in kw:
        q = _torch_norm(qk[:, :, :h], kw["q_norm_weight"], EPS)
        qk = torch.cat((q, _torch_norm(qk[:, :, h:], kw["k_norm_weight"], EPS)), dim=2)
    cos, sin = expand_angles(cos_t[pos], sin_t[pos], interleaved=kw["interleaved"])
    qk = apply_rope(qk, cos, sin, interleaved=kw["interleaved"])
    return qk[:, :, :h], qk[:, :, h:]


def _gather(cache, slots):
    """``cache[b, :, slots[b, i]]`` as ``[B, t, Hkv, D]``."""
    rows = torch.arange(cache.shape[0], device=slots.device)[:, None].expand_as(slots)
    return cache[rows, :, slots]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("bsz, t", [(1, 1), (3, 5), (1, 16)])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_rope_kv_write_matches_reference_and_the_engine_path(geometry, bsz, t, dtype, device):
    qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(geometry, bsz, t, dtype, bsz + t, device)
    before = kv.clone()
    k_cache, v_cache = kv[1, 0], kv[1, 1]  # layer 1's views
    with poisoned_allocations():
        q = rope_kv_write(qkv, cos_t, sin_t, pos, k_cache, v_cache, slots, eps=EPS, **kw)
    h, hkv, d = kw["num_q_heads"], kw["num_kv_heads"], kw["head_dim"]
    assert q.shape == (bsz, t, h, d) and q.is_contiguous() and q.dtype == dtype
    rq, rk, rv = reference_rope_kv_write(qkv, cos_t, sin_t, pos, eps=EPS, **kw)
    k, v = _gather(k_cache, slots), _gather(v_cache, slots)
    assert_close(q, rq, dtype, "o")
    assert_close(k, rk, dtype, "o")
    assert torch.equal(v, qkv[..., (h + hkv) * d :].reshape(bsz, t, hkv, d))
    assert_close(v, rv, dtype, "o")
    eq, ek = _engine_rope(qkv, cos_t, sin_t, pos, kw)
    assert_close(q, eq, dtype, "o")
    assert_close(k, ek, dtype, "o")
    # Nothing but the rows' slots of this layer changed.
    written = torch.zeros_like(kv, dtype=torch.bool)
    rows = torch.arange(bsz, device=device)[:, None].expand_as(slots)
    written[1, :, rows, :, slots] = True
    assert torch.equal(kv[~written], before[~written])


def test_rope_kv_write_reads_16_bit_tables_as_the_torch_path_does(device):
    """A model cast to fp16 wholesale holds fp16 rope tables; both paths promote them."""
    qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(
        GEOMETRIES[1], 1, 3, torch.float32, 4, device
    )
    cos_t, sin_t = cos_t.half(), sin_t.half()
    q = rope_kv_write(qkv, cos_t, sin_t, pos, kv[0, 0], kv[0, 1], slots, **kw)
    eq, ek = _engine_rope(qkv, cos_t, sin_t, pos, kw)
    torch.testing.assert_close(q, eq, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(_gather(kv[0, 0], slots), ek, atol=1e-6, rtol=1e-6)


def test_rope_kv_write_writes_what_kv_cache_write_writes(device):
    """The fused store and ``KVCache.write`` of the torch path's rotated k leave the same cache
    (fp32: the rotation agrees to rounding)."""
    from ssvkit.engine.cache import KVCache
    from ssvkit.engine.config import ModelConfig

    geometry = (4, 2, 16, 16, False, False)
    qkv, cos_t, sin_t, pos, _, slots, kw = _rope_case(geometry, 2, 3, torch.float32, 9, device)
    cfg = ModelConfig(
        vocab_size=8,
        hidden_size=64,
        intermediate_size=8,
        num_layers=2,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    caches = [
        KVCache(cfg, 2, 10, dtype=torch.float32, device=device, use_triton=True) for _ in range(2)
    ]
    rope_kv_write(qkv, cos_t, sin_t, pos, caches[0].k(1), caches[0].v(1), slots, **kw)
    _, k = _engine_rope(qkv, cos_t, sin_t, pos, kw)
    v = qkv[..., 6 * 16 :].reshape(2, 3, 2, 16)
    caches[1].write(1, torch.arange(2, device=device)[:, None].expand(2, 3), slots, k, v)
    torch.testing.assert_close(caches[0].kv, caches[1].kv, atol=1e-6, rtol=1e-6)


def test_nan_inputs_come_out_nan(device):
    x = _rand((3, 64), torch.float32, 5, device)
    w = torch.ones(64, device=device)
    x[1, 7] = float("nan")
    assert rms_norm(x, w)[1].isnan().all() and not rms_norm(x, w)[[0, 2]].isnan().any()
    delta = torch.zeros_like(x)
    delta[2, 0] = float("nan")
    res, normed = add_rms_norm(x, delta, w)
    assert res[2, 0].isnan() and normed[1:].isnan().all() and not normed[0].isnan().any()
    gu = _rand((2, 32), torch.float32, 6, device)
    gu[0, 3], gu[1, 16 + 5] = float("nan"), float("nan")  # a gate, an up
    out = silu_mul(gu)
    assert out.isnan().nonzero().tolist() == [[0, 3], [1, 5]]
    for geometry in ((4, 2, 16, 8, False, False), (4, 2, 16, 16, False, True)):
        qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(geometry, 1, 2, torch.float32, 3, device)
        qkv = qkv.clone()
        qkv[0, 1, 0 * 16 + 1] = float("nan")  # q head 0, a rotated dim
        qkv[0, 0, 4 * 16 + 12] = float("nan")  # k head 0, a dim past rotary_dim=8 / rotated
        qkv[0, 0, 6 * 16 + 2] = float("nan")  # v head 0
        q = rope_kv_write(qkv, cos_t, sin_t, pos, kv[0, 0], kv[0, 1], slots, **kw)
        k, v = _gather(kv[0, 0], slots), _gather(kv[0, 1], slots)
        assert q[0, 1, 0].isnan().any() and not q[0, 0].isnan().any()
        assert k[0, 0, 0].isnan().any() and not k[0, 1].isnan().any()
        assert v[0, 0, 0, 2].isnan() and v.isnan().sum() == 1
        if "q_norm_weight" in kw:  # the head's norm spreads it over the whole head
            assert q[0, 1, 0].isnan().all() and k[0, 0, 0].isnan().all()


def _bad_rope_calls():
    """(change to the good call, message the ValueError must carry)."""
    return [
        (dict(qkv=lambda a: a.repeat_interleave(2, -1)[..., ::2]), "contiguous last dim"),
        (dict(qkv=lambda a: a.int()), "qkv dtype"),
        (dict(qkv=lambda a: a[..., :-16]), "qkv must be"),
        (dict(positions=lambda a: a.int()), "positions must be int64"),
        (dict(slots=lambda a: a[:, :1]), "slots must be int64"),
        (dict(cos_table=lambda a: a[:, :3].contiguous()), r"cos_table must be \[max_pos, 8\]"),
        (dict(sin_table=lambda a: a.double()), "sin_table dtype"),
        (dict(sin_table=lambda a: a.half()), "differs from cos_table"),
        (dict(k_cache=lambda a: a[:, :1]), "k_cache must be"),
        (dict(v_cache=lambda a: a.transpose(2, 3)), "v_cache"),
        (dict(positions=lambda a: a + 1000), "positions must lie in"),
        (dict(slots=lambda a: a - 100), "slots must lie in"),
        (dict(rotary_dim=7), "rotary_dim=7"),
        (dict(num_kv_heads=3), "num_q_heads=4"),
        (dict(q_norm_weight=torch.ones(16)), "given together"),
        (dict(eps=-1.0), "eps"),
    ]


@pytest.mark.parametrize("change, message", _bad_rope_calls())
def test_rope_kv_write_rejects_bad_inputs(change, message, device):
    qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(
        (4, 2, 16, 16, False, False), 1, 2, torch.float32, 1, device
    )
    args = dict(
        qkv=qkv,
        cos_table=cos_t,
        sin_table=sin_t,
        positions=pos,
        k_cache=kv[0, 0],
        v_cache=kv[0, 1],
        slots=slots,
        **kw,
    )
    for name, value in change.items():
        args[name] = value(args[name]) if callable(value) else value
    with pytest.raises(ValueError, match=message):
        rope_kv_write(**args)


def test_norms_and_silu_reject_bad_inputs(device):
    x, w = torch.randn(2, 8, device=device), torch.ones(8, device=device)
    for call, message in (
        (lambda: rms_norm(x.int(), w), "x dtype"),
        (lambda: rms_norm(x, w.repeat(2)), r"weight must be \[8\]"),
        (lambda: rms_norm(x.t(), w[:2]), "last dim must be contiguous"),
        (lambda: rms_norm(x, w, float("nan")), "eps must be finite"),
        (lambda: add_rms_norm(x, x.half(), w), "delta must match"),
        (lambda: add_rms_norm(x, x[:1], w), "delta must match"),
        (lambda: add_rms_norm(x, None, w), "delta must be a tensor"),
        (lambda: silu_mul(x[:, :7]), "last dim must be even, got 7"),
        (lambda: silu_mul(x.long()), "gate_up dtype"),
        (lambda: embed(x, x), "ids must be int32 or int64"),
        (lambda: embed(x.long(), x.t()), "table must be"),
        (lambda: embed(x.long(), x.long()), "table dtype"),
    ):
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.gpu
@pytest.mark.parametrize("bsz, t", [(1, 1), (3, 16)])
def test_gpu_bf16_matches_references_and_the_engine_path(bsz, t):
    dt, dev = torch.bfloat16, "cuda"
    x, delta = _rand((bsz, t, 4096), dt, 1, dev), _rand((bsz, t, 4096), dt, 2, dev)
    w = _rand((4096,), dt, 3, dev, scale=0.5) + 1
    with poisoned_allocations():
        res, normed = add_rms_norm(x, delta, w, EPS)
        gu = _rand((bsz, t, 2 * 14336), dt, 4, dev, scale=3.0)
        act = silu_mul(gu)
    assert torch.equal(res, x + delta)
    assert_close(normed, reference_rms_norm(x + delta, w, EPS), dt, "o")
    assert_close(normed, _torch_norm(x + delta, w), dt, "o")
    assert_close(act, reference_silu_mul(gu), dt, "o")
    table = _rand((128256, 4096), dt, 5, dev)
    ids = torch.randint(0, 128256, (bsz, t), device=dev)
    assert torch.equal(embed(ids, table), F.embedding(ids, table))
    for geometry in (GEOMETRIES[0], (64, 8, 128, 128, False, True), (32, 2, 128, 64, True, False)):
        qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(geometry, bsz, t, dt, t, dev)
        with poisoned_allocations():
            q = rope_kv_write(qkv, cos_t, sin_t, pos, kv[0, 0], kv[0, 1], slots, eps=EPS, **kw)
        rq, rk, _ = reference_rope_kv_write(qkv, cos_t, sin_t, pos, eps=EPS, **kw)
        eq, ek = _engine_rope(qkv, cos_t, sin_t, pos, kw)
        k = _gather(kv[0, 0], slots)
        assert_close(q, rq, dt, "o")
        assert_close(k, rk, dt, "o")
        assert_close(q, eq, dt, "o")
        assert_close(k, ek, dt, "o")


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    """The engine's calls capture (no host synchronisation) and replay tracks new inputs."""
    dt, dev = torch.bfloat16, "cuda"
    qkv, cos_t, sin_t, pos, kv, slots, kw = _rope_case(GEOMETRIES[0], 2, 5, dt, 2, dev)
    x, delta, w = (
        _rand((2, 5, 256), dt, 1, dev),
        _rand((2, 5, 256), dt, 2, dev),
        torch.ones(256, dtype=dt, device=dev),
    )

    def step():
        q = rope_kv_write(qkv, cos_t, sin_t, pos, kv[0, 0], kv[0, 1], slots, validate=False, **kw)
        return q, add_rms_norm(x, delta, w), silu_mul(x)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, (res, normed), act = step()
    for a in (qkv, x, delta):
        a.copy_(torch.randn_like(a))
    pos.copy_(torch.randint_like(pos, 0, 300))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(q, reference_rope_kv_write(qkv, cos_t, sin_t, pos, **kw)[0], dt, "o")
    assert torch.equal(res, x + delta)
    assert_close(normed, reference_rms_norm(x + delta, w), dt, "o")
    assert_close(act, reference_silu_mul(x), dt, "o")
