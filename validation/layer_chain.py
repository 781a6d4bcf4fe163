"""A decoder layer's projections with its residual adds, norms and SwiGLU in their launches,
against the same projections with those as launches of their own: the measurements behind
``engine.model.CausalLM.chains_norms``.

    python -m ssvkit.validation.layer_chain --out validation/data/layer-chain-h200.json

A registry model's layer shapes (``--model``, Llama-3.1-8B by default), bf16 weights of
``LAYERS`` layers rotated so that each timed call reads its weights from DRAM, fresh
standard-normal inputs. Per row count: each projection plain (``linear``) and chained (the
output and down projections adding the residual with the next norm pending,
``linear_add_norm``; the q/k/v projection applying a pending norm; gate/up applying it with
SwiGLU), the ``add_rms_norm`` and ``silu_mul`` launches the chain removes, and a layer's chain
of them both ways (attention left out: it is the same both ways). Each row count is first
checked: the chained layer's residual stream and next input equal the plain layer's within
bf16 rounding. All of a row count's calls are timed together (CUDA graphs, L2 flushed per
sample, samples interleaved); ``floor_s``: a projection's weight and rows over the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from ssvkit.kernels import timing as tm
from ssvkit.kernels.layer_ops import add_rms_norm, silu_mul
from ssvkit.kernels.linear import MAX_ROWS, linear, linear_add_norm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.models import get_model
from ssvkit.validation.bench_documents import write_benchmark

LAYERS = 8
EPS = 1e-5
TIMING = tm.TimingConfig(warmup=3, graph_launches=16, graph_reps=15, max_total_s=3.0)
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def layer_shapes(model) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of each projection of one layer of ``model``."""
    d, dh = model.hidden_size, model.head_dim
    q, kv = model.num_q_heads * dh, model.num_kv_heads * dh
    f = model.intermediate_size
    return {
        "qkv_proj": (q + 2 * kv, d),
        "o_proj": (d, q),
        "gate_up_proj": (2 * f, d),
        "down_proj": (d, f),
    }


def _layers(shapes: dict, gen: torch.Generator) -> list[dict]:
    """``LAYERS`` layers' bf16 weights and norm weights on the GPU."""

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    out = []
    for _ in range(LAYERS):
        w = {k: rand(n, k_in, scale=k_in**-0.5) for k, (n, k_in) in shapes.items()}
        d = shapes["o_proj"][0]
        w |= {"post_norm": 1 + rand(d, scale=0.1), "next_norm": 1 + rand(d, scale=0.1)}
        out.append(w)
    return out


def _calls(layers: list[dict], rows: int, shapes: dict, gen: torch.Generator) -> dict:
    """Every timed call of one row count: ``name -> fn(i)`` on layer ``i``'s weights."""

    def rand(n):
        return torch.randn((rows, n), generator=gen, device="cuda").to(torch.bfloat16)

    d, q = shapes["o_proj"]
    f = shapes["down_proj"][1]
    x, attn, h, act, gate_up = rand(d), rand(q), rand(d), rand(f), rand(2 * f)
    _, g, pending = linear_add_norm(attn, layers[0]["o_proj"], x, layers[0]["post_norm"], EPS)

    def plain_layer(i):
        w = layers[i]
        linear(h, w["qkv_proj"])
        s, h2 = add_rms_norm(x, linear(attn, w["o_proj"]), w["post_norm"], EPS)
        m = linear(silu_mul(linear(h2, w["gate_up_proj"])), w["down_proj"])
        return add_rms_norm(s, m, w["next_norm"], EPS)

    def chained_layer(i):
        w = layers[i]
        linear(g, w["qkv_proj"], pending=pending)
        s, g2, post = linear_add_norm(attn, w["o_proj"], x, w["post_norm"], EPS)
        a = linear(g2, w["gate_up_proj"], pending=post, swiglu=True)
        return linear_add_norm(a, w["down_proj"], s, w["next_norm"], EPS)

    return {
        "qkv_proj": lambda i: linear(h, layers[i]["qkv_proj"]),
        "qkv_proj_chained": lambda i: linear(g, layers[i]["qkv_proj"], pending=pending),
        "o_proj": lambda i: linear(attn, layers[i]["o_proj"]),
        "o_proj_chained": lambda i: linear_add_norm(
            attn, layers[i]["o_proj"], x, layers[i]["post_norm"], EPS
        ),
        "gate_up_proj": lambda i: linear(h, layers[i]["gate_up_proj"]),
        "gate_up_proj_chained": lambda i: linear(
            g, layers[i]["gate_up_proj"], pending=pending, swiglu=True
        ),
        "down_proj": lambda i: linear(act, layers[i]["down_proj"]),
        "down_proj_chained": lambda i: linear_add_norm(
            act, layers[i]["down_proj"], x, layers[i]["next_norm"], EPS
        ),
        "add_rms_norm": lambda i: add_rms_norm(x, h, layers[i]["post_norm"], EPS),
        "silu_mul": lambda i: silu_mul(gate_up),
        "layer": plain_layer,
        "layer_chained": chained_layer,
    }


