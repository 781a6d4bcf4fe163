"""Launch-config sweep of the verification kernels on the GPU (graph replay, cold L2).

    python benchmarks/kernel_tuning.py --out DIR

Times a few launch configurations of ``dense_verify`` (t = 16 and 64 at 64K), ``sparse_verify``
(per_query and union C = 4 at batch 1 and 16) and the fused ``nsa_verify`` reuse path, each
against its default, and writes ``DIR/kernel_tuning.json``. Used to pick the defaults; the
benchmark rows of record come from ``python -m kernels.benchmark``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from kernels import benchmark as kb
from kernels import timing as tm
from kernels.dense_verify import DenseVerifyConfig, dense_verify
from kernels.nsa_verify import NsaVerifyConfig, nsa_verify
from kernels.sparse_verify import SparseVerifyConfig, sparse_verify

CFG = tm.TimingConfig(warmup=3, reps=10, graph_launches=10, graph_reps=9, max_total_s=0.4)


def time_graph(fn, num_inputs) -> float:
    return tm.bench(fn, "graph", num_inputs=num_inputs, config=CFG).median_s


def dense_rows(gen) -> list[dict]:
    out = []
    ctx = 64 * 1024
    variants = {
        "default": DenseVerifyConfig(),
        "stages4": DenseVerifyConfig(num_stages=4),
        "bn128_s2": DenseVerifyConfig(block_n=128, num_stages=2),
        "bn128_s2_w8": DenseVerifyConfig(block_n=128, num_stages=2, num_warps_small=8),
        "ctas1": DenseVerifyConfig(ctas_per_sm=1),
    }
    for t in (16, 64):
        sets = [kb.attention_inputs(1, t, ctx + t, [ctx], gen) for _ in range(2)]
        unique = kb.kv_bytes(ctx + t) * kb.NUM_KV_HEADS + kb.qol_bytes(1, t)
        for name, cfg in variants.items():
            try:
                s = time_graph(
                    lambda i, cfg=cfg, sets=sets: dense_verify(
                        *sets[i], validate=False, config=cfg
                    ),
                    2,
                )
            except Exception as e:  # a config that does not compile is a result too
                out.append({"op": "dense", "t": t, "variant": name, "error": repr(e)[:200]})
                continue
            out.append(
                {"op": "dense", "t": t, "variant": name, "us": s * 1e6, "tb_s": unique / s / 1e12}
            )
    return out


def sparse_rows(gen, rng) -> list[dict]:
    out = []
    ctx, t, top_n, gamma = 64 * 1024, 16, 32, 0.7
    variants = {
        "default": SparseVerifyConfig(),
        "pps2": SparseVerifyConfig(programs_per_sm=2),
        "pps8": SparseVerifyConfig(programs_per_sm=8),
        "stages2": SparseVerifyConfig(num_stages=2),
        "stages4": SparseVerifyConfig(num_stages=4),
        "warps8": SparseVerifyConfig(num_warps=8),
    }
    for bsz in (1, 16):
        q, k, v, lens, mask = kb.attention_inputs(bsz, t, ctx + t, [ctx] * bsz, gen)
        nb = [ctx // 64] * bsz
        idx = torch.from_numpy(kb.overlap_block_idx(nb, t, top_n, gamma, rng)).to(q.device)
        for mode, c in (("per_query", 1), ("union", 4)):
            for name, cfg in variants.items():
                try:
                    s = time_graph(
                        lambda i, cfg=cfg, mode=mode, c=c, a=(q, k, v, lens, mask, idx): (
                            sparse_verify(
                                *a,
                                mode=mode,
                                group_size=c,
                                block_size=64,
                                validate=False,
                                config=cfg,
                            )
                        ),
                        1,
                    )
                except Exception as e:
                    out.append(
                        {
                            "op": "sparse",
                            "batch": bsz,
                            "mode": mode,
                            "C": c,
                            "variant": name,
                            "error": repr(e)[:200],
                        }
                    )
                    continue
                out.append(
                    {
                        "op": "sparse",
                        "batch": bsz,
                        "mode": mode,
                        "C": c,
                        "variant": name,
                        "us": s * 1e6,
                    }
                )
    return out


def nsa_rows(gen) -> list[dict]:
    out = []
    ctx, t = 64 * 1024, 16
    import kernels.nsa_verify as mod

    args = kb._nsa_inputs(mod, 1, t, [ctx], ctx + t, gen)
    _, idx = nsa_verify(*args, **kb.NSA_KW, validate=False)
    variants = {
        "default": NsaVerifyConfig(),
        "splits32": NsaVerifyConfig(num_splits=32),
        "splits64": NsaVerifyConfig(num_splits=64, max_splits=64),
        "stages3": NsaVerifyConfig(num_stages=3),
        "bm32": NsaVerifyConfig(block_m=32),
    }
    for name, cfg in variants.items():
        try:
            s = time_graph(
                lambda i, cfg=cfg: nsa_verify(
                    *args, block_idx=idx, **kb.NSA_KW, validate=False, config=cfg
                ),
                1,
            )
        except Exception as e:
            out.append({"op": "nsa_reuse", "variant": name, "error": repr(e)[:200]})
            continue
        out.append({"op": "nsa_reuse", "variant": name, "us": s * 1e6})
    return out


def dense_split_rows(gen) -> list[dict]:
    """Split counts of dense_verify at 32K (batch 1), where the merge pass is a large share."""
    out = []
    ctx = 32 * 1024
    for t in (1, 8, 16):
        sets = [kb.attention_inputs(1, t, ctx + t, [ctx], gen) for _ in range(2)]
        unique = kb.kv_bytes(ctx + t) * kb.NUM_KV_HEADS + kb.qol_bytes(1, t)
        variants = [(n, DenseVerifyConfig()) for n in (None, 8, 12, 16, 24, 32, 48)]
        variants += [(None, DenseVerifyConfig(ctas_per_sm=1))]
        for splits, cfg in variants:
            s = time_graph(
                lambda i, sets=sets, n=splits, cfg=cfg: dense_verify(
                    *sets[i], validate=False, num_splits=n, config=cfg
                ),
                2,
            )
            out.append(
                {
                    "op": "dense_splits",
                    "t": t,
                    "num_splits": splits,
                    "ctas_per_sm": cfg.ctas_per_sm,
                    "us": s * 1e6,
                    "tb_s": unique / s / 1e12,
                }
            )
    return out


def nsa_split_rows(gen, rng) -> list[dict]:
    """Split counts of the NSA reuse path at batch 16 (the heuristic picks no split there)."""
    import kernels.nsa_verify as mod

    out = []
    ctx, t, bsz = 64 * 1024, 16, 16
    args = kb._nsa_inputs(mod, bsz, t, [ctx] * bsz, ctx + t, gen)
    nb = [ctx // kb.NSA_KW["block_size"]] * bsz
    idx = torch.from_numpy(kb.overlap_block_idx(nb, t, kb.NSA_KW["top_n"], 0.7, rng)).to("cuda")
    for impl, fn in (("fused", nsa_verify), ("unfused", mod.nsa_verify_unfused)):
        for splits in (0, 2, 4, 8):
            cfg = NsaVerifyConfig(num_splits=splits)
            s = time_graph(
                lambda i, fn=fn, cfg=cfg: fn(
                    *args, block_idx=idx, **kb.NSA_KW, validate=False, config=cfg
                ),
                1,
            )
            out.append({"op": "nsa_splits", "impl": impl, "num_splits": splits, "us": s * 1e6})
    return out


SETS = {
    "dense": lambda gen, rng: dense_rows(gen),
    "sparse": sparse_rows,
    "nsa": lambda gen, rng: nsa_rows(gen),
    "dense_splits": lambda gen, rng: dense_split_rows(gen),
    "nsa_splits": nsa_split_rows,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sets", default="dense,sparse,nsa", help=",".join(SETS))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rng = np.random.default_rng(0)
    rows = [r for name in args.sets.split(",") for r in SETS[name.strip()](gen, rng)]
    doc = {"provenance": tm.provenance(), "timing": dataclasses.asdict(CFG), "rows": rows}
    (args.out / "kernel_tuning.json").write_text(json.dumps(doc, indent=1))
    for r in rows:
        keys = {k: v for k, v in r.items() if k not in ("us", "tb_s", "error")}
        val = f"{r['us']:8.1f} us" if "us" in r else f"ERROR {r['error'][:60]}"
        extra = f"  {r['tb_s']:.2f} TB/s" if "tb_s" in r else ""
        print(f"{json.dumps(keys):90s} {val}{extra}")
    assert not math.isnan(sum(r.get("us", 0) for r in rows))


if __name__ == "__main__":
    main()
