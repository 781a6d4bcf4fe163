"""The triton backend's fused element-wise kernels as an op-sweep group (``fused``, run by
``validation.engine_op_sweep``): ``add_rms_norm``, ``rope_kv_write`` into the KV cache's tail,
``silu_mul`` and the embedding gather, each called as ``engine.model``'s fused path calls it, at
the swept models' shapes and ``calibration.sweep.TOKENS`` rows. Each kernel is checked against
its fp32 reference before any is timed (a mismatch stops the sweep). The rows' ops are
``perfmodel.ops.FUSED_CLASSES`` and their bytes those the step model counts (``fused_bytes``),
so ``calibration.fit`` fits the classes the step model prices the fused path with.

    python -m ssvkit.validation.engine_op_sweep --out DIR --ops fused --budget-s 540
"""

from __future__ import annotations

import torch
from ssvkit.calibration.runner import Runner
from ssvkit.calibration.sweep import ACT, TOKENS, swept_models
from ssvkit.engine.cache import KVCache
from ssvkit.engine.config import ModelConfig
from ssvkit.kernels import layer_ops
from ssvkit.kernels.rope_kv_write import reference_rope_kv_write, rope_kv_write
from ssvkit.perfmodel.ops import FUSED_CLASSES

ROPE_POSITIONS = 32768  # rows of the rope tables the rotary gathers from
PREFIX = 1024  # cached tokens before the tail the KV stores write
EPS = 1e-5  # the norms' epsilon (Llama's)
# The shape the summary shows: Llama-3.1-8B's width, heads and FFN.
SUMMARY_SHAPE = {"d": 4096, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "f": 14336}
SUMMARY_TOKENS = (1, 16, 128, 512)


