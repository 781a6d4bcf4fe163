"""What the cold-L2 flush before each timing sample costs the sample: the ops of a Llama-3.1-8B
verify step at 16 draft rows (its four GEMMs and an RMSNorm), each timed by CUDA-graph replay
(``kernels.timing.bench_graph``) with the L2 flushed by a 256 MB read (the method of record), by
a 256 MB write (the method before it), and not flushed, at 10 and 20 launches per replay (the
op sweep's and the kernel sweep's).

    python -m ssvkit.validation.l2_flush --out validation/data/l2-flush-h200.json

A write flush leaves the L2 full of dirty lines; the replay's first launch writes them back, so
each launch of a sample is charged that write-back over the launch count. The read flush leaves
clean lines. The rows give each op's median time per launch per flush and launch count, and
the write flush's excess over the read flush times the launch count: the write-back a sample
pays.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write

# (name, n, k) of the Llama-3.1-8B linear layers: qkv_proj, o_proj, gate_up_proj, down_proj.
GEMMS = (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 28672, 4096),
         ("down_proj", 4096, 14336))  # fmt: skip
ROWS = 16
HIDDEN = 4096
LAUNCHES = (10, 20)
FLUSHES = ("read", "write", "none")


def timing_config(flush: str, launches: int) -> tm.TimingConfig:
    return dataclasses.replace(
        tm.DEFAULT_TIMING,
        graph_launches=launches,
        flush_l2=flush != "none",
        flush_write=flush == "write",
    )


def _randn(shape, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)


def ops(gen: torch.Generator) -> dict:
    """``name -> (fn(i), input sets)``: each op over enough input sets to exceed the L2."""
    out = {}
    for name, n, k in GEMMS:
        sets = tm.num_rotations(n * k * 2)
        ws = [_randn((n, k), gen) for _ in range(sets)]
        xs = [_randn((ROWS, k), gen) for _ in range(sets)]
        out[name] = (lambda i, xs=xs, ws=ws: F.linear(xs[i], ws[i]), sets)
    x = _randn((ROWS, HIDDEN), gen)
    w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    out["rms_norm"] = (lambda i: F.rms_norm(x, (HIDDEN,), w, 1e-6), 1)
    return out


def measure() -> list[dict]:
    rows = []
    for name, (fn, sets) in ops(torch.Generator(device="cuda").manual_seed(0)).items():
        times = {
            f"{flush}_{n}": tm.bench_graph(
                fn, num_inputs=sets, config=timing_config(flush, n)
            ).median_s
            for n in LAUNCHES
            for flush in FLUSHES
        }
        write_back = {n: (times[f"write_{n}"] - times[f"read_{n}"]) * n for n in LAUNCHES}
        rows.append(dict(op=name, input_sets=sets, times_s=times, write_back_s=write_back))
    return rows


def print_table(rows: list[dict]) -> None:
    head = "  ".join(f"{f}/{n:<2d}" for n in LAUNCHES for f in FLUSHES)
    print(f"{'op':>14s}  us per launch: {head}   write-back per sample (us)")
    for r in rows:
        cells = "  ".join(
            f"{r['times_s'][f'{f}_{n}'] * 1e6:7.1f}" for n in LAUNCHES for f in FLUSHES
        )
        wb = " ".join(f"{r['write_back_s'][n] * 1e6:5.1f}" for n in LAUNCHES)
        print(f"{r['op']:>14s}  {cells}   {wb}")


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON document to write")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("l2_flush needs a CUDA GPU")
    rows = measure()
    doc = dict(
        provenance=tm.provenance(),
        flush_bytes=tm.L2_FLUSH_BYTES,
        rows_per_gemm=ROWS,
        base_timing=dataclasses.asdict(tm.DEFAULT_TIMING),
        rows=rows,
    )
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print_table(rows)


if __name__ == "__main__":
    main()