def check_layer(w: dict, rows: int, shapes: dict, gen: torch.Generator) -> None:
    """The chained layer's residual stream and the next layer's q/k/v equal the plain layer's
    within bf16 rounding (each against the fp32 chain of the same weights)."""
    d, q = shapes["o_proj"]
    x = torch.randn((rows, d), generator=gen, device="cuda").to(torch.bfloat16)
    attn = torch.randn((rows, q), generator=gen, device="cuda").to(torch.bfloat16)

    def norm(s, weight):
        sf = s.float()
        return sf * torch.rsqrt(sf.square().mean(-1, keepdim=True) + EPS) * weight.float()

    s_ref = x.float() + attn.float() @ w["o_proj"].float().T
    gate, up = (norm(s_ref, w["post_norm"]) @ w["gate_up_proj"].float().T).chunk(2, dim=-1)
    s2_ref = s_ref + (torch.nn.functional.silu(gate) * up) @ w["down_proj"].float().T
    qkv_ref = norm(s2_ref, w["next_norm"]) @ w["qkv_proj"].float().T

    s, g, post = linear_add_norm(attn, w["o_proj"], x, w["post_norm"], EPS)
    a = linear(g, w["gate_up_proj"], pending=post, swiglu=True)
    s2, g2, pre = linear_add_norm(a, w["down_proj"], s, w["next_norm"], EPS)
    qkv = linear(g2, w["qkv_proj"], pending=pre)
    s_plain, h = add_rms_norm(x, linear(attn, w["o_proj"]), w["post_norm"], EPS)
    m = linear(silu_mul(linear(h, w["gate_up_proj"])), w["down_proj"])
    s2_plain, h2 = add_rms_norm(s_plain, m, w["next_norm"], EPS)
    qkv_plain = linear(h2, w["qkv_proj"])
    for name, ref, got, plain in (("s2", s2_ref, s2, s2_plain), ("qkv", qkv_ref, qkv, qkv_plain)):
        scale = ref.abs().max().item()
        err, plain_err = (got.float() - ref).abs().max().item(), (plain.float() - ref).abs().max()
        if not torch.isfinite(got).all() or err > max(2 * plain_err.item(), 2e-2 * scale):
            raise AssertionError(
                f"layer_chain: the chained {name} is {err:.3g} off fp32 at {rows} rows "
                f"(plain {plain_err.item():.3g})"
            )


def run_rows(layers: list[dict], rows: int, shapes: dict, copy_bps: float) -> dict:
    """One row count: checked, then every call timed together."""
    gen = torch.Generator(device="cuda").manual_seed(rows)
    check_layer(layers[0], rows, shapes, gen)
    calls = _calls(layers, rows, shapes, gen)
    times = tm.bench_graphs(list(calls.values()), num_inputs=LAYERS, config=TIMING)
    floors = {k: (n * k_in + rows * (n + k_in)) * 2 / copy_bps for k, (n, k_in) in shapes.items()}
    return dict(
        rows=rows,
        graph_s={name: t.median_s for name, t in zip(calls, times, strict=True)},
        floor_s=floors,
    )


def print_table(doc_rows: list[dict]) -> None:
    print(f"{'rows':>4} {'op':<14} {'floor us':>9} {'plain us':>9} {'chained us':>11}")
    for r in doc_rows:
        t = r["graph_s"]
        for op in PROJECTIONS:
            print(
                f"{r['rows']:>4} {op:<14} {r['floor_s'][op] * 1e6:9.2f} {t[op] * 1e6:9.2f} "
                f"{t[op + '_chained'] * 1e6:11.2f}"
            )
        print(
            f"{r['rows']:>4} {'layer':<14} {'':>9} {t['layer'] * 1e6:9.2f} "
            f"{t['layer_chained'] * 1e6:11.2f}"
            f"   (add_rms_norm {t['add_rms_norm'] * 1e6:.2f}, silu_mul {t['silu_mul'] * 1e6:.2f})"
        )
    print("(us, CUDA graph, L2 flushed; a layer: its projections and element-wise launches)")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--model", default="llama-3.1-8b", help="registry model whose layer to time")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, MAX_ROWS])
    args = p.parse_args(argv)
    for r in args.rows:
        if not 1 <= r <= MAX_ROWS:
            p.exit(2, f"layer_chain: --rows {r} is outside 1..{MAX_ROWS}\n")
    try:
        model = get_model(args.model)
    except (KeyError, ValueError, FileNotFoundError) as e:
        p.exit(2, f"layer_chain: --model {args.model!r}: {e}\n")
    if model.is_moe or model.is_mla:
        p.exit(2, f"layer_chain: --model {args.model!r} has no dense Llama-family layer\n")
    if not torch.cuda.is_available():
        p.exit(2, "layer_chain: needs a CUDA GPU\n")
    shapes = layer_shapes(model)
    copy_bps = tm.copy_bytes_per_s()
    layers = _layers(shapes, torch.Generator(device="cuda").manual_seed(0))
    with torch.no_grad():
        doc_rows = [run_rows(layers, r, shapes, copy_bps) for r in args.rows]
    write_benchmark(
        args.out,
        "layer_chain",
        doc_rows,
        model=model.name,
        shapes={k: list(v) for k, v in shapes.items()},
        layers=LAYERS,
        copy_bytes_per_s=copy_bps,
    )
    print_table(doc_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