def kv_cache(num_kv_heads: int, head_dim: int, t_max: int, device: str = "cuda", dtype=ACT):
    """A one-layer, one-sequence ``engine.cache.KVCache`` of ``t_max`` positions."""
    cfg = ModelConfig(
        vocab_size=256,
        hidden_size=num_kv_heads * head_dim,
        intermediate_size=64,
        num_layers=1,
        num_q_heads=num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    return KVCache(cfg, 1, t_max, dtype=dtype, device=device, use_triton=True)


def fused_bytes(op: str, p: dict) -> int:
    """Bytes one call of a fused-path op with row params ``p`` moves (16-bit activations and
    weights, fp32 rope tables, int64 ids, positions and slots), as ``perfmodel.ops`` counts
    them."""
    m = p["m"]
    if op == "add_rms_norm":  # x and delta in, their sum and its norm out, the weight
        return 4 * m * p["d"] * 2 + p["d"] * 2
    if op == "rope_kv_write":  # q, k, v in; q out, k and v stored; cos/sin rows; positions, slots
        q = m * p["num_q_heads"] * p["head_dim"] * 2
        kv = 2 * m * p["num_kv_heads"] * p["head_dim"] * 2
        return 2 * q + 2 * kv + m * p["head_dim"] * 4 + 2 * m * 8
    if op == "silu_mul_fused":  # gate and up in, the product out
        return 3 * m * p["f"] * 2
    if op == "embed":  # ids in, table rows read and written
        return 2 * m * p["d"] * 2 + m * 8
    raise ValueError(f"op must be one of {', '.join(FUSED_CLASSES)}, got {op!r}")


def _fused_params(m: int, **shape) -> dict:
    return {"m": m, **shape, "dtype": "bfloat16", "impl": "fused"}


def _rope_store(qkv, cos_t, sin_t, positions, target, num_q: int, num_kv: int, dh: int):
    """``engine.model.Attention.rope_store`` of a Llama-style layer (full rotary, no q/k
    norm)."""
    return rope_kv_write(
        qkv,
        cos_t,
        sin_t,
        positions,
        target.k_cache,
        target.v_cache,
        target.slots,
        num_q_heads=num_q,
        num_kv_heads=num_kv,
        head_dim=dh,
        rotary_dim=dh,
        interleaved=False,
        validate=False,
    )


def _close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """An output against its fp32 reference: ``ValueError`` naming the op and the error."""
    err = (got.float() - want.float()).abs()
    bound = 2e-2 * (1.0 + want.float().abs())
    if not torch.isfinite(got.float()).all() or bool((err > bound).any()):
        raise ValueError(
            f"fused sweep check: {name} differs from its fp32 reference by {err.max()}"
        )


def check_fused(gen: torch.Generator, device: str = "cuda", dtype=ACT) -> None:
    """Each fused kernel once against its fp32 reference (5 rows of 4096 / 14336 / Llama-3.1-8B
    heads); ``ValueError`` on a mismatch, before anything is timed."""
    m, d, f, (num_q, num_kv, dh) = 5, 4096, 14336, (32, 8, 128)

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    x, delta, w = randn(m, d), randn(m, d), randn(d)
    res, y = layer_ops.add_rms_norm(x, delta, w, EPS)
    want_res, want_y = layer_ops.reference_add_rms_norm(x, delta, w, EPS)
    _close("add_rms_norm (residual)", res, want_res)
    _close("add_rms_norm (norm)", y, want_y)
    gu = randn(m, 2 * f)
    _close("silu_mul", layer_ops.silu_mul(gu), layer_ops.reference_silu_mul(gu))
    cache = kv_cache(num_kv, dh, PREFIX + m, device, dtype)
    cache.lens.fill_(PREFIX)
    target = cache.tail_writer(m).target(0)
    qkv = randn(1, m, (num_q + 2 * num_kv) * dh)
    cos_t, sin_t = (randn(ROPE_POSITIONS, dh // 2, dt=torch.float32) for _ in range(2))
    pos = torch.randint(0, ROPE_POSITIONS, (1, m), generator=gen, device=device)
    q = _rope_store(qkv, cos_t, sin_t, pos, target, num_q, num_kv, dh)
    heads = {"num_q_heads": num_q, "num_kv_heads": num_kv, "head_dim": dh}
    want_q, want_k, want_v = reference_rope_kv_write(
        qkv, cos_t, sin_t, pos, **heads, rotary_dim=dh, interleaved=False
    )
    _close("rope_kv_write (q)", q, want_q)
    _close("rope_kv_write (k)", target.k_cache[:, :, PREFIX:], want_k.transpose(1, 2))
    _close("rope_kv_write (v)", target.v_cache[:, :, PREFIX:], want_v.transpose(1, 2))


def fused_ops(s: Runner, models: dict | None = None, device: str = "cuda") -> None:
    """The ``fused`` group: after ``check_fused``, one row per (m, shape) and op at the swept
    models' (or ``models``') shapes: ``add_rms_norm`` over m rows of width d, ``rope_kv_write``
    of m rows into the cache's tail (a batch of 1 after a ``PREFIX``-token prefix), ``silu_mul``
    of m rows of 2F, the embedding gather of m tokens (``impl: engine``: the engine's gather,
    ``kernels.layer_ops.embed``)."""
    gen = torch.Generator(device=device).manual_seed(4)
    check_fused(gen, device, ACT if device == "cuda" else torch.float32)
    models = [m for m in (swept_models() if models is None else models).values() if not m.is_mla]
    widths = sorted({m.hidden_size for m in models})
    heads = sorted({(m.num_q_heads, m.num_kv_heads, m.head_dim) for m in models})
    ffn = sorted({m.intermediate_size for m in models})
    vocab = {d: max(m.vocab_size for m in models if m.hidden_size == d) for d in widths}

    def randn(*shape, dtype=ACT):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    for m in TOKENS:
        for d in widths:
            _time_norm(s, m, d, randn)
        for h in heads:
            _time_rope(s, m, h, randn, gen, device)
        for f in ffn:
            _time_silu(s, m, f, randn)
        for d in widths:
            _time_embed(s, m, d, vocab[d], randn, gen, device)


def _time_norm(s: Runner, m: int, d: int, randn) -> None:
    """``add_rms_norm`` over ``m`` rows of width ``d``."""
    norm = FUSED_CLASSES[0]
    params = _fused_params(m, d=d)
    rot = s.rotations(fused_bytes(norm, params))
    xs = [(randn(m, d), randn(m, d)) for _ in range(rot)]
    w = randn(d)
    s.time_op(
        norm,
        params,
        lambda i: layer_ops.add_rms_norm(*xs[i], w, EPS),
        num_inputs=rot,
        unique_bytes=fused_bytes(norm, params),
        flops=6 * m * d,
    )


def _time_rope(s: Runner, m: int, heads: tuple, randn, gen, device) -> None:
    """``rope_kv_write`` of ``m`` rows of ``heads`` (q heads, KV heads, head dim) into the
    cache's tail after a ``PREFIX``-token prefix."""
    rope = FUSED_CLASSES[1]
    num_q, num_kv, dh = heads
    params = _fused_params(m, num_q_heads=num_q, num_kv_heads=num_kv, head_dim=dh)
    rot = s.rotations(fused_bytes(rope, params))
    caches = [kv_cache(num_kv, dh, PREFIX + m, device) for _ in range(rot)]
    for c in caches:
        c.lens.fill_(PREFIX)
    # slots are built once per forward (engine.runner), not per layer
    targets = [c.tail_writer(m).target(0) for c in caches]
    qkvs = [randn(1, m, (num_q + 2 * num_kv) * dh) for _ in range(rot)]
    tables = tuple(randn(ROPE_POSITIONS, dh // 2, dtype=torch.float32) for _ in range(2))
    pos = torch.randint(0, ROPE_POSITIONS, (1, m), generator=gen, device=device)
    s.time_op(
        rope,
        params,
        lambda i: _rope_store(qkvs[i], *tables, pos, targets[i], *heads),
        num_inputs=rot,
        unique_bytes=fused_bytes(rope, params),
        flops=6 * m * (num_q + num_kv) * dh,
    )


def _time_silu(s: Runner, m: int, f: int, randn) -> None:
    """``silu_mul`` of ``m`` rows of ``2 f``."""
    act = FUSED_CLASSES[2]
    params = _fused_params(m, f=f)
    rot = s.rotations(fused_bytes(act, params))
    gus = [randn(m, 2 * f) for _ in range(rot)]
    s.time_op(
        act,
        params,
        lambda i: layer_ops.silu_mul(gus[i]),
        num_inputs=rot,
        unique_bytes=fused_bytes(act, params),
        flops=5 * m * f,
    )


def _time_embed(s: Runner, m: int, d: int, vocab: int, randn, gen, device) -> None:
    """The engine's embedding gather of ``m`` tokens from a ``[vocab, d]`` table."""
    embed = FUSED_CLASSES[3]
    params = {"m": m, "d": d, "vocab": vocab, "dtype": "bfloat16", "impl": "engine"}
    table = randn(vocab, d)
    ids = [torch.randint(0, vocab, (1, m), generator=gen, device=device) for _ in range(8)]
    s.time_op(
        embed,
        params,
        lambda i: layer_ops.embed(ids[i], table),
        num_inputs=len(ids),
        unique_bytes=fused_bytes(embed, params),
        flops=0,
    )


def fused_summary(rows: list[dict]) -> str:
    """Median microseconds of each fused op at ``SUMMARY_SHAPE`` and ``SUMMARY_TOKENS`` rows
    (cold L2, CUDA-graph replay); "-" where ``rows`` have none."""
    cold = [r for r in rows if r["op"] in FUSED_CLASSES and "l2" not in r["params"]]
    lines = [
        "fused element-wise ops, Llama-3.1-8B shapes, median us (graph replay, cold L2):",
        f"{'op':16s}" + "".join(f"{'m=' + str(m):>10s}" for m in SUMMARY_TOKENS),
    ]
    for op in FUSED_CLASSES:
        cells = []
        for m in SUMMARY_TOKENS:
            hit = [
                r["median_s"]
                for r in cold
                if r["op"] == op
                and r["params"]["m"] == m
                and all(r["params"].get(k, v) == v for k, v in SUMMARY_SHAPE.items())
            ]
            cells.append(f"{hit[0] * 1e6:10.2f}" if hit else f"{'-':>10s}")
        lines.append(f"{op:16s}" + "".join(cells))
    return "\n".join(lines)
