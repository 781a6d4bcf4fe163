"""``ssvkit predict --plot``: the verify ops of the longest context on the GPU's roofline, and
each baseline's speedup over ``ar_dense`` against the context length."""

from __future__ import annotations

import io

from perfmodel.strategy import BASELINES


def predict_plot(rows, gpu, dtype) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    peak = gpu.tensor_flops_per_s(dtype)
    bw = gpu.hbm_bytes_per_s
    xs = [10 ** (k / 10) for k in range(-20, 41)]
    ax1.loglog(xs, [min(peak, x * bw) for x in xs], "k-", lw=1, label=f"{gpu.name} roofline")
    ctx = max(r["context_len"] for r in rows)
    markers = dict(zip(BASELINES, "os^vD", strict=False))
    for r in rows:
        if r["context_len"] != ctx:
            continue
        for k, t in r["op_s"].items():
            f, b = r["op_flops"][k], r["op_bytes"][k]
            if f > 0 and b > 0 and k.startswith("verify."):
                ax1.scatter(f / b, f / t, marker=markers.get(r["strategy"], "o"), s=18)
                if r["strategy"] == "ssv":
                    ax1.annotate(k.split(".", 1)[1], (f / b, f / t), fontsize=6)
    ax1.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax1.set_ylabel("FLOP/s")
    ax1.set_title(f"verify ops at context {ctx} ({rows[0]['provenance']})")
    for name in dict.fromkeys(r["strategy"] for r in rows):
        pts = [(r["context_len"], r["speedup_vs_ar_dense"]) for r in rows if r["strategy"] == name]
        ax2.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker=markers.get(name, "o"), label=name
        )
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("context length (tokens)")
    ax2.set_ylabel("speedup over ar_dense")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()
