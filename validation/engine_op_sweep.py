"""The op sweep of record: ``calibration.sweep``'s groups plus the ops the engine implements,
timed exactly as the decode loop runs them. It lives above the engine because it calls the
engine's code; calibration provides the sweep machinery (``calibration.runner.Runner``: the
rows, the resume keys, the budget) and reads the rows.

    python -m ssvkit.validation.engine_op_sweep --out calibration/profiles/h100-sxm [--budget-s 540]
    # the fused kernels' rows alone, appended to a copy of the committed file (resumable):
    python -m ssvkit.validation.engine_op_sweep --out DIR --ops fused --budget-s 540

Groups: ``gemm``, ``elementwise`` (``calibration.sweep``), ``engine`` (the rotary embedding and
the decoder's other per-layer and per-forward ops of the torch backend, ``engine_group``),
``fused`` (the triton backend's fused element-wise kernels, ``validation.fused_op_sweep``; a
table of their rows at Llama-3.1-8B's shapes is printed last) and ``resident`` (every group
again at the L2-resident models). Exit status as ``calibration.sweep``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from ssvkit.calibration import sweep as base
from ssvkit.calibration.runner import STOPPED_AT_BUDGET, Runner, read_rows
from ssvkit.calibration.sweep import ACT, TOKENS, swept_models
from ssvkit.engine.rope import apply_rope, expand_angles
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.validation.fused_op_sweep import fused_ops, fused_summary, kv_cache


def _rotary(qk, cos, sin):
    return apply_rope(qk, cos, sin, interleaved=False)  # q and k heads rotated together


def _rope_inputs(gen, m: int, num_q: int, num_kv: int, head_dim: int):
    """Two q/k inputs ``[1, m, Hq + Hkv, D]``, rotary factors and the rotated element count."""
    qks = [
        torch.randn(1, m, num_q + num_kv, head_dim, generator=gen, device="cuda", dtype=ACT)
        for _ in range(2)
    ]
    cos = torch.randn(1, m, 1, head_dim, generator=gen, device="cuda")
    sin = torch.randn(1, m, 1, head_dim, generator=gen, device="cuda")
    return qks, cos, sin, m * (num_q + num_kv) * head_dim


def _head_params(m: int, num_q: int, num_kv: int, head_dim: int) -> dict:
    """Row params of a per-head op as the engine runs it."""
    return {
        "m": m,
        "num_q_heads": num_q,
        "num_kv_heads": num_kv,
        "head_dim": head_dim,
        "dtype": "bfloat16",
        "impl": "engine",
    }


def _rope_qk(qk, cos, sin, num_q: int):
    """engine.model.Attention: q and k rotated in one pass, q made contiguous for attention."""
    out = apply_rope(qk, cos, sin, interleaved=False)
    return out[:, :, :num_q].contiguous(), out[:, :, num_q:]


def _rope_tables(cos_table, sin_table, positions):
    """ssvkit.engine.model: the forward's rotary factors, gathered at the rows' positions."""
    return expand_angles(cos_table[positions], sin_table[positions], interleaved=False)


def engine_ops(s: Runner, models: dict | None = None) -> None:
    """The decoder's other per-layer and per-forward ops as ``engine.model`` runs them at the
    swept models' shapes: the two residual adds, q/k rotary with q's copy, the KV-tail write
    into the cache (a batch of 1, the tail after a 1024-token prefix), and the rotary factors
    gathered once per forward."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    models = [m for m in (swept_models() if models is None else models).values() if not m.is_mla]
    widths = sorted({m.hidden_size for m in models})
    heads = sorted({(m.num_q_heads, m.num_kv_heads, m.head_dim) for m in models})
    for m in TOKENS:
        for d in widths:
            rot = s.rotations(3 * m * d * 2)
            xs = [torch.randn(1, m, d, generator=gen, device="cuda", dtype=ACT) for _ in range(rot)]
            s.time_op(
                "residual_add",
                {"m": m, "d": d, "dtype": "bfloat16", "impl": "engine"},
                lambda i, xs=xs: xs[i] + xs[i - 1],
                num_inputs=rot,
                unique_bytes=3 * m * d * 2,
                flops=m * d,
            )
        for num_q, kv_heads, dh in heads:
            qks, cos, sin, elems = _rope_inputs(gen, m, num_q, kv_heads, dh)
            s.time_op(
                "rope_qk",
                _head_params(m, num_q, kv_heads, dh),
                lambda i, qks=qks, cos=cos, sin=sin, h=num_q: _rope_qk(qks[i], cos, sin, h),
                num_inputs=2,
                unique_bytes=2 * elems * 2 + m * num_q * dh * 2 * 2 + 2 * m * dh * 4,
                flops=6 * elems,
            )
            _time_kv_write(s, gen, m, kv_heads, dh)
        for dh in sorted({h[2] for h in heads}):
            table = 32768
            cos_t = torch.randn(table, dh // 2, generator=gen, device="cuda")
            sin_t = torch.randn(table, dh // 2, generator=gen, device="cuda")
            pos = [torch.randint(0, table, (1, m), generator=gen, device="cuda") for _ in range(2)]
            s.time_op(
                "rope_tables",
                {"m": m, "head_dim": dh, "impl": "engine"},
                lambda i, pos=pos, c=cos_t, sn=sin_t: _rope_tables(c, sn, pos[i]),
                num_inputs=2,
                unique_bytes=2 * m * dh * 4 + 2 * m * (dh // 2) * 4,
                flops=0,
            )


def _time_kv_write(s: Runner, gen: torch.Generator, m: int, kv_heads: int, dh: int) -> None:
    """The KV-tail write of ``m`` rows into a batch of 1's cache after a 1024-token prefix."""
    caches = [kv_cache(kv_heads, dh, 1024 + m) for _ in range(2)]
    for c in caches:
        c.lens.fill_(1024)
    # rows and slots are built once per forward (engine.runner), not per layer
    idx = [(c.tail_rows(m), c.tail_slots(m)) for c in caches]
    kvs = [
        torch.randn(1, m, kv_heads, dh, generator=gen, device="cuda", dtype=ACT) for _ in range(4)
    ]
    s.time_op(
        "kv_write",
        {
            "m": m,
            "num_kv_heads": kv_heads,
            "head_dim": dh,
            "dtype": "bfloat16",
            "impl": "engine",
        },
        lambda i, caches=caches, kvs=kvs, idx=idx: caches[i].write(
            0, *idx[i], kvs[2 * i], kvs[2 * i + 1]
        ),
        num_inputs=2,
        unique_bytes=2 * 2 * m * kv_heads * dh * 2,
        flops=0,
    )


def rotary_sweep(s: Runner, models: dict | None = None) -> None:
    """The rotary embedding of q and k heads together, as ``engine.rope`` applies it."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    models = (swept_models() if models is None else models).values()
    heads = sorted({(m.num_q_heads, m.num_kv_heads, m.head_dim) for m in models if not m.is_mla})
    for m in TOKENS:
        for num_q, kv_heads, dh in heads:
            qks, cos, sin, elems = _rope_inputs(gen, m, num_q, kv_heads, dh)
            s.time_op(
                "rotary",
                _head_params(m, num_q, kv_heads, dh),
                lambda i, qks=qks, cos=cos, sin=sin: _rotary(qks[i], cos, sin),
                num_inputs=2,
                unique_bytes=2 * elems * 2 + 2 * m * dh * 4,
                flops=6 * elems,
            )


def engine_group(s: Runner, models: dict | None = None) -> None:
    """The ``engine`` group: the rotary embedding, then the decoder's other ops."""
    rotary_sweep(s, models)
    engine_ops(s, models)


def main(argv: list[str] | None = None) -> int:
    groups = {**base.default_groups(), "engine": engine_group, "fused": fused_ops}
    rc = base.main(argv, groups)
    out = OneLineParser(add_help=False)
    out.add_argument("--out", type=Path)
    out.add_argument("--ops", default="fused")
    args, _ = out.parse_known_args(argv)
    path = None if args.out is None else args.out / base.ROWS_FILE
    if rc in (0, STOPPED_AT_BUDGET) and "fused" in args.ops and path and path.exists():
        print(fused_summary(read_rows(path)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
